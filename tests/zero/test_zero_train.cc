// ZeRO end to end on real ranks: the trainer's MLP under every stage, rank
// count, optimizer and dtype; checkpoints across rank counts and stages; a
// rank dying during a save; stage 3's pool of gathered buffers over steps
// and its stream-ordered release.
#include <gtest/gtest.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <vector>

#include "weft_build_config.h"
#if WEFT_HAVE_CUDA /* the header alone is not enough: the runtime is linked in CUDA builds only */
#include <cuda_runtime_api.h>
#endif

#include "harness.h"
#include "train_model.h"
#include "weft_zero.h"
#include "zero/zero_test_hooks.h"

using namespace weft_test;

namespace {

// Tolerances (docs/zero.md). fp32 reductions: 1e-6 of the largest parameter
// (sums in another order). bf16 parameters reduced in fp32: 1e-3 (a master
// weight that differs in its last bit may round to another bf16). Reduced in
// bf16, every partial sum rounds to 8 bits, so stage 0's all-reduce and a
// reduce-scatter may disagree by a bf16 step on a gradient: SGD stays within
// 1e-2; AdamW normalises each update, so a gradient near zero whose sign
// flips moves its parameter by up to 2 lr per step: 2 lr steps absolute.
constexpr double kFp32Tol = 1e-6;
constexpr double kBf16Tol = 1e-3;
constexpr double kBf16ReduceSgdTol = 1e-2;

// Largest difference relative to the largest magnitude.
double rel_diff(const float *a, const float *b, size_t n) {
  double diff = 0, mag = 0;
  for (size_t i = 0; i < n; i++) {
    diff = fmax(diff, fabs((double)a[i] - b[i]));
    mag = fmax(mag, fabs((double)a[i]));
  }
  return diff / fmax(mag, 1e-30);
}

int init(const RankCtx &ctx, weftComm_t *comm) {
  if (weftCommInitRank(comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
    return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
  return 0;
}

int train(const RankCtx &ctx, weftComm_t comm, const train_opts &o, std::vector<float> *params,
          train_result *out = nullptr) {
  train_result r;
  weftResult_t res = train_run(comm, &o, &r);
  if (res != weftSuccess)
    return rank_fail(ctx, "stage %d: %s / %s", o.stage, weftZeroLastError(),
                     weftGetLastError(nullptr));
  params->assign(r.params, r.params + r.nparams);
  free(r.params);
  r.params = nullptr;
  if (out != nullptr) *out = r;
  return 0;
}

struct StageCase {
  int nranks;
  weftZeroOptimizer_t optimizer;
  weftDataType_t dtype;
  weftDataType_t reduce;
  int accum;
  int every = 0; // reduceEveryMicroStep (stages 2-3)
};

std::string case_name(const testing::TestParamInfo<StageCase> &info) {
  const StageCase &c = info.param;
  auto t = [](weftDataType_t d) {
    return d == weftFloat32 ? "fp32" : d == weftBfloat16 ? "bf16" : "fp16";
  };
  return std::to_string(c.nranks) + "ranks_" + (c.optimizer == weftZeroAdamW ? "adamw" : "sgd") +
         "_" + t(c.dtype) + "_reduce_" + t(c.reduce) + "_accum" + std::to_string(c.accum) +
         (c.every ? "_every" : "");
}

class ZeroStages : public testing::TestWithParam<StageCase> {};

// Stages 1, 2 and 3 give stage 0's parameters after 10 steps; training moved
// them; every rank holds the same parameters.
TEST_P(ZeroStages, MatchStageZero) {
  StageCase c = GetParam();
  auto status = run_ranks(c.nranks, [c](const RankCtx &ctx) {
    weftComm_t comm;
    if (int rc = init(ctx, &comm)) return rc;
    train_opts o;
    train_opts_defaults(&o);
    o.optimizer = c.optimizer;
    o.lr = c.optimizer == weftZeroAdamW ? 1e-2 : 5e-2;
    o.dtype = c.dtype;
    o.reduce_type = c.reduce;
    o.accum = c.accum;
    o.reduce_every = c.every;
    o.global_batch = 24;
    o.seed = test_seed();
    o.clip = 0.5;  // the norm is computed across shards: clipping must agree too
    std::vector<float> ref, got, start;
    train_opts o0 = o;
    o0.steps = 0;
    if (int rc = train(ctx, comm, o0, &start)) return rc;
    if (int rc = train(ctx, comm, o, &ref)) return rc;
    if (rel_diff(ref.data(), start.data(), ref.size()) < 1e-3)
      return rank_fail(ctx, "training did not move the parameters");
    double tol = c.dtype == weftFloat32 ? kFp32Tol : kBf16Tol;
    // reduced every micro-step in fp32, stages 2-3 sum the micro-steps in
    // fp32 where stage 0 sums them in its bf16 buffers: bf16's rounding
    if (c.reduce != weftFloat32 || (c.every && c.dtype != weftFloat32)) {
      double mag = 0;
      for (float v : ref) mag = fmax(mag, fabs(v));
      tol = c.optimizer == weftZeroAdamW ? 2 * o.lr * o.steps / mag : kBf16ReduceSgdTol;
    }
    for (int stage = 1; stage <= 3; stage++) {
      o.stage = stage;
      if (int rc = train(ctx, comm, o, &got)) return rc;
      if (got.size() != ref.size()) return rank_fail(ctx, "stage %d: size", stage);
      double d = rel_diff(ref.data(), got.data(), ref.size());
      if (d > tol) return rank_fail(ctx, "stage %d differs from stage 0 by %.3g (tolerance %.3g)",
                                    stage, d, tol);
    }
    // every rank holds the same (last) parameters
    std::vector<float> rank0(got);
    weftBroadcast(got.data(), rank0.data(), got.size(), weftFloat32, 0, comm, nullptr);
    if (memcmp(rank0.data(), got.data(), got.size() * sizeof(float)) != 0)
      return rank_fail(ctx, "ranks disagree on the parameters");
    weftCommDestroy(comm);
    return 0;
  });
  for (size_t r = 0; r < status.size(); r++) EXPECT_EQ(status[r], 0) << "rank " << r;
}

std::vector<StageCase> stage_cases() {
  std::vector<StageCase> cases;
  for (int n = 1; n <= 4; n++)
    for (auto opt : {weftZeroSgdMomentum, weftZeroAdamW}) {
      cases.push_back({n, opt, weftFloat32, weftFloat32, 1});
      cases.push_back({n, opt, weftBfloat16, weftBfloat16, 1});
    }
  cases.push_back({3, weftZeroAdamW, weftBfloat16, weftFloat32, 1});
  cases.push_back({4, weftZeroSgdMomentum, weftFloat16, weftFloat32, 1});
  cases.push_back({2, weftZeroSgdMomentum, weftFloat32, weftFloat32, 3});
  cases.push_back({3, weftZeroAdamW, weftFloat32, weftFloat32, 2});
  // stages 2-3 reduce every micro-step, against stage 0's local sums
  cases.push_back({2, weftZeroSgdMomentum, weftFloat32, weftFloat32, 3, 1});
  cases.push_back({3, weftZeroAdamW, weftBfloat16, weftBfloat16, 2, 1});
  cases.push_back({4, weftZeroAdamW, weftBfloat16, weftFloat32, 2, 1});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Zero, ZeroStages, testing::ValuesIn(stage_cases()), case_name);

// Stage 0 on N ranks equals one rank on the global batch; accumulation over
// micro-steps equals one big micro-step.
TEST(ZeroStageZero, RanksMatchOneRankOnGlobalBatch) {
  for (auto opt : {weftZeroSgdMomentum, weftZeroAdamW}) {
    for (int n : {2, 3, 4}) {
      RunOptions opts;  // no launcher: rank 0's solo comm is of its process alone
      opts.env_unset = {"WEFT_RANK", "WEFT_NRANKS", "RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK",
                        "SLURM_PROCID"};
      auto status = run_ranks(n, [opt](const RankCtx &ctx) {
        train_opts o;
        train_opts_defaults(&o);
        o.optimizer = opt;
        o.global_batch = 36;
        o.seed = test_seed();
        std::vector<float> single, multi, accum;
        if (ctx.rank == 0) {  // one rank, the whole batch
          weftComm_t solo;
          if (weftCommInitFromEnv(&solo, nullptr) != weftSuccess)
            return rank_fail(ctx, "one-rank comm: %s", weftGetLastError(nullptr));
          int n1 = 0;
          weftCommCount(solo, &n1);
          if (n1 != 1) return rank_fail(ctx, "the solo comm has %d ranks", n1);
          if (int rc = train(ctx, solo, o, &single)) return rc;
          weftCommDestroy(solo);
        }
        weftComm_t comm;
        if (int rc = init(ctx, &comm)) return rc;
        if (int rc = train(ctx, comm, o, &multi)) return rc;
        o.accum = 3;
        if (int rc = train(ctx, comm, o, &accum)) return rc;
        double d = rel_diff(multi.data(), accum.data(), multi.size());
        if (d > kFp32Tol) return rank_fail(ctx, "accumulation differs by %.3g", d);
        if (ctx.rank == 0) {
          d = rel_diff(single.data(), multi.data(), multi.size());
          if (d > kFp32Tol)
            return rank_fail(ctx, "%d ranks differ from one rank by %.3g", ctx.nranks, d);
        }
        weftCommDestroy(comm);
        return 0;
      }, opts);
      for (size_t r = 0; r < status.size(); r++) EXPECT_EQ(status[r], 0) << n << " ranks, rank " << r;
    }
  }
}

std::string temp_dir(const char *tag) {
  char templ[256];
  snprintf(templ, sizeof templ, "/tmp/weft_zero_%s_XXXXXX", tag);
  const char *d = mkdtemp(templ);
  return d ? d : "";
}

void write_floats(const std::string &path, const std::vector<float> &v) {
  FILE *f = fopen(path.c_str(), "wb");
  if (f == nullptr) return;
  fwrite(v.data(), sizeof(float), v.size(), f);
  fclose(f);
}

std::vector<float> read_floats(const std::string &path) {
  std::vector<float> v;
  FILE *f = fopen(path.c_str(), "rb");
  if (f == nullptr) return v;
  float x;
  while (fread(&x, sizeof x, 1, f) == 1) v.push_back(x);
  fclose(f);
  return v;
}

train_opts ckpt_opts() {
  train_opts o;
  train_opts_defaults(&o);
  o.optimizer = weftZeroAdamW;
  o.global_batch = 24;  // divides by 2, 3 and 4 ranks
  o.seed = test_seed();
  return o;
}

// Save at step 5 on 4 ranks at stage 3; continue to step 10 on 4 ranks
// (stage 3), 2 ranks (stage 1) and 3 ranks (stage 2): each matches the
// uninterrupted run.
TEST(ZeroCheckpoint, ResumeOnOtherRanksAndStages) {
  std::string dir = temp_dir("ckpt");
  ASSERT_FALSE(dir.empty());
  std::string ckpt = dir + "/ckpt", ref_path = dir + "/ref.bin", at5_path = dir + "/at5.bin";
  auto status = run_ranks(4, [&](const RankCtx &ctx) {
    weftComm_t comm;
    if (int rc = init(ctx, &comm)) return rc;
    train_opts o = ckpt_opts();
    o.stage = 3;
    std::vector<float> p;
    if (int rc = train(ctx, comm, o, &p)) return rc;  // uninterrupted, 10 steps
    if (ctx.rank == 0) write_floats(ref_path, p);
    o.steps = 5;
    o.save = ckpt.c_str();
    if (int rc = train(ctx, comm, o, &p)) return rc;
    if (ctx.rank == 0) write_floats(at5_path, p);
    weftCommDestroy(comm);
    return 0;
  });
  for (int s : status) ASSERT_EQ(s, 0);
  std::vector<float> ref = read_floats(ref_path);
  ASSERT_GT(ref.size(), 0u);
  // consolidation: the header, then exactly the parameters at step 5
  std::string full = dir + "/full.bin";
  ASSERT_EQ(weftZeroConsolidate(ckpt.c_str(), full.c_str()), weftSuccess) << weftZeroLastError();
  std::vector<float> words = read_floats(full), at5 = read_floats(at5_path);
  train_opts o = ckpt_opts();
  size_t header = (8 + 8 + 8 * o.nlayers) / sizeof(float);
  ASSERT_EQ(words.size(), header + at5.size());
  EXPECT_EQ(memcmp(words.data(), "WEFTZF32", 8), 0);
  EXPECT_TRUE(std::equal(at5.begin(), at5.end(), words.begin() + header));
  struct Resume {
    int nranks, stage;
    double tol;  // 0: bit for bit (same ranks: the same sums in the same order)
  };
  for (Resume r : {Resume{4, 3, 0.0}, Resume{2, 1, kFp32Tol}, Resume{3, 2, kFp32Tol}, Resume{1, 0, kFp32Tol}}) {
    auto st = run_ranks(r.nranks, [&](const RankCtx &ctx) {
      weftComm_t comm;
      if (int rc = init(ctx, &comm)) return rc;
      train_opts o = ckpt_opts();
      o.stage = r.stage;
      o.resume = ckpt.c_str();
      std::vector<float> p;
      train_result res;
      if (int rc = train(ctx, comm, o, &p, &res)) return rc;
      if (res.steps_done != 10) return rank_fail(ctx, "ran to step %ld", res.steps_done);
      if (p.size() != ref.size()) return rank_fail(ctx, "size %zu", p.size());
      double d = rel_diff(ref.data(), p.data(), p.size());
      if (d > r.tol)
        return rank_fail(ctx, "resumed on %d ranks at stage %d: differs by %.3g", ctx.nranks,
                         r.stage, d);
      weftCommDestroy(comm);
      return 0;
    });
    for (size_t q = 0; q < st.size(); q++)
      EXPECT_EQ(st[q], 0) << r.nranks << " ranks stage " << r.stage << " rank " << q;
  }
  // a model of another shape is refused with a clear error
  auto st = run_ranks(2, [&](const RankCtx &ctx) {
    weftComm_t comm;
    if (int rc = init(ctx, &comm)) return rc;
    train_opts o = ckpt_opts();
    o.widths[1] = 36;
    o.resume = ckpt.c_str();
    train_result res;
    if (train_run(comm, &o, &res) != weftInvalidUsage ||
        strstr(weftZeroLastError(), "layer 0 has") == nullptr)
      return rank_fail(ctx, "another shape loaded: %s", weftZeroLastError());
    weftCommDestroy(comm);
    return 0;
  });
  for (int s : st) EXPECT_EQ(s, 0);
  std::string cmd = "rm -rf " + dir;
  EXPECT_EQ(system(cmd.c_str()), 0);
}

// A rank that dies in the middle of writing its shard: the save fails on the
// others, and the previous checkpoint still loads, with its values.
TEST(ZeroCheckpoint, CrashDuringSaveKeepsPrevious) {
  std::string dir = temp_dir("crash");
  ASSERT_FALSE(dir.empty());
  std::string ckpt = dir + "/ckpt", at3 = dir + "/at3.bin";
  auto status = run_ranks(3, [&](const RankCtx &ctx) {
    weftComm_t comm;
    if (int rc = init(ctx, &comm)) return rc;
    train_opts o = ckpt_opts();
    o.stage = 2;
    o.steps = 3;
    o.save = ckpt.c_str();
    std::vector<float> p;
    if (int rc = train(ctx, comm, o, &p)) return rc;
    if (ctx.rank == 0) write_floats(at3, p);
    weftCommDestroy(comm);
    return 0;
  });
  for (int s : status) ASSERT_EQ(s, 0);

  RunOptions crash;
  crash.env = {{"WEFT_TIMEOUT", "5"}};
  zero_test_save_crash_rank = 1;  // the ranks fork from here
  crash.allow_warnings = true;  // the dead peer is reported
  status = run_ranks(3, [&](const RankCtx &ctx) {
    weftComm_t comm;
    if (int rc = init(ctx, &comm)) return rc;
    train_opts o = ckpt_opts();
    o.stage = 2;
    o.steps = 6;
    o.resume = ckpt.c_str();
    o.save = ckpt.c_str();
    train_result r;
    weftResult_t res = train_run(comm, &o, &r);
    if (res == weftSuccess) return rank_fail(ctx, "the save succeeded although rank 1 died");
    weftCommAbort(comm);
    return 0;
  }, crash);
  zero_test_save_crash_rank = -1;
  EXPECT_EQ(status[0], 0);
  EXPECT_EQ(status[1], 3) << "rank 1 should have exited in the middle of its shard";
  EXPECT_EQ(status[2], 0);

  std::vector<float> want = read_floats(at3);
  ASSERT_GT(want.size(), 0u);
  status = run_ranks(2, [&](const RankCtx &ctx) {
    weftComm_t comm;
    if (int rc = init(ctx, &comm)) return rc;
    train_opts o = ckpt_opts();
    o.stage = 1;
    o.steps = 3;  // load only
    o.resume = ckpt.c_str();
    std::vector<float> p;
    train_result r;
    if (int rc = train(ctx, comm, o, &p, &r)) return rc;
    if (r.steps_done != 3) return rank_fail(ctx, "loaded step %ld, want 3", r.steps_done);
    if (p != want) return rank_fail(ctx, "the loaded parameters are not step 3's");
    weftCommDestroy(comm);
    return 0;
  });
  for (int s : status) EXPECT_EQ(s, 0);
  std::string cmd = "rm -rf " + dir;
  EXPECT_EQ(system(cmd.c_str()), 0);
}

// Stage 3's gather pool over steps. One parameter per layer, of four sizes
// (a gather may take a larger idle buffer), odd so that every rank count pads.
const std::vector<size_t> kPoolLayers = {301, 1000, 57, 1000, 300};
const size_t kPoolBucketBytes = 16 << 10;  // every layer's gradient at once

struct PoolCase {
  int prefetch;
  bool bound;    // gatherBoundBytes: the largest layer plus the second largest
  bool ordered;  // weftZeroReleaseOn on the stream, else weftZeroRelease
};

// A gradient that depends on the parameter, the rank and the step.
float pool_grad(float p, size_t i, int rank, int step) {
  return p - 0.01f * (float)(i % 7) + 0.003f * (float)(rank + 1) * (float)(step + 1);
}

// Reads layer l after its gather, checks it against the parameters want, and
// poisons it (stage 3: the buffer goes back to the pool) so that a later
// gather into the buffer that does not overwrite it shows.
int pool_read(const RankCtx &ctx, weftZero_t z, int stage, int l, const float *want,
              weftStream_t s, bool poison) {
  weftEvent_t ev;
  if (weftZeroGather(z, l, s, &ev) != weftSuccess || weftEventSynchronize(ev) != weftSuccess)
    return rank_fail(ctx, "gather %d: %s", l, weftZeroLastError());
  void *p;
  if (weftZeroParam(z, l, &p) != weftSuccess)
    return rank_fail(ctx, "param %d: %s", l, weftZeroLastError());
  for (size_t i = 0; i < kPoolLayers[l]; i++)
    if (memcmp((float *)p + i, want + i, sizeof(float)) != 0)
      return rank_fail(ctx, "stage %d: layer %d gathered %g at %zu where the parameter is %g",
                       stage, l, ((float *)p)[i], i, want[i]);
  if (poison && stage == 3) memset(p, 0xff, kPoolLayers[l] * sizeof(float));  // NaN
  return 0;
}

int pool_release(const RankCtx &ctx, weftZero_t z, int l, const PoolCase &c, weftStream_t s) {
  weftResult_t res = c.ordered ? weftZeroReleaseOn(z, l, s) : weftZeroRelease(z, l);
  return res == weftSuccess ? 0 : rank_fail(ctx, "release %d: %s", l, weftZeroLastError());
}

// The pools' report after a step: nothing allocated after the first, never
// more than the peak, nor the bound.
int pool_check(const RankCtx &ctx, weftZero_t z, size_t bound, int step, size_t *allocs) {
  weftZeroMemory_t r;
  weftZeroMemoryReport(z, &r);
  if (step == 0) *allocs = r.gatheredAllocs;
  if (r.gatheredAllocs != *allocs || *allocs == 0)
    return rank_fail(ctx, "step %d: %zu gathered buffers allocated, %zu after the first step",
                     step, r.gatheredAllocs, *allocs);
  // buckets come back as their reductions finish, so how many are held at
  // once depends on timing; but under bucketBytes no idle one is freed, and
  // one is allocated only while all as large are held: at most one a layer,
  // plus the step's gradient (without the pools: one a layer and step, 20)
  if (r.bucketsAllocs == 0 || r.bucketsAllocs > kPoolLayers.size() + 1)
    return rank_fail(ctx, "step %d: %zu bucket buffers allocated", step, r.bucketsAllocs);
  // buckets: within the peak or the budget, plus the step's gradient
  size_t own = 0;
  for (size_t count : kPoolLayers) own += weftZeroPadded(count, ctx.nranks) / ctx.nranks * 4;
  if (r.gathered + r.gatheredIdle > r.gatheredPeak || (bound && r.gatheredPeak > bound) ||
      r.buckets + r.bucketsIdle > std::max(r.bucketsPeak, kPoolBucketBytes) + own)
    return rank_fail(ctx, "step %d: %zu held + %zu idle, peak %zu, bound %zu; buckets %zu + %zu, "
                     "peak %zu", step, r.gathered, r.gatheredIdle, r.gatheredPeak, bound,
                     r.buckets, r.bucketsIdle, r.bucketsPeak);
  return 0;
}

// Four steps of forward (gather, read, release but the last layer) and
// backward (gather, read, gradient, release, reduce) on stream s; the
// parameters after them into out.
int pool_train(const RankCtx &ctx, weftComm_t comm, int stage, const PoolCase &c, weftStream_t s,
               std::vector<float> *out) {
  weftZeroConfig_t cfg;
  weftZeroConfigDefaults(&cfg);
  cfg.stage = stage;
  cfg.prefetchLayers = c.prefetch;
  cfg.bucketBytes = kPoolBucketBytes;
  size_t f = sizeof(float);
  cfg.gatherBoundBytes = c.bound ? 2 * weftZeroPadded(1000, ctx.nranks) * f : 0;
  weftZero_t z;
  if (weftZeroCreate(&z, comm, &cfg) != weftSuccess) return rank_fail(ctx, "create");
  Rng rng(test_seed() + 5);
  const int L = (int)kPoolLayers.size();
  for (int l = 0; l < L; l++) {
    std::vector<float> init(kPoolLayers[l]);
    for (float &v : init) v = (float)(rng.uniform() - 0.5);
    int id;
    if (weftZeroAddParam(z, l, init.size(), init.data(), &id) != weftSuccess)
      return rank_fail(ctx, "add: %s", weftZeroLastError());
  }
  if (weftZeroFinalize(z) != weftSuccess) return rank_fail(ctx, "finalize");
  out->resize(1000 + 1000 + 301 + 300 + 57);
  size_t allocs = 0;
  for (int step = 0; step < 4; step++) {
    std::vector<const float *> at(L);
    weftZeroGetParams(z, out->data(), s);
    for (int l = 0, off = 0; l < L; off += (int)kPoolLayers[l++]) at[l] = out->data() + off;
    for (int l = 0; l < L; l++) {
      TRY_RC(pool_read(ctx, z, stage, l, at[l], s, l < L - 1));
      if (l < L - 1) TRY_RC(pool_release(ctx, z, l, c, s));
    }
    for (int l = L - 1; l >= 0; l--) {
      TRY_RC(pool_read(ctx, z, stage, l, at[l], s, true));
      std::vector<float> g(kPoolLayers[l]);
      for (size_t i = 0; i < g.size(); i++) g[i] = pool_grad(at[l][i], i, ctx.rank, step);
      void *gp;
      if (weftZeroGrad(z, l, &gp) != weftSuccess) return rank_fail(ctx, "grad");
      weftZeroAccumulate(gp, weftFloat32, g.data(), g.size());
      TRY_RC(pool_release(ctx, z, l, c, s));
      if (weftZeroGradReady(z, l, s) != weftSuccess) return rank_fail(ctx, "ready");
    }
    if (weftZeroStep(z, s, nullptr) != weftSuccess)
      return rank_fail(ctx, "step: %s", weftZeroLastError());
    if (stage == 3) TRY_RC(pool_check(ctx, z, cfg.gatherBoundBytes, step, &allocs));
  }
  weftZeroGetParams(z, out->data(), s);
  if (weftZeroDestroy(z) != weftSuccess) return rank_fail(ctx, "destroy");
  return 0;
}

// Every gathered layer equals the parameters though each buffer was
// poisoned before it went back; the parameters after four steps equal stage
// 1's bit for bit (the same reductions and updates, parameters kept
// whole); after the first step no gather allocates.
TEST(ZeroGatherPool, ReusesBuffersAcrossSteps) {
  std::vector<PoolCase> cases;
  for (int prefetch : {0, 1, 2})
    for (bool bound : {false, true})
      for (bool ordered : {true, false}) cases.push_back({prefetch, bound, ordered});
  for (int n : {1, 2, 3}) {
    auto status = run_ranks(n, [&cases](const RankCtx &ctx) {
      weftComm_t comm;
      TRY_RC(init(ctx, &comm));
      weftStream_t s;
      weftStreamCreate(&s);
      std::vector<float> ref, got;
      TRY_RC(pool_train(ctx, comm, 1, cases[0], s, &ref));
      for (const PoolCase &c : cases) {
        TRY_RC(pool_train(ctx, comm, 3, c, s, &got));
        if (memcmp(got.data(), ref.data(), ref.size() * sizeof(float)) != 0)
          return rank_fail(ctx, "prefetch %d bound %d ordered %d: stage 3 differs from stage 1",
                           c.prefetch, c.bound, c.ordered);
      }
      weftStreamDestroy(s);
      weftCommDestroy(comm);
      return 0;
    });
    for (size_t r = 0; r < status.size(); r++) EXPECT_EQ(status[r], 0) << n << " ranks, rank " << r;
  }
}

// A stage 3 context of kPoolLayers (prefetch 0), for the pool's unit tests.
int pool_ctx(const RankCtx &ctx, weftComm_t comm, size_t bound, weftZero_t *z,
             std::vector<std::vector<float>> *values) {
  weftZeroConfig_t cfg;
  weftZeroConfigDefaults(&cfg);
  cfg.stage = 3;
  cfg.prefetchLayers = 0;
  cfg.gatherBoundBytes = bound;
  if (weftZeroCreate(z, comm, &cfg) != weftSuccess) return rank_fail(ctx, "create");
  values->clear();
  for (size_t l = 0; l < kPoolLayers.size(); l++) {
    values->emplace_back(kPoolLayers[l]);
    for (size_t i = 0; i < kPoolLayers[l]; i++) (*values)[l][i] = (float)(l * 10000 + i);
    int id;
    if (weftZeroAddParam(*z, (int)l, kPoolLayers[l], (*values)[l].data(), &id) != weftSuccess)
      return rank_fail(ctx, "add: %s", weftZeroLastError());
  }
  return weftZeroFinalize(*z) == weftSuccess ? 0 : rank_fail(ctx, "finalize");
}

// weftZeroReleaseOn orders the gather that next takes the buffer after the
// work queued on the release's stream. Rank 0 queues a read of layer 1 on a
// stream of its own (an all-reduce on a second communicator, which cannot
// run before rank 1 joins it 300 ms later), releases the layer on that
// stream, and gathers layer 3, of the same size, at once: into layer 1's
// buffer. The read must still see layer 1.
int release_on_rank(const RankCtx &ctx) {
  weftComm_t comm, comm2;
  TRY_RC(init(ctx, &comm));
  FAIL_IF(weftCommSplit(comm, 0, ctx.rank, &comm2, nullptr) != weftSuccess, "split");
  weftZero_t z;
  std::vector<std::vector<float>> v;
  TRY_RC(pool_ctx(ctx, comm, 0, &z, &v));
  weftStream_t gs, cs;
  weftStreamCreate(&gs);
  weftStreamCreate(&cs);
  weftEvent_t ev;
  void *p1, *p3;
  FAIL_IF(weftZeroGather(z, 1, gs, &ev) != weftSuccess || weftEventSynchronize(ev) != weftSuccess ||
              weftZeroParam(z, 1, &p1) != weftSuccess,
          "gather 1: %s", weftZeroLastError());
  size_t n = kPoolLayers[1];
  std::vector<float> sum(n, -1.0f);
  if (ctx.rank == 0)
    FAIL_IF(weftAllReduce(p1, sum.data(), n, weftFloat32, weftSum, comm2, cs) != weftSuccess,
            "read");
  FAIL_IF(weftZeroReleaseOn(z, 1, cs) != weftSuccess, "release: %s", weftZeroLastError());
  FAIL_IF(weftZeroGather(z, 3, gs, &ev) != weftSuccess, "gather 3: %s", weftZeroLastError());
  if (ctx.rank == 1) {
    usleep(300000);
    FAIL_IF(weftAllReduce(v[1].data(), sum.data(), n, weftFloat32, weftSum, comm2, cs) !=
                weftSuccess,
            "read");
  }
  FAIL_IF(weftStreamSynchronize(cs) != weftSuccess || weftEventSynchronize(ev) != weftSuccess,
          "sync");
  FAIL_IF(weftZeroParam(z, 3, &p3) != weftSuccess || p3 != p1, "layer 3 not in layer 1's buffer");
  FAIL_IF(memcmp(p3, v[3].data(), n * sizeof(float)) != 0, "layer 3 gathered wrong values");
  for (size_t i = 0; i < n; i++)
    FAIL_IF(sum[i] != 2 * v[1][i], "element %zu read %g, want %g: the gather overwrote the "
            "layer before the work on the release's stream read it", i, sum[i], 2 * v[1][i]);
  weftZeroDestroy(z);
  weftStreamDestroy(gs);
  weftStreamDestroy(cs);
  weftCommDestroy(comm2);
  weftCommDestroy(comm);
  return 0;
}

TEST(ZeroGatherPool, ReleaseOnOrdersTheNextGather) {
  auto status = run_ranks(2, release_on_rank);
  for (size_t r = 0; r < status.size(); r++) EXPECT_EQ(status[r], 0) << "rank " << r;
}

// Under a bound with layers of several sizes: a gather takes the smallest
// idle buffer that holds it, one that would need more than the bound is
// refused with the numbers, and weftZeroReleaseOn's bad arguments.
int pool_bound_rank(const RankCtx &ctx) {
  weftComm_t comm;
  TRY_RC(init(ctx, &comm));
  size_t f = sizeof(float), big = weftZeroPadded(1000, ctx.nranks) * f;
  size_t small = weftZeroPadded(57, ctx.nranks) * f;
  weftZero_t z;
  std::vector<std::vector<float>> v;
  TRY_RC(pool_ctx(ctx, comm, big + small, &z, &v));
  weftEvent_t ev;
  FAIL_IF(weftZeroGather(z, 1, nullptr, &ev) != weftSuccess, "gather 1");
  FAIL_IF(weftZeroGather(z, 2, nullptr, &ev) != weftSuccess, "gather 2");
  weftResult_t res = weftZeroGather(z, 0, nullptr, &ev);
  char want[160];
  snprintf(want, sizeof want, "would hold %zu bytes of gathered layers, over the bound of %zu",
           big + small + weftZeroPadded(301, ctx.nranks) * f, big + small);
  FAIL_IF(res != weftInvalidUsage || strstr(weftZeroLastError(), want) == nullptr,
          "over the bound: %d, %s", res, weftZeroLastError());
  FAIL_IF(weftZeroReleaseOn(z, 1, nullptr) != weftSuccess, "release 1");
  FAIL_IF(weftZeroGather(z, 0, nullptr, &ev) != weftSuccess, "gather 0 into 1's buffer: %s",
          weftZeroLastError());
  void *p;
  FAIL_IF(weftZeroParam(z, 0, &p) != weftSuccess ||
              memcmp(p, v[0].data(), v[0].size() * f) != 0,
          "layer 0 in a larger buffer");
  weftZeroMemory_t r;
  weftZeroMemoryReport(z, &r);
  FAIL_IF(r.gathered != big + small || r.gatheredIdle != 0 || r.gatheredAllocs != 2,
          "held %zu, idle %zu, %zu allocated", r.gathered, r.gatheredIdle, r.gatheredAllocs);
  // bad arguments; a layer not gathered, or twice released, is nothing
  FAIL_IF(weftZeroReleaseOn(nullptr, 0, nullptr) != weftInvalidArgument, "NULL context");
  for (int bad : {-1, (int)kPoolLayers.size()})
    FAIL_IF(weftZeroReleaseOn(z, bad, nullptr) != weftInvalidArgument ||
                strstr(weftZeroLastError(), "does not exist") == nullptr,
            "layer %d: %s", bad, weftZeroLastError());
  FAIL_IF(weftZeroReleaseOn(z, 4, nullptr) != weftSuccess, "a layer not gathered");
  // not a stream: refused, the layer still held
  weftResult_t bad = weftZeroReleaseOn(z, 2, (weftStream_t)&r);
  FAIL_IF(bad != weftInvalidArgument || strstr(weftZeroLastError(), "not a weft host stream") ==
                                            nullptr,
          "a bad stream: %d, %s", bad, weftZeroLastError());
  weftZeroMemoryReport(z, &r);
  FAIL_IF(r.gathered != big + small || weftZeroParam(z, 2, &p) != weftSuccess,
          "a refused release gave the layer back");
  FAIL_IF(weftZeroReleaseOn(z, 0, nullptr) != weftSuccess ||
              weftZeroReleaseOn(z, 0, nullptr) != weftSuccess,
          "released twice");
  weftZeroMemoryReport(z, &r);
  FAIL_IF(r.gathered != small || r.gatheredIdle != big, "held %zu, idle %zu", r.gathered,
          r.gatheredIdle);
  FAIL_IF(weftZeroDestroy(z) != weftSuccess, "destroy: %s", weftZeroLastError());
  weftCommDestroy(comm);
  return 0;
}

TEST(ZeroGatherPool, BoundAndBadArguments) {
  for (int n : {1, 2, 3}) {
    auto status = run_ranks(n, pool_bound_rank);
    for (size_t r = 0; r < status.size(); r++) EXPECT_EQ(status[r], 0) << n << " ranks, rank " << r;
  }
}

#if WEFT_HAVE_CUDA
// weft-train's kernels (tools/train/train_kernels.cu), where the build has them: a
// launch returns its own status and leaves an error the caller has pending
// in place. In a rank of its own: this process forks ranks, which could not
// use CUDA after the parent had.
extern "C" int train_kern_to_float(const void *, int, float *, size_t, void *)
    __attribute__((weak));
TEST(TrainKernels, LaunchLeavesTheCallersPendingError) {
  const int kNoGpu = 77;
  auto status = run_ranks(1, [&](const RankCtx &ctx) {
    int n = 0;
    if (train_kern_to_float == nullptr || cudaGetDeviceCount(&n) != cudaSuccess || n == 0)
      return kNoGpu;
    std::vector<float> h(1001), back(h.size());
    for (size_t i = 0; i < h.size(); i++) h[i] = 0.5f * (float)i - 7.0f;
    float *src = nullptr, *dst = nullptr;
    FAIL_IF(cudaMalloc((void **)&src, 4 * h.size()) != cudaSuccess ||
                cudaMalloc((void **)&dst, 4 * h.size()) != cudaSuccess ||
                cudaMemcpy(src, h.data(), 4 * h.size(), cudaMemcpyDefault) != cudaSuccess,
            "device buffers");
    FAIL_IF(cudaSetDevice(n + 5) != cudaErrorInvalidDevice, "no error to leave pending");
    FAIL_IF(train_kern_to_float(src, 0, dst, h.size(), nullptr) != 0, "the launch failed");
    FAIL_IF(cudaGetLastError() != cudaErrorInvalidDevice, "the pending error was cleared");
    FAIL_IF(cudaMemcpy(back.data(), dst, 4 * h.size(), cudaMemcpyDefault) != cudaSuccess ||
                back != h,
            "the kernel did not copy");
    cudaFree(src), cudaFree(dst);
    return 0;
  });
  if (status[0] == kNoGpu) GTEST_SKIP() << "no CUDA device, or no kernels in this build";
  EXPECT_EQ(status[0], 0);
}
#endif

}  // namespace
