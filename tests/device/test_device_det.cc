// WEFT_DETERMINISTIC=1 on device memory (collectives/exec/device/device_det.c):
// all-reduce, reduce-scatter and reduce give exactly the bits of the
// documented order (rank 0 op rank 1 op ..., float32 in float32, the narrow
// types widened to float32 and rounded once), which the host executor's
// tests (tests/collectives/test_deterministic.cc) hold the host to: so the
// two executors agree bit for bit. 2-5 ranks sharing GPU 0, whatever
// WEFT_ALGO, WEFT_PROTO and the channel count say, at 8 B, 64 KiB and
// 16 MiB; every datatype and op at an odd size; outputs poisoned and
// guarded. Skips without a GPU.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "tests/collectives/coll_ref.h"
#include "tests/harness.h"
#include "tests/device/dev_ranks.h"
#include "weft.h"
#include "collectives/reduce/reduce_ops.h"
extern "C" {
#include "collectives/algo/deterministic.h"
}

using namespace weft_test;

namespace {

constexpr int kGuard = 64;      // poisoned bytes past every output
constexpr uint8_t kPoison = 0x5a;

enum Coll { kAllReduce, kReduceScatter, kReduce };
const char *const kCollName[] = {"all-reduce", "reduce-scatter", "reduce"};

// One call on every rank (a group from this thread), each rank's input in[r]
// (send_n elements) and output recv_n elements plus the guard; returns each
// rank's output and guard as the device left them.
std::vector<std::vector<uint8_t>> run(Ranks &ranks, Coll coll, weftDataType_t t, weftRedOp_t op,
                                      int root, const std::vector<std::vector<uint8_t>> &in,
                                      size_t count, const std::vector<weftRedOp_t> *ops = nullptr) {
  const int k = (int)ranks.comms.size();
  const size_t es = weftTypeSize(t);
  const size_t recv_n = count;
  std::vector<void *> dsend(k), drecv(k);
  for (int r = 0; r < k; r++) {
    EXPECT_EQ(cudaMalloc(&dsend[r], in[r].size()), cudaSuccess);
    EXPECT_EQ(cudaMalloc(&drecv[r], recv_n * es + kGuard), cudaSuccess);
    EXPECT_EQ(cudaMemset(drecv[r], kPoison, recv_n * es + kGuard), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(dsend[r], in[r].data(), in[r].size(), cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  EXPECT_EQ(weftGroupStart(), weftSuccess);
  for (int r = 0; r < k; r++) {
    const weftRedOp_t o = ops != nullptr ? (*ops)[r] : op;
    weftResult_t res = weftSuccess;
    switch (coll) {
      case kAllReduce:
        res = weftAllReduce(dsend[r], drecv[r], count, t, o, ranks.comms[r], ranks.streams[r]);
        break;
      case kReduceScatter:
        res = weftReduceScatter(dsend[r], drecv[r], count, t, o, ranks.comms[r], ranks.streams[r]);
        break;
      case kReduce:
        res = weftReduce(dsend[r], drecv[r], count, t, o, root, ranks.comms[r], ranks.streams[r]);
        break;
    }
    EXPECT_EQ(res, weftSuccess) << weftGetLastError(ranks.comms[r]);
  }
  EXPECT_EQ(weftGroupEnd(), weftSuccess) << weftGetLastError(nullptr);
  ranks.sync();
  std::vector<std::vector<uint8_t>> out(k, std::vector<uint8_t>(recv_n * es + kGuard));
  for (int r = 0; r < k; r++) {
    EXPECT_EQ(cudaMemcpy(out[r].data(), drecv[r], out[r].size(), cudaMemcpyDeviceToHost),
              cudaSuccess);
    cudaFree(dsend[r]);
    cudaFree(drecv[r]);
  }
  return out;
}

// The guard past rank r's output untouched; "" or what is wrong.
std::string guard_intact(const std::vector<uint8_t> &out, size_t nbytes) {
  for (size_t b = nbytes; b < out.size(); b++)
    if (out[b] != kPoison) return "byte " + std::to_string(b - nbytes) + " past the output written";
  return "";
}

struct Setting {
  const char *algo, *proto, *nchannels; // "" leaves the setting alone
};
const Setting kSettings[] = {
    {"", "", ""}, {"ring", "simple", "1"}, {"ring", "ll", "4"}, {"tree", "ll", "2"},
    {"tree", "simple", "8"},
};

// The (setting, rank count) pairs a run takes: all 20, or with
// WEFT_TEST_SAMPLE=1 (the emulated CI, where a pair's 16 MiB reductions take
// seconds on threads) five drawn from the seed: every setting once, its rank
// count from a seeded rotation of 2-5, so every rank count comes too.
std::vector<std::pair<int, int>> det_pairs(uint64_t seed) {
  const int nsettings = (int)(sizeof kSettings / sizeof kSettings[0]);
  std::vector<std::pair<int, int>> pairs;
  const char *sample = getenv("WEFT_TEST_SAMPLE");
  if (sample == nullptr || strcmp(sample, "1") != 0) {
    for (int si = 0; si < nsettings; si++)
      for (int k = 2; k <= 5; k++) pairs.push_back({si, k});
    return pairs;
  }
  Rng rng(seed ^ 0xde7u);
  const int shift = (int)(rng.next() % 4);
  for (int si = 0; si < nsettings; si++) pairs.push_back({si, 2 + (si + shift) % 4});
  return pairs;
}

// float32 and bfloat16 sums, all-reduce and reduce-scatter, at three sizes,
// under every setting and rank count: exactly the fixed order's bits.
TEST(DeviceDeterministic, EverySettingGivesTheFixedOrder) {
  REQUIRE_GPU();
  const uint64_t seed = test_seed();
  const std::vector<std::pair<int, int>> pairs = det_pairs(seed);
  printf("seed %llu, %zu of the settings x rank counts (algo/proto/channels, '-' the tuner's):",
         (unsigned long long)seed, pairs.size());
  for (const auto &p : pairs) {
    const Setting &s = kSettings[p.first];
    printf(" %s/%s/%s x%d", s.algo[0] ? s.algo : "-", s.proto[0] ? s.proto : "-",
           s.nchannels[0] ? s.nchannels : "-", p.second);
  }
  printf("\n");
  const size_t sizes[] = {8, 65536 + 12, 16u << 20};
  for (const auto &pair : pairs) {
    const Setting &s = kSettings[pair.first];
    const int k = pair.second;
    using Vars = std::initializer_list<std::pair<const char *, const char *>>;
    ScopedEnv env({{"WEFT_DETERMINISTIC", "1"}, {"WEFT_TIMEOUT", "30"}});
    std::optional<ScopedEnv> algo, proto, nch; // the tuner's where empty
    if (s.algo[0]) algo.emplace(Vars{{"WEFT_ALGO", s.algo}});
    if (s.proto[0]) proto.emplace(Vars{{"WEFT_PROTO", s.proto}});
    if (s.nchannels[0]) nch.emplace(Vars{{"WEFT_DEVICE_NCHANNELS", s.nchannels}});
    Ranks ranks(k);
    for (size_t nbytes : sizes)
      for (Coll coll : {kAllReduce, kReduceScatter})
        for (bool bf16 : {false, true}) {
          const weftDataType_t t = bf16 ? weftBfloat16 : weftFloat32;
          const size_t es = bf16 ? 2 : 4;
          size_t total = nbytes / es;
          if (coll == kReduceScatter) total = total / k * k;
          const size_t count = coll == kReduceScatter ? total / k : total;
          SCOPED_TRACE(std::string(kCollName[coll]) + (bf16 ? " bfloat16 " : " float32 ") +
                       std::to_string(nbytes) + " B, " + std::to_string(k) + " ranks, algo " +
                       s.algo + " proto " + s.proto + " channels " + s.nchannels);
          std::vector<std::vector<uint8_t>> in(k, std::vector<uint8_t>(total * es));
          for (int r = 0; r < k; r++)
            for (size_t i = 0; i < total; i++) {
              const float v = varied_value(seed + nbytes, r, i);
              if (bf16) {
                const uint16_t h = weft_f32_to_bf16(v);
                memcpy(&in[r][i * 2], &h, 2);
              } else {
                memcpy(&in[r][i * 4], &v, 4);
              }
            }
          auto out = run(ranks, coll, t, weftSum, 0, in, count);
          for (int r = 0; r < k; r++) {
            const size_t first = coll == kReduceScatter ? (size_t)r * count : 0;
            size_t wrong = 0, first_wrong = 0;
            for (size_t j = 0; j < count; j++) {
              float acc = 0;
              for (int q = 0; q < k; q++) {
                float v = varied_value(seed + nbytes, q, first + j);
                if (bf16) v = weft_bf16_to_f32(weft_f32_to_bf16(v));
                acc = q == 0 ? v : acc + v;
              }
              bool same;
              if (bf16) {
                const uint16_t want = weft_f32_to_bf16(acc);
                same = memcmp(&want, &out[r][j * 2], 2) == 0;
              } else {
                same = memcmp(&acc, &out[r][j * 4], 4) == 0;
              }
              if (!same && wrong++ == 0) first_wrong = j;
            }
            EXPECT_EQ(wrong, 0u) << "rank " << r << ": " << wrong << " of " << count
                                 << " elements differ from the fixed order (first " << first_wrong
                                 << ")";
            EXPECT_EQ(guard_intact(out[r], count * es), "") << "rank " << r;
          }
        }
  }
}

// Every datatype and op (and a pre-multiply sum of float32, each rank with
// a scalar of its own), all-reduce,
// reduce-scatter and reduce (root 2), 3 ranks, an odd count: on every rank
// that gets a result, the bits of the host executor's reduction of the same
// blocks (det_reduce; a pre-multiply sum's inputs scaled first, as the host
// does), nothing past the output.
TEST(DeviceDeterministic, EveryDatatypeAndOp) {
  REQUIRE_GPU();
  const uint64_t seed = test_seed();
  printf("seed %llu\n", (unsigned long long)seed);
  ScopedEnv env({{"WEFT_DETERMINISTIC", "1"}, {"WEFT_TIMEOUT", "30"}});
  const int k = 3, root = 2;
  const size_t count = 1007;
  Ranks ranks(k);
  for (int ti = 0; ti < weftNumTypes; ti++)
    for (int oi = 0; oi <= weftNumOps; oi++) { // weftNumOps: a pre-multiply sum
      const auto t = (weftDataType_t)ti;
      const bool premul = oi == weftNumOps;
      if (premul && t != weftFloat32) continue;
      const auto op = premul ? weftSum : (weftRedOp_t)oi;
      std::vector<weftRedOp_t> ops(k, op);
      std::vector<float> scalars(k); // each rank's own
      if (premul) {
        for (int r = 0; r < k; r++) {
          scalars[r] = 0.375f * (float)(r + 1);
          ASSERT_EQ(weftRedOpCreatePreMulSum(&ops[r], &scalars[r], weftFloat32,
                                             weftScalarHostImmediate, ranks.comms[r]),
                    weftSuccess);
        }
      }
      const size_t es = weftTypeSize(t);
      for (Coll coll : {kAllReduce, kReduceScatter, kReduce}) {
        SCOPED_TRACE(std::string(kCollName[coll]) + " " + type_name(t) + " " +
                     (premul ? "premulsum" : op_name(op)));
        const size_t total = coll == kReduceScatter ? count * k : count;
        std::vector<std::vector<uint8_t>> in(k);
        for (int r = 0; r < k; r++)
          in[r] = make_input(t, op, total, seed + (uint64_t)ti * 16 + oi + coll * 1000, r);
        auto out = run(ranks, coll, t, op, root, in, count, &ops);
        // what each rank reduces: the inputs as the host scales them first
        std::vector<std::vector<uint8_t>> scaled = in;
        if (premul)
          for (int r = 0; r < k; r++)
            for (size_t i = 0; i < total; i++) {
              float v;
              memcpy(&v, &in[r][i * 4], 4);
              v = weft_f32_prod(v, scalars[r]);
              memcpy(&scaled[r][i * 4], &v, 4);
            }
        for (int r = 0; r < k; r++) {
          if (coll == kReduce && r != root) continue;
          const size_t first = coll == kReduceScatter ? (size_t)r * count : 0;
          std::vector<const void *> ins(k);
          for (int q = 0; q < k; q++) ins[q] = scaled[q].data() + first * es;
          std::vector<uint8_t> want(count * es);
          det_reduce(t, op, k, want.data(), ins.data(), count); // the host executor's
          size_t wrong = 0, first_wrong = 0;
          for (size_t j = 0; j < count; j++)
            if (memcmp(&want[j * es], &out[r][j * es], es) != 0 && wrong++ == 0) first_wrong = j;
          EXPECT_EQ(wrong, 0u) << "rank " << r << ": " << wrong << " of " << count
                               << " elements differ from the fixed order (first " << first_wrong
                               << ")";
          EXPECT_EQ(guard_intact(out[r], count * es), "") << "rank " << r;
        }
      }
      if (premul)
        for (int r = 0; r < k; r++) weftRedOpDestroy(ops[r], ranks.comms[r]);
    }
}

// A comm's calls run in call order whatever stream each goes to, the
// deterministic reduction's kernels too: a reduce-scatter on one stream
// whose last kernel (its reduction into the output) no launch of the comm
// counts, then an all-gather of that output on another stream, which must
// wait for it (a gate on the counted launches alone let it read the output
// while the reduction still wrote it). Rounds of 2^18 floats, 2 ranks; every
// gathered element checked.
TEST(DeviceDeterministic, NextCallOnAnotherStreamWaitsForTheReduction) {
  REQUIRE_GPU();
  ScopedEnv env({{"WEFT_DETERMINISTIC", "1"}, {"WEFT_TIMEOUT", "30"}});
  const int k = 2, rounds = 4;
  const size_t n = 1 << 18;
  Ranks ranks(k);
  std::vector<cudaStream_t> side(k);
  std::vector<float *> in(k), mid(k), out(k);
  auto input = [](int r, int j, size_t i) {
    return (float)((i * 7 + (size_t)r * 29 + (size_t)j * 3) % 113);
  };
  std::vector<float> h(n * k);
  for (int r = 0; r < k; r++) {
    ASSERT_EQ(cudaStreamCreateWithFlags(&side[r], cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaMalloc((void **)&in[r], n * k * sizeof(float)), cudaSuccess);
    ASSERT_EQ(cudaMalloc((void **)&mid[r], n * sizeof(float)), cudaSuccess);
    ASSERT_EQ(cudaMalloc((void **)&out[r], n * k * sizeof(float)), cudaSuccess);
  }
  for (int j = 0; j < rounds; j++) {
    SCOPED_TRACE("round " + std::to_string(j));
    for (int r = 0; r < k; r++) {
      for (size_t i = 0; i < n * k; i++) h[i] = input(r, j, i);
      ASSERT_EQ(cudaMemcpy(in[r], h.data(), n * k * sizeof(float), cudaMemcpyHostToDevice),
                cudaSuccess);
      ASSERT_EQ(cudaMemset(mid[r], 0xff, n * sizeof(float)), cudaSuccess); // NaN
      ASSERT_EQ(cudaMemset(out[r], 0xff, n * k * sizeof(float)), cudaSuccess);
    }
    ASSERT_EQ(weftGroupStart(), weftSuccess);
    for (int r = 0; r < k; r++)
      ASSERT_EQ(weftReduceScatter(in[r], mid[r], n, weftFloat32, weftSum, ranks.comms[r],
                                  ranks.streams[r]),
                weftSuccess);
    ASSERT_EQ(weftGroupEnd(), weftSuccess) << weftGetLastError(nullptr);
    ASSERT_EQ(weftGroupStart(), weftSuccess);
    for (int r = 0; r < k; r++)
      ASSERT_EQ(weftAllGather(mid[r], out[r], n, weftFloat32, ranks.comms[r], side[r]),
                weftSuccess);
    ASSERT_EQ(weftGroupEnd(), weftSuccess) << weftGetLastError(nullptr);
    ranks.sync();
    for (int r = 0; r < k; r++) ASSERT_EQ(cudaStreamSynchronize(side[r]), cudaSuccess);
    for (int r = 0; r < k; r++) {
      ASSERT_EQ(cudaMemcpy(h.data(), out[r], n * k * sizeof(float), cudaMemcpyDeviceToHost),
                cudaSuccess);
      size_t wrong = 0, first = 0;
      for (size_t i = 0; i < n * k; i++)
        if (h[i] != input(0, j, i) + input(1, j, i) && wrong++ == 0) first = i;
      ASSERT_EQ(wrong, 0u) << "rank " << r << ": " << wrong << " of " << n * k
                           << " gathered elements wrong, first " << first << ": " << h[first];
    }
  }
  for (int r = 0; r < k; r++) {
    cudaFree(in[r]);
    cudaFree(mid[r]);
    cudaFree(out[r]);
    cudaStreamDestroy(side[r]);
  }
}

}  // namespace
