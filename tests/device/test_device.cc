// The device executor on a GPU: every ring collective x datatype x op x
// size, in place and out of place, with 2 to 4 ranks sharing one GPU (one
// process, CommInitAll, the p2p transport), checked against host references;
// host FIFOs, views at any offset, channel and interleave settings, the
// pre-multiply sum, and the step sequence as the device computes it
// (test_device_streams.cc has graphs, streams and refusals). Skips without
// a GPU.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <unistd.h>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "tests/collectives/coll_ref.h"
#include "tests/device/dev_ranks.h"
#include "tests/device/ring_steps_dump.h"
#include "weft.h"
extern "C" {
#include "collectives/core/params.h"
#include "collectives/exec/device/device.h"
#include "transport/base/param.h"
}

using namespace weft_test;

namespace {

bool in_matrix(weftDataType_t t, weftRedOp_t op) {
  return std::string(WEFT_DEVICE_MATRIX) == "full" || t == weftFloat32 || op == weftSum;
}

struct DevCase {
  int coll; // 0 allreduce, 1 allgather, 2 reducescatter, 3 broadcast, 4 reduce
  int nranks;
  size_t count;
  bool in_place;
};

const char *const kColl[] = {"AllReduce", "AllGather", "ReduceScatter", "Broadcast", "Reduce"};

std::string dev_case_name(const testing::TestParamInfo<DevCase> &info) {
  const DevCase &c = info.param;
  return std::string(kColl[c.coll]) + "_k" + std::to_string(c.nranks) + "_n" +
         std::to_string(c.count) + (c.in_place ? "_inplace" : "_outofplace");
}

std::vector<DevCase> dev_cases() {
  std::vector<DevCase> v;
  for (int coll = 0; coll < 5; coll++)
    for (int k : {2, 3, 4})
      for (size_t n : {1ul, 1000ul, 70001ul, 1ul << 20})
        for (bool ip : {false, true}) v.push_back({coll, k, n, ip});
  return v;
}

// fn(r) for every rank r < k, each on a thread of its own: the host's share
// of a case (inputs, references) is most of the suite's time.
template <typename Fn>
void each_rank(int k, Fn fn) {
  std::vector<std::thread> th;
  for (int r = 0; r < k; r++) th.emplace_back(fn, r);
  for (auto &t : th) t.join();
}

// The (datatype, op) pairs of a case: every pair of the matrix that
// types_ok takes (ops only where the collective reduces). With
// WEFT_TEST_SAMPLE=1 (the emulated CI, where a pair of 1M elements takes
// seconds on threads), cases of 1M elements and more take a seeded sample,
// printed: every datatype once with an op drawn for it, and every op once
// with a datatype drawn for it.
std::vector<std::pair<int, int>> dev_case_pairs(const DevCase &c,
                                                 bool (*types_ok)(weftDataType_t)) {
  const bool reduces = c.coll == 0 || c.coll == 2 || c.coll == 4;
  std::vector<std::pair<int, int>> all;
  for (int ti = 0; ti < weftNumTypes; ti++)
    for (int oi = 0; oi < (reduces ? weftNumOps : 1); oi++)
      if (in_matrix((weftDataType_t)ti, (weftRedOp_t)oi) && types_ok((weftDataType_t)ti))
        all.push_back({ti, oi});
  const char *sample = getenv("WEFT_TEST_SAMPLE");
  if (sample == nullptr || strcmp(sample, "1") != 0 || c.count < (1ul << 20)) return all;
  Rng rng(test_seed() ^ (uint64_t)(c.coll * 131 + c.nranks * 17 + c.in_place));
  std::vector<std::pair<int, int>> picked;
  auto draw = [&](bool by_type, int which) {
    std::vector<std::pair<int, int>> of;
    for (const auto &p : all)
      if ((by_type ? p.first : p.second) == which) of.push_back(p);
    if (of.empty()) return;
    const auto p = of[rng.next() % of.size()];
    if (std::find(picked.begin(), picked.end(), p) == picked.end()) picked.push_back(p);
  };
  for (int ti = 0; ti < weftNumTypes; ti++) draw(true, ti);
  for (int oi = 0; oi < (reduces ? weftNumOps : 1); oi++) draw(false, oi);
  std::sort(picked.begin(), picked.end());
  printf("sampled (WEFT_TEST_SAMPLE=1, seed %llu): %zu of %zu datatype x op pairs:",
         (unsigned long long)test_seed(), picked.size(), all.size());
  for (const auto &p : picked)
    printf(" %s/%s", type_name((weftDataType_t)p.first),
           reduces ? op_name((weftRedOp_t)p.second) : "-");
  printf("\n");
  return picked;
}

// One collective of every datatype (those types_ok takes) and op on device
// memory (or the sample of dev_case_pairs), checked exactly (integers,
// copies) or within the reduction's tolerance (floats).
void run_dev_case(const DevCase &c, bool (*types_ok)(weftDataType_t)) {
  const int k = c.nranks;
  const int root = k - 1;
  Ranks ranks(k);
  for (const auto &pair : dev_case_pairs(c, types_ok)) {
    const int ti = pair.first, oi = pair.second;
    auto t = (weftDataType_t)ti;
    auto op = (weftRedOp_t)oi;
    SCOPED_TRACE(std::string(type_name(t)) + " " + op_name(op));
    const size_t es = weftTypeSize(t), n = c.count;
    const size_t send_n = c.coll == 2 ? n * k : n, recv_n = c.coll == 1 ? n * k : n;
    std::vector<std::vector<uint8_t>> in(k);
    std::vector<void *> dsend(k), drecv(k);
    const uint64_t seed = test_seed() + ti * 7 + oi;
    each_rank(k, [&](int r) { in[r] = make_input(t, op, send_n, seed, r); });
    for (int r = 0; r < k; r++) {
      ASSERT_EQ(cudaMalloc(&drecv[r], recv_n * es), cudaSuccess);
      ASSERT_EQ(cudaMemset(drecv[r], 0xa5, recv_n * es), cudaSuccess); // poison
      if (c.in_place) {
        // the input where the collective puts its result
        size_t at = c.coll == 1 ? (size_t)r * n * es : 0;
        dsend[r] = (char *)drecv[r] + at;
        if (c.coll == 2) { // reduce-scatter: output inside the input
          cudaFree(drecv[r]);
          ASSERT_EQ(cudaMalloc(&dsend[r], send_n * es), cudaSuccess);
          drecv[r] = (char *)dsend[r] + (size_t)r * n * es;
        }
      } else {
        ASSERT_EQ(cudaMalloc(&dsend[r], send_n * es), cudaSuccess);
      }
      ASSERT_EQ(cudaMemcpy(dsend[r], in[r].data(), send_n * es, cudaMemcpyHostToDevice),
                cudaSuccess);
    }
    ASSERT_EQ(weftGroupStart(), weftSuccess);
    for (int r = 0; r < k; r++) {
      weftResult_t res = weftSuccess;
      switch (c.coll) {
        case 0: res = weftAllReduce(dsend[r], drecv[r], n, t, op, ranks.comms[r], ranks.streams[r]); break;
        case 1: res = weftAllGather(dsend[r], drecv[r], n, t, ranks.comms[r], ranks.streams[r]); break;
        case 2: res = weftReduceScatter(dsend[r], drecv[r], n, t, op, ranks.comms[r], ranks.streams[r]); break;
        case 3: res = weftBroadcast(dsend[r], drecv[r], n, t, root, ranks.comms[r], ranks.streams[r]); break;
        case 4: res = weftReduce(dsend[r], drecv[r], n, t, op, root, ranks.comms[r], ranks.streams[r]); break;
      }
      ASSERT_EQ(res, weftSuccess) << weftGetLastError(ranks.comms[r]);
    }
    ASSERT_EQ(weftGroupEnd(), weftSuccess) << weftGetLastError(nullptr);
    ranks.sync();
    std::vector<std::vector<uint8_t>> out(k, std::vector<uint8_t>(recv_n * es));
    for (int r = 0; r < k; r++)
      ASSERT_EQ(cudaMemcpy(out[r].data(), drecv[r], out[r].size(), cudaMemcpyDeviceToHost),
                cudaSuccess);
    // each rank's result checked on a thread of its own; the verdicts
    // reported here, in rank order
    std::vector<std::string> bad(k);
    each_rank(k, [&](int r) {
      std::string why;
      if (c.coll == 0 || (c.coll == 4 && r == root)) {
        if (!check_reduction(t, op, in, out[r].data(), n, &why)) bad[r] = why;
      } else if (c.coll == 2) {
        std::vector<std::vector<uint8_t>> blocks(k);
        for (int q = 0; q < k; q++)
          blocks[q].assign(in[q].begin() + (size_t)r * n * es, in[q].begin() + (size_t)(r + 1) * n * es);
        if (!check_reduction(t, op, blocks, out[r].data(), n, &why)) bad[r] = why;
      } else if (c.coll == 1) {
        for (int q = 0; q < k && bad[r].empty(); q++)
          if (memcmp(out[r].data() + (size_t)q * n * es, in[q].data(), n * es) != 0)
            bad[r] = "block " + std::to_string(q) + " differs from that rank's input";
      } else if (c.coll == 3) {
        if (memcmp(out[r].data(), in[root].data(), n * es) != 0) bad[r] = "differs from the root's input";
      }
    });
    for (int r = 0; r < k; r++) EXPECT_EQ(bad[r], "") << "rank " << r;
    for (int r = 0; r < k; r++) {
      if (c.coll == 2 && c.in_place) cudaFree(dsend[r]);
      else {
        cudaFree(drecv[r]);
        if (!c.in_place) cudaFree(dsend[r]);
      }
    }
  }
}

bool every_type(weftDataType_t) { return true; }

class DeviceColl : public testing::TestWithParam<DevCase> {};

// The tuner's protocol for each size (LL for the small ones, SIMPLE for the
// large), every datatype and op.
TEST_P(DeviceColl, EveryDatatypeAndOp) {
  REQUIRE_GPU();
  run_dev_case(GetParam(), every_type);
}

INSTANTIATE_TEST_SUITE_P(All, DeviceColl, testing::ValuesIn(dev_cases()), dev_case_name);
// Two ranks' all-reduce in one exchange (RING_ALLREDUCE_PAIR, LL up to 64 KiB)
// over several channels and at its bound: 12289 elements are 12 to 48 KiB
// below 8-byte types (1 to 3 LL channels, neither whole slots nor whole
// lines), 16384 float32 are 64 KiB exactly (4 channels); 8-byte types take
// the ring at both.
INSTANTIATE_TEST_SUITE_P(Pair, DeviceColl,
                         testing::Values(DevCase{0, 2, 12289, false}, DevCase{0, 2, 12289, true},
                                         DevCase{0, 2, 16384, false}, DevCase{0, 2, 16384, true}),
                         dev_case_name);

bool float_and_int8(weftDataType_t t) { return t == weftFloat32 || t == weftInt8; }

// GPUs without peer access connect through FIFOs in pinned host memory
// (host_fifo); forced here on one GPU by turning the p2p transport off.
// Every collective with both protocols, over 16-byte lines and bulk slots
// that cross the bus twice: float32 with every op, int8 with sum, sizes of
// one element to several slots, in and out of place.
TEST(DeviceHostFifo, EveryCollectiveBothProtocols) {
  REQUIRE_GPU();
  for (const char *proto : {"simple", "ll"}) {
    // 4 channels: each comm pins 4 x 2 x 1 MiB of FIFOs rather than 32 x 2 x 1 MiB
    ScopedEnv env({{"WEFT_P2P_DISABLE", "1"}, {"WEFT_PROTO", proto}, {"WEFT_TIMEOUT", "30"},
                   {"WEFT_DEVICE_NCHANNELS", "4"}});
    for (int coll = 0; coll < 5; coll++)
      for (int k : {2, 3})
        for (size_t n : {1ul, 70001ul}) {
          const DevCase c = {coll, k, n, coll % 2 == 0};
          SCOPED_TRACE(std::string(proto) + " " + kColl[coll] + " k" + std::to_string(k) + " n" +
                       std::to_string(n));
          run_dev_case(c, float_and_int8);
          if (HasFatalFailure()) return;
        }
  }
}

// Torch tensors may be views at any element offset: buffers that are not
// 16-byte aligned take the kernels' element-wise path (SIMPLE) and partial
// LL words, with the same sums and nothing written outside the view.
TEST(DeviceAlignment, ViewsAtAnyElementOffset) {
  REQUIRE_GPU();
  const int k = 2;
  const uint32_t poison = 0xa5a5a5a5u;
  for (const char *proto : {"simple", "ll"}) {
    ScopedEnv env({{"WEFT_PROTO", proto}});
    Ranks ranks(k);
    for (size_t off : {1ul, 3ul})
      for (size_t n : {1ul, 7ul, 70001ul}) {
        SCOPED_TRACE(std::string(proto) + " offset " + std::to_string(off) + " n " + std::to_string(n));
        const size_t total = 2 * n + 2 * off + 16, at_out = n + 2 * off + 1; // out: offset off + 1
        std::vector<float *> base(k);
        std::vector<std::vector<float>> in(k, std::vector<float>(n));
        for (int r = 0; r < k; r++) {
          ASSERT_EQ(cudaMalloc((void **)&base[r], total * sizeof(float)), cudaSuccess);
          ASSERT_EQ(cudaMemset(base[r], 0xa5, total * sizeof(float)), cudaSuccess);
          for (size_t i = 0; i < n; i++) in[r][i] = (float)((i * 5 + (size_t)r * 11) % 97);
          ASSERT_EQ(cudaMemcpy(base[r] + off, in[r].data(), n * sizeof(float), cudaMemcpyHostToDevice),
                    cudaSuccess);
        }
        ASSERT_EQ(weftGroupStart(), weftSuccess);
        for (int r = 0; r < k; r++)
          ASSERT_EQ(weftAllReduce(base[r] + off, base[r] + at_out, n, weftFloat32, weftSum,
                                  ranks.comms[r], ranks.streams[r]), weftSuccess);
        ASSERT_EQ(weftGroupEnd(), weftSuccess) << weftGetLastError(nullptr);
        ranks.sync();
        for (int r = 0; r < k; r++) {
          std::vector<float> h(total);
          ASSERT_EQ(cudaMemcpy(h.data(), base[r], total * sizeof(float), cudaMemcpyDeviceToHost),
                    cudaSuccess);
          for (size_t i = 0; i < n; i++)
            ASSERT_EQ(h[at_out + i], in[0][i] + in[1][i]) << "rank " << r << " element " << i;
          for (size_t i = at_out + n; i < total; i++) {
            uint32_t bits;
            memcpy(&bits, &h[i], sizeof bits);
            ASSERT_EQ(bits, poison) << "rank " << r << ": written past the view at " << i;
          }
          cudaFree(base[r]);
        }
      }
  }
}

// A ring's blocks wait on each other, so every rank's blocks must be on the
// GPU at once. Sixteen ranks asking for 64 channels each (1024 blocks, more
// than an H100 holds) get as many as the GPU's SMs allow, and a launch large
// enough to use them all completes with the right sums instead of timing out.
TEST(DeviceChannels, RanksSharingAGpuShareItsSMs) {
  REQUIRE_GPU();
  ScopedEnv env({{"WEFT_DEVICE_NCHANNELS", "64"}, {"WEFT_TIMEOUT", "20"}});
  const int k = 16;
  const size_t n = (size_t)1 << 21; // 8 MiB: 128 launch shares of 64 KiB
  Ranks ranks(k);
  std::vector<float *> buf(k);
  std::vector<std::vector<float>> in(k, std::vector<float>(n));
  for (int r = 0; r < k; r++) {
    for (size_t i = 0; i < n; i++) in[r][i] = (float)((i * 7 + (size_t)r * 13) % 101);
    ASSERT_EQ(cudaMalloc((void **)&buf[r], n * sizeof(float)), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(buf[r], in[r].data(), n * sizeof(float), cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  ASSERT_EQ(weftGroupStart(), weftSuccess);
  for (int r = 0; r < k; r++)
    ASSERT_EQ(weftAllReduce(buf[r], buf[r], n, weftFloat32, weftSum, ranks.comms[r], ranks.streams[r]),
              weftSuccess);
  ASSERT_EQ(weftGroupEnd(), weftSuccess) << weftGetLastError(nullptr);
  ranks.sync();
  for (int r = 0; r < k; r++) {
    weftResult_t async = weftSuccess;
    EXPECT_EQ(weftCommGetAsyncError(ranks.comms[r], &async), weftSuccess);
    EXPECT_EQ(async, weftSuccess) << "rank " << r << ": " << weftGetLastError(ranks.comms[r]);
    std::vector<float> out(n);
    ASSERT_EQ(cudaMemcpy(out.data(), buf[r], n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    size_t wrong = 0;
    for (size_t i = 0; i < n; i++) {
      float want = 0;
      for (int q = 0; q < k; q++) want += in[q][i];
      wrong += out[i] != want;
    }
    EXPECT_EQ(wrong, 0u) << "rank " << r;
    cudaFree(buf[r]);
  }
}

// WEFT_DEVICE_NCHANNELS outside 1..64 and WEFT_DEVICE_RING_INTERLEAVE
// outside 1..3 fail the first device collective with weftInvalidArgument
// naming the variable and its range.
TEST(DeviceChannels, OutOfRangeIsRefused) {
  REQUIRE_GPU();
  const struct {
    const char *var, *bad, *range;
  } cases[] = {{"WEFT_DEVICE_NCHANNELS", "0", "1 to 64"},
               {"WEFT_DEVICE_NCHANNELS", "65", "1 to 64"},
               {"WEFT_DEVICE_RING_INTERLEAVE", "0", "1 to 3"},
               {"WEFT_DEVICE_RING_INTERLEAVE", "4", "1 to 3"}};
  for (const auto &c : cases) {
    const std::string bad = c.bad;
    ScopedEnv env({{c.var, c.bad}});
    Ranks ranks(2);
    float *buf[2];
    for (auto &p : buf) ASSERT_EQ(cudaMalloc((void **)&p, 1024 * sizeof(float)), cudaSuccess);
    ASSERT_EQ(weftGroupStart(), weftSuccess);
    for (int r = 0; r < 2; r++)
      ASSERT_EQ(weftAllReduce(buf[r], buf[r], 1024, weftFloat32, weftSum, ranks.comms[r],
                              ranks.streams[r]),
                weftSuccess);
    EXPECT_EQ(weftGroupEnd(), weftInvalidArgument) << bad;
    EXPECT_NE(std::string(weftGetLastError(nullptr))
                  .find(std::string(c.var) + "=" + bad + ": must be " + c.range),
              std::string::npos)
        << weftGetLastError(nullptr);
    for (auto p : buf) cudaFree(p);
  }
}

// Each channel takes WEFT_DEVICE_RING_INTERLEAVE loops together (2 unless
// set, which every other test runs): 1 and 3 give the same results, with
// both protocols, on shares of several loops (2 channels; SIMPLE's loop of
// an all-reduce is k slots of 256 KiB, LL's k of 8 KiB), the last one short.
TEST(DeviceInterleave, EveryOrderGivesTheCollective) {
  REQUIRE_GPU();
  for (const char *il : {"1", "3"})
    for (const char *proto : {"simple", "ll"}) {
      ScopedEnv env({{"WEFT_DEVICE_RING_INTERLEAVE", il}, {"WEFT_PROTO", proto},
                     {"WEFT_DEVICE_NCHANNELS", "2"}});
      { // the comms take the value (what the kernels are launched with)
        Ranks ranks(2);
        float *buf[2];
        for (auto &p : buf) ASSERT_EQ(cudaMalloc((void **)&p, 64 * sizeof(float)), cudaSuccess);
        ASSERT_EQ(weftGroupStart(), weftSuccess);
        for (int r = 0; r < 2; r++)
          ASSERT_EQ(weftAllReduce(buf[r], buf[r], 64, weftFloat32, weftSum, ranks.comms[r],
                                  ranks.streams[r]),
                    weftSuccess);
        ASSERT_EQ(weftGroupEnd(), weftSuccess) << weftGetLastError(nullptr);
        ranks.sync();
        for (int r = 0; r < 2; r++)
          EXPECT_EQ(device_comm_interleave(ranks.comms[r]), atoi(il)) << "rank " << r;
        for (auto p : buf) cudaFree(p);
      }
      const size_t n = std::string(proto) == "ll" ? 20011 : 1250011;
      for (int coll = 0; coll < 5; coll++)
        for (int k : {2, 4}) {
          const DevCase c = {coll, k, n, coll % 2 == 1};
          SCOPED_TRACE(std::string("interleave ") + il + " " + proto + " " + kColl[coll] + " k" +
                       std::to_string(k));
          run_dev_case(c, float_and_int8);
          if (HasFatalFailure()) return;
        }
    }
}

// WEFT_DEVICE_PDL: small all-reduces back to back, each on the one before's
// result in place, so a kernel launched to overlap its predecessor must
// still read what that one wrote (the pair's exchange for 2 ranks, the LL
// ring for 3); on one stream, and alternating between two streams (the
// comm orders them by events; rank 0's main stream held 20 ms before each
// of its rounds there). Values stay exact in float: (r + 1 + i % 5)
// summed, then times k a call. The launches must have gone out so.
void run_pdl_chain(int k, size_t n, bool two_streams) {
  const int rounds = 12;
  Ranks ranks(k);
  std::vector<cudaStream_t> side(k);
  std::vector<float *> buf(k);
  for (int r = 0; r < k; r++) {
    ASSERT_EQ(cudaStreamCreateWithFlags(&side[r], cudaStreamNonBlocking), cudaSuccess);
    std::vector<float> h(n);
    for (size_t i = 0; i < n; i++) h[i] = (float)(r + 1 + (int)(i % 5));
    ASSERT_EQ(cudaMalloc((void **)&buf[r], n * sizeof(float)), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(buf[r], h.data(), n * sizeof(float), cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  for (int round = 0; round < rounds; round++) {
    const bool on_side = two_streams && round % 2 == 1;
    if (two_streams && !on_side) {
      ASSERT_EQ(cudaLaunchHostFunc(ranks.streams[0], [](void *) { usleep(20000); }, nullptr),
                cudaSuccess);
    }
    ASSERT_EQ(weftGroupStart(), weftSuccess);
    for (int r = 0; r < k; r++)
      ASSERT_EQ(weftAllReduce(buf[r], buf[r], n, weftFloat32, weftSum, ranks.comms[r],
                              on_side ? side[r] : ranks.streams[r]),
                weftSuccess);
    ASSERT_EQ(weftGroupEnd(), weftSuccess) << weftGetLastError(nullptr);
  }
  ranks.sync();
  for (int r = 0; r < k; r++) {
    ASSERT_EQ(cudaStreamSynchronize(side[r]), cudaSuccess);
    EXPECT_GE(device_comm_pdl_launches(ranks.comms[r]), (uint64_t)(two_streams ? 1 : rounds))
        << "rank " << r << ": no launch went out with programmatic dependent launch";
    std::vector<float> h(n);
    ASSERT_EQ(cudaMemcpy(h.data(), buf[r], n * sizeof(float), cudaMemcpyDeviceToHost),
              cudaSuccess);
    for (size_t i = 0; i < n; i++) {
      double want = k * (k + 1) / 2.0 + k * (double)(i % 5);
      for (int round = 1; round < rounds; round++) want *= k;
      ASSERT_EQ(h[i], (float)want) << "rank " << r << " element " << i;
    }
    cudaFree(buf[r]);
    cudaStreamDestroy(side[r]);
  }
}

TEST(DevicePdl, ChainedSmallCallsReadTheirPredecessorsResults) {
  REQUIRE_GPU();
  cudaDeviceProp prop;
  ASSERT_EQ(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
  if (prop.major < 9) GTEST_SKIP() << "compute capability " << prop.major << "." << prop.minor
                                   << ": no programmatic dependent launch (9.0 and later)";
  ScopedEnv env({{"WEFT_DEVICE_PDL", "1"}, {"WEFT_TIMEOUT", "20"}});
  for (bool two_streams : {false, true})
    for (int k : {2, 3})
      for (size_t n : {2ul, 1000ul}) {
        SCOPED_TRACE("k" + std::to_string(k) + " n" + std::to_string(n) +
                     (two_streams ? " two streams" : " one stream"));
        run_pdl_chain(k, n, two_streams);
        if (HasFatalFailure()) return;
      }
}

// The body of DeviceLoad.TwoKernelsOfEachCommInOneGroup, run alone in a
// fresh process (no earlier test loaded any kernel): two ranks in this
// process, one thread; one group in which each comm launches two different
// kernels (a float32 and an int32 all-reduce). A kernel left to load at its
// first launch waits for the context's running kernels (CUDA's lazy
// loading, as cuda_emu does it): rank 0's second kernel would wait for its
// first, which waits for rank 1's, not launched yet by the thread that
// blocks.
TEST(DeviceLoad, DISABLED_FreshProcessBody) {
  REQUIRE_GPU();
  Ranks ranks(2);
  const weftDataType_t types[2] = {weftFloat32, weftInt32};
  const size_t n = 1000;
  void *bufs[2][2];
  for (int r = 0; r < 2; r++)
    for (int i = 0; i < 2; i++) {
      ASSERT_EQ(cudaMalloc(&bufs[r][i], n * 4), cudaSuccess);
      std::vector<float> f(n, (float)(r + 1));
      std::vector<int32_t> k(n, r + 1);
      ASSERT_EQ(cudaMemcpy(bufs[r][i], i == 0 ? (const void *)f.data() : (const void *)k.data(),
                           n * 4, cudaMemcpyHostToDevice),
                cudaSuccess);
    }
  ASSERT_EQ(weftGroupStart(), weftSuccess);
  for (int r = 0; r < 2; r++)
    for (int i = 0; i < 2; i++)
      ASSERT_EQ(weftAllReduce(bufs[r][i], bufs[r][i], n, types[i], weftSum, ranks.comms[r],
                              ranks.streams[r]),
                weftSuccess)
          << weftGetLastError(ranks.comms[r]);
  ASSERT_EQ(weftGroupEnd(), weftSuccess) << weftGetLastError(nullptr);
  ranks.sync();
  for (int r = 0; r < 2; r++) {
    std::vector<float> f(n);
    std::vector<int32_t> k(n);
    ASSERT_EQ(cudaMemcpy(f.data(), bufs[r][0], n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(k.data(), bufs[r][1], n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(std::count(f.begin(), f.end(), 3.0f), (long)n) << "rank " << r;
    EXPECT_EQ(std::count(k.begin(), k.end(), 3), (long)n) << "rank " << r;
    for (int i = 0; i < 2; i++) cudaFree(bufs[r][i]);
  }
}

// Kernels load before a comm launches (docs/cuda.md, "Kernels load before
// they are needed"), whatever WEFT_DEVICE_NCHANNELS says: the body above in
// a process of its own, which fails, or ends at WEFT_TIMEOUT, where one
// kernel loads only at its first launch.
TEST(DeviceLoad, TwoKernelsOfEachCommInOneGroup) {
  REQUIRE_GPU();
  std::string out;
  const double t0 = now_s();
  const bool passed = run_test_alone("DeviceLoad.DISABLED_FreshProcessBody",
                                     "-u WEFT_DEVICE_NCHANNELS WEFT_TIMEOUT=20", 120, &out);
  EXPECT_TRUE(passed) << "took " << now_s() - t0 << " s:\n" << out;
}

// The enqueue returns before the kernel has run: the stream holds the work.
TEST(DeviceStream, CallEnqueuesAndReturns) {
  REQUIRE_GPU();
  Ranks ranks(2);
  void *d[2];
  for (auto &p : d) ASSERT_EQ(weftMemAlloc(&p, 4 << 20), weftSuccess);
  ASSERT_EQ(weftGroupStart(), weftSuccess);
  for (int r = 0; r < 2; r++)
    ASSERT_EQ(weftAllReduce(d[r], d[r], 1 << 20, weftFloat32, weftSum, ranks.comms[r], ranks.streams[r]), weftSuccess);
  ASSERT_EQ(weftGroupEnd(), weftSuccess);
  ranks.sync();
  for (auto p : d) EXPECT_EQ(weftMemFree(p), weftSuccess);
}

// weftMemFree frees what weftMemAlloc gave and refuses any other device
// pointer (inside a buffer, the caller's own cudaMalloc, freed already),
// freeing nothing, as it refuses host pointers.
TEST(DeviceMem, FreeRefusesWhatItDidNotAllocate) {
  REQUIRE_GPU();
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  ASSERT_EQ(cudaFree(nullptr), cudaSuccess);  // the context, current on this thread
  void *p = nullptr, *mine = nullptr;
  ASSERT_EQ(weftMemAlloc(&p, 1 << 20), weftSuccess);
  cudaPointerAttributes attr;
  ASSERT_EQ(cudaPointerGetAttributes(&attr, p), cudaSuccess);
  ASSERT_EQ(attr.type, cudaMemoryTypeDevice);
  EXPECT_EQ(weftMemFree(static_cast<char *>(p) + 8), weftInvalidArgument);
  ASSERT_EQ(cudaMalloc(&mine, 4096), cudaSuccess);
  EXPECT_EQ(weftMemFree(mine), weftInvalidArgument);
  EXPECT_NE(std::string(weftGetLastError(nullptr)).find("device memory allocated elsewhere"),
            std::string::npos) << weftGetLastError(nullptr);
  EXPECT_EQ(cudaMemset(mine, 0, 4096), cudaSuccess) << "the refused buffer was freed";
  EXPECT_EQ(cudaFree(mine), cudaSuccess);
  EXPECT_EQ(cudaMemset(p, 0, 1 << 20), cudaSuccess);
  EXPECT_EQ(weftMemFree(p), weftSuccess);
  EXPECT_EQ(weftMemFree(p), weftInvalidArgument);
}

// The device pass of ring_steps.h gives the host executor's steps, in
// every order the kernels take them (one loop at a time, or interleaved).
void expect_device_steps(const ring_geom &g, const int *ring, int interleave) {
  std::vector<ring_step> want(4096), got(4096);
  size_t n = ring_steps_dump_c(&g, ring, want.data(), want.size(), interleave);
  ASSERT_LE(n, want.size());
  ASSERT_EQ(ring_steps_dump_nvcc_device(&g, ring, got.data(), got.size(), interleave), (long)n);
  for (size_t i = 0; i < n; i++) {
    ASSERT_EQ(got[i].prim, want[i].prim) << "step " << i;
    ASSERT_EQ(got[i].count, want[i].count) << "step " << i;
    if (ring_prim_has_src(want[i].prim)) {
      ASSERT_EQ(got[i].src_elem, want[i].src_elem) << "step " << i;
    }
    if (ring_prim_has_dst(want[i].prim)) {
      ASSERT_EQ(got[i].dst_elem, want[i].dst_elem) << "step " << i;
    }
  }
}

TEST(DeviceSteps, KernelComputesTheHostSteps) {
  REQUIRE_GPU();
  const int ring[5] = {3, 0, 4, 1, 2};
  for (int il : {1, 2, 3})
    for (int coll = 0; coll < RING_NCOLLS; coll++)
      for (int pos = 0; pos < 5; pos++) {
        ring_geom g;
        ring_geom_init(&g, coll, 5, pos, 2, 1000, 64, 500, 24, 4);
        SCOPED_TRACE("interleave " + std::to_string(il) + " coll " + std::to_string(coll));
        expect_device_steps(g, ring, il);
      }
  // two ranks' all-reduce in one exchange, which the device alone runs
  const int pair[2] = {1, 0};
  for (int il : {1, 2, 3})
    for (int pos = 0; pos < 2; pos++) {
      ring_geom g;
      ring_geom_init(&g, RING_ALLREDUCE_PAIR, 2, pos, -1, 1000, 64, 500, 24, 4);
      EXPECT_EQ(ring_nsteps_total(&g), 2u * ((500 + 23) / 24));
      expect_device_steps(g, pair, il);
    }
}

// The tree all-reduce on device memory and on host memory reduces every
// element over the same tree in the same order (tree_steps.h, and
// comm_tree_links' choice of trees by the call's size in both executors):
// float32 sums of inputs whose rounding depends on that order come out bit
// for bit the same, for calls of the tree of small calls (8 B: the root's
// up and down in one pass; 256 B) and one of the double binary tree
// (12 KB), at 4 and 8 ranks.
TEST(DeviceTree, SameBitsAsTheHostExecutor) {
  REQUIRE_GPU();
  ScopedEnv env({{"WEFT_ALGO", "allreduce:tree"}});
  for (int k : {4, 8})
    for (size_t n : {2ul, 64ul, 3001ul}) {
      SCOPED_TRACE("k " + std::to_string(k) + " n " + std::to_string(n));
      Ranks ranks(k);
      std::vector<std::vector<float>> in(k), host(k, std::vector<float>(n));
      std::vector<float *> dev(k);
      for (int r = 0; r < k; r++) {
        in[r].resize(n);
        for (size_t i = 0; i < n; i++) { // magnitudes 2^-8 to 2^8: sums round by their order
          const uint32_t h = (uint32_t)(i * 2654435761u) ^ (uint32_t)(r * 40503u + 17u);
          in[r][i] = ldexpf((float)(h % 1000003u) / 1000003.0f + 0.5f, (int)(h % 17) - 8);
        }
        ASSERT_EQ(cudaMalloc((void **)&dev[r], n * sizeof(float)), cudaSuccess);
        ASSERT_EQ(cudaMemcpy(dev[r], in[r].data(), n * sizeof(float), cudaMemcpyHostToDevice),
                  cudaSuccess);
      }
      ASSERT_EQ(weftGroupStart(), weftSuccess);
      for (int r = 0; r < k; r++)
        ASSERT_EQ(weftAllReduce(dev[r], dev[r], n, weftFloat32, weftSum, ranks.comms[r],
                                ranks.streams[r]), weftSuccess) << weftGetLastError(ranks.comms[r]);
      ASSERT_EQ(weftGroupEnd(), weftSuccess) << weftGetLastError(nullptr);
      ranks.sync();
      ASSERT_EQ(weftGroupStart(), weftSuccess);
      for (int r = 0; r < k; r++)
        ASSERT_EQ(weftAllReduce(in[r].data(), host[r].data(), n, weftFloat32, weftSum,
                                ranks.comms[r], nullptr), weftSuccess)
            << weftGetLastError(ranks.comms[r]);
      ASSERT_EQ(weftGroupEnd(), weftSuccess) << weftGetLastError(nullptr);
      for (int r = 0; r < k; r++) {
        std::vector<float> got(n);
        ASSERT_EQ(cudaMemcpy(got.data(), dev[r], n * sizeof(float), cudaMemcpyDeviceToHost),
                  cudaSuccess);
        for (size_t i = 0; i < n; i++) {
          double want = 0;
          for (int q = 0; q < k; q++) want += in[q][i];
          ASSERT_NEAR(host[r][i], want, 1e-5 * want) << "host rank " << r << " element " << i;
          ASSERT_EQ(memcmp(&got[i], &host[r][i], sizeof(float)), 0)
              << "rank " << r << " element " << i << ": device " << got[i] << ", host "
              << host[r][i];
        }
        cudaFree(dev[r]);
      }
    }
}

// Pre-multiply sum on device memory: each rank's input times the op's
// scalar, summed; the scalar given by value or in device memory (read when
// the kernel runs), all-reduce and reduce-scatter, both protocols' sizes.
TEST(DevicePreMulSum, ScalarByValueAndInDeviceMemory) {
  REQUIRE_GPU();
  for (int k : {2, 3})
    for (bool on_device : {false, true})
      for (size_t n : {7ul, 12289ul, 100003ul}) { // 12289: a pair over 3 channels
        SCOPED_TRACE("k " + std::to_string(k) + (on_device ? " device scalar" : " host scalar") +
                     " n " + std::to_string(n));
        Ranks ranks(k);
        std::vector<weftRedOp_t> ops(k);
        std::vector<float *> scal(k, nullptr), buf(k), rs(k);
        std::vector<std::vector<float>> in(k);
        for (int r = 0; r < k; r++) {
          float s = 0.25f * (float)(r + 1);
          if (on_device) {
            ASSERT_EQ(cudaMalloc((void **)&scal[r], sizeof(float)), cudaSuccess);
            ASSERT_EQ(cudaMemcpy(scal[r], &s, sizeof s, cudaMemcpyHostToDevice), cudaSuccess);
          }
          ASSERT_EQ(weftRedOpCreatePreMulSum(&ops[r], on_device ? (void *)scal[r] : (void *)&s,
                                             weftFloat32, on_device ? weftScalarDevice
                                                                    : weftScalarHostImmediate,
                                             ranks.comms[r]), weftSuccess);
          in[r].resize(n * k);
          for (size_t i = 0; i < n * k; i++) in[r][i] = (float)((i * 7 + r * 13) % 64) - 20.0f;
          ASSERT_EQ(cudaMalloc((void **)&buf[r], n * k * sizeof(float)), cudaSuccess);
          ASSERT_EQ(cudaMalloc((void **)&rs[r], n * sizeof(float)), cudaSuccess);
          ASSERT_EQ(cudaMemcpy(buf[r], in[r].data(), n * k * sizeof(float), cudaMemcpyHostToDevice),
                    cudaSuccess);
        }
        ASSERT_EQ(weftGroupStart(), weftSuccess);
        for (int r = 0; r < k; r++) {
          ASSERT_EQ(weftReduceScatter(buf[r], rs[r], n, weftFloat32, ops[r], ranks.comms[r],
                                      ranks.streams[r]), weftSuccess) << weftGetLastError(ranks.comms[r]);
          ASSERT_EQ(weftAllReduce(buf[r], buf[r], n * k, weftFloat32, ops[r], ranks.comms[r],
                                  ranks.streams[r]), weftSuccess) << weftGetLastError(ranks.comms[r]);
        }
        ASSERT_EQ(weftGroupEnd(), weftSuccess) << weftGetLastError(nullptr);
        ranks.sync();
        for (int r = 0; r < k; r++) {
          std::vector<float> all(n * k), part(n);
          cudaMemcpy(all.data(), buf[r], all.size() * sizeof(float), cudaMemcpyDeviceToHost);
          cudaMemcpy(part.data(), rs[r], part.size() * sizeof(float), cudaMemcpyDeviceToHost);
          for (size_t i = 0; i < n * k; i++) {
            double want = 0;
            for (int q = 0; q < k; q++) want += 0.25 * (q + 1) * in[q][i];
            ASSERT_NEAR(all[i], want, 1e-4) << "all-reduce rank " << r << " element " << i;
            if (i / n == (size_t)r) {
              ASSERT_NEAR(part[i % n], want, 1e-4) << "reduce-scatter rank " << r << " element " << i;
            }
          }
        }
        for (int r = 0; r < k; r++) {
          weftRedOpDestroy(ops[r], ranks.comms[r]);
          cudaFree(buf[r]);
          cudaFree(rs[r]);
          cudaFree(scal[r]);
        }
      }
}

// An op destroyed once its call returns, its slot taken at once by an op of
// another scale, inside the group that launches both (PyTorch destroys each
// op right after its call): each all-reduce scales by its own op.
TEST(DevicePreMulSum, DestroyedOnceItsCallReturnsStillScales) {
  REQUIRE_GPU();
  const int k = 2;
  const size_t n = 4099;
  const float scales[2] = {3, 5};
  Ranks ranks(k);
  std::vector<std::vector<float *>> out(2, std::vector<float *>(k, nullptr));
  std::vector<float *> in(k, nullptr);
  for (int r = 0; r < k; r++) {
    std::vector<float> h(n);
    for (size_t i = 0; i < n; i++) h[i] = (float)(i % 97) + (float)r;
    ASSERT_EQ(cudaMalloc((void **)&in[r], n * sizeof(float)), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(in[r], h.data(), n * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    for (int j = 0; j < 2; j++) ASSERT_EQ(cudaMalloc((void **)&out[j][r], n * sizeof(float)), cudaSuccess);
  }
  ASSERT_EQ(weftGroupStart(), weftSuccess);
  for (int j = 0; j < 2; j++)
    for (int r = 0; r < k; r++) {
      weftRedOp_t op;
      float s = scales[j];
      ASSERT_EQ(weftRedOpCreatePreMulSum(&op, &s, weftFloat32, weftScalarHostImmediate,
                                         ranks.comms[r]), weftSuccess);
      ASSERT_EQ(weftAllReduce(in[r], out[j][r], n, weftFloat32, op, ranks.comms[r],
                              ranks.streams[r]), weftSuccess) << weftGetLastError(ranks.comms[r]);
      ASSERT_EQ(weftRedOpDestroy(op, ranks.comms[r]), weftSuccess);
    }
  ASSERT_EQ(weftGroupEnd(), weftSuccess) << weftGetLastError(nullptr);
  ranks.sync();
  for (int j = 0; j < 2; j++)
    for (int r = 0; r < k; r++) {
      std::vector<float> got(n);
      cudaMemcpy(got.data(), out[j][r], n * sizeof(float), cudaMemcpyDeviceToHost);
      for (size_t i = 0; i < n; i++)
        ASSERT_EQ(got[i], scales[j] * (float)(i % 97) + scales[j] * ((float)(i % 97) + 1))
            << "op " << j << " rank " << r << " element " << i;
      cudaFree(out[j][r]);
    }
  for (int r = 0; r < k; r++) cudaFree(in[r]);
}

// A scalar in device memory (weftScalarDevice) with host buffers: the
// host executor runs the call and cannot read the scalar, so the call is
// refused with a message (it read the device pointer on the host, and
// crashed); the same op on device buffers still works.
TEST(DevicePreMulSum, DeviceScalarWithHostBuffersIsRefused) {
  REQUIRE_GPU();
  const int k = 2;
  const size_t n = 64;
  Ranks ranks(k);
  float *scalar_d = nullptr;
  const float half = 0.5f;
  ASSERT_EQ(cudaMalloc((void **)&scalar_d, sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(scalar_d, &half, sizeof half, cudaMemcpyHostToDevice), cudaSuccess);
  std::vector<std::vector<float>> host(k, std::vector<float>(n, 1.0f));
  std::vector<weftRedOp_t> ops(k);
  for (int r = 0; r < k; r++) {
    ASSERT_EQ(weftRedOpCreatePreMulSum(&ops[r], scalar_d, weftFloat32, weftScalarDevice,
                                       ranks.comms[r]),
              weftSuccess);
    // refused before anything starts, so one rank alone returns (the
    // refusal breaks its comm, so that no peer waits for it: a later rank
    // may hear of that before its own refusal)
    weftResult_t res = weftAllReduce(host[r].data(), host[r].data(), n, weftFloat32, ops[r],
                                     ranks.comms[r], nullptr);
    if (r == 0) {
      EXPECT_EQ(res, weftInvalidUsage);
      std::string why = weftGetLastError(ranks.comms[r]);
      EXPECT_NE(why.find("weftScalarDevice"), std::string::npos) << why;
    } else {
      EXPECT_NE(res, weftSuccess) << "rank " << r;
    }
    EXPECT_EQ(host[r][0], 1.0f) << "rank " << r << ": the buffer is left as it was";
  }
  for (int r = 0; r < k; r++) weftRedOpDestroy(ops[r], ranks.comms[r]);
  cudaFree(scalar_d);
}

// Device buffers with a weft host stream (weftStreamCreate) are refused,
// naming both: the CUDA calls took the host stream for a cudaStream_t (a
// crash, or a lock of memory that is no CUDA stream's).
TEST(DeviceStreams, HostStreamWithDeviceBuffersIsRefused) {
  REQUIRE_GPU();
  const int k = 2;
  const size_t n = 64;
  Ranks ranks(k);
  std::vector<float *> bufs(k, nullptr);
  weftStream_t host_stream;
  ASSERT_EQ(weftStreamCreate(&host_stream), weftSuccess);
  for (int r = 0; r < k; r++) {
    ASSERT_EQ(cudaMalloc((void **)&bufs[r], n * sizeof(float)), cudaSuccess);
    weftResult_t res = weftAllReduce(bufs[r], bufs[r], n, weftFloat32, weftSum, ranks.comms[r],
                                     host_stream);
    if (r == 0) {
      EXPECT_EQ(res, weftInvalidArgument);
      std::string why = weftGetLastError(ranks.comms[r]);
      EXPECT_NE(why.find("device buffers on a weft host stream"), std::string::npos) << why;
    } else {
      EXPECT_NE(res, weftSuccess) << "rank " << r; // its own refusal, or rank 0's broken comm
    }
  }
  EXPECT_EQ(weftStreamDestroy(host_stream), weftSuccess);
  for (float *b : bufs) cudaFree(b);
}

// The answer to "is this a host stream" is kept per thread between calls:
// a CUDA stream goes on working after a host stream was refused, made and
// destroyed in between on the same thread.
TEST(DeviceStreams, CudaStreamWorksAroundAHostStreamRefusal) {
  REQUIRE_GPU();
  const int k = 2;
  const size_t n = 33;
  Ranks ranks(k), alone(1);
  std::vector<float *> bufs(k, nullptr);
  for (int r = 0; r < k; r++) ASSERT_EQ(cudaMalloc((void **)&bufs[r], n * sizeof(float)), cudaSuccess);
  auto all_reduce = [&](float base) {
    std::vector<float> host(n);
    for (int r = 0; r < k; r++) {
      for (size_t i = 0; i < n; i++) host[i] = base + float(r * 100 + i);
      ASSERT_EQ(cudaMemcpy(bufs[r], host.data(), n * sizeof(float), cudaMemcpyHostToDevice),
                cudaSuccess);
    }
    ASSERT_EQ(weftGroupStart(), weftSuccess);
    for (int r = 0; r < k; r++)
      ASSERT_EQ(weftAllReduce(bufs[r], bufs[r], n, weftFloat32, weftSum, ranks.comms[r],
                              ranks.streams[r]),
                weftSuccess)
          << weftGetLastError(ranks.comms[r]);
    ASSERT_EQ(weftGroupEnd(), weftSuccess);
    ranks.sync();
    for (int r = 0; r < k; r++) {
      ASSERT_EQ(cudaMemcpy(host.data(), bufs[r], n * sizeof(float), cudaMemcpyDeviceToHost),
                cudaSuccess);
      for (size_t i = 0; i < n; i++) ASSERT_EQ(host[i], 2 * base + float(100 + 2 * i)) << r << " " << i;
    }
  };
  all_reduce(1.0f);
  for (int round = 0; round < 2; round++) {
    weftStream_t host_stream;
    ASSERT_EQ(weftStreamCreate(&host_stream), weftSuccess);
    float *one = nullptr;
    ASSERT_EQ(cudaMalloc((void **)&one, n * sizeof(float)), cudaSuccess);
    EXPECT_EQ(weftAllReduce(one, one, n, weftFloat32, weftSum, alone.comms[0], host_stream),
              weftInvalidArgument) << "round " << round;
    all_reduce(2.0f + round); // the CUDA stream, with the host stream alive
    EXPECT_EQ(weftAllReduce(one, one, n, weftFloat32, weftSum, alone.comms[0], host_stream),
              weftInvalidArgument) << "round " << round;
    EXPECT_EQ(weftStreamDestroy(host_stream), weftSuccess);
    cudaFree(one);
    all_reduce(4.0f + round);
  }
  for (float *b : bufs) cudaFree(b);
}

// A pre-multiply sum on one rank is refused in place as out of place: the
// in-place call once returned success with the buffer left unscaled.
TEST(DevicePreMulSum, OneRankIsRefusedInPlaceToo) {
  REQUIRE_GPU();
  Ranks ranks(1);
  float s = 0.5f, *buf = nullptr, *out = nullptr;
  ASSERT_EQ(cudaMalloc((void **)&buf, 64 * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc((void **)&out, 64 * sizeof(float)), cudaSuccess);
  weftRedOp_t op;
  ASSERT_EQ(weftRedOpCreatePreMulSum(&op, &s, weftFloat32, weftScalarHostImmediate, ranks.comms[0]),
            weftSuccess);
  for (float *dst : {buf, out}) {
    EXPECT_EQ(weftAllReduce(buf, dst, 64, weftFloat32, op, ranks.comms[0], ranks.streams[0]),
              weftInvalidUsage) << (dst == buf ? "in place" : "out of place");
    EXPECT_NE(std::string(weftGetLastError(ranks.comms[0])).find("2 ranks or more"), std::string::npos)
        << weftGetLastError(ranks.comms[0]);
  }
  weftRedOpDestroy(op, ranks.comms[0]);
  cudaFree(buf);
  cudaFree(out);
}

}  // namespace
