// WEFT_DETERMINISTIC=1: all-reduce and reduce-scatter of random float32 and
// bfloat16 data give, on every rank, exactly the bits of the documented
// order (rank 0 + rank 1 + ... in float32, bfloat16 rounded once), whatever
// algorithm, protocol, channel count and transport are forced, at 8 B, 64 KiB
// and 16 MiB, on 2-5 ranks. Each value of every axis runs; the combinations
// are sampled (seeded, the seed printed: WEFT_TEST_SEED repeats a run).
// Without the setting, every rank of one call still holds the same bits.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "harness.h"
#include "tests/collectives/coll_ref.h"
#include "split_signature.h"

#include "collectives/reduce/reduce_ops.h"

using namespace weft_test;

namespace {

struct Config {
  const char *algo;       // WEFT_ALGO, "" for the tuner's choice
  const char *proto;      // WEFT_PROTO, "" for the tuner's choice
  const char *transport;  // WEFT_TRANSPORT, "" for shared memory
  int nchannels;
};

const Config kConfigs[] = {
    {"", "", "", 1},           {"ring", "simple", "", 1}, {"ring", "ll", "", 2},
    {"tree", "", "", 1},       {"rd", "", "", 2},         {"cma", "", "", 1},
    {"ring", "simple", "socket", 2}, {"ring", "ll", "socket", 1}, {"tree", "", "socket", 2},
    {"bulk", "", "ucx", 2},
};

struct Call {
  bool reduce_scatter;
  bool bf16;
  size_t nbytes;  // of the reduced buffer (all ranks' blocks for reduce-scatter)
  int nranks;
};

std::string describe(const Config &c, const Call &k) {
  char buf[200];
  snprintf(buf, sizeof buf, "%s %s, %zu B, %d ranks, algo %s proto %s transport %s, %d channels",
           k.reduce_scatter ? "reduce-scatter" : "all-reduce", k.bf16 ? "bfloat16" : "float32",
           k.nbytes, k.nranks, c.algo[0] ? c.algo : "(tuner)", c.proto[0] ? c.proto : "(tuner)",
           c.transport[0] ? c.transport : "shm", c.nchannels);
  return buf;
}

// Runs one call on every rank and checks each rank's output against the
// fixed order, element by element, bit for bit.
int run_call(const RankCtx &ctx, weftComm_t comm, const Call &k, uint64_t seed) {
  const size_t esize = k.bf16 ? 2 : 4, n = (size_t)ctx.nranks;
  size_t total = k.nbytes / esize;
  if (k.reduce_scatter) total = total / n * n;
  const size_t count = k.reduce_scatter ? total / n : total;  // the call's count
  std::vector<uint8_t> in(total * esize), out(count * esize + 64, 0x5a);
  for (size_t i = 0; i < total; i++) {
    const float v = varied_value(seed, ctx.rank, i);
    if (k.bf16) {
      uint16_t h = weft_f32_to_bf16(v);
      memcpy(&in[i * 2], &h, 2);
    } else {
      memcpy(&in[i * 4], &v, 4);
    }
  }
  const weftDataType_t t = k.bf16 ? weftBfloat16 : weftFloat32;
  weftResult_t res =
      k.reduce_scatter
          ? weftReduceScatter(in.data(), out.data(), count, t, weftSum, comm, nullptr)
          : weftAllReduce(in.data(), out.data(), count, t, weftSum, comm, nullptr);
  FAIL_IF(res != weftSuccess, "%s", weftGetLastError(comm));
  const size_t first = k.reduce_scatter ? (size_t)ctx.rank * count : 0;
  size_t wrong = 0, first_wrong = 0;
  for (size_t j = 0; j < count; j++) {
    const size_t i = first + j;
    float acc = 0;
    for (int r = 0; r < ctx.nranks; r++) {
      float v = varied_value(seed, r, i);
      if (k.bf16) v = weft_bf16_to_f32(weft_f32_to_bf16(v));
      acc = r == 0 ? v : acc + v;
    }
    bool same;
    if (k.bf16) {
      uint16_t want = weft_f32_to_bf16(acc), got;
      memcpy(&got, &out[j * 2], 2);
      same = want == got;
    } else {
      same = memcmp(&acc, &out[j * 4], 4) == 0;
    }
    if (!same && wrong++ == 0) first_wrong = j;
  }
  FAIL_IF(wrong != 0, "%zu of %zu elements differ from the fixed order (first: %zu)", wrong,
          count, first_wrong);
  for (size_t b = count * esize; b < out.size(); b++)
    FAIL_IF(out[b] != 0x5a, "byte %zu past the output written", b - count * esize);
  return 0;
}

RunOptions options(const Config &c, bool deterministic) {
  RunOptions opts;
  opts.timeout_s = 120;
  opts.allow_warnings = true;  // a forced algorithm that cannot run says so
  opts.env = {{"WEFT_NCHANNELS", std::to_string(c.nchannels)}, {"WEFT_TIMEOUT", "30"}};
  if (deterministic) opts.env.push_back({"WEFT_DETERMINISTIC", "1"});
  if (c.algo[0]) opts.env.push_back({"WEFT_ALGO", c.algo});
  if (c.proto[0]) opts.env.push_back({"WEFT_PROTO", c.proto});
  if (c.transport[0]) opts.env.push_back({"WEFT_TRANSPORT", c.transport});
  return opts;
}

// Every config runs float32 and bfloat16, all-reduce and reduce-scatter, at
// 8 B, 64 KiB and 16 MiB, each once in a seeded draw; the rank count is drawn.
TEST(Deterministic, EveryPathGivesTheFixedOrder) {
  const uint64_t seed = test_seed();
  Rng rng(seed);
  const size_t sizes[] = {8, 65536 + 12, 16u << 20};
  int n16m = 0;
  for (const Config &c : kConfigs) {
    // one communicator per config (settings are read once per process):
    // several calls on it, every size, both types and both collectives
    std::vector<Call> calls;
    for (size_t s : sizes) {
      Call k;
      k.nbytes = s;
      k.reduce_scatter = rng.next() % 2;
      k.bf16 = rng.next() % 2;
      calls.push_back(k);
    }
    // both types and both collectives on this config at least once
    calls.push_back({!calls[0].reduce_scatter, !calls[0].bf16, 65536 + 12, 0});
    const int nranks = 2 + (int)(rng.next() % 4);
    // 16 MiB on 5 ranks is seconds on two cores: at most a few configs
    if (nranks >= 4 && ++n16m > 3) calls.erase(calls.begin() + 2);
    std::string label;
    for (Call &k : calls) {
      k.nranks = nranks;
      label += "  " + describe(c, k) + "\n";
    }
    printf("seed %llu:\n%s", (unsigned long long)seed, label.c_str());
    fflush(stdout);
    SCOPED_TRACE(label);
    run_comm(nranks, options(c, true), [&](const RankCtx &ctx, weftComm_t comm) {
      for (const Call &k : calls) TRY_RC(run_call(ctx, comm, k, seed + k.nbytes));
      return 0;
    });
  }
}

// Max and min of float16, bfloat16 and the fp8 types pick an input, with
// and without WEFT_DETERMINISTIC, on 2 and 3 ranks: max(-0, +0) = +0 and
// min = -0 whichever rank holds which (the deterministic order gave the
// first rank's), and e5m2's infinities stay infinite (they came back as
// +-57344). Element e of rank r: 0: +0 on even ranks, -0 on odd; 1: the
// other way round; 2: +inf (e5m2) or the largest finite value on rank 0,
// 1.0 elsewhere; 3: its negation; 4: a NaN with a payload on rank 0, 1.0
// elsewhere (it comes back with its bits; widened and narrowed, under
// WEFT_DETERMINISTIC, it was quieted).
TEST(Deterministic, MaxMinOfNarrowTypesPickAnInput) {
  struct Narrow {
    weftDataType_t type;
    uint16_t neg_zero, one, big, nan;  // bits; big: e5m2's +inf, the others' largest finite
    size_t nbytes;
  };
  const Narrow narrows[] = {{weftFloat16, 0x8000, 0x3c00, 0x7bff, 0x7d01, 2},
                            {weftBfloat16, 0x8000, 0x3f80, 0x7f7f, 0x7f81, 2},
                            {weftFloat8e4m3, 0x80, 0x38, 0x7e, 0x7f, 1},
                            {weftFloat8e5m2, 0x80, 0x3c, 0x7c, 0x7d, 1}};
  for (bool det : {true, false})
    for (int nranks : {2, 3}) {
      SCOPED_TRACE(std::string(det ? "WEFT_DETERMINISTIC=1, " : "") + std::to_string(nranks) +
                   " ranks");
      run_comm(nranks, options(kConfigs[0], det), [&](const RankCtx &ctx, weftComm_t comm) {
        for (const Narrow &t : narrows) {
          const uint16_t sign = t.neg_zero;
          const uint16_t in16[5] = {(uint16_t)(ctx.rank % 2 ? sign : 0),
                                    (uint16_t)(ctx.rank % 2 ? 0 : sign),
                                    ctx.rank == 0 ? t.big : t.one,
                                    (uint16_t)(sign | (ctx.rank == 0 ? t.big : t.one)),
                                    ctx.rank == 0 ? t.nan : t.one};
          for (weftRedOp_t op : {weftMax, weftMin}) {
            const uint16_t want[5] = {(uint16_t)(op == weftMax ? 0 : sign),
                                      (uint16_t)(op == weftMax ? 0 : sign),
                                      op == weftMax ? t.big : t.one,
                                      (uint16_t)(sign | (op == weftMax ? t.one : t.big)), t.nan};
            uint8_t in[10], out[10];
            for (int e = 0; e < 5; e++) {
              if (t.nbytes == 2) memcpy(in + 2 * e, &in16[e], 2);
              else in[e] = (uint8_t)in16[e];
            }
            memset(out, 0xa5, sizeof out);
            FAIL_IF(weftAllReduce(in, out, 5, t.type, op, comm, nullptr) != weftSuccess, "%s",
                    weftGetLastError(comm));
            for (int e = 0; e < 5; e++) {
              uint16_t got = 0;
              if (t.nbytes == 2) memcpy(&got, out + 2 * e, 2);
              else got = out[e];
              FAIL_IF(got != want[e], "type %d %s element %d: 0x%x, want 0x%x", (int)t.type,
                      op == weftMax ? "max" : "min", e, got, want[e]);
            }
          }
        }
        return 0;
      });
    }
}

// Without WEFT_DETERMINISTIC the bits may depend on the path, but every rank
// of one all-reduce holds the same ones: each path reduces each element on
// one rank (or both partners alike) and copies it to the others.
TEST(Deterministic, WithoutItEveryRankHoldsTheSameBits) {
  const uint64_t seed = test_seed();
  uint64_t *digests = (uint64_t *)mmap(nullptr, 8 * sizeof(uint64_t), PROT_READ | PROT_WRITE,
                                       MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(digests, MAP_FAILED);
  Rng rng(seed + 1);
  for (const Config &c : kConfigs) {
    const int nranks = 2 + (int)(rng.next() % 4);
    const size_t count = 1 + rng.next() % 300000;
    SCOPED_TRACE(std::string(c.algo) + " " + c.proto + " " + c.transport + ", " +
                 std::to_string(nranks) + " ranks, " + std::to_string(count) + " floats");
    memset(digests, 0, 8 * sizeof(uint64_t));
    run_comm(nranks, options(c, true), [&](const RankCtx &ctx, weftComm_t comm) {
      std::vector<float> in(count), out(count);
      for (size_t i = 0; i < count; i++) in[i] = varied_value(seed, ctx.rank, i);
      FAIL_IF(weftAllReduce(in.data(), out.data(), count, weftFloat32, weftSum, comm,
                            nullptr) != weftSuccess,
              "%s", weftGetLastError(comm));
      uint64_t h = 1469598103934665603ull;  // FNV-1a of the output's bytes
      const uint8_t *b = (const uint8_t *)out.data();
      for (size_t i = 0; i < count * 4; i++) h = (h ^ b[i]) * 1099511628211ull;
      digests[ctx.rank] = h;
      return 0;
    });
    for (int r = 1; r < nranks; r++)
      EXPECT_EQ(digests[r], digests[0]) << "rank " << r << "'s result differs from rank 0's";
  }
  munmap(digests, 8 * sizeof(uint64_t));
}

}  // namespace
