// Two simulated hosts: network namespaces joined by a veth pair, two ranks in
// each. Shared memory inside a host, sockets between them. Needs root and ip;
// skipped with the reason otherwise.
#include <gtest/gtest.h>

#include <signal.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "collectives/coll_ref.h"
#include "harness.h"

using namespace weft_test;

namespace {

int sh(const std::string &cmd) { return system((cmd + " >/dev/null 2>&1").c_str()); }

class TwoHosts : public testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root to create network namespaces";
    if (sh("command -v ip") != 0) GTEST_SKIP() << "needs the ip tool (iproute2)";
    tag = std::to_string(getpid() % 100000);
    ns[0] = "weft-h0-" + tag;
    ns[1] = "weft-h1-" + tag;
    std::string v0 = "wv0-" + tag, v1 = "wv1-" + tag;
    bool ok = sh("ip netns add " + ns[0]) == 0 && sh("ip netns add " + ns[1]) == 0 &&
              sh("ip link add " + v0 + " type veth peer name " + v1) == 0 &&
              sh("ip link set " + v0 + " netns " + ns[0]) == 0 &&
              sh("ip link set " + v1 + " netns " + ns[1]) == 0;
    for (int h = 0; ok && h < 2; h++) {
      std::string in = "ip netns exec " + ns[h] + " ";
      std::string dev = h == 0 ? v0 : v1;
      veth[h] = dev;
      ok = sh(in + "ip link set lo up") == 0 &&
           sh(in + "ip addr add 10.251." + tag.substr(0, 2) + "." + std::to_string(h + 1) +
              "/24 dev " + dev) == 0 &&
           sh(in + "ip link set " + dev + " up") == 0;
    }
    if (!ok) {
      TearDown();
      GTEST_SKIP() << "could not create namespaces and a veth pair here";
    }
    created = true;
  }
  void TearDown() override {
    if (ns[0].empty()) return;
    sh("ip netns del " + ns[0]);
    sh("ip netns del " + ns[1]);
  }
  RunOptions options(int timeout_s) {
    RunOptions o;
    o.timeout_s = 120;
    o.netns = {ns[0], ns[0], ns[1], ns[1]};
    o.env = {{"WEFT_TIMEOUT", std::to_string(timeout_s)}, {"WEFT_SLOT_BYTES", "4096"},
             // sockets between the hosts: UCX, preferred when built in, would reach the
             // other namespace through shared memory (test_multihost_ucx.cc covers it)
             {"WEFT_UCX_DISABLE", "1"}};
    return o;
  }
  std::string tag, ns[2], veth[2];
  bool created = false;
};

// Every collective is correct across the two hosts.
TEST_F(TwoHosts, AllCollectivesCorrect) {
  const uint64_t seed = test_seed();
  auto status = run_ranks(4, [&](const RankCtx &ctx) {
    weftComm_t comm;
    if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
      return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
    if (int rc = check_every_collective(ctx, comm, seed)) return rc;
    weftCommDestroy(comm);
    return 0;
  }, options(30));
  for (int r = 0; r < 4; r++) EXPECT_EQ(status[r], 0) << "rank " << r;
}

// Host 1's ranks may listen on loopback only (WEFT_SOCKET_IFNAME==lo, as
// weftrun sets for one host): every rank's init fails at once, naming the
// first such rank and loopback, instead of taking it for gone.
TEST_F(TwoHosts, LoopbackListenerOnAnotherHostIsNamed) {
  RunOptions o = options(20);
  o.env_of = [](int rank) { return rank >= 2 ? EnvList{{"WEFT_SOCKET_IFNAME", "=lo"}} : EnvList{}; };
  o.allow_warnings = true;
  auto status = run_ranks(4, [&](const RankCtx &ctx) {
    weftComm_t comm;
    const double t0 = now_s();
    if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) == weftSuccess)
      return rank_fail(ctx, "init succeeded across hosts with a loopback listener");
    const std::string text = weftGetLastError(nullptr);
    printf("rank %d: %.2f s: %s\n", ctx.rank, now_s() - t0, text.c_str());
    if (text.find("rank 2 ") == std::string::npos || text.find("loopback") == std::string::npos)
      return rank_fail(ctx, "the error does not name rank 2 and loopback: %s", text.c_str());
    if (now_s() - t0 > 10) return rank_fail(ctx, "the error took %.1f s", now_s() - t0);
    return 0;
  }, o);
  for (int r = 0; r < 4; r++) EXPECT_EQ(status[r], 0) << "rank " << r;
}

// The link between the hosts goes down while all-reduces run back to back:
// every rank gets an error within WEFT_TIMEOUT, none hangs.
TEST_F(TwoHosts, LinkDownGivesEveryRankAnError) {
  const int timeout_s = 4;
  std::string down = "ip netns exec " + ns[0] + " ip link set " + veth[0] + " down";
  pid_t cutter = fork();
  if (cutter == 0) {
    sleep(2);  // long after init, in the middle of the stream of all-reduces
    _exit(sh(down));
  }
  auto status = run_ranks(4, [&](const RankCtx &ctx) {
    weftComm_t comm;
    if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
      return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
    std::vector<float> buf(1 << 18, 1.0f);
    double start = now_s(), call_start = 0;
    weftResult_t res = weftSuccess;
    while (res == weftSuccess && now_s() - start < 30) {
      call_start = now_s();
      res = weftAllReduce(buf.data(), buf.data(), buf.size(), weftFloat32, weftAvg, comm, nullptr);
    }
    double took = now_s() - call_start;
    if (res == weftSuccess) return rank_fail(ctx, "no error 30 s after the link went down");
    printf("rank %d: error after %.2f s in the failing call: %s\n", ctx.rank, took,
           weftGetLastError(comm));
    if (took > timeout_s + 2) return rank_fail(ctx, "the error took %.1f s", took);
    weftCommAbort(comm);
    return 0;
  }, options(timeout_s));
  int cut_status = 0;
  ASSERT_EQ(waitpid(cutter, &cut_status, 0), cutter);
  ASSERT_TRUE(WIFEXITED(cut_status) && WEXITSTATUS(cut_status) == 0) << "could not take the link down";
  for (int r = 0; r < 4; r++) EXPECT_EQ(status[r], 0) << "rank " << r;
}

}  // namespace
