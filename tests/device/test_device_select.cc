// Which transport each hop of a device ring gets (transport/device_select.h):
// ranks spread over 1 to 3 emulated hosts, one or several processes per host,
// with p2p / cuda_ipc / host_fifo allowed or not and GPUs with or without
// peer access. Every hop is checked against the rule written out here, and
// an impossible hop's message names both ranks and why.
#include <gtest/gtest.h>

#include <string>
#include <vector>

extern "C" {
#include "transport/device_select.h"
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

// the ring r -> r+1: the hop into r+1 from r, as its receiver decides
std::vector<device_hop> ring_hops(const Layout &l, const device_hop_env &env_same,
                                  int net_index) {
  std::vector<device_hop> out;
  int n = (int)l.host.size();
  for (int r = 0; r < n; r++) {
    peer_info s = rank_info(l, r), t = rank_info(l, (r + 1) % n);
    device_hop_env env = env_same;
    env.net = s.host_hash != t.host_hash ? net_index : -1;
    char why[256] = "";
    out.push_back(device_hop_choose(&s, &t, &env, why, sizeof why));
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

device_hop expected(const Layout &l, int s, int r, const device_hop_env &env, int net) {
  if (l.host[s] != l.host[r]) return net >= 0 ? DEVICE_HOP_NET : DEVICE_HOP_NONE;
  if (env.peer_access && l.proc[s] == l.proc[r] && !env.p2p_disabled) return DEVICE_HOP_P2P;
  if (env.peer_access && l.proc[s] != l.proc[r] && !env.cuda_ipc_disabled)
    return DEVICE_HOP_CUDA_IPC;
  return env.host_fifo_disabled ? DEVICE_HOP_NONE : DEVICE_HOP_HOST_FIFO;
}

TEST(DeviceSelect, EveryHopOfEveryLayoutAndSetting) {
  int checked = 0, by_kind[4] = {0, 0, 0, 0};
  for (const Layout &l : kLayouts)
    for (int mask = 0; mask < 16; mask++)
      for (int net : {1, -1}) {
        device_hop_env env = {};
        env.p2p_disabled = mask & 1;
        env.cuda_ipc_disabled = (mask >> 1) & 1;
        env.host_fifo_disabled = (mask >> 2) & 1;
        env.peer_access = !((mask >> 3) & 1);
        std::vector<device_hop> hops = ring_hops(l, env, net);
        int n = (int)l.host.size();
        for (int r = 0; r < n; r++) {
          device_hop want = expected(l, r, (r + 1) % n, env, net);
          ASSERT_EQ(hops[r], want) << l.name << " mask " << mask << " net " << net << " hop "
                                   << r << "->" << (r + 1) % n;
          if (want != DEVICE_HOP_NONE) by_kind[want]++;
          checked++;
        }
      }
  EXPECT_GT(checked, 100);
  for (int k = 0; k < 4; k++) EXPECT_GT(by_kind[k], 0) << device_hop_name((device_hop)k);
}

TEST(DeviceSelect, TwoHostsWithCudaIpcOnAndOff) {
  const Layout &l = kLayouts[2];  // ranks 0,1 on host 0; 2,3 on host 1
  device_hop_env on = {};
  on.peer_access = 1;
  std::vector<device_hop> a = ring_hops(l, on, 2);
  EXPECT_EQ(a, (std::vector<device_hop>{DEVICE_HOP_CUDA_IPC, DEVICE_HOP_NET,
                                        DEVICE_HOP_CUDA_IPC, DEVICE_HOP_NET}));
  device_hop_env off = on;
  off.cuda_ipc_disabled = 1;
  std::vector<device_hop> b = ring_hops(l, off, 2);
  EXPECT_EQ(b, (std::vector<device_hop>{DEVICE_HOP_HOST_FIFO, DEVICE_HOP_NET,
                                        DEVICE_HOP_HOST_FIFO, DEVICE_HOP_NET}));
}

std::string refusal(peer_info s, peer_info r, device_hop_env env) {
  char why[256] = "";
  EXPECT_EQ(device_hop_choose(&s, &r, &env, why, sizeof why), DEVICE_HOP_NONE);
  return why;
}

TEST(DeviceSelect, ImpossibleHopsNameBothRanksAndWhy) {
  const Layout &l = kLayouts[3];
  device_hop_env env = {};
  env.net = -1;
  std::string m = refusal(rank_info(l, 2), rank_info(l, 3), env);
  EXPECT_NE(m.find("rank 2 to rank 3"), std::string::npos) << m;
  EXPECT_NE(m.find("different hosts"), std::string::npos) << m;

  env.host_fifo_disabled = 1;  // no peer access either
  m = refusal(rank_info(l, 0), rank_info(l, 1), env);
  EXPECT_NE(m.find("rank 0 to rank 1"), std::string::npos) << m;
  EXPECT_NE(m.find("without peer access"), std::string::npos) << m;
  EXPECT_NE(m.find("WEFT_DEVICE_HOST_FIFO_DISABLE"), std::string::npos) << m;

  env.peer_access = 1;
  env.cuda_ipc_disabled = 1;
  m = refusal(rank_info(l, 1), rank_info(l, 2), env);
  EXPECT_NE(m.find("WEFT_CUDA_IPC_DISABLE=1"), std::string::npos) << m;

  peer_info cpu = rank_info(l, 4);
  cpu.cuda_dev = -1;
  m = refusal(cpu, rank_info(l, 5), env);
  EXPECT_NE(m.find("rank 4 to rank 5"), std::string::npos) << m;
  EXPECT_NE(m.find("sender has no GPU"), std::string::npos) << m;
}

}  // namespace
