// Ranks that disagree on a collective on device memory: the kernels compare
// the signature each link's first slot carries (prims_device.cuh), and the
// mismatched call ends on every rank within a second with an error (never
// success), whatever WEFT_TIMEOUT is; the rank that compared names the
// fields that differ; nothing is written past a rank's own count. Every
// kind of difference (count, datatype of one size and of another, op, root,
// collective), each on a seeded choice of algorithm (ring, tree),
// protocol (SIMPLE, LL) and rank count (2-4), every algorithm and protocol
// at least once; and the roots that leave no rank receiving first or no
// rank sending first: two ranks that both take themselves for a
// broadcast's root with 32 slots to send (each finds the other's head
// while it waits for credit), two that both take themselves for a reduce's
// root (each sends its signature before it waits). Ranks on different
// protocols or algorithms (the tuner's choice follows the size) compare
// nothing and wait out WEFT_TIMEOUT; both are forced here. Ranks share
// GPU 0 in one process; skipped without one.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tests/device/dev_ranks.h"

namespace {

enum Diff {
  kCount, kTypeSameSize, kTypeOtherSize, kOp, kRoot, kKind, kRootsAllSend, kRootsAllReceive,
  kNumDiffs
};
const char *const kDiffNames[] = {"count", "datatype (same size)", "datatype (other size)", "op",
                                  "root", "collective", "broadcast: every rank its own root",
                                  "reduce: every rank its own root"};
// what the comparing rank's message names
const char *const kDiffWords[] = {"count differs", "datatype differs", "datatype differs",
                                  "op differs", "root differs", "collective differs",
                                  "root differs", "root differs"};
const size_t kLargeCount = (size_t)2 << 20; // 8 MiB of float32: 32 SIMPLE slots a channel

struct Call {
  int kind; // 0 all-reduce, 1 broadcast, 2 all-gather, 3 reduce
  size_t count;
  weftDataType_t type;
  weftRedOp_t op;
  int root;
};

// Rank r's call for difference d: rank 0 (and, for the root, ranks 1..)
// differ from the rest.
Call call_of(Diff d, int r) {
  Call c = {0, 1000, weftFloat32, weftSum, 0};
  switch (d) {
    case kCount: c.count = r == 0 ? 1000 : 1024; break;
    case kTypeSameSize: c.type = r == 0 ? weftFloat32 : weftInt32; break;
    case kTypeOtherSize: c.type = r == 0 ? weftFloat64 : weftFloat32; break;
    case kOp: c.op = r == 0 ? weftSum : weftMax; break;
    case kRoot: c.kind = 1, c.root = r == 0 ? 0 : 1; break;
    case kKind: c.kind = r == 0 ? 0 : 2; break;
    case kRootsAllSend: c.kind = 1, c.root = r, c.count = kLargeCount; break;
    case kRootsAllReceive: c.kind = 3, c.root = r; break;
    default: break;
  }
  return c;
}

// An all-reduce of n float32 on which every rank agrees, in a group, then
// each rank's async error: weftSuccess on every one.
void matched_allreduce(Ranks &ranks, const std::vector<unsigned char *> &send,
                       const std::vector<unsigned char *> &recv, size_t n) {
  const int k = (int)ranks.comms.size();
  ASSERT_EQ(weftGroupStart(), weftSuccess);
  for (int r = 0; r < k; r++)
    ASSERT_EQ(weftAllReduce(send[r], recv[r], n, weftFloat32, weftSum, ranks.comms[r],
                            ranks.streams[r]),
              weftSuccess);
  ASSERT_EQ(weftGroupEnd(), weftSuccess) << weftGetLastError(nullptr);
  ranks.sync();
  for (int r = 0; r < k; r++) {
    weftResult_t async = weftSuccess;
    weftCommGetAsyncError(ranks.comms[r], &async);
    EXPECT_EQ(async, weftSuccess) << "rank " << r << ": " << weftGetLastError(ranks.comms[r]);
  }
}

const size_t kCanary = 4096; // bytes after the largest call's output
const unsigned char kPoison = 0xa7;

TEST(DeviceMismatch, EveryRankFailsFastAndNothingPastItsCount) {
  REQUIRE_GPU();
  const unsigned seed = 20261203;
  std::mt19937 rng(seed);
  printf("seed %u\n", seed);
  const char *algos[] = {"ring", "tree"}, *protos[] = {"simple", "ll"};
  for (int d = 0; d < kNumDiffs; d++) {
    // every algorithm and protocol pair once among the first four
    // differences (a count that differs on the tree's LL, whose steps run
    // their links together), then chosen; the tree runs all-reduce only
    // (3-4 ranks)
    const bool tree_ok = d < kRoot; // the tree runs all-reduce only
    const int first_ai[4] = {1, 0, 1, 0}, first_pi[4] = {1, 0, 0, 1};
    int ai = d < 4 ? first_ai[d] : (int)(rng() % 2), pi = d < 4 ? first_pi[d] : (int)(rng() % 2);
    if (!tree_ok) ai = 0;
    int k = ai == 1 ? 3 + (int)(rng() % 2) : 2 + (int)(rng() % 3);
    if (d == kRootsAllSend) k = 2, pi = 0; // both roots: 32 SIMPLE slots on one channel
    if (d == kRootsAllReceive) k = 2;      // each the other's root's predecessor
    SCOPED_TRACE(std::string(kDiffNames[d]) + ", " + algos[ai] + " " + protos[pi] + ", " +
                 std::to_string(k) + " ranks");
    printf("%s: %s %s, %d ranks\n", kDiffNames[d], algos[ai], protos[pi], k);
    ScopedEnv env({{"WEFT_ALGO", algos[ai]}, {"WEFT_PROTO", protos[pi]}, {"WEFT_TIMEOUT", "30"},
                   {"WEFT_DEVICE_NCHANNELS", d == kRootsAllSend ? "1" : "4"}});
    Ranks ranks(k);
    const size_t max_out = d == kRootsAllSend ? kLargeCount * 4 : 1024 * 8 * (size_t)k;
    std::vector<unsigned char *> send(k), recv(k);
    for (int r = 0; r < k; r++) {
      ASSERT_EQ(cudaMalloc((void **)&send[r], max_out + kCanary), cudaSuccess);
      ASSERT_EQ(cudaMalloc((void **)&recv[r], max_out + kCanary), cudaSuccess);
      ASSERT_EQ(cudaMemset(send[r], 0x11, max_out + kCanary), cudaSuccess);
    }
    // once together, so that every link is connected and has compared
    matched_allreduce(ranks, send, recv, 1000);
    if (HasFailure()) return;
    for (int r = 0; r < k; r++)
      ASSERT_EQ(cudaMemset(recv[r], kPoison, max_out + kCanary), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

    const auto t0 = std::chrono::steady_clock::now();
    ASSERT_EQ(weftGroupStart(), weftSuccess);
    std::vector<size_t> out_nbytes(k);
    for (int r = 0; r < k; r++) {
      const Call c = call_of((Diff)d, r);
      const size_t esize = weftTypeSize(c.type);
      weftResult_t res;
      if (c.kind == 0) {
        res = weftAllReduce(send[r], recv[r], c.count, c.type, c.op, ranks.comms[r],
                            ranks.streams[r]);
        out_nbytes[r] = c.count * esize;
      } else if (c.kind == 1) {
        res = weftBroadcast(send[r], recv[r], c.count, c.type, c.root, ranks.comms[r],
                            ranks.streams[r]);
        out_nbytes[r] = c.count * esize;
      } else if (c.kind == 2) {
        res = weftAllGather(send[r], recv[r], c.count, c.type, ranks.comms[r], ranks.streams[r]);
        out_nbytes[r] = c.count * esize * (size_t)k;
      } else {
        res = weftReduce(send[r], recv[r], c.count, c.type, c.op, c.root, ranks.comms[r],
                         ranks.streams[r]);
        out_nbytes[r] = c.count * esize;
      }
      ASSERT_EQ(res, weftSuccess) << "enqueue, rank " << r << ": " << weftGetLastError(ranks.comms[r]);
    }
    weftGroupEnd(); // may already say what a kernel found
    for (int r = 0; r < k; r++) cudaStreamSynchronize(ranks.streams[r]);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(s, 1.0 * gpu_time_scale()) << "every rank's kernel ended (WEFT_TIMEOUT=30)";

    int named = 0;
    for (int r = 0; r < k; r++) {
      weftResult_t async = weftSuccess;
      EXPECT_EQ(weftCommGetAsyncError(ranks.comms[r], &async), weftSuccess);
      const std::string text = weftGetLastError(ranks.comms[r]);
      EXPECT_NE(async, weftSuccess) << "rank " << r << " returned success";
      if (async == weftInvalidUsage && text.find("ranks disagree on a collective") != std::string::npos &&
          text.find(kDiffWords[d]) != std::string::npos)
        named++;
      printf("  rank %d: %d %s\n", r, (int)async, text.c_str());
      std::vector<unsigned char> tail(kCanary);
      ASSERT_EQ(cudaMemcpy(tail.data(), recv[r] + out_nbytes[r], kCanary, cudaMemcpyDeviceToHost),
                cudaSuccess);
      size_t touched = 0;
      for (unsigned char b : tail) touched += b != kPoison;
      EXPECT_EQ(touched, 0u) << "rank " << r << ": bytes written past its count";
    }
    EXPECT_GE(named, 1) << "no rank named the fields that differ";
    for (int r = 0; r < k; r++) {
      cudaFree(send[r]);
      cudaFree(recv[r]);
    }
  }
}

// A send and its receive of different sizes on device memory: the
// receiving block refuses the first chunk (its head holds the sender's
// size) before it copies anything, and poisons every lane from the sender,
// whose blocks (more chunks than the lanes' slots hold) stop too: both
// ranks fail within a second, the receiver names both sizes, and its
// buffer is untouched.
TEST(DeviceMismatch, SendAndReceiveOfDifferentSizes) {
  REQUIRE_GPU();
  ScopedEnv env({{"WEFT_TIMEOUT", "30"}});
  // 65 chunks of 256 KiB less the head: more than 8 lanes of 4 slots hold
  const size_t send_n = (size_t)16 << 20, recv_n = send_n + 1024;
  Ranks ranks(2);
  char *sbuf, *rbuf, *warm;
  ASSERT_EQ(cudaMalloc((void **)&sbuf, send_n), cudaSuccess);
  ASSERT_EQ(cudaMalloc((void **)&rbuf, recv_n + kCanary), cudaSuccess);
  ASSERT_EQ(cudaMalloc((void **)&warm, 2 * 64), cudaSuccess);
  ASSERT_EQ(cudaMemset(sbuf, 0x3c, send_n), cudaSuccess);
  // connected once with sizes that agree
  ASSERT_EQ(weftGroupStart(), weftSuccess);
  ASSERT_EQ(weftSend(warm, 64, weftInt8, 1, ranks.comms[0], ranks.streams[0]), weftSuccess);
  ASSERT_EQ(weftRecv(warm + 64, 64, weftInt8, 0, ranks.comms[1], ranks.streams[1]), weftSuccess);
  ASSERT_EQ(weftGroupEnd(), weftSuccess) << weftGetLastError(nullptr);
  ranks.sync();
  ASSERT_EQ(cudaMemset(rbuf, kPoison, recv_n + kCanary), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(weftGroupStart(), weftSuccess);
  ASSERT_EQ(weftSend(sbuf, send_n, weftInt8, 1, ranks.comms[0], ranks.streams[0]), weftSuccess);
  ASSERT_EQ(weftRecv(rbuf, recv_n, weftInt8, 0, ranks.comms[1], ranks.streams[1]), weftSuccess);
  weftGroupEnd();
  for (int r = 0; r < 2; r++) cudaStreamSynchronize(ranks.streams[r]);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(s, 1.0 * gpu_time_scale()) << "WEFT_TIMEOUT=30";
  for (int r = 0; r < 2; r++) {
    weftResult_t async = weftSuccess;
    weftCommGetAsyncError(ranks.comms[r], &async);
    const std::string text = weftGetLastError(ranks.comms[r]);
    printf("  rank %d: %d %s\n", r, (int)async, text.c_str());
    EXPECT_NE(async, weftSuccess) << "rank " << r;
    if (r == 1) {
      EXPECT_EQ(async, weftInvalidUsage);
      EXPECT_NE(text.find("sizes differ"), std::string::npos) << text;
      EXPECT_NE(text.find(std::to_string(send_n)), std::string::npos) << text;
    }
  }
  std::vector<unsigned char> got(recv_n + kCanary);
  ASSERT_EQ(cudaMemcpy(got.data(), rbuf, got.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  size_t touched = 0;
  for (unsigned char b : got) touched += b != kPoison;
  EXPECT_EQ(touched, 0u) << "bytes of the refused receive written";
  cudaFree(sbuf);
  cudaFree(rbuf);
  cudaFree(warm);
}

// WEFT_CHECK=1 compares every call over the bootstrap before anything
// launches, on device memory too (in a group, each comm on its own
// thread): ranks that disagree get weftInvalidUsage naming what differs,
// the comms go on working, and the next call that agrees succeeds. Here
// under WEFT_DETERMINISTIC=1, whose exchanges no kernel compares.
TEST(DeviceMismatch, CheckComparesBeforeLaunching) {
  REQUIRE_GPU();
  ScopedEnv env({{"WEFT_CHECK", "1"}, {"WEFT_DETERMINISTIC", "1"}, {"WEFT_TIMEOUT", "30"}});
  const int k = 3;
  Ranks ranks(k);
  std::vector<unsigned char *> buf(k);
  for (int r = 0; r < k; r++) {
    ASSERT_EQ(cudaMalloc((void **)&buf[r], 2048 * sizeof(float)), cudaSuccess);
    ASSERT_EQ(cudaMemset(buf[r], 0, 2048 * sizeof(float)), cudaSuccess);
  }
  ASSERT_EQ(weftGroupStart(), weftSuccess);
  for (int r = 0; r < k; r++)
    ASSERT_EQ(weftAllReduce(buf[r], buf[r], r == 1 ? 1000 : 1024, weftFloat32, weftSum,
                            ranks.comms[r], ranks.streams[r]),
              weftSuccess);
  EXPECT_EQ(weftGroupEnd(), weftInvalidUsage);
  const std::string text = weftGetLastError(nullptr);
  EXPECT_NE(text.find("count differs"), std::string::npos) << text;
  ranks.sync();
  matched_allreduce(ranks, buf, buf, 1024); // the comms go on working
  for (int r = 0; r < k; r++) cudaFree(buf[r]);
}

// Polls every rank's weftCommGetAsyncError (as a watchdog does) until each
// reports an error or limit_s passes: the seconds it took, each rank's
// error and text.
double poll_until_all_fail(Ranks &ranks, double limit_s, std::vector<weftResult_t> &async,
                           std::vector<std::string> &text) {
  const int k = (int)ranks.comms.size();
  async.assign(k, weftSuccess);
  text.assign(k, "");
  const auto t0 = std::chrono::steady_clock::now();
  double s = 0;
  for (;;) {
    int failed = 0;
    for (int r = 0; r < k; r++) {
      if (async[r] == weftSuccess) {
        EXPECT_EQ(weftCommGetAsyncError(ranks.comms[r], &async[r]), weftSuccess);
        if (async[r] != weftSuccess) text[r] = weftGetLastError(ranks.comms[r]);
      }
      failed += async[r] != weftSuccess;
    }
    s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (failed == k || s > limit_s) return s;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// Counts on either side of the tuner's LL/SIMPLE threshold: the ranks'
// kernels use different FIFOs, so no kernel compares. The call is the
// second of a group, with twelve more queued behind it. weftCommGetAsyncError's watch finds their kernels have
// ended nothing for WEFT_HANG_ASK_MS, asks the peers, finds a different
// count under the call's number in their traces and stops the kernels:
// every rank fails within about a second of the watch's question with
// WEFT_TIMEOUT=30, one names the count, and nothing lands past a count.
void differ_found_by_asking(int k, size_t small, size_t large) {
  Ranks ranks(k);
  std::vector<unsigned char *> send(k), recv(k);
  for (int r = 0; r < k; r++) {
    ASSERT_EQ(cudaMalloc((void **)&send[r], large * 4 + kCanary), cudaSuccess);
    ASSERT_EQ(cudaMalloc((void **)&recv[r], large * 4 + kCanary), cudaSuccess);
    ASSERT_EQ(cudaMemset(send[r], 0x11, large * 4 + kCanary), cudaSuccess);
  }
  matched_allreduce(ranks, send, recv, small);
  if (testing::Test::HasFailure()) return;
  for (int r = 0; r < k; r++) ASSERT_EQ(cudaMemset(recv[r], kPoison, large * 4 + kCanary), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  // a group of two calls, the second mismatched (#3), then twelve more
  // calls queued behind it on every stream: more than an answer holds
  std::vector<unsigned char *> spare(k);
  for (int r = 0; r < k; r++) ASSERT_EQ(cudaMalloc((void **)&spare[r], small * 4), cudaSuccess);
  ASSERT_EQ(weftGroupStart(), weftSuccess);
  for (int r = 0; r < k; r++) {
    ASSERT_EQ(weftAllReduce(send[r], spare[r], small, weftFloat32, weftSum, ranks.comms[r],
                            ranks.streams[r]),
              weftSuccess);
    ASSERT_EQ(weftAllReduce(send[r], recv[r], r == 0 ? small : large, weftFloat32, weftSum,
                            ranks.comms[r], ranks.streams[r]),
              weftSuccess);
  }
  weftGroupEnd();
  for (int i = 0; i < 12; i++)
    for (int r = 0; r < k; r++)
      weftAllReduce(send[r], spare[r], small, weftFloat32, weftSum, ranks.comms[r],
                    ranks.streams[r]);
  std::vector<weftResult_t> async;
  std::vector<std::string> text;
  const double s = poll_until_all_fail(ranks, 10.0, async, text);
  printf("  every rank failed after %.2f s\n", s);
  EXPECT_LT(s, 2.0) << "the watch asks after WEFT_HANG_ASK_MS (500 ms)";
  int named = 0;
  for (int r = 0; r < k; r++) {
    printf("  rank %d: %d %s\n", r, (int)async[r], text[r].c_str());
    EXPECT_NE(async[r], weftSuccess) << "rank " << r;
    named += async[r] == weftInvalidUsage && text[r].find("count differs") != std::string::npos &&
             text[r].find("#3") != std::string::npos;
  }
  EXPECT_GE(named, 1) << "no rank named the count";
  for (int r = 0; r < k; r++) {
    EXPECT_EQ(cudaStreamSynchronize(ranks.streams[r]), cudaSuccess) << "the kernels stopped";
    std::vector<unsigned char> tail(kCanary);
    const size_t out = (r == 0 ? small : large) * 4;
    ASSERT_EQ(cudaMemcpy(tail.data(), recv[r] + out, kCanary, cudaMemcpyDeviceToHost), cudaSuccess);
    size_t touched = 0;
    for (unsigned char b : tail) touched += b != kPoison;
    EXPECT_EQ(touched, 0u) << "rank " << r << ": bytes written past its count";
    cudaFree(send[r]);
    cudaFree(recv[r]);
    cudaFree(spare[r]);
  }
}

TEST(DeviceMismatch, ProtocolsThatDifferFoundByAsking) {
  REQUIRE_GPU();
  ScopedEnv env({{"WEFT_TIMEOUT", "30"}});
  differ_found_by_asking(3, 1000, (size_t)4 << 20); // 4 KB and 16 MiB of float32
}

// The same with the tree and LL on both sides of WEFT_TREE_SMALL_BYTES
// (4 KiB): 4 ranks, one on the small calls' tree (a root over three), the
// others on the double binary tree, whose links partly differ: the kernels
// compare signatures on the links the two share, and the watch's question
// finds the rest; either way every rank fails fast, one names the count.
TEST(DeviceMismatch, TreesThatDifferFailFast) {
  REQUIRE_GPU();
  ScopedEnv env({{"WEFT_TIMEOUT", "30"}, {"WEFT_ALGO", "allreduce:tree"}, {"WEFT_PROTO", "ll"}});
  differ_found_by_asking(4, 1000, 1100); // 4000 and 4400 B of float32
}

// A rank that skips a collective on device memory: the others' kernels
// give up at WEFT_TIMEOUT, and their error is the verdict from the ranks'
// traces, as on host memory: the rank that never called it, its last call
// (device calls are in the trace, their state read from their kernels'
// ends) and who waits on it.
TEST(DeviceMismatch, SkippedCallNamedAfterTheTimeout) {
  REQUIRE_GPU();
  ScopedEnv env({{"WEFT_TIMEOUT", "2"}});
  const int k = 3;
  Ranks ranks(k);
  std::vector<unsigned char *> buf(k);
  for (int r = 0; r < k; r++) {
    ASSERT_EQ(cudaMalloc((void **)&buf[r], 4096 * sizeof(float)), cudaSuccess);
    ASSERT_EQ(cudaMemset(buf[r], 0, 4096 * sizeof(float)), cudaSuccess);
  }
  matched_allreduce(ranks, buf, buf, 4096);
  if (HasFailure()) return;
  // ranks 0 and 1 call all-reduce #2; rank 2 does not
  ASSERT_EQ(weftGroupStart(), weftSuccess);
  for (int r = 0; r < 2; r++)
    ASSERT_EQ(weftAllReduce(buf[r], buf[r], 4096, weftFloat32, weftSum, ranks.comms[r],
                            ranks.streams[r]),
              weftSuccess);
  weftGroupEnd();
  Ranks *rp = &ranks;
  const int waiting = 2;
  std::vector<weftResult_t> got(waiting, weftSuccess);
  std::vector<std::string> said(waiting);
  const auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 10.0 &&
         (got[0] == weftSuccess || got[1] == weftSuccess)) {
    for (int r = 0; r < waiting; r++)
      if (got[r] == weftSuccess) {
        weftCommGetAsyncError(rp->comms[r], &got[r]);
        if (got[r] != weftSuccess) said[r] = weftGetLastError(rp->comms[r]);
      }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (int r = 0; r < waiting; r++) {
    printf("  rank %d: %d %s\n", r, (int)got[r], said[r].c_str());
    EXPECT_NE(got[r], weftSuccess) << "rank " << r;
    EXPECT_NE(said[r].find("AllReduce #2 (4096 float32 sum)"), std::string::npos) << said[r];
    EXPECT_NE(said[r].find("rank 2 never called it (its last: AllReduce #1, completed"),
              std::string::npos)
        << said[r];
  }
  weftResult_t idle = weftSuccess;
  weftCommGetAsyncError(ranks.comms[2], &idle);
  EXPECT_EQ(idle, weftSuccess) << "the rank that skipped it waits on nothing";
  for (int r = 0; r < k; r++) cudaFree(buf[r]);
}

}  // namespace
