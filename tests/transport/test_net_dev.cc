// Device network connections without a GPU: each rank pretends to be on a
// host of its own, makes device network connections (FIFOs in the device's
// reach, kernels' ctrl layout, whole slots) over the socket or UCX transport
// through the proxy core, and a host thread emulating the kernel's slot
// protocol (dev_emu.h) exchanges random data of odd sizes in both ring
// directions. A rank killed mid-stream gives every other rank an error
// through the proxy's poison, well inside the timeout. The same runs between
// network-namespace hosts (root only), where a link cut mid-stream gives
// every rank an error within the timeout. WEFT_NET_GDR is parsed, logged and
// checked.
#include <gtest/gtest.h>

#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <algorithm>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "harness.h"
#include "transport/dev_emu.h"

extern "C" {
#include "collectives/api/config.h"
#include "transport/bootstrap/bootstrap.h"
#include "transport/base/log.h"
#include "transport/base/param.h"
#include "transport/proxy.h"
#include "transport/base/wait.h"
#include "transport/base/status.h"
#include "transport/transport.h"
#include "weft_build_config.h"
extern const struct weft_transport socket_transport;
#if WEFT_HAVE_UCX
extern const struct weft_transport ucx_transport;
#endif
}

using namespace weft_test;

namespace {

// the kernels read the proxy's ctrl page as their own
static_assert(offsetof(dev_fifo_ctrl, tail) == offsetof(conn_ctrl, tail), "tail offset");
static_assert(offsetof(dev_fifo_ctrl, head) == offsetof(conn_ctrl, head), "head offset");

const uint32_t kDirs = 2;  // the ring forward and backward: both directions of every pair

// A test named by its transport.
std::string transport_param(const testing::TestParamInfo<const char *> &i) { return i.param; }

const weft_transport *transport_named(const std::string &name) {
#if WEFT_HAVE_UCX
  if (name == "ucx") return &ucx_transport;
#endif
  return name == "socket" ? &socket_transport : nullptr;
}

// One rank's device network connections: per direction, a send end to the
// next rank and a receive end from the previous one.
struct Rank {
  bootstrap *bs = nullptr;
  std::vector<peer_info> peers;
  weft_conn send[kDirs] = {}, recv[kDirs] = {};
  const weft_transport *t = nullptr;

  ~Rank() {
    for (uint32_t d = 0; d < kDirs; d++) {
      if (send[d].transport != nullptr) send[d].transport->close(&send[d]);
      if (recv[d].transport != nullptr) recv[d].transport->close(&recv[d]);
    }
    if (bs != nullptr) bootstrap_close(bs);
  }

  int neighbour(const RankCtx &ctx, uint32_t dir, int ahead) const {
    int step = (dir == 0) == (ahead > 0) ? 1 : -1;
    return (ctx.rank + step + ctx.nranks) % ctx.nranks;
  }

  void conn_init(weft_conn *c, int peer, uint32_t nslots, size_t slot_nbytes,
                 const proxy_fifo_mem *mem) {
    memset(c, 0, sizeof *c);
    c->nslots = nslots;
    c->slot_nbytes = slot_nbytes;
    c->peer_rank = peer;
    c->bs = bs;
    c->peer_pid = 0;  // another host
    c->fifo_mem = mem;
  }

  // Joins the job and connects both rings, as the channels do: receive ends,
  // blobs all-gathered, send ends, barrier, receive ends connected; then a
  // barrier.
  // device_fifos false: host FIFOs (a host-memory connection), which no
  // emulated kernel can use.
  int connect(const RankCtx &ctx, const std::string &tname, uint32_t nslots, size_t slot_nbytes,
              bool device_fifos = true) {
    t = transport_named(tname);
    if (t == nullptr) return rank_fail(ctx, "no transport %s", tname.c_str());
    bootstrap_id id;
    memcpy(&id, ctx.id.internal, sizeof id);
    peer_info self;
    memset(&self, 0, sizeof self);
    bootstrap_peer_info_local(&self);
    self.rank = ctx.rank;
    self.cuda_dev = -1;
    peers.resize(ctx.nranks);
    if (bootstrap_init(&id, ctx.rank, ctx.nranks, &self, 30000000000ull, &bs, peers.data()) !=
        weftSuccess)
      return rank_fail(ctx, "bootstrap: %s", weft_error_text());
    if (peers[0].host_hash == peers[ctx.nranks - 1].host_hash)
      return rank_fail(ctx, "ranks share a host: the emulated hosts did not take");
    const proxy_fifo_mem *mem = nullptr;
    if (device_fifos && net_dev_fifo_mem(1, &mem) != weftSuccess)
      return rank_fail(ctx, "fifo memory: %s", weft_error_text());
    std::vector<conn_blob> blobs((size_t)ctx.nranks * kDirs);
    for (uint32_t d = 0; d < kDirs; d++) {
      conn_init(&recv[d], neighbour(ctx, d, -1), nslots, slot_nbytes, mem);
      recv[d].transport = t;
      conn_blob *mine = &blobs[(size_t)ctx.rank * kDirs + d];
      if (t->recv_setup(&recv[d], mine) != weftSuccess) {
        recv[d].transport = nullptr;
        return rank_fail(ctx, "recv_setup: %s", weft_error_text());
      }
    }
    if (bootstrap_allgather(bs, blobs.data(), sizeof(conn_blob) * kDirs) != weftSuccess)
      return rank_fail(ctx, "allgather: %s", weft_error_text());
    for (uint32_t d = 0; d < kDirs; d++) {
      int next = neighbour(ctx, d, 1);
      conn_init(&send[d], next, nslots, slot_nbytes, mem);
      send[d].transport = t;
      if (t->send_connect(&send[d], &blobs[(size_t)next * kDirs + d]) != weftSuccess) {
        send[d].transport = nullptr;
        return rank_fail(ctx, "send_connect: %s", weft_error_text());
      }
    }
    if (bootstrap_barrier(bs) != weftSuccess) return rank_fail(ctx, "barrier");
    for (uint32_t d = 0; d < kDirs; d++)
      if (t->recv_connect(&recv[d]) != weftSuccess) {
        recv[d].transport = nullptr;  // closed by the transport on failure
        return rank_fail(ctx, "recv_connect: %s", weft_error_text());
      }
    // every end connected on every rank before any data moves: a rank that
    // dies in the failure tests then dies mid-transfer, not while a peer
    // still sets up its connection to it
    if (bootstrap_barrier(bs) != weftSuccess) return rank_fail(ctx, "barrier after connecting");
    return 0;
  }

