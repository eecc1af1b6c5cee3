// The device point-to-point schedule (collectives/algo/sendrecv_steps.h) on the
// host: every rank count from 1 to 8, random groups of sends and receives of
// random uneven sizes in random posting order, run through real FIFOs by the
// host emulation of the kernel (sendrecv_emu.h), one thread per kernel block, and
// every received byte checked against what was sent, with nothing written
// past a message. Then the poison protocol: a rank that stops mid-stream.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <string>
#include <thread>
#include <vector>

#include "harness.h"
#include "tests/device/sendrecv_emu.h"
#include "tests/device/sendrecv_steps_dump.h"
#include "weft_build_config.h"

namespace {

using weft_test::SendrecvEmuNet;
using weft_test::Rng;

constexpr char kPoison = (char)0xA5;
constexpr size_t kGuard = 16;

// One rank's launch: its ops in posting order and their buffers.
struct RankLaunch {
  std::vector<sendrecv_op> ops;
  std::vector<std::vector<char>> bufs; // each message + kGuard poisoned bytes
  std::vector<char *> ptrs;
  int npairs = 0;
};

// The message a sends b as its m-th: bytes derived from (round, a, b, m).
char msg_byte(int round, int a, int b, int m, size_t i) {
  return (char)((i * 131 + (size_t)a * 17 + (size_t)b * 29 + (size_t)m * 7 + round * 3) % 251);
}

// Random messages between every ordered pair (self too), each rank's sends
// and receives shuffled in posting order but each pair's kept in order.
std::vector<RankLaunch> make_launches(int n, int round, Rng &rng, uint32_t slot_nbytes,
                                      size_t *total_out) {
  std::vector<RankLaunch> L(n);
  // sizes[a][b]: the messages a sends b, in order
  std::vector<std::vector<std::vector<uint64_t>>> sizes(n, std::vector<std::vector<uint64_t>>(n));
  size_t nmsgs = 0;
  for (int a = 0; a < n; a++)
    for (int b = 0; b < n; b++) {
      int m = (int)(rng.next() % 3); // 0 to 2 messages per pair
      for (int i = 0; i < m && nmsgs < (size_t)SENDRECV_MAX_OPS / 2; i++, nmsgs++) {
        uint64_t r = rng.next() % 8;
        uint64_t nb = r == 0 ? 0 : r == 1 ? 1 : rng.next() % (slot_nbytes * 7 + 3);
        sizes[a][b].push_back(nb);
      }
    }
  size_t total = 0;
  for (int r = 0; r < n; r++) {
    // the rank's queues: sends to b, receives from a; draw the posting order
    std::vector<std::pair<int, bool>> order; // (peer, send)
    for (int p = 0; p < n; p++) {
      for (size_t i = 0; i < sizes[r][p].size(); i++) order.push_back({p, true});
      for (size_t i = 0; i < sizes[p][r].size(); i++) order.push_back({p, false});
    }
    for (size_t i = order.size(); i > 1; i--) std::swap(order[i - 1], order[rng.next() % i]);
    // stable per (peer, direction): the j-th of each queue in its original order
    std::vector<int> sent(n, 0), got(n, 0);
    RankLaunch &x = L[r];
    for (auto [p, send] : order) {
      int m = send ? sent[p]++ : got[p]++;
      uint64_t nb = send ? sizes[r][p][m] : sizes[p][r][m];
      sendrecv_op op = {nb, p, (uint8_t)send, (uint8_t)(p == r), 0};
      x.ops.push_back(op);
      std::vector<char> buf(nb + kGuard, kPoison);
      if (send)
        for (size_t i = 0; i < nb; i++) buf[i] = msg_byte(round, r, p, m, i);
      x.bufs.push_back(std::move(buf));
      total += nb;
    }
    for (auto &b : x.bufs) x.ptrs.push_back(b.data());
    x.npairs = sendrecv_assign_pairs(x.ops.data(), (int)x.ops.size());
  }
  *total_out = total;
  return L;
}

// The host's part for self ops: the k-th send to self into the k-th receive.
void copy_self(RankLaunch &x) {
  for (int i = 0; i < (int)x.ops.size(); i++) {
    if (!x.ops[i].self || !x.ops[i].send) continue;
    int j = sendrecv_self_match(x.ops.data(), (int)x.ops.size(), i);
    ASSERT_GE(j, 0);
    ASSERT_EQ(x.ops[j].nbytes, x.ops[i].nbytes);
    memcpy(x.ptrs[j], x.ptrs[i], x.ops[i].nbytes);
  }
}

void check_received(const std::vector<RankLaunch> &L, int round) {
  int n = (int)L.size();
  for (int r = 0; r < n; r++) {
    std::vector<int> got(n, 0);
    for (size_t i = 0; i < L[r].ops.size(); i++) {
      const sendrecv_op &o = L[r].ops[i];
      if (o.send) continue;
      int m = got[o.peer]++;
      const std::vector<char> &b = L[r].bufs[i];
      for (size_t k = 0; k < o.nbytes; k++)
        ASSERT_EQ(b[k], msg_byte(round, o.peer, r, m, k))
            << "rank " << r << " message " << m << " from " << o.peer << " byte " << k << " of "
            << o.nbytes;
      for (size_t k = o.nbytes; k < b.size(); k++)
        ASSERT_EQ(b[k], kPoison) << "written past message " << m << " from " << o.peer;
    }
  }
}

struct Shape {
  uint32_t nslots;
  uint32_t slot_nbytes;
  int max_blocks;
};

// Runs every rank's launch, one thread per block; returns the blocks' results.
std::vector<int> run_launches(SendrecvEmuNet &net, std::vector<RankLaunch> &L, int max_blocks,
                              const std::atomic<int> *abort_flag, uint64_t timeout_ns) {
  std::vector<std::thread> threads;
  std::vector<int> results(L.size() * (size_t)max_blocks, weft_test::SENDRECV_EMU_OK);
  for (size_t r = 0; r < L.size(); r++) {
    copy_self(L[r]);
    int nblocks = sendrecv_nblocks(L[r].npairs, net.nlanes, max_blocks);
    for (int b = 0; b < nblocks; b++)
      threads.emplace_back([&, r, b, nblocks] {
        results[r * max_blocks + b] =
            weft_test::sendrecv_emu_block(net, (int)r, L[r].ops, L[r].ptrs, nblocks, b, abort_flag,
                                          timeout_ns)
                .result;
      });
  }
  for (auto &t : threads) t.join();
  return results;
}

class SendrecvSchedule : public testing::TestWithParam<int> {};

TEST_P(SendrecvSchedule, RandomGroupsMoveEveryByteInOrder) {
  const int n = GetParam();
  const Shape shapes[] = {{1, 16, 1}, {2, 64, 2}, {4, 24, 3}, {4, 64, 64}};
  for (int si = 0; si < 4; si++) {
    const Shape &s = shapes[si];
    // lanes per pair: over the rank counts 1-8, every shape meets several
    // counts and every count from 1 to SENDRECV_MAX_LANES comes up
    const int nlanes = (n + si) % SENDRECV_MAX_LANES + 1;
    SendrecvEmuNet net(n, s.nslots, s.slot_nbytes, nlanes);
    for (uint64_t seed = 0; seed < 4; seed++) {
  Rng rng(1000 + seed * 7919 + (uint64_t)n * 31 + s.slot_nbytes);
    // several launches: lanes carry on from the steps the last one reached
    for (int round = 0; round < 3; round++) {
      size_t total;
      std::vector<RankLaunch> L = make_launches(n, round, rng, s.slot_nbytes, &total);
      SCOPED_TRACE("nslots " + std::to_string(s.nslots) + " slot " +
                   std::to_string(s.slot_nbytes) + " blocks " + std::to_string(s.max_blocks) +
                   " lanes " + std::to_string(nlanes) + " round " + std::to_string(round));
      std::vector<int> res = run_launches(net, L, s.max_blocks, nullptr, 20000000000ull);
      for (int x : res) ASSERT_EQ(x, weft_test::SENDRECV_EMU_OK);
      check_received(L, round);
      if (HasFatalFailure()) return;
    }
  }
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, SendrecvSchedule, testing::Range(1, 9),
                         [](const testing::TestParamInfo<int> &i) {
                           return "k" + std::to_string(i.param);
                         });

// Both ends of a pair agree on the chunks of each lane, and the lanes cover
// the message exactly once, for every size up to a few chunks and every
// number of lanes.
TEST(SendrecvSteps, LanesCoverEachMessageOnce) {
  for (int nlanes = 1; nlanes <= SENDRECV_MAX_LANES; nlanes++)
    for (uint64_t chunk : {1ull, 7ull, 64ull})
      for (uint64_t nb = 0; nb < 10 * chunk + 3; nb++) {
        std::vector<int> seen(nb, 0);
        uint64_t chunks = 0;
        for (int l = 0; l < nlanes; l++)
          for (uint64_t k = 0; k < sendrecv_lane_nchunks(nb, chunk, l, nlanes); k++, chunks++) {
            uint64_t off, size;
            sendrecv_lane_chunk(nb, chunk, l, nlanes, k, &off, &size);
            ASSERT_GT(size, 0u);
            ASSERT_LE(off + size, nb);
            for (uint64_t i = off; i < off + size; i++) seen[i]++;
          }
        ASSERT_EQ(chunks, sendrecv_nchunks(nb, chunk));
        for (uint64_t i = 0; i < nb; i++)
          ASSERT_EQ(seen[i], 1) << nb << " bytes, byte " << i << ", " << nlanes << " lanes";
      }
}

// Pairs are numbered in order of first use; self ops get none; blocks are
// shared out among the pairs' lanes.
TEST(SendrecvSteps, PairsAndBlocks) {
  std::vector<sendrecv_op> ops = {{8, 3, 1, 0, 0}, {8, 1, 0, 0, 0}, {8, 0, 1, 1, 0},
                             {8, 3, 1, 0, 0}, {8, 3, 0, 0, 0}, {8, 0, 0, 1, 0}};
  EXPECT_EQ(sendrecv_assign_pairs(ops.data(), (int)ops.size()), 3);
  EXPECT_EQ(ops[0].pair, 0);
  EXPECT_EQ(ops[1].pair, 1);
  EXPECT_EQ(ops[3].pair, 0);
  EXPECT_EQ(ops[4].pair, 2);
  EXPECT_EQ(sendrecv_self_match(ops.data(), (int)ops.size(), 2), 5);
  EXPECT_EQ(sendrecv_nblocks(3, 2, 64), 6);
  EXPECT_EQ(sendrecv_nblocks(3, 8, 64), 24);
  EXPECT_EQ(sendrecv_nblocks(3, 8, 20), 20);
  EXPECT_EQ(sendrecv_nblocks(3, 2, 4), 4);
  EXPECT_EQ(sendrecv_nblocks(0, 2, 4), 1);
  EXPECT_EQ(sendrecv_block_of(2, 1, 8, 64), 17);
  EXPECT_EQ(sendrecv_block_of(2, 1, 8, 5), 2);
}

// Every block's order of moves, with every lane always ready: each lane's
// chunks in order, a lane's messages in posting order, every chunk of the
// launch moved by exactly one block; and nvcc's compiles (host pass; device
// pass with a GPU) give the host C compile's order, move for move.
TEST(SendrecvSteps, BlockOrderAndNvccCompileAgree) {
  for (int n : {2, 3, 5, 8})
    for (int max_blocks : {1, 2, 5, 64}) {
      // every lane count from 1 to 8 over these 16 cases
      const int nlanes = (n + max_blocks) % SENDRECV_MAX_LANES + 1;
      SCOPED_TRACE(std::to_string(n) + " ranks, " + std::to_string(max_blocks) + " blocks, " +
                   std::to_string(nlanes) + " lanes");
      Rng rng(4242 + (uint64_t)n * 13 + (uint64_t)max_blocks);
      size_t total;
      std::vector<RankLaunch> L = make_launches(n, 0, rng, 48, &total);
      for (int r = 0; r < n; r++) {
        const RankLaunch &x = L[r];
        const int nops = (int)x.ops.size();
        const int nblocks = sendrecv_nblocks(x.npairs, nlanes, max_blocks);
        uint64_t want_chunks = 0;
        for (const sendrecv_op &o : x.ops)
          want_chunks += o.self ? 0 : sendrecv_nchunks(o.nbytes, 48);
        uint64_t moved = 0;
        for (int b = 0; b < nblocks; b++) {
          std::vector<sendrecv_move> c(SENDRECV_MAX_ITEMS * 64), h(c.size()), d(c.size());
          size_t nc =
              sendrecv_steps_dump_c(x.ops.data(), nops, 48, nlanes, nblocks, b, c.data(), c.size());
          ASSERT_NE(nc, (size_t)-1) << "a block with unfinished items and none eligible";
          ASSERT_LE(nc, c.size());
          moved += nc;
          // per (op, lane): chunks 0, 1, ...; per lane: an op only after the earlier ones
          std::vector<std::vector<uint64_t>> next(nops, std::vector<uint64_t>(nlanes, 0));
          for (size_t i = 0; i < nc; i++) {
            const sendrecv_move &m = c[i];
            ASSERT_EQ(m.chunk, next[m.op][m.lane]++) << "move " << i;
            for (int e = 0; e < m.op; e++) {
              if (x.ops[e].peer != x.ops[m.op].peer || x.ops[e].send != x.ops[m.op].send ||
                  x.ops[e].self)
                continue;
              ASSERT_EQ(next[e][m.lane], sendrecv_lane_nchunks(x.ops[e].nbytes, 48, m.lane, nlanes))
                  << "op " << m.op << " overtook op " << e << " on lane " << m.lane;
            }
          }
#if WEFT_HAVE_CUDA
          size_t nh = sendrecv_steps_dump_nvcc_host(x.ops.data(), nops, 48, nlanes, nblocks, b,
                                                    h.data(), h.size());
          ASSERT_EQ(nh, nc);
          long nd = sendrecv_steps_dump_nvcc_device(x.ops.data(), nops, 48, nlanes, nblocks, b,
                                                    d.data(), d.size());
          if (nd >= 0) {
            ASSERT_EQ((size_t)nd, nc);
          }
          for (size_t i = 0; i < nc; i++) {
            ASSERT_EQ(h[i].op, c[i].op) << "nvcc host, move " << i;
            ASSERT_EQ(h[i].lane, c[i].lane);
            ASSERT_EQ(h[i].chunk, c[i].chunk);
            if (nd >= 0) {
              ASSERT_EQ(d[i].op, c[i].op) << "nvcc device, move " << i;
              ASSERT_EQ(d[i].chunk, c[i].chunk);
            }
          }
#endif
        }
        ASSERT_EQ(moved, want_chunks) << "rank " << r << " of " << n;
      }
    }
}

// A rank that stops after a few chunks: its peers' blocks give up, the ones
// waiting on it by timeout or poison, and every lane the stopped rank's
// blocks drove is poisoned, so a later launch on those lanes returns at once.
TEST(SendrecvPoison, StoppedRankPoisonsItsLanesAndLaterLaunchesReturnAtOnce) {
  const int n = 3;
  SendrecvEmuNet net(n, 2, 32);
  std::vector<RankLaunch> L(n);
  for (int r = 0; r < n; r++) {
    for (int p = 0; p < n; p++) {
      if (p == r) continue;
      L[r].ops.push_back({4096, p, 1, 0, 0});
      L[r].ops.push_back({4096, p, 0, 0, 0});
    }
    for (auto &o : L[r].ops) L[r].bufs.emplace_back(o.nbytes + kGuard, kPoison);
    for (auto &b : L[r].bufs) L[r].ptrs.push_back(b.data());
    L[r].npairs = sendrecv_assign_pairs(L[r].ops.data(), (int)L[r].ops.size());
  }
  std::atomic<int> stop_rank0{0};
  std::vector<std::thread> threads;
  std::vector<int> res(n * 8, -1);
  const uint64_t timeout = 300000000ull; // 0.3 s
  uint64_t t0 = weft_test::sendrecv_emu_now_ns();
  for (int r = 0; r < n; r++) {
    int nblocks = sendrecv_nblocks(L[r].npairs, net.nlanes, 2);
    for (int b = 0; b < nblocks; b++)
      threads.emplace_back([&, r, b, nblocks] {
        // rank 0 is aborted after its blocks moved 3 chunks each
        std::function<void(uint64_t)> hook;
        if (r == 0) hook = [&](uint64_t chunks) { if (chunks >= 3) stop_rank0 = 1; };
        res[r * 8 + b] =
            weft_test::sendrecv_emu_block(net, r, L[r].ops, L[r].ptrs, nblocks, b,
                                          r == 0 ? &stop_rank0 : nullptr, timeout, hook)
                .result;
      });
  }
  for (auto &t : threads) t.join();
  uint64_t took = weft_test::sendrecv_emu_now_ns() - t0;
  for (int b = 0; b < sendrecv_nblocks(L[0].npairs, net.nlanes, 2); b++)
    EXPECT_EQ(res[b], weft_test::SENDRECV_EMU_ABORTED);
  for (int r = 1; r < n; r++)
    for (int b = 0; b < sendrecv_nblocks(L[r].npairs, net.nlanes, 2); b++)
      EXPECT_NE(res[r * 8 + b], weft_test::SENDRECV_EMU_OK) << "rank " << r << " block " << b;
  EXPECT_LT(took, 4 * timeout) << "peers gave up late";
  // every lane touching rank 0 is poisoned, and keeps its reached steps
  for (int p = 1; p < n; p++)
    for (int l = 0; l < net.nlanes; l++) {
      EXPECT_NE(net.send_end[net.index(0, p, l)].ctrl->poison, 0u);
      EXPECT_NE(net.send_end[net.index(p, 0, l)].ctrl->poison, 0u);
    }
  // a later launch of rank 1 to rank 0 returns at once, poisoned, without
  // waiting out the timeout
  std::vector<sendrecv_op> again = {{64, 0, 1, 0, 0}};
  sendrecv_assign_pairs(again.data(), 1);
  std::vector<char> buf(64, 1);
  std::vector<char *> ptrs = {buf.data()};
  uint64_t t1 = weft_test::sendrecv_emu_now_ns();
  auto out = weft_test::sendrecv_emu_block(net, 1, again, ptrs, 1, 0, nullptr, 10 * timeout);
  uint64_t waited = weft_test::sendrecv_emu_now_ns() - t1;
  EXPECT_EQ(out.result, weft_test::SENDRECV_EMU_POISONED);
  EXPECT_EQ(out.chunks, 0u);
  EXPECT_LT(waited, timeout);
}

// A send and a receive of different sizes: the receiver's block refuses the
// first chunk it finds on each lane (its head holds the sender's size), before
// it copies anything and without waiting out the timeout, and poisons its
// lanes; nothing lands in the receive buffer. Sizes on either side of the
// other's, across chunk and lane counts, 1 to 3 lanes.
TEST(SendrecvHead, SizesThatDifferAreRefusedAtTheFirstChunk) {
  const uint32_t chunk = 32;
  const std::pair<uint64_t, uint64_t> sizes[] = {{100, 64}, {64, 100}, {1, 2}, {33, 32},
                                                 {32 * 7, 32 * 7 + 1}, {5, 32 * 9}};
  const uint64_t timeout = 2000000000ull; // 2 s: far above what a refusal takes
  for (int nlanes = 1; nlanes <= 3; nlanes++)
    for (auto [send_n, recv_n] : sizes) {
      SCOPED_TRACE("send " + std::to_string(send_n) + " recv " + std::to_string(recv_n) +
                   " lanes " + std::to_string(nlanes));
      SendrecvEmuNet net(2, 2, chunk, nlanes);
      std::vector<sendrecv_op> sops = {{send_n, 1, 1, 0, 0}}, rops = {{recv_n, 0, 0, 0, 0}};
      sendrecv_assign_pairs(sops.data(), 1);
      sendrecv_assign_pairs(rops.data(), 1);
      std::vector<char> sbuf(send_n, 7), rbuf(recv_n + kGuard, kPoison);
      std::vector<char *> sptrs = {sbuf.data()}, rptrs = {rbuf.data()};
      const int nblocks = sendrecv_nblocks(1, nlanes, 8);
      std::vector<weft_test::SendrecvEmuBlockOut> rout(nblocks), sout(nblocks);
      std::vector<std::thread> threads;
      std::atomic<int> error[2] = {{0}, {0}}; // each rank's error word
      const uint64_t t0 = weft_test::sendrecv_emu_now_ns();
      for (int b = 0; b < nblocks; b++) {
        threads.emplace_back([&, b] {
          sout[b] = weft_test::sendrecv_emu_block(net, 0, sops, sptrs, nblocks, b, nullptr,
                                                  timeout, nullptr, &error[0]);
        });
        threads.emplace_back([&, b] {
          rout[b] = weft_test::sendrecv_emu_block(net, 1, rops, rptrs, nblocks, b, nullptr,
                                                  timeout, nullptr, &error[1]);
        });
      }
      for (auto &t : threads) t.join();
      const uint64_t took = weft_test::sendrecv_emu_now_ns() - t0;
      int refused = 0, named = 0;
      for (int b = 0; b < nblocks; b++) {
        // a block with no chunk of the receive ends at once (the rank's
        // call fails by its error word, which another block set)
        EXPECT_NE(rout[b].result, weft_test::SENDRECV_EMU_TIMED_OUT) << "receiver block " << b;
        EXPECT_EQ(rout[b].chunks, 0u) << "receiver block " << b << " took a chunk";
        if (rout[b].result == weft_test::SENDRECV_EMU_MISMATCH) {
          refused++;
          // a block that stopped on another block's refusal (the rank's error
          // word) read no head of its own
          if (rout[b].their_nbytes != 0) {
            named++;
            EXPECT_EQ(rout[b].their_nbytes, send_n) << "the head names the sender's size";
          }
        }
        EXPECT_NE(sout[b].result, weft_test::SENDRECV_EMU_TIMED_OUT) << "sender block " << b;
      }
      EXPECT_GE(refused, 1);
      EXPECT_GE(named, 1) << "no block read the sender's size from a head";
      EXPECT_EQ(error[1].load(), weft_test::SENDRECV_EMU_MISMATCH);
      for (int b = 0; b < nblocks; b++) {
        if (sout[b].result != weft_test::SENDRECV_EMU_OK) {
          EXPECT_EQ(sout[b].result, weft_test::SENDRECV_EMU_PEER_MISMATCH) << "sender block " << b;
        }
      }
      EXPECT_LT(took, timeout / 2) << "a refusal waited";
      for (size_t i = 0; i < rbuf.size(); i++)
        ASSERT_EQ(rbuf[i], kPoison) << "byte " << i << " of the receive buffer written";
    }
}

// A block of the refusing rank that waits on another peer (here one that
// never sends) gives up on its rank's error word, which the refusing block
// set, rather than by the timeout.
TEST(SendrecvHead, SiblingBlocksStopOnTheRanksError) {
  const uint32_t chunk = 32;
  const uint64_t timeout = 2000000000ull;
  SendrecvEmuNet net(3, 2, chunk, 1);
  // rank 0 sends 40 bytes to rank 1, which receives 48 from it and 8 from
  // rank 2; rank 2 never runs
  std::vector<sendrecv_op> sops = {{40, 1, 1, 0, 0}};
  std::vector<sendrecv_op> rops = {{48, 0, 0, 0, 0}, {8, 2, 0, 0, 0}};
  sendrecv_assign_pairs(sops.data(), 1);
  sendrecv_assign_pairs(rops.data(), 2);
  std::vector<char> sbuf(40, 3), r0(48 + kGuard, kPoison), r2(8 + kGuard, kPoison);
  std::vector<char *> sptrs = {sbuf.data()}, rptrs = {r0.data(), r2.data()};
  const int rblocks = sendrecv_nblocks(2, 1, 8);
  ASSERT_EQ(rblocks, 2) << "one block a peer";
  std::atomic<int> error[2] = {{0}, {0}};
  std::vector<weft_test::SendrecvEmuBlockOut> rout(rblocks);
  weft_test::SendrecvEmuBlockOut sout;
  const uint64_t t0 = weft_test::sendrecv_emu_now_ns();
  std::vector<std::thread> threads;
  threads.emplace_back([&] {
    sout = weft_test::sendrecv_emu_block(net, 0, sops, sptrs, 1, 0, nullptr, timeout, nullptr,
                                         &error[0]);
  });
  for (int b = 0; b < rblocks; b++)
    threads.emplace_back([&, b] {
      rout[b] = weft_test::sendrecv_emu_block(net, 1, rops, rptrs, rblocks, b, nullptr, timeout,
                                              nullptr, &error[1]);
    });
  for (auto &t : threads) t.join();
  const uint64_t took = weft_test::sendrecv_emu_now_ns() - t0;
  EXPECT_EQ(rout[0].result, weft_test::SENDRECV_EMU_MISMATCH);
  EXPECT_EQ(rout[0].their_nbytes, 40u);
  EXPECT_EQ(rout[1].result, weft_test::SENDRECV_EMU_MISMATCH) << "the sibling, by the error word";
  EXPECT_EQ(rout[1].their_nbytes, 0u) << "the sibling read no head";
  EXPECT_LT(took, timeout / 2);
  for (char c : r0) ASSERT_EQ(c, kPoison);
  for (char c : r2) ASSERT_EQ(c, kPoison);
}

}  // namespace
