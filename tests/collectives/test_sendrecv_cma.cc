// Single-copy sends and receives (collectives/algo/sendrecv_cma.c) over forked
// ranks: all-to-all with uneven splits (empty blocks, odd sizes) and even
// ones, every datatype, 2 to 5 ranks, over shared memory (receivers copy from
// the senders' buffers: counted) and over sockets (through the FIFOs: never
// copied); sizes that differ between sender and receiver fail on both ranks
// with nothing written; a sender that may not be read falls back to the FIFO;
// lone sends offered while their receiver comes, taken back otherwise.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "coll_ref.h"
#include "harness.h"
extern "C" {
#include "collectives/algo/sendrecv_cma.h"
#include "collectives/core/comm.h"
#include "collectives/core/mem.h"
}

using namespace weft_test;

namespace {

const uint8_t kPoison = 0xa5;
const size_t kGuard = 64;                 // poisoned bytes after each output
const size_t kMinNbytes = 4096;           // WEFT_P2P_CMA_MIN_NBYTES in these tests
const size_t kFifoNbytes = 4 * 4096;      // WEFT_NSLOTS x WEFT_SLOT_BYTES

RunOptions options(const char *transport) {
  RunOptions o;
  o.timeout_s = 300;
  o.env = {{"WEFT_SLOT_BYTES", "4096"}, {"WEFT_NSLOTS", "4"}, {"WEFT_TIMEOUT", "60"},
           {"WEFT_P2P_CMA_MIN_NBYTES", std::to_string(kMinNbytes)}};
  if (transport != nullptr) o.env.push_back({"WEFT_TRANSPORT", transport});
  return o;
}

struct Counts {
  uint64_t sent = 0, received = 0;
};

Counts counts(weftComm_t comm) {
  Counts c;
  sendrecv_cma_counts((const weftComm *)comm, &c.sent, &c.received);
  return c;
}

// Elements rank `from` sends rank `to` in round `round`: the same on every
// rank. Empty blocks, single elements, odd sizes around the threshold, and
// blocks larger than the FIFO.
size_t split(uint64_t seed, int round, int from, int to, size_t esize) {
  Rng rng(seed * 7919u + (uint64_t)round * 104729u + (uint64_t)from * 131u + (uint64_t)to);
  const size_t bytes[] = {0, 0, 1, 77, kMinNbytes - 1, kMinNbytes, 9001, kFifoNbytes + 333, 70001};
  const size_t n = bytes[rng.next() % (sizeof bytes / sizeof bytes[0])];
  return (n + esize - 1) / esize; // at least one element where any bytes
}

// Whether a block of nbytes is copied single-copy over shared memory: 1
// always (larger than the FIFO), 2 where its receiver takes the offer before
// the sender takes it back (it fits the FIFO), 0 never.
int copied(size_t nbytes) {
  if (nbytes == 0 || nbytes < kMinNbytes) return 0;
  return nbytes > kFifoNbytes ? 1 : 2;
}

// One all-to-all with uneven splits as a group of sends and receives (empty
// blocks skipped on both sides, as torch_weft does), into a poisoned output:
// checks every block, the guard, the untouched input, and how many blocks
// were copied single-copy (none with single_copy false).
int alltoallv_check(const RankCtx &ctx, weftComm_t comm, weftDataType_t t, int round,
                    uint64_t seed, bool single_copy) {
  const int n = ctx.nranks, me = ctx.rank;
  const size_t es = weftTypeSize(t);
  std::vector<size_t> send_off(n + 1, 0), recv_off(n + 1, 0);
  for (int p = 0; p < n; p++) {
    send_off[p + 1] = send_off[p] + split(seed, round, me, p, es) * es;
    recv_off[p + 1] = recv_off[p] + split(seed, round, p, me, es) * es;
  }
  std::vector<std::vector<uint8_t>> inputs;  // every rank's whole send buffer
  for (int r = 0; r < n; r++) {
    size_t total = 0;
    for (int p = 0; p < n; p++) total += split(seed, round, r, p, es) * es;
    inputs.push_back(make_input(t, weftSum, total / es, seed + (uint64_t)round, r));
  }
  const std::vector<uint8_t> input = inputs[me];
  std::vector<uint8_t> out(recv_off[n] + kGuard, kPoison);
  const Counts before = counts(comm);
  size_t want_sent = 0, want_received = 0, may_sent = 0, may_received = 0;
  FAIL_IF(weftGroupStart() != weftSuccess, "group start");
  for (int p = 0; p < n; p++) {
    const size_t sn = send_off[p + 1] - send_off[p], rn = recv_off[p + 1] - recv_off[p];
    if (sn > 0)
      FAIL_IF(weftSend(inputs[me].data() + send_off[p], sn / es, t, p, comm, nullptr) != weftSuccess,
              "send: %s", weftGetLastError(comm));
    if (rn > 0)
      FAIL_IF(weftRecv(out.data() + recv_off[p], rn / es, t, p, comm, nullptr) != weftSuccess,
              "recv: %s", weftGetLastError(comm));
    want_sent += p != me && copied(sn) == 1;
    want_received += p != me && copied(rn) == 1;
    may_sent += p != me && copied(sn) == 2;
    may_received += p != me && copied(rn) == 2;
  }
  FAIL_IF(weftGroupEnd() != weftSuccess, "%s round %d: %s", type_name(t), round,
          weftGetLastError(comm));
  for (int p = 0; p < n; p++) {
    size_t from = 0;  // where p's block for this rank starts in p's buffer
    for (int q = 0; q < me; q++) from += split(seed, round, p, q, es) * es;
    FAIL_IF(memcmp(out.data() + recv_off[p], inputs[p].data() + from, recv_off[p + 1] - recv_off[p]) != 0,
            "%s round %d: block from rank %d (%zu bytes) wrong", type_name(t), round, p,
            recv_off[p + 1] - recv_off[p]);
  }
  for (size_t i = recv_off[n]; i < out.size(); i++)
    FAIL_IF(out[i] != kPoison, "%s round %d: guard byte %zu written", type_name(t), round, i);
  FAIL_IF(inputs[me] != input, "%s round %d: the input changed", type_name(t), round);
  const Counts after = counts(comm);
  if (!single_copy) want_sent = want_received = may_sent = may_received = 0;
  const uint64_t sent = after.sent - before.sent, received = after.received - before.received;
  FAIL_IF(sent < want_sent || sent > want_sent + may_sent || received < want_received ||
              received > want_received + may_received,
          "%s round %d: %llu sends and %llu receives copied single-copy, want %zu (+%zu) and "
          "%zu (+%zu)",
          type_name(t), round, (unsigned long long)sent, (unsigned long long)received, want_sent,
          may_sent, want_received, may_received);
  return 0;
}

// weftAlltoAll with blocks of count elements, the input in a
// weftMemAllocHost buffer (peers map it) where mapped: every block right, the
// guard untouched, and n-1 blocks each way copied where single_copy.
int alltoall_check(const RankCtx &ctx, weftComm_t comm, weftDataType_t t, size_t count,
                   uint64_t seed, bool single_copy, bool mapped) {
  const int n = ctx.nranks, me = ctx.rank;
  const size_t block = count * weftTypeSize(t);
  std::vector<std::vector<uint8_t>> inputs;
  for (int r = 0; r < n; r++) inputs.push_back(make_input(t, weftSum, count * n, seed, r));
  std::vector<uint8_t> out(block * n + kGuard, kPoison);
  void *send = inputs[me].data();
  FAIL_IF(mapped && weftMemAllocHost(&send, block * n) != weftSuccess, "weftMemAllocHost");
  if (mapped) memcpy(send, inputs[me].data(), block * n);
  const Counts before = counts(comm);
  weftResult_t res = weftAlltoAll(send, out.data(), count, t, comm, nullptr);
  if (mapped) weftMemFree(send);
  FAIL_IF(res != weftSuccess, "alltoall: %s", weftGetLastError(comm));
  for (int p = 0; p < n; p++)
    FAIL_IF(memcmp(out.data() + p * block, inputs[p].data() + me * block, block) != 0,
            "alltoall %s: block from rank %d wrong", type_name(t), p);
  for (size_t i = block * n; i < out.size(); i++)
    FAIL_IF(out[i] != kPoison, "alltoall %s: guard byte %zu written", type_name(t), i);
  const Counts after = counts(comm);
  const uint64_t want = single_copy && copied(block) == 1 ? (uint64_t)(n - 1) : 0;
  FAIL_IF(after.sent - before.sent != want || after.received - before.received != want,
          "alltoall %s: %llu/%llu blocks copied single-copy, want %llu", type_name(t),
          (unsigned long long)(after.sent - before.sent),
          (unsigned long long)(after.received - before.received), (unsigned long long)want);
  return 0;
}

struct Case {
  int nranks;
  const char *transport;  // nullptr: shared memory, single-copy
  bool stream = false;    // WEFT_CMA_STREAM_NBYTES=1: every group's copies bypass the caches
  bool withdraw = false;  // WEFT_P2P_CMA_PAIRED_WITHDRAW_NS=1: paired offers that fit the FIFO
                          // are taken back as the receivers take them
};

class SendrecvCma : public testing::TestWithParam<Case> {};

TEST_P(SendrecvCma, AllToAllEveryTypeEvenAndUneven) {
  const Case c = GetParam();
  const uint64_t seed = test_seed();
  auto status = run_ranks(c.nranks, [&](const RankCtx &ctx) {
    weftComm_t comm;
    if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
      return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
    const bool single_copy = c.transport == nullptr;
    for (int t = 0; t < weftNumTypes; t++) {
      const weftDataType_t dt = (weftDataType_t)t;
      for (int round = 0; round < 2; round++)
        TRY_RC(alltoallv_check(ctx, comm, dt, round, seed + (uint64_t)t, single_copy));
      const size_t count = (kFifoNbytes + 1000) / weftTypeSize(dt) + (size_t)t;  // odd sizes
      TRY_RC(alltoall_check(ctx, comm, dt, count, seed + 100 + (uint64_t)t, single_copy, false));
    }
    // inputs peers map (weftMemAllocHost, from 64 KiB): copied with memcpy,
    // or streaming stores where the group's receives exceed the caches
    const size_t count = kMemSharedMinNbytes / 4 / (size_t)ctx.nranks + 4099;
    TRY_RC(alltoall_check(ctx, comm, weftFloat32, count, seed + 200, single_copy, true));
    FAIL_IF(single_copy != (mem_peer_map_count((weftComm *)comm) > 0),
            "%d of the peers' buffers mapped", mem_peer_map_count((weftComm *)comm));
    weftCommDestroy(comm);
    return 0;
  }, [&] {
    RunOptions o = options(c.transport);
    if (c.stream) o.env.push_back({"WEFT_CMA_STREAM_NBYTES", "1"});
    if (c.withdraw) o.env.push_back({"WEFT_P2P_CMA_PAIRED_WITHDRAW_NS", "1"});
    return o;
  }());
  for (int r = 0; r < c.nranks; r++) EXPECT_EQ(status[r], 0) << c.nranks << " ranks, rank " << r;
}

INSTANTIATE_TEST_SUITE_P(Transports, SendrecvCma,
                         testing::Values(Case{2, nullptr}, Case{3, nullptr}, Case{4, nullptr},
                                         Case{5, nullptr}, Case{3, "socket"},
                                         Case{2, nullptr, true}, Case{3, nullptr, true},
                                         Case{2, nullptr, false, true},
                                         Case{4, nullptr, false, true}),
                         [](const testing::TestParamInfo<Case> &info) {
                           return std::to_string(info.param.nranks) + "ranks_" +
                                  (info.param.transport ? info.param.transport : "shm") +
                                  (info.param.stream ? "_stream" : "") +
                                  (info.param.withdraw ? "_withdraw" : "");
                         });

// --- sizes that differ, and senders that may not be read -------------------

const size_t kMismatchCount = 30000;  // floats each rank sends: more than the FIFO holds

// Rank 0 sends kMismatchCount floats to rank 1 and rank 1 as many back, in
// one group each (paired: single-copy where allowed); rank 1 expects
// recv_count. Returns 0 or a failure code; sets *res and *msg to how the
// group ended.
int mismatch_exchange(const RankCtx &ctx, weftComm_t comm, size_t recv_count,
                      std::vector<float> *got, weftResult_t *res, std::string *msg) {
  const int peer = 1 - ctx.rank;
  std::vector<float> mine(kMismatchCount);
  for (size_t i = 0; i < mine.size(); i++) mine[i] = (float)(i * 3 + (size_t)ctx.rank);
  const size_t want = ctx.rank == 1 ? recv_count : kMismatchCount;
  got->assign(want + kGuard, -1.0f);
  FAIL_IF(weftGroupStart() != weftSuccess, "group start");
  FAIL_IF(weftSend(mine.data(), kMismatchCount, weftFloat32, peer, comm, nullptr) != weftSuccess, "send");
  FAIL_IF(weftRecv(got->data(), want, weftFloat32, peer, comm, nullptr) != weftSuccess, "recv");
  *res = weftGroupEnd();
  *msg = weftGetLastError(comm);
  return 0;
}

// A receive of another size than the send: single-copy, both ranks fail with
// weftInvalidUsage naming the other, at once, and the receiver's buffer is
// untouched; through the FIFO the receiver fails so, and the sender fails in
// the same call or its next one, also without waiting for the timeout (rank 1
// lingers before it aborts, so rank 0 learns it from the poisoned
// connections, not from the abort).
TEST(SendrecvCmaMismatch, FailsOnBothRanksNothingWritten) {
  for (bool single_copy : {true, false}) {
    for (size_t recv_count : {10000, 50000}) {
      RunOptions opts = options(nullptr);
      opts.env.push_back({"WEFT_TIMEOUT", "60"});
      if (!single_copy) opts.env.push_back({"WEFT_P2P_CMA_MIN_NBYTES", "1G"});
      const double start = now_s();
      auto status = run_ranks(2, [&](const RankCtx &ctx) {
        weftComm_t comm;
        if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
          return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
        std::vector<float> got;
        weftResult_t res = weftSuccess;
        std::string msg;
        const double call = now_s();
        TRY_RC(mismatch_exchange(ctx, comm, recv_count, &got, &res, &msg));
        const char *other = ctx.rank == 0 ? "rank 1" : "rank 0";
        if (ctx.rank == 1 || single_copy) {
          FAIL_IF(res != weftInvalidUsage || msg.find(other) == std::string::npos,
                  "recv count %zu: got %s: %s", recv_count, weftGetErrorString(res), msg.c_str());
          FAIL_IF(msg.find(std::to_string(recv_count * 4)) == std::string::npos ||
                      (single_copy && msg.find(std::to_string(kMismatchCount * 4)) == std::string::npos),
                  "recv count %zu: the message names the wrong sizes: %s", recv_count, msg.c_str());
        } else if (res == weftSuccess) {  // its send went before rank 1 found it
          float x = 1.0f;
          res = weftAllReduce(&x, &x, 1, weftFloat32, weftSum, comm, nullptr);
          FAIL_IF(res == weftSuccess, "recv count %zu: the sender never learnt of it", recv_count);
        }
        FAIL_IF(ctx.rank == 0 && now_s() - call > 5.0, "recv count %zu: rank 0 took %.1f s to "
                "learn of it", recv_count, now_s() - call);
        for (size_t i = 0; ctx.rank == 1 && single_copy && i < got.size(); i++)
          FAIL_IF(got[i] != -1.0f, "recv count %zu: element %zu written", recv_count, i);
        if (ctx.rank == 1 && !single_copy) usleep(6000000);
        weftCommAbort(comm);
        return 0;
      }, opts);
      EXPECT_EQ(status[0], 0) << "single-copy " << single_copy << ", recv count " << recv_count;
      EXPECT_EQ(status[1], 0) << "single-copy " << single_copy << ", recv count " << recv_count;
      EXPECT_LT(now_s() - start, 30.0) << "a mismatch should not wait for the timeout";
    }
  }
}

// A sender that failed (its receiver past WEFT_TIMEOUT) and freed its buffer:
// the late receiver finds the offer void, fails with weftRemoteError (not
// the copy's "Bad address") and leaves its buffer as it was.
TEST(SendrecvCmaLone, OfferOfASenderThatFailedIsVoid) {
  RunOptions opts = options(nullptr);
  opts.env.push_back({"WEFT_TIMEOUT", "1"});
  opts.allow_warnings = true;
  const size_t nbytes = 64 * kFifoNbytes;  // offered for good: it does not fit the FIFO
  auto status = run_ranks(2, [&](const RankCtx &ctx) {
    weftComm_t comm;
    if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
      return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
    uint8_t x = 0;  // connected both ways, so that the send offers at once
    if (ctx.rank == 0) {
      FAIL_IF(weftSend(&x, 1, weftUint8, 1, comm, nullptr) != weftSuccess ||
                  weftRecv(&x, 1, weftUint8, 1, comm, nullptr) != weftSuccess,
              "warm-up: %s", weftGetLastError(comm));
      void *buf = mmap(nullptr, nbytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      FAIL_IF(buf == MAP_FAILED, "mmap");
      memset(buf, 0x11, nbytes);
      weftResult_t res = weftSend(buf, nbytes, weftUint8, 1, comm, nullptr);
      FAIL_IF(res == weftSuccess, "the send completed without its receiver");
      munmap(buf, nbytes);
      usleep(3000000);  // alive while rank 1 receives: its reads find no mapping
    } else {
      FAIL_IF(weftRecv(&x, 1, weftUint8, 0, comm, nullptr) != weftSuccess ||
                  weftSend(&x, 1, weftUint8, 0, comm, nullptr) != weftSuccess,
              "warm-up: %s", weftGetLastError(comm));
      usleep(2000000);
      std::vector<uint8_t> got(nbytes, kPoison);
      weftResult_t res = weftRecv(got.data(), nbytes, weftUint8, 0, comm, nullptr);
      std::string msg = weftGetLastError(comm);
      FAIL_IF(res != weftRemoteError, "the late receive: %s: %s", weftGetErrorString(res),
              msg.c_str());
      for (size_t i = 0; i < nbytes; i++)
        FAIL_IF(got[i] != kPoison, "byte %zu written (%#x): %s", i, got[i], msg.c_str());
    }
    weftCommAbort(comm);
    return 0;
  }, opts);
  EXPECT_EQ(status[0], 0);
  EXPECT_EQ(status[1], 0);
}

// A group offering to two peers, one of which receives another size: the
// sender's call fails with weftInvalidUsage, and the other peer, coming
// later, must not take the offer whose buffer the sender now reuses: the
// sender poisons its connections however it learnt of the mismatch (through
// the offer's answer, or through its wait seeing the receiver's poison).
TEST(SendrecvCmaMismatch, OtherOffersOfTheGroupAreVoid) {
  auto status = run_ranks(3, [&](const RankCtx &ctx) {
    weftComm_t comm;
    if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
      return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
    const size_t count = 3 * kFifoNbytes / 4;  // offered: the group receives from both peers
    std::vector<float> buf(count, 1.0f), in(count + 64, -1.0f);
    weftResult_t res;
    if (ctx.rank == 0) {
      weftGroupStart();
      for (int p : {1, 2}) {
        weftSend(buf.data(), count, weftFloat32, p, comm, nullptr);
        weftRecv(in.data(), 1, weftFloat32, p, comm, nullptr);
      }
      res = weftGroupEnd();
      FAIL_IF(res != weftInvalidUsage, "rank 0 got %s: %s", weftGetErrorString(res),
              weftGetLastError(comm));
      std::fill(buf.begin(), buf.end(), 666.0f);  // the caller reuses its buffer
    } else {
      if (ctx.rank == 2) usleep(300000);
      const size_t want = ctx.rank == 1 ? count / 2 : count;
      weftGroupStart();
      weftSend(in.data(), 1, weftFloat32, 0, comm, nullptr);
      weftRecv(in.data(), want, weftFloat32, 0, comm, nullptr);
      res = weftGroupEnd();
      FAIL_IF(ctx.rank == 1 && res != weftInvalidUsage, "rank 1 got %s",
              weftGetErrorString(res));
      for (size_t i = 0; ctx.rank == 2 && res == weftSuccess && i < count; i++)
        FAIL_IF(in[i] != 1.0f, "rank 2 succeeded with element %zu = %g", i, (double)in[i]);
    }
    usleep(500000);  // every rank's call is over before any aborts
    weftCommAbort(comm);
    return 0;
  }, options(nullptr));
  for (int r = 0; r < 3; r++) EXPECT_EQ(status[r], 0) << "rank " << r;
}

// A rank that may not be read (not dumpable, readers without CAP_SYS_PTRACE):
// its offers are refused, its messages go through the FIFO and it offers no
// more; the results are right.
TEST(SendrecvCmaFallback, UnreadableSenderUsesTheFifo) {
  const uint64_t seed = test_seed();
  auto status = run_ranks(3, [&](const RankCtx &ctx) {
    drop_ptrace_capability();
    if (ctx.rank == 1) prctl(PR_SET_DUMPABLE, 0);
    weftComm_t comm;
    if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
      return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
    for (int i = 0; i < 3; i++) {
      const size_t count = kFifoNbytes / 4 + 1001 + (size_t)i;
      const int n = ctx.nranks, me = ctx.rank;
      std::vector<std::vector<uint8_t>> inputs;
      for (int r = 0; r < n; r++) inputs.push_back(make_input(weftInt32, weftSum, count * n, seed + i, r));
      std::vector<uint8_t> out(count * 4 * n, kPoison);
      FAIL_IF(weftAlltoAll(inputs[me].data(), out.data(), count, weftInt32, comm, nullptr) != weftSuccess,
              "alltoall: %s", weftGetLastError(comm));
      for (int p = 0; p < n; p++)
        FAIL_IF(memcmp(out.data() + p * count * 4, inputs[p].data() + me * count * 4, count * 4) != 0,
                "alltoall %d: block from rank %d wrong", i, p);
    }
    const Counts c = counts(comm);
    FAIL_IF(ctx.rank == 1 && c.sent != 0, "rank 1's sends were copied %llu times",
            (unsigned long long)c.sent);
    weftCommDestroy(comm);
    return 0;
  }, options(nullptr));
  for (int r = 0; r < 3; r++) EXPECT_EQ(status[r], 0) << "rank " << r;
}

// Two ranks' communicator, connected (connections are made with both ends
// calling: a group exchange of a byte).
int init_pair(const RankCtx &ctx, weftComm_t *comm_out) {
  if (weftCommInitRank(comm_out, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
    return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
  weftComm_t comm = *comm_out;
  const int peer = 1 - ctx.rank;
  uint8_t out = 1, in = 0;
  weftGroupStart();
  weftSend(&out, 1, weftUint8, peer, comm, nullptr);
  weftRecv(&in, 1, weftUint8, peer, comm, nullptr);
  FAIL_IF(weftGroupEnd() != weftSuccess, "warm: %s", weftGetLastError(comm));
  return 0;
}

// A lone blocking send that fits the FIFO, its receiver already waiting: the
// receiver copies it from the sender's buffer (offered, and not taken back
// within WEFT_P2P_CMA_WITHDRAW_NS, here 10 s), every time, bytes right.
TEST(SendrecvCmaLone, WaitingReceiverCopiesSingleCopy) {
  const uint64_t seed = test_seed();
  RunOptions opts = options(nullptr);
  opts.env.push_back({"WEFT_P2P_CMA_WITHDRAW_NS", "10000000000"});
  auto status = run_ranks(2, [&](const RankCtx &ctx) {
    weftComm_t comm;
    TRY_RC(init_pair(ctx, &comm));
    const Counts before = counts(comm);
    const int kRounds = 20;
    for (int i = 0; i < kRounds; i++) {
      // whole slots (4 KiB here: 1 to 4 of them, the FIFO's) and between
      const size_t nbytes = i % 3 == 0 ? 4096 * (size_t)(1 + i % 4)
                                       : kMinNbytes + 200 + (size_t)(1000 * i) % 3000;
      const std::vector<uint8_t> want = make_input(weftUint8, weftSum, nbytes, seed + i, 0);
      if (ctx.rank == 0) {
        if (i == 0) usleep(50000);  // the receiver waits first
        FAIL_IF(weftSend(want.data(), nbytes, weftUint8, 1, comm, nullptr) != weftSuccess,
                "send %d: %s", i, weftGetLastError(comm));
      } else {
        std::vector<uint8_t> got(nbytes + kGuard, kPoison);
        FAIL_IF(weftRecv(got.data(), nbytes, weftUint8, 0, comm, nullptr) != weftSuccess,
                "recv %d: %s", i, weftGetLastError(comm));
        FAIL_IF(memcmp(got.data(), want.data(), nbytes) != 0 || got[nbytes] != kPoison,
                "recv %d of %zu bytes: wrong", i, nbytes);
      }
      uint8_t ack = 0;  // the next send finds its receiver waiting
      if (ctx.rank == 1) weftSend(&ack, 1, weftUint8, 0, comm, nullptr);
      else weftRecv(&ack, 1, weftUint8, 1, comm, nullptr);
    }
    const Counts after = counts(comm);
    FAIL_IF(ctx.rank == 0 && after.sent - before.sent != kRounds, "%llu of %d sends copied",
            (unsigned long long)(after.sent - before.sent), kRounds);
    FAIL_IF(ctx.rank == 1 && after.received - before.received != kRounds,
            "%llu of %d receives copied", (unsigned long long)(after.received - before.received),
            kRounds);
    weftCommDestroy(comm);
    return 0;
  }, opts);
  EXPECT_EQ(status[0], 0);
  EXPECT_EQ(status[1], 0);
}

// A lone blocking send whose receiver comes late completes on its own (the
// offer taken back, the message through the FIFO), as it did before offers;
// both ranks sending first, then receiving, complete for every size up to
// the FIFO's, and for several sends that fill the FIFO together.
TEST(SendrecvCmaLone, SendCompletesBeforeItsReceiver) {
  const uint64_t seed = test_seed();
  auto status = run_ranks(2, [&](const RankCtx &ctx) {
    weftComm_t comm;
    TRY_RC(init_pair(ctx, &comm));
    const int peer = 1 - ctx.rank;
    const size_t late_nbytes = 10000;
    const std::vector<uint8_t> want = make_input(weftUint8, weftSum, late_nbytes, seed, 0);
    if (ctx.rank == 0) {
      const double t0 = now_s();
      FAIL_IF(weftSend(want.data(), late_nbytes, weftUint8, 1, comm, nullptr) != weftSuccess,
              "send: %s", weftGetLastError(comm));
      FAIL_IF(now_s() - t0 > 0.2, "the send waited %.3f s for its receiver", now_s() - t0);
    } else {
      usleep(300000);
      std::vector<uint8_t> got(late_nbytes + kGuard, kPoison);
      FAIL_IF(weftRecv(got.data(), late_nbytes, weftUint8, 0, comm, nullptr) != weftSuccess,
              "recv: %s", weftGetLastError(comm));
      FAIL_IF(memcmp(got.data(), want.data(), late_nbytes) != 0 || got[late_nbytes] != kPoison,
              "the late receive's bytes are wrong");
    }
    // several sends queued before the receives, as many slots as the FIFO has:
    // an offer taken back leaves the later sends the room they had
    for (const std::vector<size_t> &sizes :
         std::vector<std::vector<size_t>>{{4296, 4296}, {8000, 100, 100}, {4296, 5000},
                                          {4096, 4096, 4096, 4096}}) {
      std::vector<std::vector<uint8_t>> got;
      for (size_t i = 0; i < sizes.size(); i++) {
        const std::vector<uint8_t> out =
            make_input(weftUint8, weftSum, sizes[i], seed + sizes[i] + i, ctx.rank);
        FAIL_IF(weftSend(out.data(), sizes[i], weftUint8, peer, comm, nullptr) != weftSuccess,
                "queued send of %zu: %s", sizes[i], weftGetLastError(comm));
      }
      for (size_t i = 0; i < sizes.size(); i++) {
        std::vector<uint8_t> in(sizes[i] + kGuard, kPoison);
        FAIL_IF(weftRecv(in.data(), sizes[i], weftUint8, peer, comm, nullptr) != weftSuccess,
                "queued recv of %zu: %s", sizes[i], weftGetLastError(comm));
        const std::vector<uint8_t> want_in =
            make_input(weftUint8, weftSum, sizes[i], seed + sizes[i] + i, peer);
        FAIL_IF(memcmp(in.data(), want_in.data(), sizes[i]) != 0 || in[sizes[i]] != kPoison,
                "queued recv of %zu: wrong bytes", sizes[i]);
      }
    }
    for (size_t nbytes : {kMinNbytes, (size_t)10000, 3 * (size_t)4096, 3 * (size_t)4096 + 1,
                          kFifoNbytes}) {
      const std::vector<uint8_t> out = make_input(weftUint8, weftSum, nbytes, seed + nbytes, ctx.rank);
      const std::vector<uint8_t> in_want = make_input(weftUint8, weftSum, nbytes, seed + nbytes, peer);
      std::vector<uint8_t> in(nbytes + kGuard, kPoison);
      FAIL_IF(weftSend(out.data(), nbytes, weftUint8, peer, comm, nullptr) != weftSuccess,
              "send of %zu: %s", nbytes, weftGetLastError(comm));
      FAIL_IF(weftRecv(in.data(), nbytes, weftUint8, peer, comm, nullptr) != weftSuccess,
              "recv of %zu: %s", nbytes, weftGetLastError(comm));
      FAIL_IF(memcmp(in.data(), in_want.data(), nbytes) != 0 || in[nbytes] != kPoison,
              "recv of %zu: wrong bytes", nbytes);
    }
    weftCommDestroy(comm);
    return 0;
  }, options(nullptr));
  EXPECT_EQ(status[0], 0);
  EXPECT_EQ(status[1], 0);
}

// The sender taking its offer back while the receiver takes it: with
// WEFT_P2P_CMA_WITHDRAW_NS at 1 ns and at 2 us the two meet often; each
// message arrives once, right, whichever wins.
TEST(SendrecvCmaLone, WithdrawRacesTheReceiver) {
  const uint64_t seed = test_seed();
  for (const char *ns : {"1", "2000"}) {
    RunOptions opts = options(nullptr);
    opts.env.push_back({"WEFT_P2P_CMA_WITHDRAW_NS", ns});
    auto status = run_ranks(2, [&](const RankCtx &ctx) {
      weftComm_t comm;
      TRY_RC(init_pair(ctx, &comm));
      const int peer = 1 - ctx.rank;
      for (int i = 0; i < 300; i++) {
        const size_t nbytes = i % 5 == 0 ? 4096 * (size_t)(1 + i % 4)  // whole slots too
                                         : kMinNbytes + (size_t)(i * 37) % 8000;
        const int from = i % 2;  // a ping-pong: each rank sends every other round
        const std::vector<uint8_t> want = make_input(weftUint8, weftSum, nbytes, seed + i, from);
        if (ctx.rank == from) {
          FAIL_IF(weftSend(want.data(), nbytes, weftUint8, peer, comm, nullptr) != weftSuccess,
                  "send %d: %s", i, weftGetLastError(comm));
        } else {
          std::vector<uint8_t> got(nbytes + kGuard, kPoison);
          FAIL_IF(weftRecv(got.data(), nbytes, weftUint8, peer, comm, nullptr) != weftSuccess,
                  "recv %d: %s", i, weftGetLastError(comm));
          FAIL_IF(memcmp(got.data(), want.data(), nbytes) != 0 || got[nbytes] != kPoison,
                  "recv %d of %zu bytes: wrong", i, nbytes);
        }
      }
      const Counts c = counts(comm);
      fprintf(stderr, "rank %d, withdraw after %s ns: %llu of 150 sends copied\n", ctx.rank, ns,
              (unsigned long long)c.sent);
      weftCommDestroy(comm);
      return 0;
    }, opts);
    EXPECT_EQ(status[0], 0) << ns;
    EXPECT_EQ(status[1], 0) << ns;
  }
}

// Sends paired with a receive from their peer, whose peer receives them only
// after a message that needs the sender past its group: rank 0 sends rank 1
// a lone message (pre, where any), then in a group the messages of sizes and
// a receive of a byte from rank 1, then sends rank 2 a byte; rank 1 sends its
// byte, receives one from rank 2, then the messages; rank 2 passes rank 0's
// byte on to rank 1. The messages fit the FIFO together, so through it rank
// 0's group completes alone; an offer for good waited for rank 1, which
// waited for rank 2, which waited for rank 0. The offers are taken back
// (none copied), and then take the slots the FIFO would: several in one
// group, after a lone send, whole slots, near the FIFO's size.
int paired_chain(const RankCtx &ctx, weftComm_t comm, const std::vector<size_t> &sizes,
                 size_t pre, uint64_t seed) {
  std::vector<std::vector<uint8_t>> bigs;
  for (size_t k = 0; k < sizes.size(); k++)
    bigs.push_back(make_input(weftUint8, weftSum, sizes[k], seed + k, 0));
  const std::vector<uint8_t> pre_msg = make_input(weftUint8, weftSum, pre + 1, seed + 99, 0);
  uint8_t byte = (uint8_t)(seed % 251), got_byte = 0;
  const Counts before = counts(comm);
  if (ctx.rank == 0) {
    if (pre > 0)
      FAIL_IF(weftSend(pre_msg.data(), pre, weftUint8, 1, comm, nullptr) != weftSuccess,
              "lone send: %s", weftGetLastError(comm));
    FAIL_IF(weftGroupStart() != weftSuccess, "group start");
    for (const std::vector<uint8_t> &b : bigs)
      FAIL_IF(weftSend(b.data(), b.size(), weftUint8, 1, comm, nullptr) != weftSuccess, "send");
    FAIL_IF(weftRecv(&got_byte, 1, weftUint8, 1, comm, nullptr) != weftSuccess, "recv");
    FAIL_IF(weftGroupEnd() != weftSuccess, "group: %s", weftGetLastError(comm));
    FAIL_IF(got_byte != byte, "the byte from rank 1: %#x", got_byte);
    FAIL_IF(weftSend(&byte, 1, weftUint8, 2, comm, nullptr) != weftSuccess, "send to rank 2: %s",
            weftGetLastError(comm));
  } else if (ctx.rank == 1) {
    FAIL_IF(weftSend(&byte, 1, weftUint8, 0, comm, nullptr) != weftSuccess, "send: %s",
            weftGetLastError(comm));
    FAIL_IF(weftRecv(&got_byte, 1, weftUint8, 2, comm, nullptr) != weftSuccess,
            "recv from rank 2: %s", weftGetLastError(comm));
    FAIL_IF(got_byte != byte, "the byte from rank 2: %#x", got_byte);
    std::vector<uint8_t> got(pre + kGuard, kPoison);
    if (pre > 0)
      FAIL_IF(weftRecv(got.data(), pre, weftUint8, 0, comm, nullptr) != weftSuccess ||
                  memcmp(got.data(), pre_msg.data(), pre) != 0 || got[pre] != kPoison,
              "the lone message of %zu bytes: %s", pre, weftGetLastError(comm));
    for (const std::vector<uint8_t> &b : bigs) {
      got.assign(b.size() + kGuard, kPoison);
      FAIL_IF(weftRecv(got.data(), b.size(), weftUint8, 0, comm, nullptr) != weftSuccess,
              "recv of %zu: %s", b.size(), weftGetLastError(comm));
      FAIL_IF(memcmp(got.data(), b.data(), b.size()) != 0 || got[b.size()] != kPoison,
              "recv of %zu: wrong bytes", b.size());
    }
  } else {
    FAIL_IF(weftRecv(&got_byte, 1, weftUint8, 0, comm, nullptr) != weftSuccess,
            "recv from rank 0: %s", weftGetLastError(comm));
    FAIL_IF(weftSend(&got_byte, 1, weftUint8, 1, comm, nullptr) != weftSuccess,
            "send to rank 1: %s", weftGetLastError(comm));
  }
  const Counts after = counts(comm);
  FAIL_IF(after.sent != before.sent || after.received != before.received,
          "copied single-copy: the receiver was not there");
  return 0;
}

TEST(SendrecvCmaPaired, PeerThatReceivesAfterAChainGetsIt) {
  const uint64_t seed = test_seed();
  RunOptions opts = options(nullptr);
  opts.env.push_back({"WEFT_TIMEOUT", "10"});  // the last one set wins
  struct Chain {
    std::vector<size_t> sizes;
    size_t pre;
  };
  const std::vector<Chain> chains = {
      {{kMinNbytes}, 0},       {{kMinNbytes + 200}, 0},   {{10000}, 0},
      {{3 * 4096}, 0},         {{3 * 4096 + 1000}, 0},    {{kFifoNbytes - 84}, 0},
      {{kFifoNbytes}, 0},      {{8192, 8192}, 0},         {{4096, 4096, 4096, 4096}, 0},
      {{3 * 4096}, 100},       {{4096, 4100}, 3000}};
  auto status = run_ranks(3, [&](const RankCtx &ctx) {
    weftComm_t comm;
    if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
      return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
    uint8_t warm[3] = {1, 1, 1}, warm_in[3] = {0, 0, 0};  // every connection made
    FAIL_IF(weftGroupStart() != weftSuccess, "group start");
    for (int p = 0; p < 3; p++) {
      if (p == ctx.rank) continue;
      weftSend(&warm[p], 1, weftUint8, p, comm, nullptr);
      weftRecv(&warm_in[p], 1, weftUint8, p, comm, nullptr);
    }
    FAIL_IF(weftGroupEnd() != weftSuccess, "warm: %s", weftGetLastError(comm));
    for (size_t k = 0; k < chains.size(); k++) {
      const double t0 = now_s();
      TRY_RC(paired_chain(ctx, comm, chains[k].sizes, chains[k].pre, seed + 1000 * k));
      FAIL_IF(now_s() - t0 > 5.0, "chain %zu: %.1f s", k, now_s() - t0);
    }
    weftCommDestroy(comm);
    return 0;
  }, opts);
  for (int r = 0; r < 3; r++) EXPECT_EQ(status[r], 0) << "rank " << r;
}

// Offers one after another on one connection, each taken or taken back
// (withdrawal after 1 ns, 2 us and 200 us, lone and paired alike): 150
// seeded rounds of 1-4 messages from rank 0, alone or in a group, of sizes
// around the slot and the FIFO, header-sized among them, received after a
// random wait, with an all-reduce on the same connections every third
// round. The control block holds one offer at a time; every message arrives
// once, right, guard intact.
TEST(SendrecvCmaLone, BackToBackOffersOnOneConnection) {
  const uint64_t seed = test_seed();
  const size_t sizes[] = {100,   4097,        4100,        5000, 8192, 3 * 4096,
                          12289, kFifoNbytes, kFifoNbytes + 1,   3 * kFifoNbytes + 7};
  for (const char *ns : {"1", "2000", "200000"}) {
    RunOptions opts = options(nullptr);
    opts.env.push_back({"WEFT_P2P_CMA_WITHDRAW_NS", ns});
    opts.env.push_back({"WEFT_P2P_CMA_PAIRED_WITHDRAW_NS", ns});
    auto status = run_ranks(2, [&](const RankCtx &ctx) {
      weftComm_t comm;
      TRY_RC(init_pair(ctx, &comm));
      Rng rng(seed);  // the same draws on both ranks
      for (int round = 0; round < 150; round++) {
        const int nmsg = 1 + (int)(rng.next() % 4);
        const bool group = rng.next() % 2 != 0;
        const useconds_t late = (useconds_t)(rng.next() % 300);
        std::vector<std::vector<uint8_t>> msgs;
        for (int k = 0; k < nmsg; k++) {
          const size_t n = sizes[rng.next() % (sizeof sizes / sizeof sizes[0])];
          msgs.push_back(make_input(weftUint8, weftSum, n, seed + (uint64_t)(round * 8 + k), 0));
        }
        if (ctx.rank == 0) {
          if (group) FAIL_IF(weftGroupStart() != weftSuccess, "group start");
          for (const std::vector<uint8_t> &m : msgs)
            FAIL_IF(weftSend(m.data(), m.size(), weftUint8, 1, comm, nullptr) != weftSuccess,
                    "round %d: send of %zu: %s", round, m.size(), weftGetLastError(comm));
          if (group)
            FAIL_IF(weftGroupEnd() != weftSuccess, "round %d: group: %s", round,
                    weftGetLastError(comm));
        } else {
          usleep(late);
          for (const std::vector<uint8_t> &m : msgs) {
            std::vector<uint8_t> got(m.size() + kGuard, kPoison);
            FAIL_IF(weftRecv(got.data(), m.size(), weftUint8, 0, comm, nullptr) != weftSuccess,
                    "round %d: recv of %zu: %s", round, m.size(), weftGetLastError(comm));
            FAIL_IF(memcmp(got.data(), m.data(), m.size()) != 0 || got[m.size()] != kPoison,
                    "round %d: recv of %zu: wrong bytes", round, m.size());
          }
        }
        if (round % 3 == 0) {
          float one = 1.0f, sum = 0.0f;
          FAIL_IF(weftAllReduce(&one, &sum, 1, weftFloat32, weftSum, comm, nullptr) !=
                          weftSuccess ||
                      sum != 2.0f,
                  "round %d: all-reduce: %g (%s)", round, sum, weftGetLastError(comm));
        }
      }
      weftCommDestroy(comm);
      return 0;
    }, opts);
    EXPECT_EQ(status[0], 0) << ns << " ns";
    EXPECT_EQ(status[1], 0) << ns << " ns";
  }
}

}  // namespace
