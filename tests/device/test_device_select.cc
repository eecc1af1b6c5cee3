// Which transport each hop of a device ring gets (transport_select with
// device memory, over the one registry of transports): ranks spread over 1 to
// 3 emulated hosts, one or several processes per host, with peer_access /
// cuda_ipc / host_fifo / the networks allowed or not and GPUs with or without
// peer access. Every hop is checked against the rule written out here, and an
// impossible hop's message names both ranks and why.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

extern "C" {
#include "transport/cuda_ipc/cuda_params.h"
#include "transport/socket/socket_proxy.h"
#include "transport/ucx/ucx_params.h"
#include "transport/transport.h"
#include "weft_build_config.h"
}

namespace {

struct Layout {
  const char *name;
  std::vector<int> host;  // per rank
  std::vector<int> proc;  // per rank: ranks of one process share it
};

peer_info rank_info(const Layout &l, int r) {
  peer_info p = {};
  p.rank = r;
  p.host_hash = 0x1000u + (uint64_t)l.host[r];
  p.pid = 100 + l.proc[r];
  p.cuda_dev = r % 2;
  p.bus_id = -1;
  return p;
}

// What the environment turns off, set for one scope.
struct Disabled {
  bool peer_access = false, cuda_ipc = false, host_fifo = false, networks = false;
};

void reset_tables() {
  struct weft_param *const tables[] = {cuda_transport_params, socket_params, ucx_params,
                                       transport_params, NULL};
  param_tables_reset(tables);
}

class ScopedDisabled {
 public:
  explicit ScopedDisabled(const Disabled &d) {
    set("WEFT_P2P_DISABLE", d.peer_access);
    set("WEFT_CUDA_IPC_DISABLE", d.cuda_ipc);
    set("WEFT_DEVICE_HOST_FIFO_DISABLE", d.host_fifo);
    set("WEFT_SOCKET_DISABLE", d.networks);
    set("WEFT_UCX_DISABLE", d.networks);
    reset_tables();
  }
  ~ScopedDisabled() {
    for (const char *n : {"WEFT_P2P_DISABLE", "WEFT_CUDA_IPC_DISABLE",
                          "WEFT_DEVICE_HOST_FIFO_DISABLE", "WEFT_SOCKET_DISABLE",
                          "WEFT_UCX_DISABLE"})
      unsetenv(n);
    reset_tables();
  }

