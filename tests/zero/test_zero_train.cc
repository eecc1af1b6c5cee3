// ZeRO end to end on real ranks: the trainer's MLP under every stage, rank
// count, optimizer and dtype; checkpoints across rank counts and stages; a
// rank dying during a save.
#include <gtest/gtest.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <vector>

#include "harness.h"
#include "train_model.h"

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
};

std::string case_name(const testing::TestParamInfo<StageCase> &info) {
  const StageCase &c = info.param;
  auto t = [](weftDataType_t d) {
    return d == weftFloat32 ? "fp32" : d == weftBfloat16 ? "bf16" : "fp16";
  };
  return std::to_string(c.nranks) + "ranks_" + (c.optimizer == weftZeroAdamW ? "adamw" : "sgd") +
         "_" + t(c.dtype) + "_reduce_" + t(c.reduce) + "_accum" + std::to_string(c.accum);
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
    if (c.reduce != weftFloat32) {
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
  crash.env = {{"WEFT_ZERO_SAVE_CRASH_RANK", "1"}, {"WEFT_TIMEOUT", "5"}};
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

}  // namespace