  bool any_failed() const {
    for (uint32_t d = 0; d < kDirs; d++)
      if (net_dev_conn_failed(&send[d]) || net_dev_conn_failed(&recv[d])) return true;
    return false;
  }
};

// What rank r sends in direction d in round k: an odd size around a few
// slots (0 and 1 byte too), known to the receiver.
size_t msg_nbytes(uint64_t seed, int r, uint32_t d, int k, size_t slot_nbytes) {
  Rng rng(seed ^ ((uint64_t)r << 40) ^ ((uint64_t)d << 32) ^ (uint64_t)k);
  uint64_t pick = rng.next() % 8;
  if (pick == 0) return 0;
  if (pick == 1) return 1;
  return (size_t)(rng.next() % (slot_nbytes * 5)) | 1u;
}

void msg_fill(uint64_t seed, int r, uint32_t d, int k, std::vector<char> &buf) {
  Rng rng(seed * 31 + (uint64_t)r * 7919 + d * 104729 + (uint64_t)k);
  for (char &b : buf) b = (char)rng.next();
}

struct ExchangeCase {
  const char *transport;
  int nranks;
  uint32_t nslots;
  size_t slot_nbytes;
  int nsocks = 0; // WEFT_SOCKET_NSOCKS when set: 8 makes the proxy poll its idle sockets at once
};

std::string case_name(const testing::TestParamInfo<ExchangeCase> &info) {
  const ExchangeCase &c = info.param;
  return std::string(c.transport) + "_hosts" + std::to_string(c.nranks) + "_slot" +
         std::to_string(c.slot_nbytes) + "x" + std::to_string(c.nslots) +
         (c.nsocks ? "_socks" + std::to_string(c.nsocks) : "");
}

// With own_hosts, every rank is an emulated host of its own.
RunOptions options(const char *transport, int timeout_s, bool own_hosts = false) {
  RunOptions o;
  if (own_hosts) o.host_of = one_host_per_rank("net-dev-test-host");
  o.timeout_s = 120;
  o.env = {{"WEFT_TIMEOUT", std::to_string(timeout_s)}};
  if (std::string(transport) == "ucx") o.env.push_back({"UCX_TLS", "tcp"});
  return o;
}

RunOptions exchange_options(const ExchangeCase &c) {
  RunOptions o = options(c.transport, 30, true);
  if (c.nsocks > 0) o.env.push_back({"WEFT_SOCKET_NSOCKS", std::to_string(c.nsocks)});
  return o;
}

class NetDevExchange : public testing::TestWithParam<ExchangeCase> {};

// Random data of odd sizes both ways around the ring, several rounds (the
// FIFO's steps carry on, as from one launch to the next); every byte checked,
// nothing written past a message.
TEST_P(NetDevExchange, RandomOddSizesBothDirections) {
  const ExchangeCase c = GetParam();
  if (transport_named(c.transport) == nullptr) GTEST_SKIP() << c.transport << " not built in";
  const uint64_t seed = test_seed();
  auto status = run_ranks(c.nranks, [&](const RankCtx &ctx) {
    Rank rk;
    if (int rc = rk.connect(ctx, c.transport, c.nslots, c.slot_nbytes)) return rc;
    net_dev_fifo views[2][kDirs];
    for (uint32_t d = 0; d < kDirs; d++)
      if (net_dev_conn_fifo(&rk.send[d], &views[0][d]) != weftSuccess ||
          net_dev_conn_fifo(&rk.recv[d], &views[1][d]) != weftSuccess)
        return rank_fail(ctx, "fifo view: %s", weft_error_text());
    std::vector<EmuFifo> fifos;
    fifos.reserve(2 * kDirs);
    for (uint32_t d = 0; d < kDirs; d++) {
      fifos.emplace_back(views[0][d]);
      fifos.emplace_back(views[1][d]);
    }
    for (int k = 0; k < 4; k++) {
      std::vector<std::vector<char>> out(kDirs), in(kDirs);
      std::vector<EmuMsg> msgs;
      for (uint32_t d = 0; d < kDirs; d++) {
        out[d].resize(msg_nbytes(seed, ctx.rank, d, k, c.slot_nbytes));
        msg_fill(seed, ctx.rank, d, k, out[d]);
        int prev = rk.neighbour(ctx, d, -1);
        size_t want = msg_nbytes(seed, prev, d, k, c.slot_nbytes);
        in[d].assign(want + 64, (char)0xa5);  // poisoned, with a guard past the end
        msgs.push_back(EmuMsg{&fifos[2 * d], true, out[d].data(), out[d].size()});
        msgs.push_back(EmuMsg{&fifos[2 * d + 1], false, in[d].data(), want});
      }
      EmuResult r = emu_kernel_run(msgs, [&] { return rk.any_failed(); }, 20000000000ull);
      if (r != EMU_OK) return rank_fail(ctx, "round %d: emulated kernel gave up (%d)", k, (int)r);
      for (uint32_t d = 0; d < kDirs; d++) {
        int prev = rk.neighbour(ctx, d, -1);
        std::vector<char> expect(msg_nbytes(seed, prev, d, k, c.slot_nbytes));
        msg_fill(seed, prev, d, k, expect);
        if (memcmp(in[d].data(), expect.data(), expect.size()) != 0)
          return rank_fail(ctx, "round %d dir %u: data from rank %d differs", k, d, prev);
        for (size_t i = expect.size(); i < in[d].size(); i++)
          if (in[d][i] != (char)0xa5)
            return rank_fail(ctx, "round %d dir %u: byte %zu past the message written", k, d, i);
      }
    }
    // every rank done, none closed yet: no connection may have failed
    if (bootstrap_barrier(rk.bs) != weftSuccess) return rank_fail(ctx, "barrier");
    if (rk.any_failed()) return rank_fail(ctx, "a connection failed during the exchange");
    if (bootstrap_barrier(rk.bs) != weftSuccess) return rank_fail(ctx, "barrier");
    return 0;
  }, exchange_options(c));
  for (int r = 0; r < c.nranks; r++) EXPECT_EQ(status[r], 0) << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(
    NetDev, NetDevExchange,
    testing::Values(ExchangeCase{"socket", 2, 4, 4096}, ExchangeCase{"socket", 3, 2, 1000},
                    ExchangeCase{"socket", 3, 3, 1000, 8}, ExchangeCase{"ucx", 2, 3, 4096},
                    ExchangeCase{"ucx", 3, 4, 1000}),
    case_name);

// A GPU kernel fills a network FIFO's slots without telling the host, and an
// idle proxy sleeps between polls (up to 2 ms for sockets, 1 ms for UCX), so
// the device executor kicks the proxies of a comm's network connections
// before each launch (net_dev_conn_kick). A kicked proxy does not sleep until
// its window ends, then sleeps again. Printed, not judged: a one-slot
// ping-pong after each idle spell, kicked and not.
class NetDevKick : public testing::TestWithParam<const char *> {};

uint64_t sleeps_of(proxy *p) { return __atomic_load_n(&p->sleeps, __ATOMIC_RELAXED); }

TEST_P(NetDevKick, KickedProxyPollsWithoutSleeping) {
  const char *tname = GetParam();
  if (transport_named(tname) == nullptr) GTEST_SKIP() << tname << " not built in";
  auto status = run_ranks(2, [&](const RankCtx &ctx) {
    Rank rk;
    if (int rc = rk.connect(ctx, tname, 4, 4096)) return rc;
    proxy *p = static_cast<proxy_conn *>(rk.send[0].priv)->proxy;
    if (p == nullptr) return rank_fail(ctx, "the connection has no proxy thread");
    weft_conn none;
    memset(&none, 0, sizeof none);
    net_dev_conn_kick(&none);  // no network connection: nothing to kick
    usleep(100000);            // idle: the thread sleeps, a little longer each time
    uint64_t s0 = sleeps_of(p);
    proxy_kick(p, 2000000000ull);
    usleep(300000);
    uint64_t s1 = sleeps_of(p);
    if (s1 - s0 > 1)  // one may have begun as the kick came; the kick ends it
      return rank_fail(ctx, "kicked for 2 s, the thread slept %llu times in 0.3 s",
                       (unsigned long long)(s1 - s0));
    usleep(2000000);
    if (sleeps_of(p) == s1) return rank_fail(ctx, "the thread never slept after its window");
    uint64_t now = clock_ns();
    net_dev_conn_kick(&rk.recv[1]);
    proxy *q = static_cast<proxy_conn *>(rk.recv[1].priv)->proxy;
    if (__atomic_load_n(&q->busy_until_ns, __ATOMIC_RELAXED) < now + NET_DEV_KICK_NS / 2)
      return rank_fail(ctx, "net_dev_conn_kick set no window");

    // rank 0 sends 8 bytes forward, rank 1 sends them back
    net_dev_fifo v[4];
    if (net_dev_conn_fifo(&rk.send[0], &v[0]) != weftSuccess ||
        net_dev_conn_fifo(&rk.recv[0], &v[1]) != weftSuccess ||
        net_dev_conn_fifo(&rk.send[1], &v[2]) != weftSuccess ||
        net_dev_conn_fifo(&rk.recv[1], &v[3]) != weftSuccess)
      return rank_fail(ctx, "fifo view: %s", weft_error_text());
    std::vector<EmuFifo> f(v, v + 4);
    auto failed = [&] { return rk.any_failed(); };
    double median_us[2];
    for (int kick = 0; kick < 2; kick++) {
      std::vector<double> us;
      for (int i = 0; i < 15; i++) {
        if (bootstrap_barrier(rk.bs) != weftSuccess) return rank_fail(ctx, "barrier");
        usleep(20000);
        if (kick)
          for (weft_conn *c : {&rk.send[0], &rk.recv[0], &rk.send[1], &rk.recv[1]})
            net_dev_conn_kick(c);
        uint64_t word = 0x5eed0000ull + (uint64_t)(kick * 100 + i), got = 0, t0 = clock_ns();
        std::vector<EmuMsg> out{EmuMsg{&f[ctx.rank == 0 ? 0 : 2], true, (char *)&word, 8}};
        std::vector<EmuMsg> in{EmuMsg{&f[ctx.rank == 0 ? 3 : 1], false, (char *)&got, 8}};
        EmuResult r = ctx.rank == 0 ? emu_kernel_run(out, failed, 20000000000ull) : EMU_OK;
        if (r == EMU_OK) r = emu_kernel_run(in, failed, 20000000000ull);
        if (r == EMU_OK && ctx.rank == 1) {
          word = got;
          r = emu_kernel_run(out, failed, 20000000000ull);
        }
        if (r != EMU_OK) return rank_fail(ctx, "round %d: emulated kernel gave up (%d)", i, (int)r);
        if (got != word) return rank_fail(ctx, "round %d: got %llx", i, (unsigned long long)got);
        us.push_back((double)(clock_ns() - t0) / 1e3);
      }
      std::sort(us.begin(), us.end());
      median_us[kick] = us[us.size() / 2];
    }
    if (ctx.rank == 0)
      printf("%s, 2 emulated hosts: one-slot ping-pong after 20 ms idle, median of 15: "
             "%.1f us, %.1f us kicked\n", tname, median_us[0], median_us[1]);
    if (bootstrap_barrier(rk.bs) != weftSuccess) return rank_fail(ctx, "barrier");
    return 0;
  }, options(tname, 30, true));
  for (int r = 0; r < 2; r++) EXPECT_EQ(status[r], 0) << "rank " << r;
}

// A kernel may start long after its launch (queued behind other work on its
// stream), past any kick's window: its proxy would be asleep, up to its
// longest sleep, when the kernel fills a slot (sender) or drains one, whose
// credit is to go back (receiver). The launch announces the slots its kernel
// fills or drains (net_dev_conn_expect), and the proxy does not sleep until
// they were, however late, then sleeps again once idle. Rank 0's kernel
// sends one slot 220 ms after its announcement; rank 1's drains it 200 ms
// after that.
TEST_P(NetDevKick, AnnouncedSlotsKeepTheProxyUpUntilDone) {
  const char *tname = GetParam();
  if (transport_named(tname) == nullptr) GTEST_SKIP() << tname << " not built in";
  auto status = run_ranks(2, [&](const RankCtx &ctx) {
    Rank rk;
    if (int rc = rk.connect(ctx, tname, 4, 4096)) return rc;
    net_dev_fifo v;
    weft_conn *mine = ctx.rank == 0 ? &rk.send[0] : &rk.recv[0];
    if (net_dev_conn_fifo(mine, &v) != weftSuccess)
      return rank_fail(ctx, "fifo view: %s", weft_error_text());
    EmuFifo f(v);
    proxy *p = static_cast<proxy_conn *>(mine->priv)->proxy;
    if (p == nullptr) return rank_fail(ctx, "the connection has no proxy thread");
    auto failed = [&] { return rk.any_failed(); };
    auto awake = [&](uint64_t since, const char *when) {
      uint64_t n = sleeps_of(p) - since;  // one may have begun as the announcement came
      if (n > 1) rank_fail(ctx, "%s, the thread slept %llu times", when, (unsigned long long)n);
      return n <= 1;
    };
    weft_conn none;
    memset(&none, 0, sizeof none);
    net_dev_conn_expect(&none, 1);  // no network connection: nothing to announce
    usleep(100000);                 // idle: the thread sleeps
    net_dev_conn_expect(mine, 1);
    uint64_t s0 = sleeps_of(p);
    usleep(2 * NET_DEV_KICK_NS / 1000 + 200000);  // the kernels start late
    if (!awake(s0, "a slot was announced, and before it was filled")) return 1;
    uint64_t word = 0xfeed5eedull, got = 0;
    if (ctx.rank == 0) {
      std::vector<EmuMsg> out{EmuMsg{&f, true, (char *)&word, 8}};
      if (EmuResult r = emu_kernel_run(out, failed, 20000000000ull))
        return rank_fail(ctx, "emulated kernel gave up (%d)", (int)r);
      if (bootstrap_barrier(rk.bs) != weftSuccess) return rank_fail(ctx, "barrier");
    } else {
      if (bootstrap_barrier(rk.bs) != weftSuccess) return rank_fail(ctx, "barrier");
      usleep(200000);  // the slot waits in the FIFO for a kernel that starts later still
      if (!awake(s0, "a slot to drain was announced, and before it was drained")) return 1;
      std::vector<EmuMsg> in{EmuMsg{&f, false, (char *)&got, 8}};
      if (EmuResult r = emu_kernel_run(in, failed, 20000000000ull))
        return rank_fail(ctx, "emulated kernel gave up (%d)", (int)r);
      if (got != word) return rank_fail(ctx, "got %llx", (unsigned long long)got);
    }
    if (bootstrap_barrier(rk.bs) != weftSuccess) return rank_fail(ctx, "barrier");
    uint64_t s1 = sleeps_of(p);
    usleep(300000);
    if (sleeps_of(p) == s1) return rank_fail(ctx, "the thread never slept once its slot went");
    return 0;
  }, options(tname, 30, true));
  for (int r = 0; r < 2; r++) EXPECT_EQ(status[r], 0) << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(NetDev, NetDevKick, testing::Values("socket", "ucx"), transport_param);

// A GPU fills a device network FIFO while its rank's thread waits on the GPU
// (spinning, as CUDA's synchronizations do by default) and never drives the
// proxy. Pinned with its rank to one CPU, as weftrun pins UCX ranks, the
// proxy ran only when the scheduler took that CPU from the spinner: about
// 11 ms a ring step on a GPU machine. Each rank here is pinned to a CPU of
// its own before it connects (the proxy thread starts pinned there too):
// with device FIFOs the proxy leaves that CPU; with host FIFOs only a UCX
// proxy stays (a UCX rank drives its passes itself while it waits). The
// socket proxy leaves a one-CPU rank whatever it serves; UCX's is the case
// the rule decides. (The time itself shows on a machine with CPUs to spare,
// not on two.)
class NetDevProxyCpu : public testing::TestWithParam<const char *> {};

// The fewest CPUs any thread of this process whose name starts with prefix
// may run on; -1 when there is no such thread.
int thread_ncpus(const char *prefix) {
  std::vector<pid_t> tids;
  int n = -1;
  cpu_set_t set;
  if (!threads_named(prefix, &tids)) return -1;
  for (pid_t tid : tids)
    if (sched_getaffinity(tid, sizeof set, &set) == 0 && (n < 0 || CPU_COUNT(&set) < n))
      n = CPU_COUNT(&set);
  return n;
}

TEST_P(NetDevProxyCpu, DeviceFifosTakeTheProxyOffTheRanksCpu) {
  const char *tname = GetParam();
  if (transport_named(tname) == nullptr) GTEST_SKIP() << tname << " not built in";
  cpu_set_t mine;
  ASSERT_EQ(sched_getaffinity(0, sizeof mine, &mine), 0);
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; c++)
    if (CPU_ISSET(c, &mine)) cpus.push_back(c);
  if (cpus.size() < 2) GTEST_SKIP() << "one CPU: nowhere for the proxy to go";
  const std::string thread = "weft-" + std::string(tname).substr(0, 4) + "-"; // its proxies
  for (bool device : {true, false}) {
    SCOPED_TRACE(device ? "device FIFOs" : "host FIFOs");
    auto status = run_ranks(2, [&](const RankCtx &ctx) {
      cpu_set_t one;
      CPU_ZERO(&one);
      CPU_SET(cpus[(size_t)ctx.rank % cpus.size()], &one);
      if (sched_setaffinity(0, sizeof one, &one) != 0) return rank_fail(ctx, "pinning the rank");
      Rank rk;
      if (int rc = rk.connect(ctx, tname, 4, 4096, device)) return rc;
      const bool stays = !device && std::string(tname) == "ucx";
      int n = -1;
      // the thread moves on its next pass; one that stays is watched for 0.2 s
      for (int i = 0; i < (stays ? 20 : 200); i++) {
        n = thread_ncpus(thread.c_str());
        if (n < 0) return rank_fail(ctx, "no thread named %s*", thread.c_str());
        if (n > 1 && !stays) break;
        usleep(10000);
      }
      if (stays && n != 1) return rank_fail(ctx, "host FIFOs: the proxy left the rank's CPU");
      if (!stays && n < 2)
        return rank_fail(ctx, "the proxy of %s FIFOs shares the rank's one CPU",
                         device ? "device" : "host");
      return bootstrap_barrier(rk.bs) == weftSuccess ? 0 : 1;
    }, options(tname, 30, true));
    for (int r = 0; r < 2; r++) EXPECT_EQ(status[r], 0) << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(NetDev, NetDevProxyCpu, testing::Values("socket", "ucx"),
                         transport_param);

class NetDevFailure : public testing::TestWithParam<ExchangeCase> {};

// The last rank dies (SIGKILL) after a few slots of a long message: every
// other rank's emulated kernel gives up through the poison its proxy set,
// well before the kernel's own timeout and inside WEFT_TIMEOUT. host_watch:
// the host side raises the abort flag (EMU_ABORTED), unless the proxy's
// poison reached the kernel first (EMU_POISONED: both paths race, and either
// ends it in time); otherwise the kernel sees the poison word of its FIFOs
// itself (EMU_POISONED), as on a GPU.
void killed_peer_case(const ExchangeCase &c, bool host_watch) {
  const int timeout_s = 20;
  auto status = run_ranks(c.nranks, [&](const RankCtx &ctx) {
    Rank rk;
    if (int rc = rk.connect(ctx, c.transport, c.nslots, c.slot_nbytes)) return rc;
    std::vector<EmuFifo> fifos;
    fifos.reserve(2 * kDirs);
    for (uint32_t d = 0; d < kDirs; d++) {
      net_dev_fifo s, r;
      if (net_dev_conn_fifo(&rk.send[d], &s) != weftSuccess ||
          net_dev_conn_fifo(&rk.recv[d], &r) != weftSuccess)
        return rank_fail(ctx, "fifo view: %s", weft_error_text());
      fifos.emplace_back(s);
      fifos.emplace_back(r);
    }
    const size_t nbytes = c.slot_nbytes * 64 + 3;  // far more than the FIFO holds
    std::vector<std::vector<char>> out(kDirs, std::vector<char>(nbytes, 7)),
        in(kDirs, std::vector<char>(nbytes));
    std::vector<EmuMsg> msgs;
    const bool victim = ctx.rank == ctx.nranks - 1;
    for (uint32_t d = 0; d < kDirs; d++) {
      msgs.push_back(EmuMsg{&fifos[2 * d], true, out[d].data(), nbytes});
      if (victim)
        msgs.back().after_slot = [&](size_t done) {
          if (done >= c.slot_nbytes * 3) raise(SIGKILL);
        };
      msgs.push_back(EmuMsg{&fifos[2 * d + 1], false, in[d].data(), nbytes});
    }
    double t0 = now_s();
    // the kernel's own timeout lies past the test's bound: only the poison can end it in time
    EmuResult r = emu_kernel_run(
        msgs, [&] { return host_watch && rk.any_failed(); }, 60000000000ull);
    double waited = now_s() - t0;
    if (victim) return rank_fail(ctx, "the victim lived on");
    if (r != EMU_POISONED && !(host_watch && r == EMU_ABORTED))
      return rank_fail(ctx, "emulated kernel ended with %d, want %d%s", (int)r, (int)EMU_POISONED,
                       host_watch ? " or 1 (aborted)" : "");
    if (waited > timeout_s / 2.0)
      return rank_fail(ctx, "the error took %.1f s (WEFT_TIMEOUT %d s)", waited, timeout_s);
    return 0;
  }, options(c.transport, timeout_s, true));
  for (int r = 0; r + 1 < c.nranks; r++) EXPECT_EQ(status[r], 0) << "rank " << r;
  EXPECT_EQ(status[c.nranks - 1], 128 + SIGKILL) << "the victim";
}

TEST_P(NetDevFailure, KilledPeerGivesEveryRankAnError) {
  if (transport_named(GetParam().transport) == nullptr) GTEST_SKIP() << "not built in";
  killed_peer_case(GetParam(), true);
}

// No host watcher: the proxy's poison reaches the kernel's poison word.
TEST_P(NetDevFailure, KilledPeerPoisonsTheKernelsFifo) {
  if (transport_named(GetParam().transport) == nullptr) GTEST_SKIP() << "not built in";
  killed_peer_case(GetParam(), false);
}

INSTANTIATE_TEST_SUITE_P(
    NetDev, NetDevFailure,
    testing::Values(ExchangeCase{"socket", 2, 4, 4096}, ExchangeCase{"socket", 3, 4, 4096},
                    ExchangeCase{"ucx", 2, 4, 4096}, ExchangeCase{"ucx", 3, 4, 4096}),
    case_name);

int sh(const std::string &cmd) { return system((cmd + " >/dev/null 2>&1").c_str()); }

// Whether this namespace's weft0 is down, by what ip prints (system()'s status
// is not to be trusted in a forked rank under ASan).
bool link_is_down() {
  FILE *f = popen("ip -br link show weft0 2>/dev/null", "r");
  if (f == nullptr) return false;
  char line[256] = "";
  bool down = fgets(line, sizeof line, f) != nullptr && strstr(line, " DOWN ") != nullptr;
  pclose(f);
  return down;
}

// UCX finds network devices under /sys/class/net, which shows the namespace
// that mounted it: a rank that entered its host's namespace mounts a sysfs of
// its own in a private mount namespace, as "ip netns exec" does.
int see_own_netns_devices(const RankCtx &ctx) {
  if (unshare(CLONE_NEWNS) == 0 && mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) == 0 &&
      umount2("/sys", MNT_DETACH) == 0 && mount("sysfs", "/sys", "sysfs", 0, nullptr) == 0)
    return 0;
  return rank_fail(ctx, "mounting /sys: %m");
}

// Two hosts as network namespaces joined by a veth pair, two ranks in each
// (ranks 0 and 1 on the first): the ring crosses the link twice.
class NetDevNetns : public testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (transport_named(GetParam()) == nullptr) GTEST_SKIP() << GetParam() << " not built in";
    if (geteuid() != 0) GTEST_SKIP() << "needs root to create network namespaces";
    if (sh("command -v ip") != 0) GTEST_SKIP() << "needs the ip tool (iproute2)";
    tag = std::to_string(getpid() % 100000);
    ns[0] = "wnd-h0-" + tag;
    ns[1] = "wnd-h1-" + tag;
    // each host's end of the link is weft0: one UCX_NET_DEVICES for both
    bool ok = sh("ip netns add " + ns[0]) == 0 && sh("ip netns add " + ns[1]) == 0 &&
              sh("ip link add weft0 netns " + ns[0] + " type veth peer name weft0 netns " +
                 ns[1]) == 0;
    for (int h = 0; ok && h < 2; h++) {
      std::string in = "ip netns exec " + ns[h] + " ";
      ok = sh(in + "ip link set lo up") == 0 &&
           sh(in + "ip addr add 10.252." + tag.substr(0, 2) + "." + std::to_string(h + 1) +
              "/24 dev weft0") == 0 &&
           sh(in + "ip link set weft0 up") == 0;
    }
    // UCX leaves out a device that is not up yet: wait for both ends' carrier
    for (int h = 0; ok && h < 2; h++)
      ok = sh("ip netns exec " + ns[h] +
              " sh -c 'for i in $(seq 100); do grep -qx up /sys/class/net/weft0/operstate && "
              "exit 0; sleep 0.05; done; exit 1'") == 0;
    if (!ok) {
      TearDown();
      GTEST_SKIP() << "could not create namespaces and a veth pair here";
    }
  }
  void TearDown() override {
    if (ns[0].empty()) return;
    sh("ip netns del " + ns[0]);
    sh("ip netns del " + ns[1]);
  }
  RunOptions netns_options(int timeout_s) {
    RunOptions o = options(GetParam().c_str(), timeout_s);
    o.netns = {ns[0], ns[0], ns[1], ns[1]};
    if (GetParam() == "ucx") o.env.push_back({"UCX_NET_DEVICES", "weft0"});
    return o;
  }
  std::string tag, ns[2];
};

// Rounds of exchange around both rings until one fails or `rounds` are done.
// Returns the emulated kernel's last result and, in *round_s, how long the
// last round took. A kernel that gives up poisons its connections, as the
// device executor's host side does, so that the peers hear of it.
EmuResult exchange_rounds(const RankCtx &ctx, Rank &rk, size_t slot_nbytes, uint64_t seed,
                          int rounds, uint64_t kernel_timeout_ns, double *round_s,
                          bool host_watch = true) {
  std::vector<EmuFifo> fifos;
  fifos.reserve(2 * kDirs);
  for (uint32_t d = 0; d < kDirs; d++) {
    net_dev_fifo s, r;
    if (net_dev_conn_fifo(&rk.send[d], &s) != weftSuccess ||
        net_dev_conn_fifo(&rk.recv[d], &r) != weftSuccess)
      return EMU_ABORTED;
    fifos.emplace_back(s);
    fifos.emplace_back(r);
  }
  EmuResult r = EMU_OK;
  for (int k = 0; r == EMU_OK && k < rounds; k++) {
    std::vector<std::vector<char>> out(kDirs), in(kDirs);
    std::vector<EmuMsg> msgs;
    for (uint32_t d = 0; d < kDirs; d++) {
      out[d].resize(msg_nbytes(seed, ctx.rank, d, k, slot_nbytes) * 8);
      msg_fill(seed, ctx.rank, d, k, out[d]);
      int prev = rk.neighbour(ctx, d, -1);
      in[d].assign(msg_nbytes(seed, prev, d, k, slot_nbytes) * 8, 0);
      msgs.push_back(EmuMsg{&fifos[2 * d], true, out[d].data(), out[d].size()});
      msgs.push_back(EmuMsg{&fifos[2 * d + 1], false, in[d].data(), in[d].size()});
    }
    double t0 = now_s();
    r = emu_kernel_run(msgs, [&] { return host_watch && rk.any_failed(); }, kernel_timeout_ns);
    *round_s = now_s() - t0;
    for (uint32_t d = 0; r == EMU_OK && d < kDirs; d++) {
      int prev = rk.neighbour(ctx, d, -1);
      std::vector<char> expect(in[d].size());
      msg_fill(seed, prev, d, k, expect);
      if (in[d] != expect) {
        rank_fail(ctx, "round %d dir %u: data from rank %d differs", k, d, prev);
        return EMU_ABORTED;
      }
    }
  }
  if (r != EMU_OK)
    for (uint32_t d = 0; d < kDirs; d++) {
      conn_poison(&rk.send[d]);
      conn_poison(&rk.recv[d]);
    }
  return r;
}

// Random data both ways between the namespace hosts, checked.
TEST_P(NetDevNetns, ExchangeAcrossHosts) {
  const uint64_t seed = test_seed();
  const std::string t = GetParam();
  auto status = run_ranks(4, [&](const RankCtx &ctx) {
    if (t == "ucx")
      if (int rc = see_own_netns_devices(ctx)) return rc;
    Rank rk;
    if (int rc = rk.connect(ctx, t, 4, 4096)) return rc;
    double round_s = 0;
    EmuResult r = exchange_rounds(ctx, rk, 4096, seed, 20, 20000000000ull, &round_s);
    if (r != EMU_OK) return rank_fail(ctx, "emulated kernel gave up (%d)", (int)r);
    if (bootstrap_barrier(rk.bs) != weftSuccess) return rank_fail(ctx, "barrier");
    if (rk.any_failed()) return rank_fail(ctx, "a connection failed during the exchange");
    if (bootstrap_barrier(rk.bs) != weftSuccess) return rank_fail(ctx, "barrier");
    return 0;
  }, netns_options(30));
  for (int r = 0; r < 4; r++) EXPECT_EQ(status[r], 0) << "rank " << r;
}

// The link between the hosts goes down in the middle of the exchange: every
// rank's emulated kernel gives up within the timeout, none hangs.
// host_watch: the kernel's own timeout or the host's abort flag may end it;
// otherwise its own timeout lies far past the bound, and only the poison word
// of its FIFOs (set by the proxy: WEFT_TIMEOUT without news from the peer,
// or a peer that gave up) can end it in time.
const int kLinkCutTimeoutS = 3;

void link_cut_case(const std::string &t, bool host_watch, const RunOptions &opts) {
  const uint64_t seed = test_seed();
  const int timeout_s = kLinkCutTimeoutS;
  const uint64_t kernel_timeout_ns = (host_watch ? timeout_s : 60) * 1000000000ull;
  // rank 0 takes its host's end of the link down (it runs in that namespace)
  const std::string down = "ip link set weft0 down";
  auto status = run_ranks(4, [&](const RankCtx &ctx) {
    if (t == "ucx")
      if (int rc = see_own_netns_devices(ctx)) return rc;
    Rank rk;
    if (int rc = rk.connect(ctx, t, 4, 4096)) return rc;
    std::atomic<int> cut{-1};
    std::thread cutter;
    if (ctx.rank == 0)
      cutter = std::thread([&] {
        sleep(2);  // long after set-up, in the middle of the rounds
        sh(down);
        cut = link_is_down() ? 0 : 1;
      });
    double round_s = 0;
    EmuResult r = exchange_rounds(ctx, rk, 4096, seed, 1 << 30, kernel_timeout_ns, &round_s,
                                  host_watch);
    if (cutter.joinable()) cutter.join();
    if (ctx.rank == 0 && cut != 0) return rank_fail(ctx, "could not take the link down");
    if (r == EMU_OK) return rank_fail(ctx, "no error after the link went down");
    if (!host_watch && r != EMU_POISONED)
      return rank_fail(ctx, "emulated kernel ended with %d, want poisoned", (int)r);
    printf("rank %d: emulated kernel %s after %.2f s in the failing round\n", ctx.rank,
           r == EMU_ABORTED ? "aborted" : r == EMU_POISONED ? "poisoned" : "timed out", round_s);
    // the kernel's own timeout, or a peer's poison, and room for a loaded machine
    if (round_s > 2 * timeout_s + 2) return rank_fail(ctx, "the error took %.1f s", round_s);
    return 0;
  }, opts);
  for (int r = 0; r < 4; r++) EXPECT_EQ(status[r], 0) << "rank " << r;
}

TEST_P(NetDevNetns, LinkCutGivesEveryRankAnError) {
  link_cut_case(GetParam(), true, netns_options(kLinkCutTimeoutS));
}

TEST_P(NetDevNetns, LinkCutPoisonsTheKernelsFifo) {
  link_cut_case(GetParam(), false, netns_options(kLinkCutTimeoutS));
}

INSTANTIATE_TEST_SUITE_P(NetDev, NetDevNetns, testing::Values("socket", "ucx"),
                         [](const testing::TestParamInfo<std::string> &i) { return i.param; });

std::vector<std::string> *captured_lines;
void capture(int level, const char *line, void *ctx) {
  (void)level;
  (void)ctx;
  captured_lines->push_back(line);
}

// WEFT_NET_GDR: -1 and 0 log where the FIFOs go and that GPUDirect RDMA is
// unavailable; 1 and out-of-range values are refused with the variable named.
TEST(NetDevGdr, ParsedLoggedAndChecked) {
  struct Case {
    const char *value;
    weftResult_t want;
  };
  for (Case k : {Case{"-1", weftSuccess}, Case{"0", weftSuccess}, Case{"1", weftInvalidArgument},
                 Case{"2", weftInvalidArgument}}) {
    RunOptions opts;  // set before the bootstrap's root thread starts, which reads them
    opts.env = {{"WEFT_NET_GDR", k.value}, {"WEFT_DEBUG", "INFO"}, {"WEFT_DEBUG_SUBSYS", "NET"}};
    auto status = run_ranks(1, [&](const RankCtx &ctx) {
      std::vector<std::string> lines;
      captured_lines = &lines;
      weft_log_set_sink(capture, nullptr);
      const proxy_fifo_mem *mem = nullptr;
      weftResult_t res = net_dev_fifo_mem(1, &mem);
      weft_log_set_sink(nullptr, nullptr);
      if (res != k.want) return rank_fail(ctx, "WEFT_NET_GDR=%s: result %d", k.value, (int)res);
      if (res != weftSuccess) {
        if (std::string(weft_error_text()).find("WEFT_NET_GDR") == std::string::npos)
          return rank_fail(ctx, "the error does not name WEFT_NET_GDR: %s", weft_error_text());
        return 0;
      }
      if (mem != &net_dev_mem_host) return rank_fail(ctx, "not the emulation's memory");
      bool logged = false;
      for (const std::string &l : lines)
        logged |= l.find("GPUDirect RDMA unavailable") != std::string::npos &&
                  l.find(std::string("WEFT_NET_GDR=") + k.value) != std::string::npos;
      if (!logged) return rank_fail(ctx, "WEFT_NET_GDR=%s: the choice was not logged", k.value);
      return 0;
    }, opts);
    EXPECT_EQ(status[0], 0) << "WEFT_NET_GDR=" << k.value;
  }
}

}  // namespace