 private:
  static void set(const char *name, bool on) {
    if (on) setenv(name, "1", 1);
    else unsetenv(name);
  }
};

// The kind of hop a transport makes for device memory.
enum Hop { PEER_ACCESS, CUDA_IPC, HOST_FIFO, NET, NONE };
const char *hop_name(Hop h) {
  static const char *names[] = {"peer_access", "cuda_ipc", "host_fifo", "net", "none"};
  return names[h];
}

Hop hop_of(int t) {
  if (t < 0) return NONE;
  const weft_transport *tr = weft_transports[t];
  if (!(tr->caps & TRANSPORT_CAP_DEVICE_MEMORY)) return NET;
  std::string n = tr->name;
  return n == "peer_access" ? PEER_ACCESS : n == "cuda_ipc" ? CUDA_IPC : HOST_FIFO;
}

int choose(const peer_info &s, const peer_info &r, int peer_access, std::string *why) {
  transport_need need = {};
  need.mem = TRANSPORT_MEM_DEVICE;
  need.peer_access = peer_access;
  char buf[1024] = "";
  int t = transport_select(&s, &r, &need, buf, sizeof buf);
  if (why != nullptr) *why = buf;
  return t;
}

// the ring r -> r+1: the hop into r+1 from r, as its receiver decides
std::vector<Hop> ring_hops(const Layout &l, int peer_access) {
  std::vector<Hop> out;
  int n = (int)l.host.size();
  for (int r = 0; r < n; r++) {
    peer_info s = rank_info(l, r), t = rank_info(l, (r + 1) % n);
    out.push_back(hop_of(choose(s, t, s.host_hash == t.host_hash ? peer_access : 0, nullptr)));
  }
  return out;
}

const Layout kLayouts[] = {
    {"one host, one process per rank", {0, 0, 0, 0}, {0, 1, 2, 3}},
    {"one host, one process", {0, 0, 0}, {0, 0, 0}},
    {"2 hosts x 2 processes", {0, 0, 1, 1}, {0, 1, 2, 3}},
    {"3 hosts, odd sizes", {0, 0, 0, 1, 2, 2}, {0, 1, 2, 3, 4, 5}},
    {"3 hosts, one process each with 2 GPUs", {0, 0, 1, 1, 2, 2}, {0, 0, 1, 1, 2, 2}},
};

Hop expected(const Layout &l, int s, int r, const Disabled &d, int peer_access) {
  if (l.host[s] != l.host[r]) return d.networks ? NONE : NET;
  if (peer_access && l.proc[s] == l.proc[r] && !d.peer_access) return PEER_ACCESS;
  if (peer_access && l.proc[s] != l.proc[r] && !d.cuda_ipc) return CUDA_IPC;
  return d.host_fifo ? NONE : HOST_FIFO;
}

#if WEFT_HAVE_CUDA
#define REQUIRE_DEVICE_TRANSPORTS()
#else
#define REQUIRE_DEVICE_TRANSPORTS() GTEST_SKIP() << "built without CUDA: no device transports"
#endif

TEST(DeviceSelect, EveryHopOfEveryLayoutAndSetting) {
  REQUIRE_DEVICE_TRANSPORTS();
  int checked = 0, by_kind[5] = {0, 0, 0, 0, 0};
  for (const Layout &l : kLayouts)
    for (int mask = 0; mask < 32; mask++) {
      Disabled d;
      d.peer_access = mask & 1;
      d.cuda_ipc = (mask >> 1) & 1;
      d.host_fifo = (mask >> 2) & 1;
      d.networks = (mask >> 4) & 1;
      int peer_access = !((mask >> 3) & 1);
      ScopedDisabled env(d);
      std::vector<Hop> hops = ring_hops(l, peer_access);
      int n = (int)l.host.size();
      for (int r = 0; r < n; r++) {
        Hop want = expected(l, r, (r + 1) % n, d, peer_access);
        ASSERT_EQ(hop_name(hops[r]), std::string(hop_name(want)))
            << l.name << " mask " << mask << " hop " << r << "->" << (r + 1) % n;
        by_kind[want]++;
        checked++;
      }
    }
  EXPECT_GT(checked, 100);
  for (int k = 0; k < 5; k++) EXPECT_GT(by_kind[k], 0) << hop_name((Hop)k);
}

TEST(DeviceSelect, TwoHostsWithCudaIpcOnAndOff) {
  REQUIRE_DEVICE_TRANSPORTS();
  const Layout &l = kLayouts[2];  // ranks 0,1 on host 0; 2,3 on host 1
  {
    ScopedDisabled env(Disabled{});
    EXPECT_EQ(ring_hops(l, 1), (std::vector<Hop>{CUDA_IPC, NET, CUDA_IPC, NET}));
  }
  Disabled off;
  off.cuda_ipc = true;
  ScopedDisabled env(off);
  EXPECT_EQ(ring_hops(l, 1), (std::vector<Hop>{HOST_FIFO, NET, HOST_FIFO, NET}));
}

// Host memory never takes a device transport, and device memory on one host
// never takes a network.
TEST(DeviceSelect, EachMemoryKeepsToItsTransports) {
  REQUIRE_DEVICE_TRANSPORTS();
  ScopedDisabled env(Disabled{});
  const Layout &l = kLayouts[2];
  transport_need host = {};
  host.mem = TRANSPORT_MEM_HOST;
  peer_info a = rank_info(l, 0), b = rank_info(l, 1), c = rank_info(l, 2);
  int t = transport_select(&a, &b, &host, nullptr, 0);
  ASSERT_GE(t, 0);
  EXPECT_STREQ(weft_transports[t]->name, "shm");
  t = transport_select(&a, &c, &host, nullptr, 0);
  ASSERT_GE(t, 0);
  EXPECT_FALSE(weft_transports[t]->caps & TRANSPORT_CAP_DEVICE_MEMORY);
  Disabled no_fifo;
  no_fifo.host_fifo = true;
  no_fifo.cuda_ipc = true;
  ScopedDisabled env2(no_fifo);
  std::string why;
  EXPECT_EQ(choose(a, b, 1, &why), -1) << "a network on one host for device memory";
  EXPECT_NE(why.find("device memory between hosts only"), std::string::npos) << why;
}

std::string refusal(const peer_info &s, const peer_info &r, int peer_access) {
  std::string why;
  EXPECT_EQ(choose(s, r, peer_access, &why), -1);
  return why;
}

TEST(DeviceSelect, ImpossibleHopsNameBothRanksAndWhy) {
  REQUIRE_DEVICE_TRANSPORTS();
  const Layout &l = kLayouts[3];
  Disabled d;
  d.networks = true;
  {
    ScopedDisabled env(d);
    std::string m = refusal(rank_info(l, 2), rank_info(l, 3), 0);
    EXPECT_NE(m.find("rank 2 to rank 3"), std::string::npos) << m;
    EXPECT_NE(m.find("different hosts"), std::string::npos) << m;
    EXPECT_NE(m.find("WEFT_SOCKET_DISABLE=1"), std::string::npos) << m;
  }
  d.host_fifo = true;  // no peer access either
  {
    ScopedDisabled env(d);
    std::string m = refusal(rank_info(l, 0), rank_info(l, 1), 0);
    EXPECT_NE(m.find("rank 0 to rank 1"), std::string::npos) << m;
    EXPECT_NE(m.find("without peer access"), std::string::npos) << m;
    EXPECT_NE(m.find("WEFT_DEVICE_HOST_FIFO_DISABLE"), std::string::npos) << m;
  }
  d.cuda_ipc = true;
  ScopedDisabled env(d);
  std::string m = refusal(rank_info(l, 1), rank_info(l, 2), 1);
  EXPECT_NE(m.find("WEFT_CUDA_IPC_DISABLE=1"), std::string::npos) << m;

  peer_info cpu = rank_info(l, 4);
  cpu.cuda_dev = -1;
  m = refusal(cpu, rank_info(l, 5), 1);
  EXPECT_NE(m.find("rank 4 to rank 5"), std::string::npos) << m;
  EXPECT_NE(m.find("sender has no GPU"), std::string::npos) << m;
}

}  // namespace
