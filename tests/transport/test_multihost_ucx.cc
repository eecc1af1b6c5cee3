// Three simulated hosts: network namespaces on one bridge (in a fourth
// namespace), two ranks in each. Shared memory inside a host, UCX over TCP
// between them (UCX_TLS=tcp, UCX_NET_DEVICES=weft0). Needs root, ip and a
// build with UCX; skipped with the reason otherwise.
#include <gtest/gtest.h>

#include <signal.h>
#include <sched.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <dirent.h>

#include <fstream>
#include <string>
#include <vector>

#include "collectives/coll_ref.h"
#include "harness.h"
#include "weft_build_config.h"

using namespace weft_test;

namespace {

int sh(const std::string &cmd) { return system((cmd + " >/dev/null 2>&1").c_str()); }

// UCX finds network devices under /sys/class/net, which shows the namespace
// that mounted it: a rank that entered its host's namespace mounts a sysfs of
// its own in a private mount namespace, as "ip netns exec" does.
bool see_own_netns_devices() {
  return unshare(CLONE_NEWNS) == 0 && mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) == 0 &&
         umount2("/sys", MNT_DETACH) == 0 && mount("sysfs", "/sys", "sysfs", 0, nullptr) == 0;
}

const int kHosts = 3, kRanksPerHost = 2, kRanks = kHosts * kRanksPerHost;

class ThreeHosts : public testing::Test {
 protected:
  void SetUp() override {
    if (!WEFT_HAVE_UCX) GTEST_SKIP() << "weft was built without UCX (libucx-dev)";
    if (geteuid() != 0) GTEST_SKIP() << "needs root to create network namespaces";
    if (sh("command -v ip") != 0) GTEST_SKIP() << "needs the ip tool (iproute2)";
    tag = std::to_string(getpid() % 100000);
    sw = "weft-sw-" + tag;
    bool ok = sh("ip netns add " + sw) == 0 &&
              sh("ip netns exec " + sw + " ip link add br0 type bridge") == 0 &&
              sh("ip netns exec " + sw + " ip link set br0 up") == 0;
    for (int h = 0; ok && h < kHosts; h++) {
      ns[h] = "weft-u" + std::to_string(h) + "-" + tag;
      std::string in = "ip netns exec " + ns[h] + " ";
      std::string port = "wu" + std::to_string(h) + "-" + tag;
      // the host's end is called weft0 in every namespace: one UCX_NET_DEVICES for all
      ok = sh("ip netns add " + ns[h]) == 0 &&
           sh("ip link add " + port + " netns " + sw + " type veth peer name weft0 netns " +
              ns[h]) == 0 &&
           sh("ip netns exec " + sw + " ip link set " + port + " master br0") == 0 &&
           sh("ip netns exec " + sw + " ip link set " + port + " up") == 0 &&
           sh(in + "ip link set lo up") == 0 &&
           sh(in + "ip addr add 10.252." + std::to_string(std::stoi(tag) % 250) + "." +
              std::to_string(h + 1) + "/24 dev weft0") == 0 &&
           sh(in + "ip link set weft0 up") == 0;
    }
    if (!ok) {
      TearDown();
      GTEST_SKIP() << "could not create namespaces, veth pairs and a bridge here";
    }
  }
  void TearDown() override {
    for (int h = 0; h < kHosts; h++)
      if (!ns[h].empty()) sh("ip netns del " + ns[h]);
    if (!sw.empty()) sh("ip netns del " + sw);
  }
  RunOptions options(int timeout_s) {
    RunOptions o;
    o.timeout_s = 120;
    for (int r = 0; r < kRanks; r++) o.netns.push_back(ns[r / kRanksPerHost]);
    o.env = {{"WEFT_TIMEOUT", std::to_string(timeout_s)},
             {"WEFT_TRANSPORT", ""},  // unset: shm inside a host, UCX between hosts
             {"WEFT_SLOT_BYTES", "4096"},
             {"UCX_TLS", "tcp"},
             {"UCX_NET_DEVICES", "weft0"}};
    return o;
  }
  std::string tag, sw, ns[kHosts];
};

// Every collective is correct across the three hosts.
TEST_F(ThreeHosts, AllCollectivesCorrect) {
  const uint64_t seed = test_seed();
  auto status = run_ranks(kRanks, [&](const RankCtx &ctx) {
    if (!see_own_netns_devices()) return rank_fail(ctx, "mounting /sys: %m");
    weftComm_t comm;
    if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
      return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
    // every rank has one ring hop to another host: over UCX, not sockets
    int ucx = count_threads_named("weft-ucx"), sock = count_threads_named("weft-sock");
    if (ucx != 1 || sock != 0)
      return rank_fail(ctx, "%d ucx and %d socket proxy threads, want 1 and 0", ucx, sock);
    if (int rc = check_every_collective(ctx, comm, seed)) return rc;
    weftCommDestroy(comm);
    return 0;
  }, options(30));
  for (int r = 0; r < kRanks; r++) EXPECT_EQ(status[r], 0) << "rank " << r;
}

// Host 2 turns UCX off (WEFT_UCX_DISABLE=1, and a UCX_TLS that cannot work
// there, as on a host whose HCA is broken): its ranks touch no UCX, whichever
// end of a connection chooses the transport (its peers choose sockets to it),
// and every collective is still correct.
TEST_F(ThreeHosts, TransportOffOnOneHostIsOffForItsPeersToo) {
  const uint64_t seed = test_seed();
  RunOptions o = options(30);
  o.env_of = [](int rank) {
    return rank / kRanksPerHost == 2 ? EnvList{{"WEFT_UCX_DISABLE", "1"}, {"UCX_TLS", "rc_x"}}
                                     : EnvList{};
  };
  auto status = run_ranks(kRanks, [&](const RankCtx &ctx) {
    if (!see_own_netns_devices()) return rank_fail(ctx, "mounting /sys: %m");
    weftComm_t comm;
    if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
      return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
    if (int rc = check_every_collective(ctx, comm, seed)) return rc;
    const int ucx = count_threads_named("weft-ucx"), sock = count_threads_named("weft-sock");
    if (ctx.rank / kRanksPerHost == 2 && (ucx != 0 || sock == 0))
      return rank_fail(ctx, "UCX is off here, yet %d ucx and %d socket proxy threads", ucx, sock);
    weftCommDestroy(comm);
    return 0;
  }, o);
  for (int r = 0; r < kRanks; r++) EXPECT_EQ(status[r], 0) << "rank " << r;
}

// Host 0's link to the bridge goes down while all-reduces run back to back:
// every rank gets an error within WEFT_TIMEOUT, none hangs.
TEST_F(ThreeHosts, LinkDownGivesEveryRankAnError) {
  const int timeout_s = 4;
  std::string down = "ip netns exec " + ns[0] + " ip link set weft0 down";
  pid_t cutter = fork();
  if (cutter == 0) {
    sleep(2);  // long after init, in the middle of the stream of all-reduces
    _exit(sh(down));
  }
  auto status = run_ranks(kRanks, [&](const RankCtx &ctx) {
    if (!see_own_netns_devices()) return rank_fail(ctx, "mounting /sys: %m");
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
  for (int r = 0; r < kRanks; r++) EXPECT_EQ(status[r], 0) << "rank " << r;
}

}  // namespace
