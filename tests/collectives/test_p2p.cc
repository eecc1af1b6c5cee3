// Send/recv, groups, all-to-all, gather and scatter over forked ranks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "coll_check.h"
#include "harness.h"

using namespace weft_test;

namespace {

// A message's content: unique per (sender, receiver, index), checkable bytes.
std::vector<uint8_t> message(int from, int to, int index, size_t nbytes) {
  std::vector<uint8_t> m(nbytes);
  Rng rng((uint64_t)from * 1000003u + (uint64_t)to * 1009u + (uint64_t)index);
  for (auto &b : m) b = (uint8_t)rng.next();
  return m;
}

// Elements each ordered pair exchanges: 0, small, and several slots' worth.
size_t pair_count(int from, int to) {
  static const size_t sizes[] = {0, 1, 77, 1000, 5003};
  return sizes[(from * 3 + to * 5) % 5];
}

RunOptions small_slots() {
  RunOptions o;
  o.timeout_s = 120;
  o.env = {{"WEFT_SLOT_BYTES", "256"}, {"WEFT_NSLOTS", "2"}, {"WEFT_TIMEOUT", "30"}};
  return o;
}

int init(const RankCtx &ctx, weftComm_t *comm) {
  if (weftCommInitRank(comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
    return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
  return 0;
}

// 8 ranks: every rank sends to and receives from every rank (itself too) in a
// random order inside one group, with messages far larger than the FIFOs.
TEST(P2P, AllToAllRandomOrderInGroup) {
  const uint64_t seed = test_seed();
  for (int nranks : {2, 5, 8}) {
    auto status = run_ranks(nranks, [&](const RankCtx &ctx) {
      weftComm_t comm;
      if (int rc = init(ctx, &comm)) return rc;
      const int n = ctx.nranks, me = ctx.rank;
      std::vector<std::vector<uint8_t>> out(n), in(n);
      struct Op { bool send; int peer; };
      std::vector<Op> ops;
      for (int p = 0; p < n; p++) {
        out[p] = message(me, p, 0, pair_count(me, p) * 4);
        in[p].assign(pair_count(p, me) * 4, 0xa5);
        ops.push_back({true, p});
        ops.push_back({false, p});
      }
      std::mt19937_64 shuffle(seed + (uint64_t)me);
      std::shuffle(ops.begin(), ops.end(), shuffle);
      weftGroupStart();
      for (const Op &op : ops) {
        weftResult_t res = op.send ? weftSend(out[op.peer].data(), out[op.peer].size() / 4,
                                              weftFloat32, op.peer, comm, nullptr)
                                   : weftRecv(in[op.peer].data(), in[op.peer].size() / 4,
                                              weftFloat32, op.peer, comm, nullptr);
        if (res != weftSuccess) return rank_fail(ctx, "recording: %s", weftGetLastError(comm));
      }
      if (weftGroupEnd() != weftSuccess)
        return rank_fail(ctx, "group: %s", weftGetLastError(comm));
      for (int p = 0; p < n; p++)
        if (in[p] != message(p, me, 0, pair_count(p, me) * 4))
          return rank_fail(ctx, "message from rank %d is wrong", p);
      weftCommDestroy(comm);
      return 0;
    }, small_slots());
    for (int r = 0; r < nranks; r++) EXPECT_EQ(status[r], 0) << nranks << " ranks, rank " << r;
  }
}

// Several messages to one peer in a group arrive in order; outside a group a
// send larger than the FIFO completes once the peer receives.
TEST(P2P, OrderPerPeerAndBlockingCalls) {
  auto status = run_ranks(2, [](const RankCtx &ctx) {
    weftComm_t comm;
    if (int rc = init(ctx, &comm)) return rc;
    const int peer = 1 - ctx.rank;
    const size_t sizes[] = {3000, 0, 17, 4096};
    std::vector<std::vector<uint8_t>> got(4);
    weftGroupStart();
    for (int i = 0; i < 4; i++) {
      if (ctx.rank == 0) {
        static std::vector<uint8_t> m[4];
        m[i] = message(0, 1, i, sizes[i]);
        weftSend(m[i].data(), sizes[i], weftUint8, peer, comm, nullptr);
      } else {
        got[i].assign(sizes[i], 0);
        weftRecv(got[i].data(), sizes[i], weftUint8, peer, comm, nullptr);
      }
    }
    if (weftGroupEnd() != weftSuccess) return rank_fail(ctx, "group: %s", weftGetLastError(comm));
    for (int i = 0; ctx.rank == 1 && i < 4; i++)
      if (got[i] != message(0, 1, i, sizes[i])) return rank_fail(ctx, "message %d out of order", i);
    // ping-pong without groups, 64 KiB each way through 512-byte FIFOs
    std::vector<uint8_t> ping = message(ctx.rank, peer, 9, 65536), pong(65536);
    weftResult_t a, b;
    if (ctx.rank == 0) {
      a = weftSend(ping.data(), ping.size(), weftUint8, 1, comm, nullptr);
      b = weftRecv(pong.data(), pong.size(), weftUint8, 1, comm, nullptr);
    } else {
      a = weftRecv(pong.data(), pong.size(), weftUint8, 0, comm, nullptr);
      b = weftSend(ping.data(), ping.size(), weftUint8, 0, comm, nullptr);
    }
    if (a != weftSuccess || b != weftSuccess) return rank_fail(ctx, "ping-pong: %s", weftGetLastError(comm));
    if (pong != message(peer, ctx.rank, 9, 65536)) return rank_fail(ctx, "ping-pong data");
    weftCommDestroy(comm);
    return 0;
  }, small_slots());
  EXPECT_EQ(status[0], 0);
  EXPECT_EQ(status[1], 0);
}

// A receive whose count differs from the send is an error, not junk.
TEST(P2P, SizeMismatchIsAnError) {
  for (size_t recv_count : {100, 5000}) {
    auto status = run_ranks(2, [&](const RankCtx &ctx) {
      weftComm_t comm;
      if (int rc = init(ctx, &comm)) return rc;
      std::vector<float> buf(5000, 1.0f);
      if (ctx.rank == 0) {
        weftSend(buf.data(), 1000, weftFloat32, 1, comm, nullptr);
      } else {
        weftResult_t res = weftRecv(buf.data(), recv_count, weftFloat32, 0, comm, nullptr);
        std::string msg = weftGetLastError(comm);
        if (res != weftInvalidUsage || msg.find("rank 0") == std::string::npos)
          return rank_fail(ctx, "count %zu: got %d: %s", recv_count, res, msg.c_str());
      }
      weftCommAbort(comm);
      return 0;
    }, small_slots());
    EXPECT_EQ(status[0], 0);
    EXPECT_EQ(status[1], 0) << "recv count " << recv_count;
  }
}

TEST(P2P, BadArguments) {
  weftUniqueId id;
  ASSERT_EQ(weftGetUniqueId(&id), weftSuccess);
  weftComm_t comm;
  ASSERT_EQ(weftCommInitRank(&comm, 1, id, 0), weftSuccess);
  float x[4];
  EXPECT_EQ(weftSend(x, 4, weftFloat32, 1, comm, nullptr), weftInvalidArgument);
  EXPECT_NE(std::string(weftGetLastError(comm)).find("peer 1 out of range"), std::string::npos);
  EXPECT_EQ(weftRecv(nullptr, 4, weftFloat32, 0, comm, nullptr), weftInvalidArgument);
  EXPECT_EQ(weftSend(x, 4, (weftDataType_t)42, 0, comm, nullptr), weftInvalidArgument);
  EXPECT_EQ(weftGather(x, x, 1, weftFloat32, 3, comm, nullptr), weftInvalidArgument);
  EXPECT_EQ(weftAlltoAll(x, x + 1, 2, weftFloat32, comm, nullptr), weftInvalidArgument);
  // a send to self outside a group has no receive to pair with
  EXPECT_EQ(weftSend(x, 4, weftFloat32, 0, comm, nullptr), weftInvalidUsage);
  EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
}

// AlltoAll, Gather and Scatter entry points, every datatype, moving roots.
TEST(P2P, AlltoAllGatherScatter) {
  const uint64_t seed = test_seed();
  for (int nranks : {1, 3, 4}) {
    auto status = run_ranks(nranks, [&](const RankCtx &ctx) {
      weftComm_t comm;
      if (int rc = init(ctx, &comm)) return rc;
      const int n = ctx.nranks, me = ctx.rank;
      for (int t = 0; t < weftNumTypes; t++) {
        weftDataType_t dt = (weftDataType_t)t;
        const size_t count = 1 + (size_t)t * 97, es = weftTypeSize(dt), block = count * es;
        std::vector<std::vector<uint8_t>> inputs;  // rank r's n blocks
        for (int r = 0; r < n; r++) inputs.push_back(make_input(dt, weftSum, count * n, seed + t, r));
        std::vector<uint8_t> out(block * n, 0xa5);
        if (weftAlltoAll(inputs[me].data(), out.data(), count, dt, comm, nullptr) != weftSuccess)
          return rank_fail(ctx, "alltoall: %s", weftGetLastError(comm));
        for (int p = 0; p < n; p++)
          if (memcmp(out.data() + p * block, inputs[p].data() + me * block, block) != 0)
            return rank_fail(ctx, "alltoall %s: block from rank %d wrong", type_name(dt), p);
        int root = t % n;
        std::fill(out.begin(), out.end(), 0xa5);
        if (weftGather(inputs[me].data(), me == root ? out.data() : nullptr, count, dt, root, comm,
                       nullptr) != weftSuccess)
          return rank_fail(ctx, "gather: %s", weftGetLastError(comm));
        for (int p = 0; me == root && p < n; p++)
          if (memcmp(out.data() + p * block, inputs[p].data(), block) != 0)
            return rank_fail(ctx, "gather %s root %d: block of rank %d wrong", type_name(dt), root, p);
        std::vector<uint8_t> mine(block + 16, 0xa5);
        if (weftScatter(me == root ? inputs[me].data() : nullptr, mine.data(), count, dt, root, comm,
                        nullptr) != weftSuccess)
          return rank_fail(ctx, "scatter: %s", weftGetLastError(comm));
        if (memcmp(mine.data(), inputs[root].data() + me * block, block) != 0 || mine[block] != 0xa5)
          return rank_fail(ctx, "scatter %s root %d wrong", type_name(dt), root);
      }
      weftCommDestroy(comm);
      return 0;
    }, small_slots());
    for (int r = 0; r < nranks; r++) EXPECT_EQ(status[r], 0) << nranks << " ranks, rank " << r;
  }
}

// Collectives fused in one group give what they give one by one.
TEST(Group, FusedCollectivesMatchSeparateOnes) {
  const uint64_t seed = test_seed();
  auto status = run_ranks(4, [&](const RankCtx &ctx) {
    weftComm_t comm;
    if (int rc = init(ctx, &comm)) return rc;
    const size_t count = 3001;
    std::vector<uint8_t> a = make_input(weftFloat32, weftSum, count, seed, ctx.rank);
    std::vector<uint8_t> b = make_input(weftInt32, weftMax, count, seed, ctx.rank);
    std::vector<uint8_t> c = make_input(weftBfloat16, weftSum, count, seed, 2);
    std::vector<uint8_t> a1(count * 4), b1(count * 4 * 4), c1(count * 2);
    std::vector<uint8_t> a2(count * 4), b2(count * 4 * 4), c2(count * 2);
    auto issue = [&](std::vector<uint8_t> &ao, std::vector<uint8_t> &bo, std::vector<uint8_t> &co) {
      weftResult_t r1 = weftAllReduce(a.data(), ao.data(), count, weftFloat32, weftSum, comm, nullptr);
      weftResult_t r2 = weftAllGather(b.data(), bo.data(), count, weftInt32, comm, nullptr);
      weftResult_t r3 = weftBroadcast(c.data(), co.data(), count, weftBfloat16, 2, comm, nullptr);
      return r1 == weftSuccess && r2 == weftSuccess && r3 == weftSuccess;
    };
    if (!issue(a1, b1, c1)) return rank_fail(ctx, "one by one: %s", weftGetLastError(comm));
    weftGroupStart();
    bool ok = issue(a2, b2, c2);
    if (weftGroupEnd() != weftSuccess || !ok) return rank_fail(ctx, "group: %s", weftGetLastError(comm));
    if (a1 != a2 || b1 != b2 || c1 != c2) return rank_fail(ctx, "fused results differ");
    weftCommDestroy(comm);
    return 0;
  }, small_slots());
  for (int r = 0; r < 4; r++) EXPECT_EQ(status[r], 0) << "rank " << r;
}

}  // namespace
