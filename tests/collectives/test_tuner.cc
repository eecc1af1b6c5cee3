// The tuner's parsing of WEFT_ALGO/WEFT_PROTO, its choices, and ring order.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "harness.h"

extern "C" {
#include "collectives/core/channel.h"
#include "collectives/core/comm.h"
#include "collectives/api/config.h"
#include "collectives/core/params.h"
#include "collectives/core/plan.h"
#include "collectives/tune/tuner.h"
}

using namespace weft_test;

namespace {

const char *const kAlgos[] = {"ring", "tree", "rd"};

TEST(TunerParse, ListsExclusionsAndPerCollective) {
  uint8_t a[COLL_NUM_RING][8];
  ASSERT_EQ(tuner_parse(nullptr, kAlgos, 3, a), 0);
  for (int c = 0; c < COLL_NUM_RING; c++) EXPECT_TRUE(a[c][0] && a[c][1] && a[c][2]);

  ASSERT_EQ(tuner_parse("Tree,RING", kAlgos, 3, a), 0);
  EXPECT_TRUE(a[COLL_ALLREDUCE][0] && a[COLL_ALLREDUCE][1] && !a[COLL_ALLREDUCE][2]);

  ASSERT_EQ(tuner_parse("^tree", kAlgos, 3, a), 0);
  EXPECT_TRUE(a[COLL_BROADCAST][0] && !a[COLL_BROADCAST][1] && a[COLL_BROADCAST][2]);

  ASSERT_EQ(tuner_parse("allreduce:rd;broadcast:^ring", kAlgos, 3, a), 0);
  EXPECT_TRUE(!a[COLL_ALLREDUCE][0] && !a[COLL_ALLREDUCE][1] && a[COLL_ALLREDUCE][2]);
  EXPECT_TRUE(!a[COLL_BROADCAST][0] && a[COLL_BROADCAST][1]);
  EXPECT_TRUE(a[COLL_ALLGATHER][0] && a[COLL_ALLGATHER][1]) << "others keep everything";

  EXPECT_EQ(tuner_parse("ring,warp", kAlgos, 3, a), -1);
  EXPECT_TRUE(a[COLL_ALLREDUCE][0] && !a[COLL_ALLREDUCE][1]) << "known names still apply";
  EXPECT_EQ(tuner_parse("gatherall:ring", kAlgos, 3, a), -1);
  // a list that allows nothing restricts nothing (NCCL_ALGO=NVLS, ^ of every name)
  for (const char *none : {"warp", "^ring,tree,rd", "broadcast:warp"}) {
    EXPECT_EQ(tuner_parse(none, kAlgos, 3, a), -1) << none;
    for (int c = 0; c < COLL_NUM_RING; c++)
      EXPECT_TRUE(a[c][0] && a[c][1] && a[c][2]) << none << ", collective " << c;
  }
}

// A communicator shape good enough for the tuner.
struct FakeComm {
  weftComm c;
  FakeComm(int nranks, int nchannels, size_t slot_nbytes) {
    memset(&c, 0, sizeof c);
    c.nranks = nranks;
    c.nchannels = nchannels;
    c.channels[0].send.slot_nbytes = slot_nbytes;
  }
};

// A float32 sum of count elements, not yet planned.
weft_plan float_sum(enum coll_kind coll, size_t count, bool on_device = false) {
  weft_plan p;
  memset(&p, 0, sizeof p);
  p.coll = coll;
  p.count = count;
  p.datatype = weftFloat32;
  p.op = weftSum;
  p.root = coll == COLL_BROADCAST || coll == COLL_REDUCE ? 0 : -1;
  p.on_device = on_device;
  return p;
}

// The same as plan_tune plans it, on host buffers or device buffers.
weft_plan tune(const weftComm &comm, enum coll_kind coll, size_t count, bool on_device = false) {
  weft_plan p = float_sum(coll, count, on_device);
  plan_tune(&comm, &p);
  return p;
}

// Every ring collective.
const coll_kind kColls[] = {COLL_ALLREDUCE, COLL_ALLGATHER, COLL_REDUCESCATTER, COLL_BROADCAST,
                            COLL_REDUCE};

// WEFT_ALGO and WEFT_PROTO unset: the tuner chooses freely.
void tuner_env_clear() {
  ASSERT_TRUE(weft_test::env_set_alone("WEFT_ALGO", nullptr));
  ASSERT_TRUE(weft_test::env_set_alone("WEFT_PROTO", nullptr));
  weft_params_reset();
}

TEST(TunerChoice, SmallUsesFewStepsLargeUsesRing) {
  tuner_env_clear();
  FakeComm f(8, 4, 131072);
  weft_plan small = tune(f.c, COLL_ALLREDUCE, 2);
  EXPECT_NE(small.algo, ALGO_RING) << "8 B on 8 ranks should not take 14 ring steps";
  EXPECT_EQ(small.nchannels, 1);
  weft_plan large = tune(f.c, COLL_ALLREDUCE, 64 << 20);
  EXPECT_EQ(large.algo, ALGO_RING);
  EXPECT_EQ(large.proto, PROTO_SIMPLE);
  EXPECT_EQ(large.nchannels, 1) << "the host executor runs channels one after another";
  EXPECT_EQ(tune(f.c, COLL_ALLGATHER, 2).algo, ALGO_RING) << "only all-reduce has other algorithms";
}

// The model of a tree all-reduce counts the tree the call takes: up to
// WEFT_TREE_SMALL_BYTES, the tree of small calls' depth (2 at 8 and 9 ranks:
// 2 x 2 + 2 steps), above it, or where it is off, the double binary tree's
// (log2 n: 2 x 3 + 2 at 8 ranks, 2 x 4 + 2 at 9).
TEST(TunerModel, TreeOfSmallCallsCountsItsOwnDepth) {
  tuner_env_clear();
  for (int n : {8, 9}) {
    FakeComm on(n, 1, 131072), off(n, 1, 131072);
    on.c.tree_depth = off.c.tree_depth = 3;
    on.c.tree_small_nbytes = 4096;
    off.c.tree_small_nbytes = 0;
    weft_plan p = float_sum(COLL_ALLREDUCE, 2);
    p.algo = ALGO_TREE;
    p.proto = PROTO_SIMPLE;
    p.nchannels = 1;
    const double dtree_steps = n == 8 ? 8.0 : 10.0;
    EXPECT_NEAR(plan_estimate_us(&on.c, &p) / plan_estimate_us(&off.c, &p), 6.0 / dtree_steps,
                0.01)
        << n << " ranks, 8 B";
    p.count = 1024;  // 4 KiB: the last size it takes
    EXPECT_LT(plan_estimate_us(&on.c, &p), plan_estimate_us(&off.c, &p)) << n << " ranks, 4 KiB";
    p.count = 1025;
    EXPECT_EQ(plan_estimate_us(&on.c, &p), plan_estimate_us(&off.c, &p)) << n << " ranks, 4100 B";
  }
}

// A small all-reduce on 3 to 8 ranks takes the direct all-reduce's one step
// where recursive doubling needs more; 2 ranks keep recursive doubling's
// single exchange, 8 its three steps. With more ranks than cores every step
// waits for the scheduler, so 3 and 4 ranks take it up to 4 KiB.
TEST(TunerChoice, SmallAllReduceOnFewRanksTakesOneStep) {
  tuner_env_clear();
  FakeComm two(2, 1, 131072), three(3, 1, 131072), four(4, 1, 131072), eight(8, 1, 131072),
      nine(9, 1, 131072);
  EXPECT_EQ(tune(two.c, COLL_ALLREDUCE, 2).algo, ALGO_RD);
  EXPECT_EQ(tune(three.c, COLL_ALLREDUCE, 2).algo, ALGO_DIRECT);
  EXPECT_EQ(tune(four.c, COLL_ALLREDUCE, 2).algo, ALGO_DIRECT);
  EXPECT_EQ(tune(eight.c, COLL_ALLREDUCE, 2).algo, ALGO_RD);
  EXPECT_NE(tune(nine.c, COLL_ALLREDUCE, 2).algo, ALGO_DIRECT) << "direct runs on 8 at most";
  EXPECT_EQ(tune(three.c, COLL_ALLGATHER, 2).algo, ALGO_RING) << "direct is all-reduce only";
  // oversubscribed (the same comms: the tuner's memo must see the change)
  for (FakeComm *f : {&three, &four}) {
    f->c.oversubscribed_any = 1;
    for (size_t count : {size_t{2}, size_t{16}, size_t{128}, size_t{1024}})
      EXPECT_EQ(tune(f->c, COLL_ALLREDUCE, count).algo, ALGO_DIRECT)
          << f->c.nranks << " ranks, " << count * 4 << " B";
  }
  two.c.oversubscribed_any = 1;
  EXPECT_EQ(tune(two.c, COLL_ALLREDUCE, 2).algo, ALGO_RD);
}

// The channels a plan gets are those its own estimate prices lowest: no
// count the comm has would be estimated faster, for any collective and size.
TEST(TunerChoice, ChannelsFollowTheModel) {
  tuner_env_clear();
  for (int nranks : {2, 3, 8}) {
    FakeComm f(nranks, 4, 4096);
    for (coll_kind coll : kColls)
      for (size_t count : {size_t{1}, size_t{4099}, size_t{1} << 16, size_t{16} << 20}) {
        weft_plan p = tune(f.c, coll, count);
        ASSERT_GE(p.nchannels, 1);
        ASSERT_LE(p.nchannels, 4);
        const double chosen = plan_estimate_us(&f.c, &p);
        for (int nch = 1; nch <= 4; nch++) {
          weft_plan other = p;
          other.nchannels = nch;
          EXPECT_LE(chosen, plan_estimate_us(&f.c, &other))
              << nranks << " ranks, coll " << coll << ", count " << count << ": " << p.nchannels
              << " channels chosen, " << nch << " estimated faster";
        }
      }
  }
}

TEST(TunerChoice, EnvironmentRestricts) {
  FakeComm f(8, 1, 131072);
  ASSERT_TRUE(weft_test::env_set_alone("WEFT_ALGO", "ring"));
  ASSERT_TRUE(weft_test::env_set_alone("WEFT_PROTO", "simple"));
  weft_params_reset();
  weft_plan p = tune(f.c, COLL_ALLREDUCE, 2);
  EXPECT_EQ(p.algo, ALGO_RING);
  EXPECT_EQ(p.proto, PROTO_SIMPLE);
  ASSERT_TRUE(weft_test::env_set_alone("WEFT_ALGO", "allreduce:tree"));
  ASSERT_TRUE(weft_test::env_set_alone("WEFT_PROTO", "ll"));
  weft_params_reset();
  p = tune(f.c, COLL_ALLREDUCE, 64 << 20);
  EXPECT_EQ(p.algo, ALGO_TREE);
  EXPECT_EQ(p.proto, PROTO_LL);
  // a collective whose allowed list has nothing it implements falls back to ring
  p = tune(f.c, COLL_BROADCAST, 1000);
  EXPECT_EQ(p.algo, ALGO_RING);
  ASSERT_TRUE(weft_test::env_set_alone("WEFT_ALGO", nullptr));
  ASSERT_TRUE(weft_test::env_set_alone("WEFT_PROTO", nullptr));
  weft_params_reset();
}

// A call that names the pairs it allows (NCCL's per-call algSelection, as
// plan->alg_select) takes the cheapest of them: the ring or the tree where
// the tuner takes recursive doubling, single copy never; narrowed by
// WEFT_ALGO where that leaves any, else the call's own; none that runs here
// (the tree of one rank), the tuner's choice. The choice is not kept: the
// same shape unselected after it is the tuner's again.
TEST(TunerChoice, ACallsSelectionNarrowsTheChoice) {
  tuner_env_clear();
  FakeComm f(8, 1, 131072), one(1, 1, 131072);
  auto selected = [](const weftComm &c, enum coll_kind coll, size_t count, unsigned sel,
                     bool on_device = false) {
    weft_plan p = float_sum(coll, count, on_device);
    p.alg_select = sel;
    EXPECT_EQ(plan_tune(&c, &p), 0) << "a selected call's choice is not memoized";
    return p;
  };
  const unsigned ring = PLAN_SELECT(ALGO_RING, PROTO_SIMPLE) | PLAN_SELECT(ALGO_RING, PROTO_LL);
  const unsigned tree = PLAN_SELECT(ALGO_TREE, PROTO_SIMPLE) | PLAN_SELECT(ALGO_TREE, PROTO_LL);
  ASSERT_EQ(tune(f.c, COLL_ALLREDUCE, 2).algo, ALGO_RD);
  weft_plan p = selected(f.c, COLL_ALLREDUCE, 2, ring);
  EXPECT_EQ(p.algo, ALGO_RING);
  p = selected(f.c, COLL_ALLREDUCE, 2, tree);
  EXPECT_EQ(p.algo, ALGO_TREE);
  p = selected(f.c, COLL_ALLREDUCE, 64 << 20, PLAN_SELECT(ALGO_TREE, PROTO_LL));
  EXPECT_EQ(p.algo, ALGO_TREE);
  EXPECT_EQ(p.proto, PROTO_LL) << "the only pair allowed, however dear";
  p = selected(f.c, COLL_ALLREDUCE, 2, PLAN_SELECT(ALGO_TREE, PROTO_SIMPLE), true);
  EXPECT_EQ(p.algo, ALGO_TREE) << "device buffers on one host";
  EXPECT_EQ(p.proto, PROTO_SIMPLE);
  p = selected(f.c, COLL_ALLGATHER, 1 << 20, PLAN_SELECT(ALGO_RING, PROTO_LL));
  EXPECT_EQ(p.algo, ALGO_RING);
  EXPECT_EQ(p.proto, PROTO_LL);
  EXPECT_EQ(tune(f.c, COLL_ALLREDUCE, 2).algo, ALGO_RD) << "the tuner's own choice after";
  // no pair of it runs: the tuner's choice, and the selection dropped
  p = float_sum(COLL_ALLREDUCE, 2);
  p.alg_select = tree;
  plan_tune(&one.c, &p);
  EXPECT_EQ(p.alg_select, 0u);
  EXPECT_EQ(p.algo, tune(one.c, COLL_ALLREDUCE, 2).algo);
  // narrowed by WEFT_PROTO where that leaves a pair; the call's own where not
  ASSERT_TRUE(weft_test::env_set_alone("WEFT_PROTO", "simple"));
  weft_params_reset();
  p = selected(f.c, COLL_ALLREDUCE, 2, ring);
  EXPECT_EQ(p.algo, ALGO_RING);
  EXPECT_EQ(p.proto, PROTO_SIMPLE);
  ASSERT_TRUE(weft_test::env_set_alone("WEFT_ALGO", "tree"));
  weft_params_reset();
  p = selected(f.c, COLL_ALLREDUCE, 2, PLAN_SELECT(ALGO_RING, PROTO_LL));
  EXPECT_EQ(p.algo, ALGO_RING);
  EXPECT_EQ(p.proto, PROTO_LL);
  tuner_env_clear();
}

// Device buffers on a ring that crosses hosts: SIMPLE only (the executor
// cannot carry LL over a network), each step dearer by two PCIe crossings
// (the slot staged through pinned host memory), and large messages priced
// at the network's bandwidth, which is the slower stage.
TEST(TunerChoice, DeviceBuffersAcrossHosts) {
  tuner_env_clear();
  for (int nranks : {2, 3, 8}) {
    FakeComm net(nranks, 2, 131072);
    net.c.network = 1;
    for (size_t count : {size_t{2}, size_t{1000}, size_t{16} << 20}) {
      weft_plan host = tune(net.c, COLL_ALLREDUCE, count);
      EXPECT_EQ(tune(net.c, COLL_ALLREDUCE, count, true).proto, PROTO_SIMPLE)
          << nranks << " ranks, count " << count;
      weft_plan same = host;  // the host's plan, priced for device buffers
      same.on_device = 1;
      const double h = plan_estimate_us(&net.c, &host), d = plan_estimate_us(&net.c, &same);
      EXPECT_GT(d, h) << "staging through host memory costs something";
      if (count >= (size_t{16} << 20)) {
        EXPECT_LT(d, h * 1.01) << "large messages: the network is the slower stage";
      }
    }
  }
  // LL only: a device plan across hosts still runs SIMPLE
  ASSERT_TRUE(weft_test::env_set_alone("WEFT_PROTO", "ll"));
  weft_params_reset();
  FakeComm net(4, 1, 131072);
  net.c.network = 1;
  EXPECT_EQ(tune(net.c, COLL_ALLGATHER, 4, true).proto, PROTO_SIMPLE);
  EXPECT_EQ(tune(net.c, COLL_ALLGATHER, 4).proto, PROTO_LL) << "host buffers follow WEFT_PROTO";
  ASSERT_TRUE(weft_test::env_set_alone("WEFT_PROTO", nullptr));
  weft_params_reset();
}

// The device tree all-reduce: never the tuner's own pick while its kernels'
// figures are unmeasured; WEFT_ALGO that leaves all-reduce the tree alone
// runs it on one host (LL small, SIMPLE large, as the ring), and nothing
// else: other collectives and comms across hosts keep the ring.
TEST(TunerChoice, DeviceTreeOnlyWhenAskedUntilMeasured) {
  tuner_env_clear();
  for (int nranks : {2, 4, 8}) {
    FakeComm local(nranks, 2, 131072);
    for (size_t count : {size_t{2}, size_t{1} << 14, size_t{64} << 20})
      EXPECT_EQ(tune(local.c, COLL_ALLREDUCE, count, true).algo, ALGO_RING)
          << nranks << " ranks, count " << count;
  }
  ASSERT_TRUE(weft_test::env_set_alone("WEFT_ALGO", "tree"));
  weft_params_reset();
  FakeComm local(8, 2, 131072);
  weft_plan small = tune(local.c, COLL_ALLREDUCE, 2, true);
  EXPECT_EQ(small.algo, ALGO_TREE);
  EXPECT_EQ(small.proto, PROTO_LL);
  weft_plan large = tune(local.c, COLL_ALLREDUCE, size_t{64} << 20, true);
  EXPECT_EQ(large.algo, ALGO_TREE);
  EXPECT_EQ(large.proto, PROTO_SIMPLE);
  EXPECT_EQ(tune(local.c, COLL_ALLGATHER, 1000, true).algo, ALGO_RING);
  FakeComm net(8, 2, 131072);
  net.c.network = 1;
  EXPECT_EQ(tune(net.c, COLL_ALLREDUCE, 2, true).algo, ALGO_RING);
  ASSERT_TRUE(weft_test::env_set_alone("WEFT_ALGO", "ring,tree"));
  weft_params_reset();
  EXPECT_EQ(tune(local.c, COLL_ALLREDUCE, 2, true).algo, ALGO_RING) << "the ring still allowed";
  ASSERT_TRUE(weft_test::env_set_alone("WEFT_ALGO", nullptr));
  weft_params_reset();
}

// Device buffers on one host have a model of their own (the device
// kernels'): always the ring, whatever the host would run (cma, bulk, tree,
// rd have no device executor); LL for small messages, where a step that
// waits on the lines themselves is cheaper, SIMPLE from some size on and
// for every larger one; WEFT_PROTO still decides.
TEST(TunerChoice, DeviceBuffersOnOneHost) {
  tuner_env_clear();
  for (int nranks : {2, 3, 8}) {
    FakeComm local(nranks, 2, 131072);
    for (coll_kind coll : kColls) {
      SCOPED_TRACE(std::to_string(nranks) + " ranks, collective " + std::to_string(coll));
      EXPECT_EQ(tune(local.c, coll, 2, true).proto, PROTO_LL);
      EXPECT_EQ(tune(local.c, coll, size_t{16} << 20, true).proto, PROTO_SIMPLE);
      bool simple = false;
      for (size_t count = 1; count <= (size_t{64} << 20); count *= 2) {
        weft_plan p = tune(local.c, coll, count, true);
        EXPECT_EQ(p.algo, ALGO_RING) << count;
        if (simple) {
          EXPECT_EQ(p.proto, PROTO_SIMPLE) << "LL again at " << count;
        }
        simple = p.proto == PROTO_SIMPLE;
      }
    }
    // where the host goes off the ring (tree, rd, cma, bulk), device buffers stay on it
    for (size_t count : {size_t{2}, size_t{1} << 20, size_t{64} << 20})
      EXPECT_EQ(tune(local.c, COLL_ALLREDUCE, count, true).algo, ALGO_RING) << count;
  }
  FakeComm two(2, 2, 131072);
  ASSERT_TRUE(weft_test::env_set_alone("WEFT_PROTO", "simple"));
  weft_params_reset();
  EXPECT_EQ(tune(two.c, COLL_ALLREDUCE, 2, true).proto, PROTO_SIMPLE);
  ASSERT_TRUE(weft_test::env_set_alone("WEFT_PROTO", "ll"));
  weft_params_reset();
  EXPECT_EQ(tune(two.c, COLL_ALLREDUCE, size_t{16} << 20, true).proto, PROTO_LL);
  ASSERT_TRUE(weft_test::env_set_alone("WEFT_PROTO", nullptr));
  weft_params_reset();
}

// A run of calls of one shape is answered from the tuner's memo, which must
// still follow what the memo does not hold: WEFT_CMA_MIN_NBYTES changed
// between two calls of the same size, and whether the comm's transports
// allow single copy at all (a peer that turns out to be on another host).
TEST(TunerChoice, RepeatedShapeFollowsThresholdAndTransports) {
  tuner_env_clear();
  FakeComm f(2, 1, 131072);
  f.c.slot_nbytes = 131072;
  peer_info peers[2];
  memset(peers, 0, sizeof peers);
  peers[0].host_hash = peers[1].host_hash = 42;
  f.c.peers = peers;
  weft_transport host_memory;
  memset(&host_memory, 0, sizeof host_memory);
  host_memory.name = "fake";
  host_memory.caps = TRANSPORT_CAP_HOST_MEMORY;
  f.c.channels[0].send.transport = &host_memory;
  const size_t count = 1024; // 4 KiB: below the default threshold (64 KiB)
  for (int i = 0; i < 3; i++) EXPECT_EQ(tune(f.c, COLL_ALLREDUCE, count).algo, ALGO_RD) << i;
  ASSERT_TRUE(weft_test::env_set_alone("WEFT_CMA_MIN_NBYTES", "1K"));
  weft_params_reset();
  for (int i = 0; i < 3; i++) EXPECT_EQ(tune(f.c, COLL_ALLREDUCE, count).algo, ALGO_CMA) << i;
  peers[1].host_hash = 43; // the same shape, but no longer one host
  for (int i = 0; i < 3; i++) EXPECT_EQ(tune(f.c, COLL_ALLREDUCE, count).algo, ALGO_RD) << i;
  peers[1].host_hash = 42;
  EXPECT_EQ(tune(f.c, COLL_ALLREDUCE, count).algo, ALGO_CMA) << "one host again";
  ASSERT_TRUE(weft_test::env_set_alone("WEFT_CMA_MIN_NBYTES", nullptr));
  weft_params_reset();
  EXPECT_EQ(tune(f.c, COLL_ALLREDUCE, count).algo, ALGO_RD) << "the default threshold again";
  f.c.peers = nullptr;
  f.c.channels[0].send.transport = nullptr;
}

TEST(RingOrder, HostsAdjacentCrossingOncePerHost) {
  peer_info peers[7];
  memset(peers, 0, sizeof peers);
  const uint64_t host_of[7] = {10, 20, 10, 30, 20, 10, 30};  // interleaved launch
  for (int r = 0; r < 7; r++) peers[r].host_hash = host_of[r];
  int ring[7];
  ring_order(peers, 7, ring);
  const int want[7] = {0, 2, 5, 1, 4, 3, 6};
  for (int i = 0; i < 7; i++) EXPECT_EQ(ring[i], want[i]) << "position " << i;
  int crossings = 0;
  for (int i = 0; i < 7; i++) crossings += host_of[ring[i]] != host_of[ring[(i + 1) % 7]];
  EXPECT_EQ(crossings, 3);
}

// Ranks on hosts of which one is oversubscribed (3 ranks on this machine's
// CPUs, the other host 1 rank): the tuner prices a call alike on every rank,
// so every rank plans every size the same (each host priced its own: the
// lone rank planned, say, recursive doubling where the others took the tree,
// and the call hung until the timeout). Each rank's choices for all-reduce,
// all-gather and broadcast from 8 B to 16 MiB go into shared memory, and
// rank 0 compares them.
TEST(TunerChoice, HostsAgreeWhenOneIsOversubscribed) {
  const long ncpus = sysconf(_SC_NPROCESSORS_ONLN);
  if (ncpus > 2) GTEST_SKIP() << "needs 3 ranks to outnumber the CPUs (" << ncpus << " here)";
  const int n = 4, nsizes = 22;
  const enum coll_kind colls[] = {COLL_ALLREDUCE, COLL_ALLGATHER, COLL_BROADCAST};
  const int nplans = nsizes * 3;
  int *plans = (int *)mmap(nullptr, sizeof(int) * n * nplans, PROT_READ | PROT_WRITE,
                           MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(plans, MAP_FAILED);
  RunOptions opts;
  opts.env = {{"WEFT_TIMEOUT", "20"}};
  opts.host_of = [](int rank) { return std::string(rank < 3 ? "oversub-a" : "oversub-b"); };
  auto status = run_ranks(n, [&](const RankCtx &ctx) {
    weftComm_t comm;
    if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
      return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
    weftComm *c = (weftComm *)comm;
    printf("rank %d: this host oversubscribed %d, some host %d\n", ctx.rank,
           c->oversubscribed_hold, c->oversubscribed_any);
    for (int k = 0; k < 3; k++)
      for (int i = 0; i < nsizes; i++) {
        weft_plan p = float_sum(colls[k], (size_t)2 << i);
        plan_tune(c, &p);
        plans[ctx.rank * nplans + k * nsizes + i] = p.algo * PROTO_NUM + p.proto;
      }
    int rc = 0;
    float x = 1, y = 0;  // and a call that works: every rank here after planning
    if (rc == 0 && (weftAllReduce(&x, &y, 1, weftFloat32, weftSum, comm, nullptr) != weftSuccess ||
                    y != (float)n))
      rc = rank_fail(ctx, "all-reduce: %s", weftGetLastError(comm));
    if (rc == 0 && ctx.rank == 0)
      for (int r = 1; r < n; r++)
        for (int j = 0; j < nplans; j++)
          if (plans[r * nplans + j] != plans[j] && rc == 0)
            rc = rank_fail(ctx, "%s of %zu B: rank 0 plans %s, rank %d %s",
                           coll_kind_name(colls[j / nsizes]), (size_t)8 << (j % nsizes),
                           tuner_algo_name(plans[j] / PROTO_NUM), r,
                           tuner_algo_name(plans[r * nplans + j] / PROTO_NUM));
    weftCommDestroy(comm);
    return rc;
  }, opts);
  for (int r = 0; r < n; r++) EXPECT_EQ(status[r], 0) << "rank " << r;
  munmap(plans, sizeof(int) * n * nplans);
}

}  // namespace
