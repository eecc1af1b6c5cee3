// Topology: a DGX-like machine written as hwloc XML (2 sockets, 8 GPUs behind
// 4 PCI switches, one InfiniBand NIC per switch) read through real hwloc;
// GPU-NIC pairing, ring order, hierarchical trees, weft-topo's output, and
// NUMA placement on this machine.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <set>
#include <sstream>
#include <string>
#include <vector>

extern "C" {
#include "collectives/core/channel.h"
#include "collectives/core/comm.h"
#include "collectives/api/config.h"
#include "collectives/core/params.h"
#include "collectives/tune/topo_plan.h"
#include "collectives/core/tree_links.h"
#include "transport/base/status.h"
#include "transport/topology/topo.h"
}
#include "collectives/coll_ref.h"
#include "harness.h"
#include "weft_build_config.h"

namespace {

// get_mempolicy's modes and flag (numaif.h, without needing libnuma)
constexpr int kMpolDefault = 0, kMpolPreferred = 1;
constexpr unsigned long kMpolFAddr = 1ul << 1;

// One PCI object line.
std::string pci(const char *type, int &gp, const std::string &busid, const char *cls,
                const char *ids, const std::string &extra) {
  char buf[512];
  snprintf(buf, sizeof buf,
           "<object type=\"%s\" gp_index=\"%d\" pci_busid=\"%s\" pci_type=\"%s %s [0000:0000] 00\""
           " pci_link_speed=\"16.000000\"%s",
           type, gp++, busid.c_str(), cls, ids, extra.c_str());
  return buf;
}

std::string busid(int bus, int dev) {
  char buf[32];
  snprintf(buf, sizeof buf, "0000:%02x:%02x.0", bus, dev);
  return buf;
}

std::string range(int lo, int hi) {
  char buf[64];
  snprintf(buf, sizeof buf, " bridge_pci=\"0000:[%02x-%02x]\"", lo, hi);
  return buf;
}

// Two sockets of 8 cores, a NUMA node and a host bridge each; under each host
// bridge two root ports, each leading to a PCI switch with three downstream
// ports: GPU, GPU, NIC. GPUs 2k, 2k+1 and NIC k share switch k.
std::string dgx_xml() {
  int gp = 1;
  std::string x =
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<!DOCTYPE topology SYSTEM \"hwloc2.dtd\">\n"
      "<topology version=\"2.0\">\n"
      "<object type=\"Machine\" os_index=\"0\" cpuset=\"0x0000ffff\" complete_cpuset=\"0x0000ffff\""
      " allowed_cpuset=\"0x0000ffff\" nodeset=\"0x00000003\" complete_nodeset=\"0x00000003\""
      " allowed_nodeset=\"0x00000003\" gp_index=\"" + std::to_string(gp++) + "\">\n";
  for (int s = 0; s < 2; s++) {
    char set[64], node[32];
    snprintf(set, sizeof set, "0x%08x", 0xffu << (8 * s));
    snprintf(node, sizeof node, "0x%08x", 1u << s);
    std::string sets = std::string(" cpuset=\"") + set + "\" complete_cpuset=\"" + set +
                       "\" nodeset=\"" + node + "\" complete_nodeset=\"" + node + "\"";
    x += "<object type=\"Package\" os_index=\"" + std::to_string(s) + "\"" + sets +
         " gp_index=\"" + std::to_string(gp++) + "\">\n";
    x += "<object type=\"NUMANode\" os_index=\"" + std::to_string(s) + "\"" + sets +
         " gp_index=\"" + std::to_string(gp++) + "\" local_memory=\"68719476736\"/>\n";
    for (int c = 0; c < 8; c++) {
      int cpu = s * 8 + c;
      char cs[32];
      snprintf(cs, sizeof cs, "0x%08x", 1u << cpu);
      std::string csets = std::string(" cpuset=\"") + cs + "\" complete_cpuset=\"" + cs +
                          "\" nodeset=\"" + node + "\" complete_nodeset=\"" + node + "\"";
      x += "<object type=\"Core\" os_index=\"" + std::to_string(cpu) + "\"" + csets +
           " gp_index=\"" + std::to_string(gp++) + "\">";
      x += "<object type=\"PU\" os_index=\"" + std::to_string(cpu) + "\"" + csets +
           " gp_index=\"" + std::to_string(gp++) + "\"/></object>\n";
    }
    const int sb = s * 0x80;
    x += "<object type=\"Bridge\" gp_index=\"" + std::to_string(gp++) +
         "\" bridge_type=\"0-1\" depth=\"0\"" + range(sb, sb + 0x7f) + ">\n";
    for (int p = 0; p < 2; p++) {
      const int k = s * 2 + p;  // switch number
      const int b = sb + 0x10 + p * 0x20;
      x += pci("Bridge", gp, busid(sb, p + 1), "0604", "[8086:347a]",
               " bridge_type=\"1-1\" depth=\"1\"" + range(b, b + 0x1f) + ">\n");
      x += pci("Bridge", gp, busid(b, 0), "0604", "[10b5:8796]",
               " bridge_type=\"1-1\" depth=\"2\"" + range(b + 1, b + 0x1f) + ">\n");
      for (int j = 0; j < 3; j++) {
        const int dev_bus = b + 2 + j;
        x += pci("Bridge", gp, busid(b + 1, j), "0604", "[10b5:8796]",
                 " bridge_type=\"1-1\" depth=\"3\"" + range(dev_bus, dev_bus) + ">\n");
        if (j < 2) {
          x += pci("PCIDev", gp, busid(dev_bus, 0), "0302", "[10de:20b0]", ">");
          x += "<object type=\"OSDev\" gp_index=\"" + std::to_string(gp++) + "\" name=\"cuda" +
               std::to_string(2 * k + j) + "\" osdev_type=\"5\"/></object>\n";
        } else {
          x += pci("PCIDev", gp, busid(dev_bus, 0), "0207", "[15b3:101b]", ">");
          x += "<object type=\"OSDev\" gp_index=\"" + std::to_string(gp++) + "\" name=\"mlx5_" +
               std::to_string(k) + "\" osdev_type=\"3\"/>";
          x += "<object type=\"OSDev\" gp_index=\"" + std::to_string(gp++) + "\" name=\"ib" +
               std::to_string(k) + "\" osdev_type=\"2\"/></object>\n";
        }
        x += "</object>\n";
      }
      x += "</object>\n</object>\n";
    }
    x += "</object>\n</object>\n";
  }
  x += "</object>\n"
       "<distances2 type=\"NUMANode\" nbobjs=\"2\" kind=\"5\" indexing=\"os\">"
       "<indexes length=\"4\">0 1 </indexes><u64values length=\"12\">10 21 21 10 </u64values>"
       "</distances2>\n</topology>\n";
  return x;
}

class Dgx : public testing::Test {
 protected:
  void SetUp() override {
    if (!WEFT_HAVE_HWLOC) GTEST_SKIP() << "weft was built without hwloc: no XML topologies";
    char tmpl[] = "/tmp/weft-dgx-XXXXXX.xml";
    int fd = mkstemps(tmpl, 4);
    ASSERT_GE(fd, 0);
    std::string xml = dgx_xml();
    ASSERT_EQ(write(fd, xml.data(), xml.size()), (ssize_t)xml.size());
    close(fd);
    path = tmpl;
    ASSERT_EQ(topo_load(path.c_str(), &topo), weftSuccess) << weft_error_text();
  }
  void TearDown() override {
    if (topo != nullptr) topo_free(topo);
    if (path.empty()) return;
    if (getenv("WEFT_TEST_KEEP_XML") == nullptr) unlink(path.c_str());
    else printf("kept %s\n", path.c_str());
  }
  // Peer info of nranks GPU ranks on nhosts hosts (round-robin), local rank i
  // on GPU gpu_of_local[i % 8].
  std::vector<peer_info> peers(int nranks, int nhosts, const int *gpu_of_local) {
    std::vector<peer_info> p(nranks);
    EXPECT_EQ(topo_plan_peers(topo, nranks, nhosts, WEFT_TOPO_GPUS | WEFT_TOPO_ROUND_ROBIN,
                              p.data()),
              weftSuccess);
    for (int r = 0; r < nranks && gpu_of_local != nullptr; r++) {
      topo_place pl;
      p[r].cuda_dev = gpu_of_local[(r / nhosts) % 8];
      topo_place_rank(topo, p[r].cuda_dev, -1, &pl);
      topo_peer_fill(topo, &pl, &p[r]);
    }
    return p;
  }
  std::string path;
  struct topo *topo = nullptr;
};

TEST_F(Dgx, ReadsSocketsGpusNicsSwitches) {
  EXPECT_FALSE(topo->this_system);
  EXPECT_EQ(topo->npackages, 2);
  EXPECT_EQ(topo->ncores, 16);
  ASSERT_EQ(topo->nnuma, 2);
  EXPECT_EQ(topo->ngpus, 8);
  EXPECT_EQ(topo->nnics, 4);
  EXPECT_EQ(topo->nswitches, 4);
  EXPECT_EQ(topo->nbridges, 2);
  EXPECT_EQ(topo->numa_latency[0][1], 21);
  EXPECT_EQ(CPU_COUNT(&topo->numa[1].cpus), 8);
  EXPECT_TRUE(CPU_ISSET(8, &topo->numa[1].cpus));
  for (int g = 0; g < 8; g++) {
    const topo_dev &d = topo->devs[topo_gpu(topo, g)];
    EXPECT_EQ(d.kind, TOPO_DEV_GPU);
    EXPECT_EQ(std::string(d.name), "cuda" + std::to_string(g));
    EXPECT_EQ(d.numa, g / 4) << d.name;
    EXPECT_EQ(d.package, g / 4) << d.name;
    EXPECT_EQ(d.bridge, g / 4) << d.name;
    EXPECT_EQ(d.pci_switch, g / 2) << d.name;
  }
  for (int n = 8; n < 12; n++) {
    EXPECT_EQ(topo->devs[n].kind, TOPO_DEV_NIC);
    EXPECT_TRUE(topo->devs[n].ib);
    const std::string k = std::to_string(n - 8);
    EXPECT_EQ(std::string(topo->devs[n].name), "mlx5_" + k + ",ib" + k);
  }
}

// Each GPU uses the NIC behind its own switch, never one across the host
// bridge or the sockets.
TEST_F(Dgx, EachGpuPairedWithTheNicUnderItsSwitch) {
  std::set<int> used;
  for (int g = 0; g < 8; g++) {
    const topo_dev &gpu = topo->devs[topo_gpu(topo, g)];
    ASSERT_GE(gpu.nearest_nic, 0) << gpu.name;
    const topo_dev &nic = topo->devs[gpu.nearest_nic];
    EXPECT_EQ(nic.pci_switch, gpu.pci_switch) << gpu.name << " -> " << nic.name;
    EXPECT_EQ(topo_dev_path(topo, &gpu, &nic), TOPO_PATH_SWITCH);
    EXPECT_EQ(std::string(nic.name).substr(0, 6), "mlx5_" + std::to_string(g / 2));
    used.insert(gpu.nearest_nic);
  }
  EXPECT_EQ(used.size(), 4u) << "every NIC serves two GPUs";
  // a GPU rank's peer info names that NIC; a host rank gets one on its node
  topo_place pl;
  topo_place_rank(topo, 5, -1, &pl);
  EXPECT_EQ(pl.nic, topo->devs[topo_gpu(topo, 5)].nearest_nic);
  topo_place_rank(topo, -1, 1, &pl);
  ASSERT_GE(pl.nic, 0);
  EXPECT_EQ(topo->devs[pl.nic].numa, 1);
}

// GPUs handed to ranks so that consecutive ranks sit behind different
// switches (what a naive rank-order ring would cross at every hop): weft's
// ring crosses each switch boundary once, the minimum.
TEST_F(Dgx, RingCrossesSwitchesTheFewestTimes) {
  const int scattered[8] = {0, 2, 4, 6, 1, 3, 5, 7};
  for (int nhosts : {1, 2, 3}) {
    const int n = 8 * nhosts;
    auto p = peers(n, nhosts, scattered);
    std::vector<int> ring(n), naive(n);
    ring_order(p.data(), n, ring.data());
    for (int i = 0; i < n; i++) naive[i] = i;
    ring_crossings c, cn;
    ring_count_crossings(p.data(), n, ring.data(), &c);
    ring_count_crossings(p.data(), n, naive.data(), &cn);
    // 4 switches per host, each entered once; 2 NUMA nodes per host
    EXPECT_EQ(c.switches, 4 * nhosts) << nhosts << " host(s)";
    EXPECT_EQ(c.numa, 2 * nhosts) << nhosts << " host(s)";
    EXPECT_EQ(c.hosts, nhosts == 1 ? 0 : nhosts);
    EXPECT_EQ(cn.switches, n) << "the naive order crosses at every hop";
    EXPECT_GT(cn.switches, c.switches);
    // a permutation of the ranks, each host's ranks adjacent
    std::set<int> seen(ring.begin(), ring.end());
    EXPECT_EQ((int)seen.size(), n);
  }
}

// Checks that trees[t] over n ranks (links of every rank) form one tree, and
// returns its links between hosts; host_entries counts, per host, the links
// into it from another host.
int check_tree(const std::vector<peer_info> &p, const std::vector<std::array<tree_links, 2>> &l,
               int t, std::vector<int> *host_entries) {
  const int n = (int)p.size();
  int roots = 0, crossings = 0;
  for (int r = 0; r < n; r++) {
    const tree_links &me = l[r][t];
    EXPECT_LE(me.nchildren, TREE_MAX_CHILDREN);
    if (me.parent == TREE_NONE) {
      roots++;
      EXPECT_EQ(me.depth, 0);
      continue;
    }
    const tree_links &up = l[me.parent][t];
    int listed = 0;
    for (int c = 0; c < up.nchildren; c++) listed += up.child[c] == r;
    EXPECT_EQ(listed, 1) << "rank " << r << " missing from its parent's children, tree " << t;
    EXPECT_EQ(me.depth, up.depth + 1) << "rank " << r << " tree " << t;
    if (p[r].host_hash != p[me.parent].host_hash) {
      crossings++;
      (*host_entries)[p[r].host_hash - 1]++;
    }
  }
  EXPECT_EQ(roots, 1) << "tree " << t;
  return crossings;
}

// Across emulated hosts, each tree enters every host but the root's exactly
// once; inside a host it is a chain; the two trees enter a host at
// different ranks, so no rank carries both trees' links between hosts.
TEST_F(Dgx, TreesCrossIntoEachHostOnce) {
  for (int nhosts : {1, 2, 3, 4, 5}) {
    for (int per_host : {1, 3, 8}) {
      const int n = nhosts * per_host;
      auto p = peers(n, nhosts, nullptr);
      std::vector<std::array<tree_links, 2>> l(n), sl(n);
      int depth_max = 0, said_max = 0;
      for (int r = 0; r < n; r++) {
        tree_links two[2], small;
        said_max = comm_trees(p.data(), n, r, two, &small, nullptr);
        l[r] = {two[0], two[1]};
        sl[r] = {small, small};
        depth_max = std::max({depth_max, two[0].depth, two[1].depth});
      }
      EXPECT_EQ(said_max, depth_max) << nhosts << " hosts x " << per_host;
      // the tree of small calls: one tree over every rank, position i of
      // the ring order under position (i - 1) / 3
      std::vector<int> order(n), pos(n);
      ring_order(p.data(), n, order.data());
      for (int i = 0; i < n; i++) pos[order[i]] = i;
      std::vector<int> entries(nhosts, 0);
      EXPECT_EQ(check_tree(p, sl, 0, &entries) >= 0, true);
      for (int r = 0; r < n; r++) {
        const tree_links &x = sl[r][0];
        EXPECT_EQ(x.parent, pos[r] == 0 ? TREE_NONE : order[(pos[r] - 1) / 3]) << "rank " << r;
        EXPECT_LE(x.nchildren, 3);
      }
      std::vector<int> entered_by[2];
      for (int t = 0; t < 2; t++) {
        std::vector<int> entries(nhosts, 0);
        int crossings = check_tree(p, l, t, &entries);
        EXPECT_EQ(crossings, nhosts - 1) << nhosts << " hosts x " << per_host << ", tree " << t;
        for (int h = 0; h < nhosts; h++) EXPECT_LE(entries[h], 1) << "host " << h;
        // which rank each host is entered at
        entered_by[t].assign(nhosts, -1);
        for (int r = 0; r < n; r++)
          if (l[r][t].parent != TREE_NONE && p[r].host_hash != p[l[r][t].parent].host_hash)
            entered_by[t][p[r].host_hash - 1] = r;
      }
      for (int h = 0; per_host > 1 && h < nhosts; h++) {
        if (entered_by[0][h] >= 0 && entered_by[1][h] >= 0) {
          EXPECT_NE(entered_by[0][h], entered_by[1][h]) << "host " << h;
        }
      }
    }
  }
}

std::string print_plan(const char *xml, int nranks, int nhosts, int flags, weftResult_t *res) {
  char *buf = nullptr;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  *res = weftTopoPrint(f, xml, nranks, nhosts, flags);
  fclose(f);
  std::string s(buf, len);
  free(buf);
  return s;
}

TEST_F(Dgx, WeftTopoPrintsPairsRingsAndTrees) {
  weftResult_t res;
  std::string s = print_plan(path.c_str(), 16, 2, WEFT_TOPO_GPUS, &res);
  ASSERT_EQ(res, weftSuccess) << weftGetLastError(nullptr);
  for (int g = 0; g < 8; g++) {
    const std::string k = std::to_string(g / 2);
    std::string want = "-> NIC mlx5_" + k + ",ib" + k + " (switch)";
    EXPECT_NE(s.find("GPU cuda" + std::to_string(g)), std::string::npos);
    size_t at = s.find("GPU cuda" + std::to_string(g));
    EXPECT_NE(s.find(want, at), std::string::npos) << want;
  }
  EXPECT_NE(s.find("PCI switch 3"), std::string::npos);
  EXPECT_NE(s.find("crossings: 2 between hosts, 4 between NUMA nodes, 8 between PCI switches"),
            std::string::npos)
      << s;
  EXPECT_NE(s.find("ring: 0 1 2 3 4 5 6 7 | 8 9"), std::string::npos) << s;
  EXPECT_NE(s.find("1 link(s) between hosts"), std::string::npos) << s;
  // between hosts: UCX when weft is built with it, else sockets
  EXPECT_NE(s.find(WEFT_HAVE_UCX ? "hop 7 -> 8: ucx" : "hop 7 -> 8: socket"), std::string::npos)
      << s;
  EXPECT_NE(s.find("hop 0 -> 1: shm"), std::string::npos) << s;
  EXPECT_NE(s.find("tree of small calls: none (the ranks span hosts)"), std::string::npos) << s;
  // on one host: the tree of small calls, three children a node along the ring
  s = print_plan(path.c_str(), 8, 1, WEFT_TOPO_GPUS, &res);
  ASSERT_EQ(res, weftSuccess) << weftGetLastError(nullptr);
  const size_t ring_at = s.find("ring: ");
  ASSERT_NE(ring_at, std::string::npos) << s;
  std::vector<int> ring;
  {
    std::istringstream in(s.substr(ring_at + 6, s.find('\n', ring_at) - ring_at - 6));
    for (int r; in >> r;) ring.push_back(r);
  }
  ASSERT_EQ(ring.size(), 8u) << s;
  std::string want = "tree of small calls, up to 4096 bytes (rank<-parent):";
  std::vector<std::string> links(8);
  for (int pos = 1; pos < 8; pos++)
    links[ring[pos]] = " " + std::to_string(ring[pos]) + "<-" + std::to_string(ring[(pos - 1) / 3]);
  for (const auto &l : links) want += l;
  EXPECT_NE(s.find(want + "\n  root " + std::to_string(ring[0]) + ", depth 2,"), std::string::npos)
      << "no \"" << want << "\" in:\n" << s;
  // bad input is an error with a message, not a crash
  print_plan("/nonexistent/topo.xml", 4, 1, 0, &res);
  EXPECT_EQ(res, weftInvalidArgument);
  print_plan(path.c_str(), 2, 3, 0, &res);
  EXPECT_EQ(res, weftInvalidArgument);
  print_plan(path.c_str(), 2, 1, 0x100, &res);
  EXPECT_EQ(res, weftInvalidArgument);
}

// The ranks of Dgx.CommunicatorFollowsTopologyFile under one WEFT_ALGO, set in
// opts: rank 0's exit status.
int dgx_ranks(const char *algo, const weft_test::RunOptions &opts) {
  auto status = weft_test::run_ranks(1, [&](const weft_test::RankCtx &ctx) {
    const int scattered[8] = {0, 2, 4, 6, 1, 3, 5, 7};
    weftComm_t comms[8];
    if (weftCommInitAll(comms, 8, scattered) != weftSuccess)
      return weft_test::rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
    const weftComm *c0 = comms[0];
    for (int r = 0; r < 8; r++) {
      const peer_info &p = c0->peers[r];
      if (p.cuda_dev != scattered[r] || p.pci_switch != scattered[r] / 2 ||
          p.numa_node != scattered[r] / 4 || p.nic != 8 + scattered[r] / 2)
        return weft_test::rank_fail(ctx, "rank %d: gpu %d switch %d numa %d nic %d", r,
                                    p.cuda_dev, p.pci_switch, p.numa_node, p.nic);
    }
    ring_crossings rc;
    ring_count_crossings(c0->peers, 8, c0->channels[0].ring, &rc);
    if (rc.switches != 4)
      return weft_test::rank_fail(ctx, "ring crosses switches %d times", rc.switches);
    // every rank's all-reduce, from its own thread, under algo
    struct Arg {
      weftComm_t comm;
      int rank;
      int rc;
    } args[8];
    pthread_t tids[8];
    for (int r = 0; r < 8; r++) {
      args[r] = {comms[r], r, 0};
      pthread_create(&tids[r], nullptr, [](void *p) -> void * {
        Arg *a = (Arg *)p;
        weft_test::RankCtx me{a->rank, 8, {}};
        for (size_t count : {1, 1000, 20001})
          if (a->rc == 0)
            a->rc = weft_test::check_allreduce(me, a->comm, weftFloat32, weftSum, count,
                                               false, 7);
        return nullptr;
      }, &args[r]);
    }
    for (int r = 0; r < 8; r++) pthread_join(tids[r], nullptr);
    for (int r = 0; r < 8; r++)
      if (args[r].rc != 0)
        return weft_test::rank_fail(ctx, "all-reduce (%s) on rank %d", algo, r);
    for (int r = 0; r < 8; r++) weftCommDestroy(comms[r]);
    return 0;
  }, opts);
  return status[0];
}

// A real communicator planned on the DGX file: 8 in-process ranks given the
// GPUs in scattered order (weftCommInitAll's device list), WEFT_TOPO_FILE
// set. Peer info carries the file's places, the ring follows the switches,
// and all-reduces over that ring and the trees are correct.
TEST_F(Dgx, CommunicatorFollowsTopologyFile) {
  // WEFT_ALGO for a process of its own, set before any thread starts
  for (const char *algo : {"ring", "tree"}) {
    weft_test::RunOptions opts;
    opts.timeout_s = 60;
    opts.env = {{"WEFT_TOPO_FILE", path}, {"WEFT_SLOT_BYTES", "4096"}, {"WEFT_ALGO", algo}};
    EXPECT_EQ(dgx_ranks(algo, opts), 0) << "WEFT_ALGO=" << algo;
  }
}

// The live machine: some NUMA node, the rank's node found, and memory placed
// there unless WEFT_TOPO_NUMA=off.
TEST(TopoLive, LoadsThisMachineAndPlacesMemory) {
  // hwloc's PCI plugin brings in libpciaccess, whose process-wide state stays
  // allocated when topo_free's hwloc_topology_destroy unloads both; held
  // resident here, that state stays reachable and LeakSanitizer does not
  // count it as a leak (it is libpciaccess's, not weft's).
  dlopen("libpciaccess.so.0", RTLD_LAZY | RTLD_NODELETE);
  topo *t = nullptr;
  ASSERT_EQ(topo_load(nullptr, &t), weftSuccess) << weft_error_text();
  EXPECT_TRUE(t->this_system);
  EXPECT_GE(t->nnuma, 1);
  EXPECT_GE(t->npus, 1);
  topo_place pl;
  topo_place_rank(t, -1, -1, &pl);
  EXPECT_GE(pl.numa, 0);
  EXPECT_EQ(topo_gpu(t, t->ngpus), -1);
  topo_free(t);

  ASSERT_TRUE(weft_test::env_set_alone("WEFT_TOPO_NUMA", nullptr));
  weft_params_reset();
  const int node = topo_place_node();
  ASSERT_GE(node, 0);
  const size_t nbytes = 1 << 20;
  void *mem = mmap(nullptr, nbytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(mem, MAP_FAILED);
  topo_mem_place(mem, nbytes);
  int mode = -1;
  unsigned long mask[16] = {0};
  ASSERT_EQ(syscall(SYS_get_mempolicy, &mode, mask, 64 * 16, mem, kMpolFAddr), 0);
  EXPECT_EQ(mode, kMpolPreferred);
  EXPECT_TRUE(mask[node / 64] & (1ul << (node % 64)));
  munmap(mem, nbytes);

  ASSERT_TRUE(weft_test::env_set_alone("WEFT_TOPO_NUMA", "off"));
  weft_params_reset();
  EXPECT_EQ(topo_place_node(), -1);
  mem = mmap(nullptr, nbytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  topo_mem_place(mem, nbytes);
  ASSERT_EQ(syscall(SYS_get_mempolicy, &mode, mask, 64 * 16, mem, kMpolFAddr), 0);
  EXPECT_EQ(mode, kMpolDefault);
  munmap(mem, nbytes);
  ASSERT_TRUE(weft_test::env_set_alone("WEFT_TOPO_NUMA", nullptr));
  weft_params_reset();
}

}  // namespace
