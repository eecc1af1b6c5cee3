// Tree, recursive-doubling and direct all-reduce, and the direct broadcast
// and reduce, called directly (not
// through the tuner): the double binary tree's shape for 1 to 64 ranks, then
// every datatype x op x count x placement on forked ranks with 2-slot FIFOs of
// 256 bytes, against a reference, with every rank's result bitwise the same;
// and the credits these algorithms and the 2-rank ring take from a peer's
// signed slot, through the public API.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "coll_ref.h"
#include "harness.h"

extern "C" {
#include "collectives/core/comm.h"
#include "collectives/core/plan.h"
#include "collectives/core/tree_links.h"
#include "collectives/algo/algo.h"
#include "collectives/algo/tree_steps.h"
}

using namespace weft_test;

namespace {

// --- the double binary tree's shape ------------------------------------------

// Checks a tree over n ranks (l[r]: rank r's links, at most max_children
// children); returns its depth, or -1 after a failure.
int check_links(int n, int t, const std::vector<tree_links> &l, int max_children) {
  int roots = 0, depth_max = 0;
  for (int r = 0; r < n; r++) {
    const tree_links &x = l[r];
    SCOPED_TRACE("n " + std::to_string(n) + " tree " + std::to_string(t) + " rank " +
                 std::to_string(r));
    roots += x.parent == TREE_NONE;
    EXPECT_GE(x.nchildren, 0);
    EXPECT_LE(x.nchildren, max_children);
    for (int c = 0; c < TREE_MAX_CHILDREN; c++) {
      if (c >= x.nchildren) {
        EXPECT_EQ(x.child[c], TREE_NONE);
        continue;
      }
      int ch = x.child[c];
      EXPECT_TRUE(ch >= 0 && ch < n && ch != r) << "child " << ch;
      if (ch < 0 || ch >= n) return -1;
      EXPECT_EQ(l[ch].parent, r) << "child " << ch << " names another parent";
    }
    for (int a = 0; a < x.nchildren; a++)
      for (int b = 0; b < a; b++) EXPECT_NE(x.child[a], x.child[b]);
    if (x.parent != TREE_NONE) {
      EXPECT_TRUE(x.parent >= 0 && x.parent < n && x.parent != r);
      if (x.parent < 0 || x.parent >= n) return -1;
      const tree_links &p = l[x.parent];
      EXPECT_NE(std::find(p.child, p.child + p.nchildren, r), p.child + p.nchildren)
          << "parent " << x.parent;
    }
    // the way up reaches the root in depth steps: no cycles, one component
    int steps = 0, up = r;
    while (l[up].parent != TREE_NONE && steps <= n) {
      up = l[up].parent;
      steps++;
    }
    EXPECT_EQ(l[up].parent, TREE_NONE) << "no root above";
    EXPECT_EQ(steps, x.depth);
    depth_max = std::max(depth_max, x.depth);
  }
  EXPECT_EQ(roots, 1) << "n " << n << " tree " << t;
  return testing::Test::HasFailure() ? -1 : depth_max;
}

// Checks tree t of the double binary tree over n ranks.
int check_tree(int n, int t) {
  std::vector<tree_links> l(n);
  for (int r = 0; r < n; r++) tree_dtree_links(n, r, t, &l[r]);
  return check_links(n, t, l, 2);
}

TEST(DoubleTree, ShapeForEveryRankCount) {
  for (int n = 1; n <= 64; n++) {
    int depth[2];
    for (int t = 0; t < 2; t++) depth[t] = check_tree(n, t);
    if (testing::Test::HasFailure()) return;
    // log depth: NCCL's root has one child, one level above a balanced tree
    int log2n = 0;
    while ((1 << log2n) < n) log2n++;
    for (int t = 0; t < 2; t++) EXPECT_LE(depth[t], log2n + 1) << "n " << n << " tree " << t;
    // every rank is interior in at most one tree (so a leaf in at least one)
    int interior[2] = {0, 0};
    for (int r = 0; r < n; r++) {
      tree_links a, b;
      tree_dtree_links(n, r, 0, &a);
      tree_dtree_links(n, r, 1, &b);
      EXPECT_FALSE(a.nchildren > 0 && b.nchildren > 0) << "n " << n << " rank " << r;
      interior[0] += a.nchildren > 0;
      interior[1] += b.nchildren > 0;
    }
    // balanced: the trees share the interior work evenly
    EXPECT_LE(std::abs(interior[0] - interior[1]), 1) << "n " << n;
  }
}

// The small calls' tree (tree_small_links): a tree of three children a
// node, depth the fewest levels that hold n ranks; with the double binary
// tree's links, no rank has more neighbours than a device tree channel
// connects (TREE_MAX_PEERS).
TEST(SmallTree, ShapeForEveryRankCount) {
  for (int n = 1; n <= 64; n++) {
    std::vector<tree_links> l(n);
    for (int r = 0; r < n; r++) tree_small_links(n, r, &l[r]);
    const int depth = check_links(n, 0, l, 3);
    if (testing::Test::HasFailure()) return;
    int want = 0;
    for (long held = 1, level = 1; held < n; want++) held += (level *= 3);
    EXPECT_EQ(depth, want) << "n " << n;
    EXPECT_EQ(l[0].parent, TREE_NONE);
    for (int r = 0; r < n; r++) {
      std::vector<int> nb;
      tree_links three[3];
      tree_dtree_links(n, r, 0, &three[0]);
      tree_dtree_links(n, r, 1, &three[1]);
      three[2] = l[r];
      for (const tree_links &x : three) {
        if (x.parent != TREE_NONE) nb.push_back(x.parent);
        nb.insert(nb.end(), x.child, x.child + x.nchildren);
      }
      std::sort(nb.begin(), nb.end());
      nb.erase(std::unique(nb.begin(), nb.end()), nb.end());
      EXPECT_LE(nb.size(), (size_t)TREE_MAX_PEERS) << "n " << n << " rank " << r;
    }
  }
  if (testing::Test::HasFailure()) return;
  // 8 ranks: 0 over 1, 2, 3; 1 over 4, 5, 6; 2 over 7
  tree_links x;
  tree_small_links(8, 1, &x);
  EXPECT_EQ(x.parent, 0);
  EXPECT_EQ(std::vector<int>(x.child, x.child + x.nchildren), std::vector<int>({4, 5, 6}));
  tree_small_links(8, 7, &x);
  EXPECT_EQ(x.parent, 2);
  EXPECT_EQ(x.depth, 2);
}

// --- the algorithms on forked ranks ------------------------------------------

struct TreeRdCase {
  int nranks;
  coll_algo algo;         // ALGO_TREE, ALGO_RD or ALGO_DIRECT
  const char *transport;  // "shm", or "socket": slots forwarded by a proxy
};

std::string case_name(const testing::TestParamInfo<TreeRdCase> &info) {
  const coll_algo a = info.param.algo;
  return std::string(a == ALGO_TREE ? "tree" : a == ALGO_RD ? "rd" : "direct") + "_ranks" +
         std::to_string(info.param.nranks) + "_" + info.param.transport;
}

const size_t kGuard = 64;  // poisoned bytes after the output, checked untouched

// The plan of one call of algo on one channel, with the simple protocol.
weft_plan make_plan(coll_kind coll, coll_algo algo, weftDataType_t t, weftRedOp_t op, int root,
                    const void *src, void *dst, size_t count) {
  weft_plan plan;
  memset(&plan, 0, sizeof plan);
  plan.coll = coll;
  plan.sendbuf = src;
  plan.recvbuf = dst;
  plan.count = count;
  plan.datatype = t;
  plan.op = op;
  plan.root = root;
  plan.algo = algo;
  plan.proto = PROTO_SIMPLE;
  plan.nchannels = 1;
  return plan;
}

weftResult_t run_algo(weftComm_t comm, coll_algo algo, weftDataType_t t, weftRedOp_t op,
                      const void *src, void *dst, size_t count) {
  const weft_plan plan = make_plan(COLL_ALLREDUCE, algo, t, op, 0, src, dst, count);
  algo_fn fn = algo == ALGO_TREE ? tree_allreduce : algo == ALGO_RD ? rd_allreduce : direct_allreduce;
  return fn(comm, &comm->channels[0], &plan, 0, count);
}

int check_one(const RankCtx &ctx, weftComm_t comm, coll_algo algo, weftDataType_t t, weftRedOp_t op,
              size_t count, bool in_place, uint64_t seed) {
  const size_t esize = weftTypeSize(t), nbytes = count * esize;
  const char *what = in_place ? "in-place" : "out-of-place";
  std::vector<std::vector<uint8_t>> inputs;
  for (int r = 0; r < ctx.nranks; r++) inputs.push_back(make_input(t, op, count, seed, r));
  std::vector<uint8_t> send = inputs[ctx.rank];
  std::vector<uint8_t> recv(nbytes + kGuard, 0xa5);
  if (in_place) memcpy(recv.data(), send.data(), nbytes);
  const void *src = in_place ? recv.data() : send.data();
  weftResult_t res = run_algo(comm, algo, t, op, src, recv.data(), count);
  if (res != weftSuccess)
    return rank_fail(ctx, "%s %s %s count %zu: %s: %s", what, type_name(t), op_name(op), count,
                     weftGetErrorString(res), weftGetLastError(comm));
  std::string why;
  if (!check_reduction(t, op, inputs, recv.data(), count, &why))
    return rank_fail(ctx, "%s %s %s count %zu: %s", what, type_name(t), op_name(op), count,
                     why.c_str());
  for (size_t i = nbytes; i < recv.size(); i++)
    if (recv[i] != 0xa5)
      return rank_fail(ctx, "%s %s %s count %zu: wrote past the end (byte %zu)", what,
                       type_name(t), op_name(op), count, i - nbytes);
  if (!in_place && send != inputs[ctx.rank])
    return rank_fail(ctx, "%s %s count %zu: sendbuff was modified", type_name(t), op_name(op),
                     count);
  // every rank holds the same bits
  std::vector<uint8_t> all(nbytes * (size_t)ctx.nranks);
  res = weftAllGather(recv.data(), all.data(), nbytes, weftUint8, comm, nullptr);
  if (res != weftSuccess)
    return rank_fail(ctx, "allgather of the results: %s", weftGetLastError(comm));
  for (int r = 0; r < ctx.nranks; r++)
    if (memcmp(all.data() + (size_t)r * nbytes, recv.data(), nbytes) != 0)
      return rank_fail(ctx, "%s %s %s count %zu: rank %d's result differs from this rank's",
                       what, type_name(t), op_name(op), count, r);
  return 0;
}

// One channel of two 256-byte slots (counts of many pieces), over shm or,
// with shm off, sockets.
RunOptions small_slots(const TreeRdCase &c) {
  RunOptions opts;
  opts.timeout_s = 600;
  opts.env = {{"WEFT_NCHANNELS", "1"},
              {"WEFT_SLOT_BYTES", "256"},
              {"WEFT_NSLOTS", "2"},
              {"WEFT_TIMEOUT", "60"}};
  if (std::string(c.transport) == "socket") opts.env.push_back({"WEFT_SHM_DISABLE", "1"});
  return opts;
}

class TreeRdAllReduce : public testing::TestWithParam<TreeRdCase> {};

TEST_P(TreeRdAllReduce, EveryTypeOpCountPlacement) {
  const TreeRdCase c = GetParam();
  const uint64_t seed = test_seed();
  auto status = run_ranks(c.nranks, [&](const RankCtx &ctx) {
    weftComm_t comm;
    if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
      return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
    int rc = 0;
    // count 0 returns at once: no buffers read, no connection made
    if (run_algo(comm, c.algo, weftFloat32, weftSum, nullptr, nullptr, 0) != weftSuccess)
      rc = rank_fail(ctx, "count 0: %s", weftGetLastError(comm));
    for (int r = 0; r < ctx.nranks && rc == 0; r++)
      if (comm->send_conns[r].transport != nullptr || comm->recv_conns[r].transport != nullptr)
        rc = rank_fail(ctx, "count 0 connected to rank %d", r);
    const size_t counts[] = {0, 1, 3, 1009, 4099};
    for (int t = 0; t < weftNumTypes && rc == 0; t++)
      for (int op = 0; op < weftNumOps && rc == 0; op++)
        for (size_t ci = 0; ci < sizeof counts / sizeof counts[0] && rc == 0; ci++)
          for (int in_place = 0; in_place < 2 && rc == 0; in_place++)
            rc = check_one(ctx, comm, c.algo, (weftDataType_t)t, (weftRedOp_t)op, counts[ci],
                           in_place, seed + (uint64_t)(t * 1000 + op * 100 + ci * 10 + in_place));
    weftCommDestroy(comm);
    return rc;
  }, small_slots(c));
  for (int r = 0; r < c.nranks; r++) EXPECT_EQ(status[r], 0) << "rank " << r;
}

// The direct all-reduce with slots larger than its stack copy: an in-place
// rank above 1 keeps its input in a heap buffer while ranks 0..rank-1 are
// reduced into it; one piece and several, both placements.
TEST(DirectAllReduce, PiecesLargerThanTheStackCopy) {
  const uint64_t seed = test_seed();
  RunOptions opts;
  opts.timeout_s = 120;
  opts.env = {{"WEFT_NCHANNELS", "1"}, {"WEFT_SLOT_BYTES", "64K"}, {"WEFT_TIMEOUT", "60"}};
  auto status = run_ranks(3, [&](const RankCtx &ctx) {
    weftComm_t comm;
    if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
      return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
    int rc = 0;
    for (size_t count : {size_t{1500}, size_t{16379}, size_t{40000}})
      for (int in_place = 0; in_place < 2 && rc == 0; in_place++)
        rc = check_one(ctx, comm, ALGO_DIRECT, weftFloat32, weftSum, count, in_place,
                       seed + count + (uint64_t)in_place);
    weftCommDestroy(comm);
    return rc;
  }, opts);
  for (int r = 0; r < 3; r++) EXPECT_EQ(status[r], 0) << "rank " << r;
}

// A message of msg bytes (none where 0) to rank `to` and one from rank
// `from` in one group, each byte a function of its sender and round: checks
// what came and the guard after it.
int message_round(const RankCtx &ctx, weftComm_t comm, size_t msg, int to, int from, int round) {
  if (msg == 0) return 0;
  std::vector<uint8_t> mine(msg), theirs(msg + kGuard, 0xa5);
  for (size_t i = 0; i < msg; i++) mine[i] = (uint8_t)(i * 7 + (size_t)ctx.rank + (size_t)round);
  weftGroupStart();
  weftSend(mine.data(), msg, weftUint8, to, comm, nullptr);
  weftRecv(theirs.data(), msg, weftUint8, from, comm, nullptr);
  FAIL_IF(weftGroupEnd() != weftSuccess, "round %d: send/recv: %s", round, weftGetLastError(comm));
  for (size_t i = 0; i < msg; i++)
    FAIL_IF(theirs[i] != (uint8_t)(i * 7 + (size_t)from + (size_t)round),
            "round %d: received byte %zu wrong", round, i);
  for (size_t i = msg; i < theirs.size(); i++)
    FAIL_IF(theirs[i] != 0xa5, "round %d: received past the end", round);
  return 0;
}

// Recursive doubling between two ranks takes its credits from the partner's
// slot of the call rather than the head word: with FIFOs of two slots, calls
// of one piece interleave with sends and receives of several slots each on
// the same connections (the partner drains those before its next call), and
// every result, every received message and every guard stays right. Three
// slots too: a FIFO whose slot index is a remainder, not a mask.
TEST(RecursiveDoubling, CreditsAcrossSendsAndCalls) {
  const uint64_t seed = test_seed() + 7;
  printf("seed %llu\n", (unsigned long long)seed);
  for (const char *nslots : {"2", "3"}) {
    RunOptions opts;
    opts.env = {{"WEFT_NSLOTS", nslots}, {"WEFT_SLOT_BYTES", "256"}, {"WEFT_TIMEOUT", "30"}};
    auto status = run_ranks(2, [&](const RankCtx &ctx) {
      weftComm_t comm;
      if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
        return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
      Rng rng(seed);
      const int peer = 1 - ctx.rank;
      for (int round = 0; round < 200; round++) {
        // sends of 0 to 3 slots' worth each way, then a few one-piece calls
        TRY_RC(message_round(ctx, comm, (size_t)(rng.next() % 700), peer, peer, round));
        const int calls = 1 + (int)(rng.next() % 4);
        for (int c = 0; c < calls; c++) {
          const size_t count = 1 + (size_t)(rng.next() % 50);
          const int rc = check_one(ctx, comm, ALGO_RD, weftFloat32, weftSum, count, c & 1,
                                   seed + (uint64_t)(round * 8 + c));
          if (rc != 0) return rc;
        }
      }
      weftCommDestroy(comm);
      return 0;
    }, opts);
    EXPECT_EQ(status[0], 0) << "WEFT_NSLOTS=" << nslots;
    EXPECT_EQ(status[1], 0) << "WEFT_NSLOTS=" << nslots;
  }
}

// The ring on two ranks and the direct algorithms also take a peer's signed
// first slot of a call as the sign that every slot sent it before the call
// is drained (peer_send_drained), and take the next slot's line early
// (peer_send_warm). Through the public API with the algorithm forced and
// FIFOs of two and three 256-byte slots: runs of calls of one to six slots
// each, of every kind that algorithm runs, roots in turn, interleaved with
// point-to-point messages of several slots on the same connections (which
// the partner drains before its next call); every result exact (int32), every
// guard untouched.
int credits_call(const RankCtx &ctx, weftComm_t comm, Rng &rng, bool ring, int round) {
  const int n = ctx.nranks, rank = ctx.rank;
  const size_t count = 1 + (size_t)(rng.next() % 300);
  const int kind = (int)(rng.next() % (ring ? 4 : 3));
  const int root = (int)(rng.next() % (uint64_t)n);
  auto value = [&](int r, size_t i) { return (int32_t)(i * 31 + (size_t)r * 1000 + (size_t)round); };
  // ring: all-reduce, all-gather, reduce-scatter, broadcast; direct: all-reduce, broadcast, reduce
  const bool gather = ring && kind == 1, scatter = ring && kind == 2;
  const bool bcast = ring ? kind == 3 : kind == 1, reduce = !ring && kind == 2;
  const size_t in_count = scatter ? count * (size_t)n : count;
  const size_t out_count = gather ? count * (size_t)n : count;
  std::vector<int32_t> in(in_count), out(out_count + 16, -7);
  for (size_t i = 0; i < in_count; i++) in[i] = value(rank, i);
  weftResult_t res;
  const char *what;
  if (gather) {
    what = "all-gather";
    res = weftAllGather(in.data(), out.data(), count, weftInt32, comm, nullptr);
  } else if (scatter) {
    what = "reduce-scatter";
    res = weftReduceScatter(in.data(), out.data(), count, weftInt32, weftSum, comm, nullptr);
  } else if (bcast) {
    what = "broadcast";
    res = weftBroadcast(in.data(), out.data(), count, weftInt32, root, comm, nullptr);
  } else if (reduce) {
    what = "reduce";
    res = weftReduce(in.data(), out.data(), count, weftInt32, weftSum, root, comm, nullptr);
  } else {
    what = "all-reduce";
    res = weftAllReduce(in.data(), out.data(), count, weftInt32, weftSum, comm, nullptr);
  }
  FAIL_IF(res != weftSuccess, "round %d: %s of %zu: %s", round, what, count,
          weftGetLastError(comm));
  for (size_t i = out_count; i < out.size(); i++)
    FAIL_IF(out[i] != -7, "round %d: %s of %zu wrote past the end", round, what, count);
  if (reduce && rank != root) {
    for (size_t i = 0; i < count; i++)
      FAIL_IF(out[i] != -7, "round %d: reduce wrote a non-root's output", round);
    return 0;
  }
  for (size_t i = 0; i < out_count; i++) {
    int32_t want = 0;
    if (gather) want = value((int)(i / count), i % count);
    else if (bcast) want = value(root, i);
    else
      for (int r = 0; r < n; r++) want += value(r, scatter ? (size_t)rank * count + i : i);
    FAIL_IF(out[i] != want, "round %d: %s of %zu, element %zu: %d, not %d", round, what, count,
            i, out[i], want);
  }
  return 0;
}

TEST(Credits, InferredFromSignedSlotsRingAndDirect) {
  const uint64_t seed = test_seed() + 11;
  printf("seed %llu\n", (unsigned long long)seed);
  for (const bool ring : {true, false})
    for (const char *nslots : {"2", "3"}) {
      const int nranks = ring ? 2 : 3;
      RunOptions opts;
      opts.env = {{"WEFT_NSLOTS", nslots},     {"WEFT_SLOT_BYTES", "256"},
                  {"WEFT_TIMEOUT", "30"},      {"WEFT_ALGO", ring ? "ring" : "direct"},
                  {"WEFT_PROTO", "simple"}};
      auto status = run_ranks(nranks, [&](const RankCtx &ctx) {
        weftComm_t comm;
        if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
          return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
        Rng rng(seed + (ring ? 0 : 1));
        const int next = (ctx.rank + 1) % ctx.nranks, prev = (ctx.rank + ctx.nranks - 1) % ctx.nranks;
        for (int round = 0; round < 120; round++) {
          // to the next rank, from the previous: connections the direct algorithms use
          TRY_RC(message_round(ctx, comm, (size_t)(rng.next() % 700), next, prev, round));
          const int calls = 1 + (int)(rng.next() % 4);
          for (int c = 0; c < calls; c++) TRY_RC(credits_call(ctx, comm, rng, ring, round));
        }
        weftCommDestroy(comm);
        return 0;
      }, opts);
      for (int r = 0; r < nranks; r++)
        EXPECT_EQ(status[r], 0) << (ring ? "ring" : "direct") << ", WEFT_NSLOTS=" << nslots
                                << ", rank " << r;
    }
}

// --- direct broadcast and reduce ---------------------------------------------

weftResult_t run_rooted(weftComm_t comm, coll_kind coll, weftDataType_t t, weftRedOp_t op,
                        int root, const void *src, void *dst, size_t count) {
  const weft_plan plan = make_plan(coll, ALGO_DIRECT, t, op, root, src, dst, count);
  return (coll == COLL_BROADCAST ? direct_broadcast : direct_reduce)(comm, &comm->channels[0],
                                                                    &plan, 0, count);
}

// One direct broadcast or reduce: the root's input on every rank (broadcast)
// or the reduction at the root (reduce), guards poisoned, a reduce's
// non-root output untouched, the send buffer unchanged.
int check_rooted(const RankCtx &ctx, weftComm_t comm, coll_kind coll, weftDataType_t t,
                 weftRedOp_t op, int root, size_t count, bool in_place, uint64_t seed) {
  const size_t esize = weftTypeSize(t), nbytes = count * esize;
  const bool bcast = coll == COLL_BROADCAST;
  char what[96];
  snprintf(what, sizeof what, "%s %s %s root %d count %zu %s", bcast ? "broadcast" : "reduce",
           type_name(t), bcast ? "" : op_name(op), root, count,
           in_place ? "in-place" : "out-of-place");
  std::vector<std::vector<uint8_t>> inputs;
  for (int r = 0; r < ctx.nranks; r++) inputs.push_back(make_input(t, op, count, seed, r));
  std::vector<uint8_t> send = inputs[ctx.rank];
  std::vector<uint8_t> recv(nbytes + kGuard, 0xa5);
  if (in_place) memcpy(recv.data(), send.data(), nbytes);
  const void *src = in_place ? recv.data() : send.data();
  const weftResult_t res = run_rooted(comm, coll, t, op, root, src, recv.data(), count);
  if (res != weftSuccess)
    return rank_fail(ctx, "%s: %s: %s", what, weftGetErrorString(res), weftGetLastError(comm));
  for (size_t i = nbytes; i < recv.size(); i++)
    if (recv[i] != 0xa5) return rank_fail(ctx, "%s: wrote past the end (byte %zu)", what, i - nbytes);
  if (!in_place && send != inputs[ctx.rank])
    return rank_fail(ctx, "%s: sendbuff was modified", what);
  if (bcast) {
    if (memcmp(recv.data(), inputs[root].data(), nbytes) != 0)
      return rank_fail(ctx, "%s: not the root's data", what);
    return 0;
  }
  if (ctx.rank != root) {  // a reduce leaves a non-root's buffer as it was
    const std::vector<uint8_t> &before = in_place ? inputs[ctx.rank] : std::vector<uint8_t>(nbytes, 0xa5);
    if (memcmp(recv.data(), before.data(), nbytes) != 0)
      return rank_fail(ctx, "%s: a non-root's buffer was written", what);
    return 0;
  }
  std::string why;
  if (!check_reduction(t, op, inputs, recv.data(), count, &why))
    return rank_fail(ctx, "%s: %s", what, why.c_str());
  return 0;
}

// Every datatype x op x count x placement, the root drawn from the case so
// that every rank is the root somewhere, on 2-8 ranks over shm and 3 over
// sockets, with 256-byte slots (counts of many pieces).
class DirectRooted : public testing::TestWithParam<TreeRdCase> {};

TEST_P(DirectRooted, BroadcastAndReduce) {
  const TreeRdCase c = GetParam();
  const uint64_t seed = test_seed();
  auto status = run_ranks(c.nranks, [&](const RankCtx &ctx) {
    weftComm_t comm;
    if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
      return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
    int rc = 0, k = 0;
    const size_t counts[] = {1, 3, 61, 1009};
    for (int t = 0; t < weftNumTypes && rc == 0; t++)
      for (size_t ci = 0; ci < sizeof counts / sizeof counts[0] && rc == 0; ci++)
        for (int in_place = 0; in_place < 2 && rc == 0; in_place++, k++) {
          const uint64_t s = seed + (uint64_t)(t * 1000 + ci * 10 + in_place);
          rc = check_rooted(ctx, comm, COLL_BROADCAST, (weftDataType_t)t, weftSum, k % ctx.nranks,
                            counts[ci], in_place, s);
          for (int op = 0; op < weftNumOps && rc == 0; op++)
            rc = check_rooted(ctx, comm, COLL_REDUCE, (weftDataType_t)t, (weftRedOp_t)op,
                              (k + op) % ctx.nranks, counts[ci], in_place, s + 7 * (uint64_t)op);
        }
    weftCommDestroy(comm);
    return rc;
  }, small_slots(c));
  for (int r = 0; r < c.nranks; r++) EXPECT_EQ(status[r], 0) << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(Ranks, DirectRooted,
                         testing::Values(TreeRdCase{2, ALGO_DIRECT, "shm"},
                                         TreeRdCase{3, ALGO_DIRECT, "shm"},
                                         TreeRdCase{5, ALGO_DIRECT, "shm"},
                                         TreeRdCase{8, ALGO_DIRECT, "shm"},
                                         TreeRdCase{3, ALGO_DIRECT, "socket"}),
                         case_name);

std::vector<TreeRdCase> all_cases() {
  std::vector<TreeRdCase> cases;
  for (coll_algo a : {ALGO_TREE, ALGO_RD, ALGO_DIRECT}) {
    for (int n : {1, 2, 3, 4, 5, 6, 7, 8, 13}) {
      if (a == ALGO_DIRECT && n > DIRECT_MAX_RANKS) continue;
      cases.push_back(TreeRdCase{n, a, "shm"});
    }
    for (int n : {3, 5})  // direct: its sends are the same whatever the count of peers
      if (a != ALGO_DIRECT || n == 3) cases.push_back(TreeRdCase{n, a, "socket"});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Algos, TreeRdAllReduce, testing::ValuesIn(all_cases()), case_name);

}  // namespace
