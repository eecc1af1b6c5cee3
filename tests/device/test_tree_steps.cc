// The tree all-reduce's device steps without a GPU: tree_steps.h run by a
// simulated executor (a FIFO per link and channel, credits as the kernels
// wait for them, the reduction arithmetic of the host executor), against
// the host executor's results on forked ranks (bitwise where both reduce an
// element over the same tree) and against a reference reduction; and the
// nvcc compile of the steps against the C one.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "tests/collectives/coll_ref.h"
#include "harness.h"
#include "weft.h"
#include "weft_build_config.h"

extern "C" {
#include "collectives/core/comm.h"
#include "collectives/core/redop.h"
#include "collectives/exec/device/dev_types.h"
#include "collectives/core/tree_links.h"
#include "collectives/reduce/reduce_host.h"
}
#include "tests/device/tree_steps_dump.h"
#include "collectives/reduce/reduce_ops.h"

using namespace weft_test;

namespace {

// Elements a slot carries, by the protocol a kernel would run the size with.
enum Piece { kPieceLL, kPieceSimple, kPieceTiny };
size_t piece_count(Piece p, size_t esize) {
  switch (p) {
    case kPieceLL: return DEV_SLOT_ROOM(DEV_PROTO_LL, DEV_LL_SLOT_NBYTES) / esize;
    case kPieceSimple: return DEV_SLOT_ROOM(DEV_PROTO_SIMPLE, DEV_SIMPLE_SLOT_NBYTES) / esize;
    default: return std::max<size_t>(1, 64 / esize); // many pieces from little data
  }
}
const char *piece_name(Piece p) {
  return p == kPieceLL ? "LL" : p == kPieceSimple ? "SIMPLE" : "tiny";
}

// The size classes: none, one element, a few (odd), several LL slots, several
// SIMPLE slots, and many tiny slots (a deep pipeline from little data).
struct SizeClass {
  const char *name;
  size_t nbytes;
  Piece piece;
};
const SizeClass kSizes[] = {{"zero", 0, kPieceLL},
                            {"one", 1, kPieceLL},
                            {"few", 37, kPieceLL},
                            {"LL", 2 * 8192 + 3001, kPieceLL},
                            {"SIMPLE", 2 * (256 << 10) + 80001, kPieceSimple},
                            {"tiny_slots", 1203, kPieceTiny}};
constexpr int kNumSizes = sizeof kSizes / sizeof kSizes[0];
constexpr int kPremul = weftNumOps; // the pre-multiply sum, in this file's numbering

struct Case {
  int nranks;
  weftDataType_t type;
  int op;          // weftRedOp_t, or kPremul
  int size;        // index in kSizes
  int nchannels;   // of the simulated device executor
  int slots;       // per simulated FIFO
  bool in_place;
  size_t count;
};

std::string case_text(const Case &c) {
  char buf[160];
  snprintf(buf, sizeof buf, "%d ranks %s %s count %zu (%s, %s slots) %d channels %d slots %s",
           c.nranks, type_name(c.type), c.op == kPremul ? "premulsum" : op_name((weftRedOp_t)c.op),
           c.count, kSizes[c.size].name, piece_name(kSizes[c.size].piece), c.nchannels, c.slots,
           c.in_place ? "in place" : "out of place");
  return buf;
}

// Every rank count 2..9 runs every datatype, op, size class, channel count
// (1, 2, 3) and slot count (2, the fewest the trees need, and the device's)
// at least once; which goes with which is drawn from the seed.
std::vector<Case> draw_cases(int k, uint64_t seed) {
  Rng rng(seed * 31 + (uint64_t)k);
  auto shuffled = [&](int n) {
    std::vector<int> v(n);
    for (int i = 0; i < n; i++) v[i] = i;
    for (int i = n - 1; i > 0; i--) std::swap(v[i], v[rng.next() % (uint64_t)(i + 1)]);
    return v;
  };
  const int n = weftNumTypes; // 12 cases: every datatype once
  std::vector<int> types = shuffled(n), ops = shuffled(n), sizes = shuffled(n),
                   chans = shuffled(n), slots = shuffled(n);
  std::vector<Case> v;
  for (int i = 0; i < n; i++) {
    Case c;
    c.nranks = k;
    c.type = (weftDataType_t)types[i];
    c.op = ops[i] % (kPremul + 1);
    c.size = sizes[i] % kNumSizes;
    c.nchannels = 1 + chans[i] % 3;
    c.slots = slots[i] % 2 ? DEV_NSLOTS : 2;
    c.in_place = rng.next() % 2;
    size_t esize = weftTypeSize(c.type);
    c.count = kSizes[c.size].nbytes / esize;
    if (c.count > 1 && c.count % 2 == 0) c.count--; // odd counts
    if (kSizes[c.size].nbytes == 1) c.count = 1;
    v.push_back(c);
  }
  return v;
}

// 2 in the datatype: the pre-multiply sum's scalar (exact in every type).
std::vector<uint8_t> scalar_two(weftDataType_t t) {
  std::vector<uint8_t> s(weftTypeSize(t), 0);
  switch (t) {
    case weftFloat16: { uint16_t v = weft_f32_to_f16(2.0f); memcpy(s.data(), &v, 2); break; }
    case weftBfloat16: { uint16_t v = weft_f32_to_bf16(2.0f); memcpy(s.data(), &v, 2); break; }
    case weftFloat8e4m3: s[0] = weft_f32_to_e4m3(2.0f); break;
    case weftFloat8e5m2: s[0] = weft_f32_to_e5m2(2.0f); break;
    case weftFloat32: { float v = 2; memcpy(s.data(), &v, 4); break; }
    case weftFloat64: { double v = 2; memcpy(s.data(), &v, 8); break; }
    default: s[0] = 2; break; // little-endian integers
  }
  return s;
}

// The inputs of a case, one per rank, and the same times the scalar where
// the op pre-multiplies (what the reference reduces).
std::vector<std::vector<uint8_t>> inputs_of(const Case &c, uint64_t seed) {
  std::vector<std::vector<uint8_t>> in;
  weftRedOp_t op = c.op == kPremul ? weftSum : (weftRedOp_t)c.op;
  for (int r = 0; r < c.nranks; r++) in.push_back(make_input(c.type, op, c.count, seed, r));
  return in;
}
// x times s (the scalar's bits in t; default: 2).
std::vector<uint8_t> times_scalar(weftDataType_t t, const std::vector<uint8_t> &x,
                                  std::vector<uint8_t> s = {}) {
  const size_t esize = weftTypeSize(t), n = x.size() / esize;
  if (s.empty()) s = scalar_two(t);
  std::vector<uint8_t> rep(x.size()), out(x.size());
  for (size_t i = 0; i < n; i++) memcpy(rep.data() + i * esize, s.data(), esize);
  if (n > 0) reduce_host_fn(t, weftProd)(out.data(), nullptr, x.data(), rep.data(), n, 1);
  return out;
}

// --- the simulated device executor ------------------------------------------

// One channel of every rank, run step by step: a rank runs its next step
// when the FIFO it receives from holds a slot and the one it sends to has
// room; until no rank can. Each primitive does what the kernels' does
// (prims_device.cuh): received op source, the source scaled where it is this
// rank's input of a pre-multiply sum (or of avg of a narrow floating type, by
// 1/n: redop_avg_prescales), divided where the step says.
struct SimResult {
  std::vector<size_t> left; // steps not run, per rank (a deadlock if any)
  std::vector<size_t> fifo_left; // slots never received
};

void sim_channel(const Case &c, const std::vector<tree_links> (&links)[2], bool one_tree, int ch,
                 const std::vector<std::vector<uint8_t>> &send,
                 std::vector<std::vector<uint8_t>> &recv, SimResult *res) {
  const int k = c.nranks;
  const size_t esize = weftTypeSize(c.type);
  const size_t piece = piece_count(kSizes[c.size].piece, esize);
  const bool avg_scaled = c.op == weftAvg && redop_avg_prescales(c.type);
  const weftRedOp_t rop = c.op == kPremul || avg_scaled ? weftSum : (weftRedOp_t)c.op;
  const weft_reduce_fn reduce = reduce_host_fn(c.type, rop);
  const int divisor = c.op == weftAvg && !avg_scaled ? k : 1;
  std::vector<uint8_t> inv_k(8);
  if (avg_scaled) redop_avg_scalar(c.type, k, reinterpret_cast<char *>(inv_k.data()));
  inv_k.resize(esize);
  std::vector<tree_geom> g(k);
  std::vector<std::vector<tree_step>> steps(k);
  for (int r = 0; r < k; r++) {
    const tree_links mine[2] = {links[0][r], links[1][r]};
    tree_geom_init_trees(&g[r], mine, one_tree ? 1 : 2, c.nchannels, ch, c.count, esize, piece);
    size_t n = tree_steps_dump_c(&g[r], nullptr, 0);
    steps[r].resize(n);
    tree_steps_dump_c(&g[r], steps[r].data(), n);
    ASSERT_EQ(n, tree_nsteps_total(&g[r])) << "rank " << r;
  }
  std::map<std::pair<int, int>, std::deque<std::vector<uint8_t>>> fifo; // (from, to)
  std::vector<size_t> next(k, 0);
  bool progress = true;
  while (progress) {
    progress = false;
    for (int r = 0; r < k; r++) {
      while (next[r] < steps[r].size()) {
        const tree_step &st = steps[r][next[r]];
        const int from = st.recv_peer >= 0 ? g[r].peer[st.recv_peer] : -1;
        const int to = st.send_peer >= 0 ? g[r].peer[st.send_peer] : -1;
        const bool recvs = st.prim >= PRIM_RECV, sends = to >= 0;
        ASSERT_EQ(recvs, from >= 0) << "rank " << r << " step " << next[r];
        ASSERT_EQ(sends, st.prim != PRIM_RECV && st.prim != PRIM_RECV_REDUCE_COPY)
            << "rank " << r << " step " << next[r];
        if (recvs && fifo[{from, r}].empty()) break;
        if (sends && fifo[{r, to}].size() >= (size_t)c.slots) break; // no credit
        const size_t nbytes = st.count * esize, off = st.elem * esize;
        std::vector<uint8_t> in;
        if (recvs) {
          in = fifo[{from, r}].front();
          fifo[{from, r}].pop_front();
          ASSERT_EQ(in.size(), nbytes) << "rank " << r << " step " << next[r]
                                       << " receives a slot of another size from " << from;
        }
        std::vector<uint8_t> val(nbytes);
        if (ring_prim_has_src(st.prim)) {
          const std::vector<uint8_t> &buf = st.src_own ? send[r] : recv[r];
          ASSERT_LE(off + nbytes, buf.size());
          std::vector<uint8_t> a(buf.begin() + off, buf.begin() + off + nbytes);
          if (st.src_own && c.op == kPremul) a = times_scalar(c.type, a);
          if (st.src_own && avg_scaled) a = times_scalar(c.type, a, inv_k);
          if (recvs && st.count > 0)
            reduce(val.data(), nullptr, a.data(), in.data(), st.count, st.divide ? divisor : 1);
          else
            val = a;
        } else {
          val = in;
        }
        if (ring_prim_has_dst(st.prim)) {
          ASSERT_LE(off + nbytes, recv[r].size());
          std::copy(val.begin(), val.end(), recv[r].begin() + off);
        }
        if (sends) fifo[{r, to}].push_back(val);
        next[r]++;
        progress = true;
      }
    }
  }
  res->left.assign(k, 0);
  for (int r = 0; r < k; r++) res->left[r] = steps[r].size() - next[r];
  res->fifo_left.clear();
  for (auto &f : fifo) res->fifo_left.push_back(f.second.size());
}

// The device executor's result of a case: every channel simulated over the
// same buffers (in place: the send buffers are the receive buffers); over
// links[0] alone where one_tree (the tree of small calls).
void sim_case(const Case &c, const std::vector<tree_links> (&links)[2], bool one_tree,
              const std::vector<std::vector<uint8_t>> &inputs,
              std::vector<std::vector<uint8_t>> *out) {
  const size_t nbytes = c.count * weftTypeSize(c.type);
  std::vector<std::vector<uint8_t>> send = inputs;
  out->assign(c.nranks, std::vector<uint8_t>(nbytes, 0xa5));
  if (c.in_place) *out = inputs;
  for (int ch = 0; ch < c.nchannels; ch++) {
    SimResult res;
    sim_channel(c, links, one_tree, ch, c.in_place ? *out : send, *out, &res);
    if (testing::Test::HasFatalFailure()) return;
    for (int r = 0; r < c.nranks; r++)
      ASSERT_EQ(res.left[r], 0u) << "channel " << ch << " rank " << r << " is stuck with "
                                 << res.left[r] << " steps left: the trees deadlock";
    for (size_t f : res.fifo_left) ASSERT_EQ(f, 0u) << "channel " << ch << ": slots left unread";
  }
}

// The tree element i goes through: the host executor's (one channel, both
// trees) or channel ch's of the device's.
int tree_of_element(size_t count, size_t esize, int nchannels, size_t i) {
  const int parts = nchannels == 1 ? 2 : nchannels;
  for (int p = 0; p < parts; p++) {
    size_t off, cnt;
    ring_channel_share(count, parts, esize, p, &off, &cnt);
    if (i >= off && i < off + cnt) return p % 2;
  }
  return -1;
}

// --- the host executor on forked ranks ----------------------------------------

// What the ranks hand back: their trees (comm->trees and comm->tree_small),
// the size up to which a call takes the small ones, and each case's output.
struct SharedHead {
  tree_links links[2][16];
  tree_links small[16];
  size_t small_nbytes;
};
struct Shared {
  uint8_t *base = nullptr;
  size_t nbytes = 0;
  SharedHead *head() { return reinterpret_cast<SharedHead *>(base); }
  uint8_t *out(size_t at) { return base + sizeof(SharedHead) + at; }
};

class TreeSteps : public testing::TestWithParam<int> {};

TEST_P(TreeSteps, SimulatedDeviceStepsMatchTheHostExecutor) {
  const int k = GetParam();
  const uint64_t seed = test_seed();
  const std::vector<Case> cases = draw_cases(k, seed);
  printf("tree steps: %d ranks, seed %llu (WEFT_TEST_SEED to repeat)\n", k,
         (unsigned long long)seed);
  std::vector<size_t> at(cases.size());
  size_t total = 0;
  for (size_t i = 0; i < cases.size(); i++) {
    at[i] = total;
    total += cases[i].count * weftTypeSize(cases[i].type) * (size_t)k;
  }
  Shared sh;
  sh.nbytes = sizeof(SharedHead) + total + 1;
  void *m = mmap(nullptr, sh.nbytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(m, MAP_FAILED);
  sh.base = static_cast<uint8_t *>(m);

  RunOptions opts;
  opts.timeout_s = 300;
  opts.env = {{"WEFT_ALGO", "tree"}, {"WEFT_SLOT_BYTES", "4096"}, {"WEFT_TIMEOUT", "60"}};
  // the small calls' trees (comm_tree_links): by default the classes up to
  // tiny_slots take them; at even rank counts the LL class's several slots too
  if (k % 2 == 0) opts.env.push_back({"WEFT_TREE_SMALL_BYTES", "64K"});
  printf("tree steps: small calls' trees up to %s\n", k % 2 == 0 ? "64K" : "the default");
  auto status = run_ranks(k, [&](const RankCtx &ctx) {
    weftComm_t comm;
    if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
      return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
    for (int t = 0; t < 2; t++) sh.head()->links[t][ctx.rank] = comm->trees[t];
    sh.head()->small[ctx.rank] = comm->tree_small;
    if (ctx.rank == 0) sh.head()->small_nbytes = comm->tree_small_nbytes;
    int rc = 0;
    for (size_t i = 0; i < cases.size() && rc == 0; i++) {
      const Case &c = cases[i];
      const size_t nbytes = c.count * weftTypeSize(c.type);
      std::vector<uint8_t> send = inputs_of(c, seed + i)[ctx.rank];
      std::vector<uint8_t> recv(nbytes + 1, 0xa5);
      if (c.in_place) std::copy(send.begin(), send.end(), recv.begin());
      weftRedOp_t op = (weftRedOp_t)c.op;
      std::vector<uint8_t> scalar = scalar_two(c.type);
      if (c.op == kPremul &&
          weftRedOpCreatePreMulSum(&op, scalar.data(), c.type, weftScalarHostImmediate, comm) !=
              weftSuccess)
        rc = rank_fail(ctx, "premulsum: %s", weftGetLastError(comm));
      if (rc == 0 && weftAllReduce(c.in_place ? recv.data() : send.data(), recv.data(), c.count,
                                   c.type, op, comm, nullptr) != weftSuccess)
        rc = rank_fail(ctx, "%s: %s", case_text(c).c_str(), weftGetLastError(comm));
      if (c.op == kPremul && rc == 0) weftRedOpDestroy(op, comm);
      if (rc == 0) memcpy(sh.out(at[i] + (size_t)ctx.rank * nbytes), recv.data(), nbytes);
    }
    weftCommDestroy(comm);
    return rc;
  }, opts);
  for (int r = 0; r < k; r++) ASSERT_EQ(status[r], 0) << "rank " << r;

  std::vector<tree_links> trees[2], small[2];
  for (int t = 0; t < 2; t++) {
    trees[t].assign(sh.head()->links[t], sh.head()->links[t] + k);
    small[t].assign(sh.head()->small, sh.head()->small + k); // [1] unused
  }
  EXPECT_EQ(sh.head()->small_nbytes, k % 2 == 0 ? 65536u : 4096u);
  for (size_t i = 0; i < cases.size(); i++) {
    const Case &c = cases[i];
    SCOPED_TRACE(case_text(c));
    const size_t esize = weftTypeSize(c.type), nbytes = c.count * esize;
    // the trees the call takes, as comm_tree_small decides in both
    // executors: the tree of small calls on one channel, the device's way
    const bool is_small = nbytes <= sh.head()->small_nbytes;
    const std::vector<tree_links>(&links)[2] = is_small ? small : trees;
    Case sim = c;
    if (is_small) sim.nchannels = 1;
    printf("  %s: %s\n", case_text(c).c_str(),
           is_small ? "the tree of small calls, 1 channel" : "the double binary tree");
    const std::vector<std::vector<uint8_t>> inputs = inputs_of(c, seed + i);
    std::vector<std::vector<uint8_t>> dev;
    sim_case(sim, links, is_small, inputs, &dev);
    if (HasFatalFailure()) break;
    std::vector<std::vector<uint8_t>> ref_inputs = inputs;
    if (c.op == kPremul)
      for (auto &x : ref_inputs) x = times_scalar(c.type, x);
    const weftRedOp_t rop = c.op == kPremul ? weftSum : (weftRedOp_t)c.op;
    for (int r = 0; r < k; r++) {
      const uint8_t *host = sh.out(at[i] + (size_t)r * nbytes);
      std::string why;
      EXPECT_TRUE(check_reduction(c.type, rop, ref_inputs, dev[r].data(), c.count, &why))
          << "device steps, rank " << r << ": " << why;
      EXPECT_TRUE(check_reduction(c.type, rop, ref_inputs, host, c.count, &why))
          << "host executor, rank " << r << ": " << why;
      EXPECT_EQ(memcmp(dev[r].data(), dev[0].data(), nbytes), 0)
          << "rank " << r << "'s result differs from rank 0's";
      size_t same_tree = 0;
      for (size_t e = 0; e < c.count; e++) {
        // the tree of small calls carries every element, whole
        if (!is_small &&
            tree_of_element(c.count, esize, 1, e) != tree_of_element(c.count, esize, c.nchannels, e))
          continue;
        same_tree++;
        ASSERT_EQ(memcmp(dev[r].data() + e * esize, host + e * esize, esize), 0)
            << "rank " << r << " element " << e << ": the device steps and the host executor "
            << "reduce it over the same tree, in the same order";
      }
      if (c.nchannels <= 2 || is_small) {
        EXPECT_EQ(same_tree, c.count);
      }
    }
  }
  munmap(m, sh.nbytes);
}

INSTANTIATE_TEST_SUITE_P(Ranks, TreeSteps, testing::Range(2, 10),
                         [](const testing::TestParamInfo<int> &p) {
                           return "ranks" + std::to_string(p.param);
                         });

// The primitives of up and down, by a rank's place in a tree, for the
// double binary tree of every rank count up to 16: every child's slot is
// received once and the parent's sent once in up(i), the reverse in down(i);
// only the root's last reduction divides; a step reads this rank's input
// only before anything was reduced into the receive buffer.
TEST(TreeStepsShape, UpAndDownPerPlace) {
  for (int n = 2; n <= 16; n++)
    for (int t = 0; t < 2; t++)
      for (int r = 0; r < n; r++) {
        tree_links l[2];
        tree_dtree_links(n, r, 0, &l[0]);
        tree_dtree_links(n, r, 1, &l[1]);
        tree_geom g;
        tree_geom_init(&g, l, 2, t, 128, 4, 64); // one piece of tree t
        const tree_part &h = g.part[0];
        SCOPED_TRACE("n " + std::to_string(n) + " tree " + std::to_string(t) + " rank " +
                     std::to_string(r));
        ASSERT_EQ(h.npieces, 1u);
        std::vector<tree_step> st(tree_nsteps_total(&g));
        ASSERT_EQ(tree_steps_dump_c(&g, st.data(), st.size()), st.size());
        const int up_n = tree_up_nsteps(&h);
        std::vector<int> up_recv, up_send, down_recv, down_send;
        int divides = 0, own_reads = 0;
        for (int j = 0; j < (int)st.size(); j++) {
          const bool up = j < up_n;
          if (st[j].recv_peer >= 0) (up ? up_recv : down_recv).push_back(g.peer[st[j].recv_peer]);
          if (st[j].send_peer >= 0) (up ? up_send : down_send).push_back(g.peer[st[j].send_peer]);
          divides += st[j].divide;
          if (ring_prim_has_src(st[j].prim) && st[j].src_own) {
            own_reads++;
            EXPECT_EQ(j, 0) << "this rank's input read after the first step";
          }
          EXPECT_EQ(st[j].piece, 0u);
          EXPECT_EQ(st[j].elem, 64u * (size_t)t);
          EXPECT_EQ(st[j].count, 64u);
        }
        std::vector<int> children(h.links.child, h.links.child + h.links.nchildren);
        std::vector<int> parent;
        if (h.links.parent != TREE_NONE) parent.push_back(h.links.parent);
        EXPECT_EQ(up_recv, children);
        EXPECT_EQ(up_send, parent);
        EXPECT_EQ(down_recv, parent);
        EXPECT_EQ(down_send, children);
        EXPECT_EQ(divides, h.links.parent == TREE_NONE ? 1 : 0);
        EXPECT_EQ(own_reads, 1);
      }
}

// Alone, a channel runs both trees over the halves the host executor cuts;
// several channels run a tree each, alternating, over ring_channel_share's cut.
TEST(TreeStepsShape, PartsPerChannelCount) {
  tree_links l[2];
  tree_dtree_links(5, 2, 0, &l[0]);
  tree_dtree_links(5, 2, 1, &l[1]);
  tree_geom g;
  tree_geom_init(&g, l, 1, 0, 1001, 4, 64);
  ASSERT_EQ(g.nparts, 2);
  EXPECT_EQ(g.part[0].first, 0u);
  EXPECT_EQ(g.part[0].count, 512u); // half, up to 64 bytes
  EXPECT_EQ(g.part[1].first, 512u);
  EXPECT_EQ(g.part[1].count, 489u);
  EXPECT_EQ(g.part[0].npieces, 8u);
  for (int ch = 0; ch < 3; ch++) {
    tree_geom_init(&g, l, 3, ch, 1001, 4, 64);
    ASSERT_EQ(g.nparts, 1);
    EXPECT_EQ(g.part[0].links.depth, l[ch % 2].depth);
    size_t off, cnt;
    ring_channel_share(1001, 3, 4, ch, &off, &cnt);
    EXPECT_EQ(g.part[0].first, off);
    EXPECT_EQ(g.part[0].count, cnt);
  }
}

#if WEFT_HAVE_CUDA
bool same_step(const tree_step &a, const tree_step &b) {
  return a.prim == b.prim && a.recv_peer == b.recv_peer && a.send_peer == b.send_peer &&
         a.src_own == b.src_own && a.divide == b.divide && a.piece == b.piece && a.elem == b.elem &&
         a.count == b.count;
}
#endif

// The kernels' compile of the steps (nvcc, host pass; the device pass where
// a GPU is) is the host executor's, step for step.
TEST(TreeStepsShape, NvccCompileGivesTheSameSteps) {
#if !WEFT_HAVE_CUDA
  GTEST_SKIP() << "built without CUDA: no nvcc compile to compare with";
#else
  bool device = true;
  for (int n = 2; n <= 9; n++)
    for (int nch : {1, 2, 3})
      for (int r = 0; r < n; r++)
        for (int ch = 0; ch < nch; ch++) {
          tree_links l[2];
          tree_dtree_links(n, r, 0, &l[0]);
          tree_dtree_links(n, r, 1, &l[1]);
          tree_geom g;
          tree_geom_init(&g, l, nch, ch, 777, 2, 32);
          std::vector<tree_step> want(tree_steps_dump_c(&g, nullptr, 0));
          tree_steps_dump_c(&g, want.data(), want.size());
          std::vector<tree_step> got(want.size() + 1);
          ASSERT_EQ(tree_steps_dump_nvcc_host(&g, got.data(), got.size()), want.size());
          for (size_t i = 0; i < want.size(); i++) ASSERT_TRUE(same_step(got[i], want[i])) << "step " << i;
          if (!device) continue;
          long dn = tree_steps_dump_nvcc_device(&g, got.data(), got.size());
          if (dn < 0) {
            device = false; // no GPU: the host pass only
            continue;
          }
          ASSERT_EQ((size_t)dn, want.size());
          for (size_t i = 0; i < want.size(); i++)
            ASSERT_TRUE(same_step(got[i], want[i])) << "device step " << i;
        }
  if (!device) printf("no GPU: nvcc's device pass not run\n");
#endif
}

}  // namespace
