// What the device path is without a GPU: the ring step sequences (run on a
// simulated ring, and compared across the C, nvcc-host and nvcc-device
// compiles), the generated kernel matrix, and the errors of a build without
// CUDA.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <deque>
#include <numeric>
#include <string>
#include <vector>

#include "harness.h"
#include "tests/device/ring_steps_dump.h"
#include "weft.h"
#include "weft_build_config.h"
#include "collectives/exec/host/run.h"

namespace {

struct SimCase {
  int coll;
  int nranks;
  size_t count;      // the plan's count
  size_t slot_count; // elements per slot
  int nchannels;
  int root;
  int interleave; // loops a channel takes together (struct ring_iter)
};

const char *coll_name(int coll) {
  static const char *const names[] = {"allreduce", "allgather", "reducescatter", "broadcast",
                                      "reduce"};
  return coll == RING_ALLREDUCE_PAIR ? "allreducepair" : names[coll];
}

std::string case_name(const testing::TestParamInfo<SimCase> &info) {
  const SimCase &c = info.param;
  char buf[128];
  snprintf(buf, sizeof buf, "%s_k%d_n%zu_slot%zu_ch%d_root%d_il%d", coll_name(c.coll),
           c.nranks, c.count, c.slot_count, c.nchannels, c.root, c.interleave);
  return buf;
}

std::vector<SimCase> sim_cases() {
  std::vector<SimCase> v;
  for (int coll = 0; coll < RING_NCOLLS; coll++)
    for (int k : {2, 3, 4, 7})
      for (size_t count : {1ul, 13ul, 64ul, 1000ul})
        for (size_t slot : {8ul, 64ul})
          for (int nch : {1, 3})
            for (int il : {1, 2, 3})
              v.push_back({coll, k, count, slot, nch, k > 2 ? 1 : k - 1, il});
  // the device's all-reduce of two ranks in one exchange
  for (size_t count : {1ul, 13ul, 64ul, 1000ul})
    for (size_t slot : {8ul, 64ul})
      for (int nch : {1, 3})
        for (int il : {1, 2, 3}) v.push_back({RING_ALLREDUCE_PAIR, 2, count, slot, nch, 1, il});
  return v;
}

// A ring in a shuffled order, so that ring[] and positions differ from ranks.
std::vector<int> shuffled_ring(int k, uint64_t seed) {
  std::vector<int> ring(k);
  std::iota(ring.begin(), ring.end(), 0);
  weft_test::Rng rng(seed);
  for (int i = k - 1; i > 0; i--) std::swap(ring[i], ring[rng.next() % (uint64_t)(i + 1)]);
  return ring;
}

// The channel shares of plan_run_host and the ring kernel: contiguous,
// 64-byte aligned (8-byte elements here).
std::vector<std::pair<size_t, size_t>> channel_shares(size_t count, int nch) {
  size_t align = 64 / 8, share = (count + nch - 1) / nch;
  share = (share + align - 1) / align * align;
  std::vector<std::pair<size_t, size_t>> v;
  for (int c = 0; c < nch; c++) {
    size_t off = (size_t)c * share;
    if (off >= count) break;
    v.push_back({off, std::min(share, count - off)});
  }
  return v;
}

int pos_of(const std::vector<int> &ring, int rank) {
  return (int)(std::find(ring.begin(), ring.end(), rank) - ring.begin());
}

ring_geom geom_for(const SimCase &c, const std::vector<int> &ring, int rank, size_t off,
                   size_t cnt) {
  int pos = pos_of(ring, rank), root_pos = pos_of(ring, c.root);
  bool rooted = c.coll == RING_BROADCAST || c.coll == RING_REDUCE;
  ring_geom g;
  ring_geom_init(&g, c.coll, c.nranks, pos, rooted ? root_pos : -1, c.count, off, cnt,
                 c.slot_count, 8);
  return g;
}

std::vector<ring_step> steps_of(const ring_geom &g, const std::vector<int> &ring,
                                int interleave) {
  size_t n = ring_steps_dump_c(&g, ring.data(), nullptr, 0, interleave);
  std::vector<ring_step> v(n);
  ring_steps_dump_c(&g, ring.data(), v.data(), n, interleave);
  return v;
}

// The device kernel's order (ring_kernel_iter): the steps with a chain's
// agreement around them, whose slots carry no data (count 0).
std::vector<ring_step> kernel_steps_of(const ring_geom &g, const std::vector<int> &ring,
                                       int interleave) {
  std::vector<ring_step> v;
  ring_kernel_iter ki;
  ring_kernel_iter_init(&ki, &g, interleave);
  ring_step st;
  int agree;
  while (ring_kernel_iter_next(&ki, &g, ring.data(), &st, &agree)) {
    if (agree) {
      EXPECT_EQ(st.count, 0u) << "an agreement slot carries no data";
    }
    v.push_back(st);
  }
  return v;
}

// One channel share run on a simulated ring: a FIFO of `slots` slots into
// each rank (a step that sends waits for room, as the kernels wait for
// credit), int64 sums. What each rank ran, sent and received; a rank whose
// next_step falls short of its steps was stuck (the ring deadlocked).
struct SimChannel {
  std::vector<std::vector<ring_step>> steps;
  std::vector<size_t> next_step, sent, received;
  std::vector<std::deque<std::vector<int64_t>>> fifo; // into each rank
};

void sim_channel(const SimCase &c, const std::vector<int> &ring, size_t off, size_t cnt,
                 size_t slots, const std::vector<std::vector<int64_t>> &send,
                 std::vector<std::vector<int64_t>> &recv, SimChannel *sc, bool kernel_order) {
  const int k = c.nranks;
  sc->steps.assign(k, {});
  for (int r = 0; r < k; r++)
    sc->steps[r] = kernel_order ? kernel_steps_of(geom_for(c, ring, r, off, cnt), ring, c.interleave)
                                : steps_of(geom_for(c, ring, r, off, cnt), ring, c.interleave);
  sc->fifo.assign(k, {});
  sc->next_step.assign(k, 0);
  sc->sent.assign(k, 0);
  sc->received.assign(k, 0);
  bool progress = true;
  while (progress) {
    progress = false;
    for (int r = 0; r < k; r++) {
      while (sc->next_step[r] < sc->steps[r].size()) {
        const ring_step &st = sc->steps[r][sc->next_step[r]];
        const bool recvs = st.prim >= PRIM_RECV;
        const bool sends = st.prim != PRIM_RECV && st.prim != PRIM_RECV_REDUCE_COPY;
        const int next = ring[(pos_of(ring, r) + 1) % k];
        if (recvs && sc->fifo[r].empty()) break;
        if (sends && sc->fifo[next].size() >= slots) break; // no credit
        std::vector<int64_t> val(st.count);
        if (recvs) {
          ASSERT_EQ(sc->fifo[r].front().size(), st.count)
              << "rank " << r << " step " << sc->next_step[r]
              << " receives a slot of another size";
          val = sc->fifo[r].front();
          sc->fifo[r].pop_front();
          sc->received[r]++;
        }
        for (size_t i = 0; i < st.count; i++) {
          int64_t s = ring_prim_has_src(st.prim) ? send[r].at(st.src_elem + i) : 0;
          val[i] = recvs ? val[i] + s : s;
        }
        if (ring_prim_has_dst(st.prim))
          for (size_t i = 0; i < st.count; i++) recv[r].at(st.dst_elem + i) = val[i];
        if (sends) {
          sc->fifo[next].push_back(val);
          sc->sent[r]++;
        }
        sc->next_step[r]++;
        progress = true;
      }
    }
  }
}

std::vector<std::vector<int64_t>> sim_inputs(const SimCase &c) {
  const size_t send_n = c.coll == RING_REDUCESCATTER ? c.count * c.nranks : c.count;
  std::vector<std::vector<int64_t>> send(c.nranks);
  weft_test::Rng rng(99);
  for (int r = 0; r < c.nranks; r++)
    for (size_t i = 0; i < send_n; i++) send[r].push_back((int64_t)(rng.next() % 1000) - 500);
  return send;
}

class RingSteps : public testing::TestWithParam<SimCase> {};

// Runs every rank's steps on the simulated ring, with as few slots per FIFO
// as the interleave allows (ring_interleave_max), and compares with the
// collective's definition: the host executor's order, then the device
// kernel's (a chain's agreement slots around the steps). A step that
// receives a slot of another size, or a ring that stops with steps left,
// fails.
void run_sim_case(const SimCase &c, bool kernel_order) {
  const int k = c.nranks;
  const std::vector<int> ring = shuffled_ring(k, 1234 + k);
  const size_t n = c.count;
  const size_t recv_n = c.coll == RING_ALLGATHER ? n * k : n;
  const int64_t poison = -777777;
  const std::vector<std::vector<int64_t>> send = sim_inputs(c);
  std::vector<std::vector<int64_t>> recv(k, std::vector<int64_t>(recv_n, poison));
  size_t slots = 2; // a ring needs two (each step waits for its slot in and its slot out)
  while (ring_interleave_max((int)slots) < c.interleave) slots++;

  const auto shares = channel_shares(n, c.nchannels);
  for (int ch = 0; ch < c.nchannels; ch++) { // the executors' cut is this one
    size_t off, cnt;
    ring_channel_share(n, c.nchannels, 8, ch, &off, &cnt);
    if ((size_t)ch < shares.size()) {
      EXPECT_EQ(off, shares[ch].first) << "channel " << ch;
      EXPECT_EQ(cnt, shares[ch].second) << "channel " << ch;
    } else {
      EXPECT_EQ(cnt, 0u) << "channel " << ch << " past the end";
    }
  }
  for (auto [off, cnt] : shares) {
    SimChannel sc;
    sim_channel(c, ring, off, cnt, slots, send, recv, &sc, kernel_order);
    if (testing::Test::HasFatalFailure()) return;
    for (int r = 0; r < k; r++) {
      ASSERT_EQ(sc.next_step[r], sc.steps[r].size())
          << "rank " << r << " is stuck: the ring deadlocks with " << slots << " slots";
      ASSERT_TRUE(sc.fifo[r].empty()) << "rank " << r << " left slots unread";
      // what a network hop's proxy is told to expect (device_net_expect_ring)
      const ring_geom g = geom_for(c, ring, r, off, cnt);
      size_t nsends = 0, nrecvs = 0, agree_sends = 0, agree_recvs = 0;
      ring_channel_nslots(&g, ring.data(), &nsends, &nrecvs);
      if (kernel_order)
        ring_chain_agree_nslots(c.coll, k, g.root_pos, g.pos, &agree_sends, &agree_recvs);
      EXPECT_EQ(nsends + agree_sends, sc.sent[r]) << "rank " << r;
      EXPECT_EQ(nrecvs + agree_recvs, sc.received[r]) << "rank " << r;
    }
  }

  for (int r = 0; r < k; r++)
    for (size_t i = 0; i < recv_n; i++) {
      int64_t want = poison;
      switch (c.coll) {
        case RING_ALLREDUCE:
        case RING_ALLREDUCE_PAIR:
          want = 0;
          for (int q = 0; q < k; q++) want += send[q][i];
          break;
        case RING_ALLGATHER: want = send[i / n][i % n]; break;
        case RING_REDUCESCATTER:
          want = 0;
          for (int q = 0; q < k; q++) want += send[q][(size_t)r * n + i];
          break;
        case RING_BROADCAST: want = send[c.root][i]; break;
        case RING_REDUCE:
          if (r == c.root) {
            want = 0;
            for (int q = 0; q < k; q++) want += send[q][i];
          }
          break;
      }
      ASSERT_EQ(recv[r][i], want) << "rank " << r << " element " << i;
    }
}

TEST_P(RingSteps, SimulatedRingComputesTheCollective) {
  const SimCase c = GetParam();
  for (bool kernel_order : {false, true}) {
    SCOPED_TRACE(kernel_order ? "the device kernel's order" : "the host executor's order");
    run_sim_case(c, kernel_order);
    if (HasFatalFailure()) return;
  }
}

// The kernels' compile of the steps (nvcc, host and device passes) is the
// host executor's, step for step.
TEST_P(RingSteps, NvccCompileGivesTheSameSteps) {
#if !WEFT_HAVE_CUDA
  GTEST_SKIP() << "built without CUDA: no nvcc compile to compare with";
#else
  const SimCase c = GetParam();
  const std::vector<int> ring = shuffled_ring(c.nranks, 77);
  for (int r = 0; r < c.nranks; r++)
    for (auto [off, cnt] : channel_shares(c.count, c.nchannels)) {
      ring_geom g = geom_for(c, ring, r, off, cnt);
      std::vector<ring_step> want = steps_of(g, ring, c.interleave);
      std::vector<ring_step> got(want.size() + 1);
      size_t n =
          ring_steps_dump_nvcc_host(&g, ring.data(), got.data(), got.size(), c.interleave);
      ASSERT_EQ(n, want.size());
      for (size_t i = 0; i < n; i++) {
        ASSERT_EQ(got[i].prim, want[i].prim) << "step " << i;
        ASSERT_EQ(got[i].count, want[i].count) << "step " << i;
        if (ring_prim_has_src(want[i].prim)) {
          ASSERT_EQ(got[i].src_elem, want[i].src_elem);
        }
        if (ring_prim_has_dst(want[i].prim)) {
          ASSERT_EQ(got[i].dst_elem, want[i].dst_elem);
        }
      }
    }
#endif
}

INSTANTIATE_TEST_SUITE_P(All, RingSteps, testing::ValuesIn(sim_cases()), case_name);

// ring_interleave_max is the most a FIFO's slots allow: one loop more in
// flight and every rank fills its next rank's FIFO while its own waits on
// the rank before, around the ring.
TEST(RingInterleave, OneLoopMoreThanTheSlotsAllowDeadlocks) {
  for (int coll : {RING_ALLREDUCE, RING_ALLGATHER, RING_REDUCESCATTER})
    for (int slots : {2, 3, 4}) {
      const SimCase c = {coll, 4, 1000, 8, 1, 1, ring_interleave_max(slots) + 1};
      const std::vector<int> ring = shuffled_ring(c.nranks, 5);
      const auto send = sim_inputs(c);
      std::vector<std::vector<int64_t>> recv(
          c.nranks, std::vector<int64_t>(coll == RING_ALLGATHER ? c.count * c.nranks : c.count));
      SimChannel sc;
      sim_channel(c, ring, 0, c.count, slots, send, recv, &sc, false);
      ASSERT_FALSE(HasFatalFailure());
      bool stuck = false;
      for (int r = 0; r < c.nranks; r++) stuck |= sc.next_step[r] < sc.steps[r].size();
      EXPECT_TRUE(stuck) << coll_name(coll) << ": interleave " << c.interleave << " on " << slots
                         << " slots ran through";
    }
}

// Steps per loop: NCCL's textbook counts.
TEST(RingStepsShape, LoopLengths) {
  ring_geom g;
  for (int k : {2, 5, 16}) {
    ring_geom_init(&g, RING_ALLREDUCE, k, 0, -1, 100, 0, 100, 8, 4);
    EXPECT_EQ(ring_loop_nsteps(&g), 2 * k - 1);
    EXPECT_EQ(ring_loop_nelems(&g), (size_t)k * 8);
    ring_geom_init(&g, RING_ALLGATHER, k, 0, -1, 100, 0, 100, 8, 4);
    EXPECT_EQ(ring_loop_nsteps(&g), k);
    ring_geom_init(&g, RING_BROADCAST, k, 0, 0, 100, 0, 100, 8, 4);
    EXPECT_EQ(ring_loop_nsteps(&g), 1);
  }
  // two ranks in one exchange: a send and a receive per slot, half the ring's
  // dependent steps (its loop: send, recv-reduce-copy-send, recv over 2 slots)
  ring_geom_init(&g, RING_ALLREDUCE_PAIR, 2, 0, -1, 100, 0, 100, 8, 4);
  EXPECT_EQ(ring_loop_nsteps(&g), 2);
  EXPECT_EQ(ring_loop_nelems(&g), 8u);
}

// Loops taken together: step s of each loop of a group before step s + 1 of
// any; the last group holds the loops left; every step once.
TEST(RingStepsShape, InterleavedOrder) {
  ring_geom g;
  ring_geom_init(&g, RING_ALLGATHER, 3, 0, -1, 100, 0, 5 * 8 - 3, 8, 4); // 5 loops of 3 steps
  for (int il : {1, 2, 3, 7}) {
    std::vector<std::pair<size_t, int>> want; // (loop, step)
    for (int first = 0; first < 5; first += il)
      for (int s = 0; s < 3; s++)
        for (int l = first; l < std::min(first + il, 5); l++) want.push_back({(size_t)l, s});
    struct ring_iter o;
    ring_iter_init(&o, &g, il);
    std::vector<std::pair<size_t, int>> got;
    size_t base;
    int s;
    while (ring_iter_next(&o, &base, &s) && got.size() <= want.size()) {
      EXPECT_EQ(base % 8, 0u);
      got.push_back({base / 8, s});
    }
    EXPECT_EQ(got, want) << "interleave " << il;
    EXPECT_EQ(ring_nsteps_total(&g), want.size());
  }
}

// --- the generated matrix -------------------------------------------------

std::vector<std::string> gen_list(const char *matrix) {
  std::string cmd = std::string("python3 ") + WEFT_GEN_KERNELS + " --list --matrix " + matrix;
  std::vector<std::string> lines;
  FILE *p = popen(cmd.c_str(), "r");
  if (p == nullptr) return lines;
  char buf[128];
  while (fgets(buf, sizeof buf, p)) lines.push_back(std::string(buf, strcspn(buf, "\n")));
  EXPECT_EQ(pclose(p), 0) << cmd;
  return lines;
}

const char *const kTags[] = {"i8", "u8", "i32", "u32", "i64", "u64",
                             "f16", "f32", "f64", "bf16", "e4m3", "e5m2"};
const char *const kOps[] = {"sum", "prod", "max", "min", "avg", "premulsum"};
constexpr size_t kNumOps = sizeof kOps / sizeof kOps[0];

TEST(KernelMatrix, FullHasEveryDatatypeAndOp) {
  std::vector<std::string> full = gen_list("full");
  ASSERT_EQ(full.size(), 12u * kNumOps);
  for (const char *t : kTags)
    for (const char *o : kOps)
      EXPECT_NE(std::find(full.begin(), full.end(), std::string(t) + " " + o), full.end())
          << t << " " << o;
}

// small still compiles every datatype's arithmetic and every op.
TEST(KernelMatrix, SmallCoversEveryDatatypeAndEveryOp) {
  std::vector<std::string> small = gen_list("small");
  EXPECT_LT(small.size(), 12u * kNumOps);
  for (const char *t : kTags)
    EXPECT_NE(std::find(small.begin(), small.end(), std::string(t) + " sum"), small.end()) << t;
  for (const char *o : kOps)
    EXPECT_NE(std::find(small.begin(), small.end(), std::string("f32 ") + o), small.end()) << o;
}

TEST(KernelMatrix, GeneratedFilesInstantiateTheMatrix) {
  char dir[] = "/tmp/weft-gen-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  std::string cmd = std::string("python3 ") + WEFT_GEN_KERNELS + " --matrix small --outdir " + dir;
  ASSERT_EQ(system(cmd.c_str()), 0) << cmd;
  std::vector<std::string> small = gen_list("small");
  for (const char *t : kTags) {
    std::string path = std::string(dir) + "/kernels_" + t + ".cu";
    FILE *f = fopen(path.c_str(), "r");
    ASSERT_NE(f, nullptr) << path;
    std::string text;
    char buf[4096];
    size_t got;
    while ((got = fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, got);
    fclose(f);
    auto occurrences = [&](const std::string &what) {
      size_t n = 0;
      for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) n++;
      return n;
    };
    size_t pairs = std::count_if(small.begin(), small.end(), [&](const std::string &s) {
      return s.rfind(std::string(t) + " ", 0) == 0;
    });
    EXPECT_EQ(occurrences("(const void *)weft_ring_kernel<"), 2 * pairs)
        << t << ": one kernel per protocol for each op of the matrix";
    // and each registered for the host build (tests/device/cuda_emu)
    EXPECT_EQ(occurrences("CUDA_EMU_KERNEL(&weft_ring_kernel<"), 2 * pairs) << t;
    EXPECT_EQ(occurrences("CUDA_EMU_KERNEL(&weft_tree_kernel<"), 2 * pairs) << t;
    unlink(path.c_str());
  }
  unlink((std::string(dir) + "/kernel_table.c").c_str());
  rmdir(dir);
}

#if WEFT_HAVE_CUDA
extern "C" const void *const (*const weft_dev_kernels[12])[2];
extern "C" const char weft_dev_matrix[];

// The library holds exactly the kernels of the matrix it was configured with.
TEST(KernelMatrix, LinkedTableMatchesTheBuildOption) {
  std::vector<std::string> want = gen_list(weft_dev_matrix);
  size_t present = 0;
  for (int t = 0; t < 12; t++)
    for (int o = 0; o < (int)kNumOps; o++) {
      bool in = std::find(want.begin(), want.end(), std::string(kTags[t]) + " " + kOps[o]) !=
                want.end();
      for (int p = 0; p < 2; p++) EXPECT_EQ(weft_dev_kernels[t][o][p] != nullptr, in);
      present += in;
    }
  EXPECT_EQ(present, want.size());
}
#endif

// --- errors without a GPU -------------------------------------------------

TEST(DeviceErrors, CommInitAllWithDevicesItCannotUse) {
  weftComm_t comms[2];
  int devs[2] = {0, 99};
  EXPECT_EQ(weftCommInitAll(comms, 2, devs), weftInvalidArgument); // NCCL's, for a device out of range
  std::string text = weftGetLastError(nullptr);
#if WEFT_HAVE_CUDA
  EXPECT_NE(text.find("CUDA device"), std::string::npos) << text;
#else
  EXPECT_NE(text.find("built without CUDA"), std::string::npos) << text;
#endif
}

TEST(DeviceErrors, ForeignStreamWithHostMemorySaysWhy) {
  weftComm_t comm;
  ASSERT_EQ(weftCommInitAll(&comm, 1, nullptr), weftSuccess);
  float x[4] = {1, 2, 3, 4};
  int fake_stream;
  EXPECT_EQ(weftAllReduce(x, x, 4, weftFloat32, weftSum, comm, &fake_stream), weftInvalidArgument);
  std::string text = weftGetLastError(comm);
  EXPECT_NE(text.find("not a weft host stream"), std::string::npos) << text;
#if !WEFT_HAVE_CUDA
  EXPECT_NE(text.find("built without CUDA"), std::string::npos) << text;
#endif
  EXPECT_EQ(x[2], 3.0f) << "a rejected call leaves the buffer alone";
  EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
}

// A collective of no elements with NULL buffers on a stream that is not
// weft's (an empty tensor on a CUDA stream): in a CUDA build it moves nothing
// and succeeds, and the comm goes on working; without CUDA the stream is
// refused as above. Sends and receives of no elements do nothing as well.
TEST(DeviceErrors, EmptyCollectiveOnForeignStream) {
  weftComm_t comm;
  ASSERT_EQ(weftCommInitAll(&comm, 1, nullptr), weftSuccess);
  int fake_stream;
  const weftResult_t want = WEFT_HAVE_CUDA ? weftSuccess : weftInvalidArgument;
  EXPECT_EQ(weftAllReduce(nullptr, nullptr, 0, weftFloat32, weftSum, comm, &fake_stream), want)
      << weftGetLastError(comm);
  EXPECT_EQ(weftAllGather(nullptr, nullptr, 0, weftBfloat16, comm, &fake_stream), want);
  EXPECT_EQ(weftBroadcast(nullptr, nullptr, 0, weftInt8, 0, comm, &fake_stream), want);
  EXPECT_EQ(weftSend(nullptr, 0, weftFloat32, 0, comm, &fake_stream), want);
  EXPECT_EQ(weftRecv(nullptr, 0, weftFloat32, 0, comm, &fake_stream), want);
  float x[3] = {1, 2, 3};
  EXPECT_EQ(weftAllReduce(x, x, 3, weftFloat32, weftSum, comm, nullptr), weftSuccess)
      << weftGetLastError(comm);
  EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
}

// No CUDA context on this thread: weftMemAlloc gives host memory, usable at once.
TEST(DeviceErrors, MemAllocWithoutContextIsHostMemory) {
  void *p = nullptr;
  ASSERT_EQ(weftMemAlloc(&p, 1000), weftSuccess);
  memset(p, 0x5a, 1000);
  EXPECT_EQ(((unsigned char *)p)[999], 0x5a);
  EXPECT_EQ(weftMemFree(p), weftSuccess);
  // 0 bytes: NULL, as cudaMalloc's and NCCL's, which weftMemFree takes
  EXPECT_EQ(weftMemAlloc(&p, 0), weftSuccess);
  EXPECT_EQ(p, nullptr);
  EXPECT_EQ(weftMemFree(p), weftSuccess);
}

}  // namespace
