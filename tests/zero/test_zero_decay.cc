// Per-parameter weight decay (weftZeroSetParamWeightDecay): stages 0-3 on 1,
// 2 and 3 ranks, AdamW and SGD with momentum, parameters of odd sizes that
// straddle ranks with some exempt (decay 0) and one of its own decay, over
// several steps, against a double-precision loop written here; the runs of
// one decay each rank's owned range is cut into, against the same cut made
// here element by element; the offloaded optimizer's threads (staged host
// memory through the device path, zero_ops_host_staged) bit for bit with a
// host context; a model without per-parameter decays in one run, bit for
// bit the same as one whose decays are all set to the configuration's; and
// the refusals.
#include <gtest/gtest.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#include <string>
#include <vector>

#include "harness.h"
#include "weft_zero.h"
#include "zero_ranks.h"
extern "C" {
#include "zero/zero_internal.h"  // the runs; zero_ops_host_staged for the offload path
}

using namespace weft_test;

namespace {

// fp32 reductions against a double loop: 1e-6 of the largest parameter
// (docs/zero.md, "Tolerances").
constexpr double kTol = 1e-6;
constexpr int kSteps = 5;
constexpr double kDecay = 0.1; // the configuration's

// A parameter: its layer, size and decay (< 0: the configuration's, not set).
struct Param {
  int layer;
  size_t count;
  double decay;
};

// Layer 0 is 7 + 5 with only the 5 exempt; layer 1 one parameter of 13;
// layer 2 is 3 + 11 + 2, the 11 exempt and the 2 of a decay of its own;
// layer 3 a single exempt element (on 2-3 ranks, padding beside it).
const std::vector<Param> kModel = {{0, 7, -1},  {0, 5, 0},   {1, 13, -1}, {2, 3, -1},
                                   {2, 11, 0},  {2, 2, 0.3}, {3, 1, 0}};

double decay_of(const Param &p) { return p.decay < 0 ? kDecay : p.decay; }

struct Case {
  int stage;
  weftZeroOptimizer_t opt;
};

weftZeroConfig_t config(const Case &c) {
  weftZeroConfig_t cfg;
  weftZeroConfigDefaults(&cfg);
  cfg.stage = c.stage;
  cfg.optimizer = c.opt;
  cfg.lr = c.opt == weftZeroAdamW ? 1e-2 : 5e-2;
  cfg.weightDecay = kDecay;
  cfg.bucketBytes = 64; // stage 0: several buckets
  return cfg;
}

float init_value(size_t i) { return (float)(0.5 * cos(0.11 * (double)i)); }
// Rank r's gradient of element i (registration order) at step s.
float grad_value(int r, int s, size_t i) {
  return (float)(0.5 * sin(0.37 * (double)i + 1.3 * s + 0.7 * r));
}

size_t psi_of(const std::vector<Param> &model) {
  size_t n = 0;
  for (const Param &p : model) n += p.count;
  return n;
}

// The parameters after `steps` steps on nranks ranks, in double.
std::vector<double> reference(const std::vector<Param> &model, const weftZeroConfig_t &cfg,
                              int nranks, int steps) {
  const size_t n = psi_of(model);
  std::vector<double> p(n), m(n, 0), v(n, 0), wd(n);
  size_t at = 0;
  for (const Param &q : model)
    for (size_t k = 0; k < q.count; k++, at++) wd[at] = decay_of(q);
  for (size_t i = 0; i < n; i++) p[i] = init_value(i);
  for (int s = 0; s < steps; s++) {
    const int t = s + 1;
    for (size_t i = 0; i < n; i++) {
      double g = 0;
      for (int r = 0; r < nranks; r++) g += grad_value(r, s, i);
      g /= nranks;
      if (cfg.optimizer == weftZeroAdamW) {
        m[i] = cfg.beta1 * m[i] + (1 - cfg.beta1) * g;
        v[i] = cfg.beta2 * v[i] + (1 - cfg.beta2) * g * g;
        const double denom = sqrt(v[i]) / sqrt(1 - pow(cfg.beta2, t)) + cfg.eps;
        p[i] -= cfg.lr / (1 - pow(cfg.beta1, t)) * m[i] / denom + cfg.lr * wd[i] * p[i];
      } else {
        m[i] = cfg.momentum * m[i] + g + wd[i] * p[i];
        p[i] -= cfg.lr * m[i];
      }
    }
  }
  return p;
}

// Hooks a created context onto the offload path on the host: staged host
// memory through the device branches, the optimizer "offloaded" to plain
// host memory on `threads` threads (as test_zero_device_ctx.cc does).
void offload_on_host(weftZero_t z, int threads) {
  z->ops = &zero_ops_host_staged;
  z->cfg.offloadOptimizer = 1;
  z->cfg.offloadThreads = threads;
  z->offload_ops = &zero_ops_host;
}

// Makes a context of model (set_all: every decay set, the configuration's
// where the model has none; offload_threads > 0: the offload path), trains
// it `steps` steps and reads its parameters.
int run_model(const RankCtx &ctx, weftComm_t comm, const weftZeroConfig_t &cfg,
              const std::vector<Param> &model, int steps, std::vector<float> *out,
              weftZero_t *keep = nullptr, bool set_all = false, int offload_threads = 0) {
  weftZero_t z;
  FAIL_IF(weftZeroCreate(&z, comm, &cfg) != weftSuccess, "create: %s", weftZeroLastError());
  if (offload_threads > 0) offload_on_host(z, offload_threads);
  size_t at = 0;
  for (size_t k = 0; k < model.size(); k++) {
    const Param &q = model[k];
    std::vector<float> init(q.count);
    for (size_t i = 0; i < q.count; i++) init[i] = init_value(at + i);
    at += q.count;
    int id;
    FAIL_IF(weftZeroAddParam(z, q.layer, q.count, init.data(), &id) != weftSuccess, "add: %s",
            weftZeroLastError());
    if (q.decay >= 0 || set_all)
      FAIL_IF(weftZeroSetParamWeightDecay(z, id, decay_of(q)) != weftSuccess, "decay: %s",
              weftZeroLastError());
  }
  FAIL_IF(weftZeroFinalize(z) != weftSuccess, "finalize: %s", weftZeroLastError());
  for (int s = 0; s < steps; s++) {
    size_t first = 0;
    for (size_t k = 0; k < model.size(); k++) {
      void *g;
      FAIL_IF(weftZeroGrad(z, (int)k, &g) != weftSuccess, "grad: %s", weftZeroLastError());
      std::vector<float> grad(model[k].count);
      for (size_t i = 0; i < grad.size(); i++) grad[i] = grad_value(ctx.rank, s, first + i);
      first += grad.size();
      FAIL_IF(weftZeroAccumulate(g, weftFloat32, grad.data(), grad.size()) != weftSuccess,
              "accumulate");
      if (k + 1 == model.size() || model[k + 1].layer != model[k].layer)
        FAIL_IF(weftZeroGradReady(z, model[k].layer, nullptr) != weftSuccess, "ready: %s",
                weftZeroLastError());
    }
    FAIL_IF(weftZeroStep(z, nullptr, nullptr) != weftSuccess, "step %d: %s", s,
            weftZeroLastError());
  }
  out->assign(psi_of(model), NAN);
  FAIL_IF(weftZeroGetParams(z, out->data(), nullptr) != weftSuccess, "get: %s",
          weftZeroLastError());
  if (keep != nullptr) *keep = z;
  else weftZeroDestroy(z);
  return 0;
}

// The largest difference from the reference relative to its largest
// magnitude (infinite for a NaN).
double rel_diff(const std::vector<float> &got, const std::vector<double> &ref) {
  double diff = 0, mag = 0;
  for (size_t i = 0; i < ref.size(); i++) {
    if (!isfinite(got[i])) return INFINITY;
    diff = fmax(diff, fabs(got[i] - ref[i]));
    mag = fmax(mag, fabs(ref[i]));
  }
  return diff / mag;
}

// The runs this rank's owned range should be cut into: every owned
// element's decay (padding: the configuration's), equal neighbours merged.
std::vector<zero_decay_run> expected_runs(const std::vector<Param> &model, int stage, int nranks,
                                          int rank) {
  std::vector<zero_decay_run> runs;
  size_t master = 0;
  for (int layer = 0; layer <= model.back().layer; layer++) {
    std::vector<double> wd; // per element of the layer
    for (const Param &q : model)
      if (q.layer == layer) wd.insert(wd.end(), q.count, decay_of(q));
    const size_t count = wd.size(), padded = weftZeroPadded(count, nranks);
    const size_t shard = padded / (size_t)nranks;
    const size_t own = stage == 0 ? 0 : (size_t)rank * shard, n = stage == 0 ? padded : shard;
    for (size_t e = own; e < own + n; e++, master++) {
      const double d = e < count ? wd[e] : kDecay;
      if (!runs.empty() && runs.back().weight_decay == d) runs.back().count++;
      else runs.push_back({master, 1, d});
    }
  }
  return runs;
}

int check_runs(const RankCtx &ctx, weftZero_t z, const std::vector<Param> &model, int stage) {
  const std::vector<zero_decay_run> want = expected_runs(model, stage, ctx.nranks, ctx.rank);
  FAIL_IF(z->ndecay_runs != want.size(), "stage %d: %zu runs, want %zu", stage, z->ndecay_runs,
          want.size());
  for (size_t r = 0; r < want.size(); r++) {
    const zero_decay_run &a = z->decay_runs[r], &b = want[r];
    FAIL_IF(a.begin != b.begin || a.count != b.count || a.weight_decay != b.weight_decay,
            "stage %d run %zu: [%zu, +%zu) decay %g, want [%zu, +%zu) decay %g", stage, r,
            a.begin, a.count, a.weight_decay, b.begin, b.count, b.weight_decay);
  }
  return 0;
}

// Every stage and optimizer on 1, 2 and 3 ranks against the reference; the
// runs as cut here; the decays matter (a model decayed alike throughout
// ends elsewhere).
TEST(ZeroDecay, PerParameterDecayMatchesTheReference) {
  for (int n : {1, 2, 3}) {
    auto status = run_ranks(n, [](const RankCtx &ctx) {
      weftComm_t comm;
      TRY_RC(init(ctx, &comm));
      for (int stage = 0; stage <= 3; stage++)
        for (weftZeroOptimizer_t opt : {weftZeroAdamW, weftZeroSgdMomentum}) {
          const Case c{stage, opt};
          const weftZeroConfig_t cfg = config(c);
          std::vector<float> got;
          weftZero_t z;
          TRY_RC(run_model(ctx, comm, cfg, kModel, kSteps, &got, &z));
          TRY_RC(check_runs(ctx, z, kModel, stage));
          weftZeroDestroy(z);
          const std::vector<double> ref = reference(kModel, cfg, ctx.nranks, kSteps);
          const double diff = rel_diff(got, ref);
          FAIL_IF(!(diff <= kTol), "stage %d %s: %g from the reference", stage,
                  opt == weftZeroAdamW ? "adamw" : "sgd", diff);
          // the exemptions change the result by far more than the tolerance
          std::vector<Param> alike = kModel;
          for (Param &q : alike) q.decay = -1;
          const double apart = rel_diff(got, reference(alike, cfg, ctx.nranks, kSteps));
          FAIL_IF(!(apart > 100 * kTol), "stage %d: exempting parameters changed little (%g)",
                  stage, apart);
          if (ctx.rank == 0 && ctx.nranks == 3 && stage == 1)
            printf("%s: %g from the reference, %g from decaying everything\n",
                   opt == weftZeroAdamW ? "adamw" : "sgd", diff, apart);
        }
      weftCommDestroy(comm);
      return 0;
    });
    for (int r = 0; r < n; r++) EXPECT_EQ(status[r], 0) << n << " ranks, rank " << r;
  }
}

// Without per-parameter decays a model is one run; with every decay set to
// the configuration's it is one run too, and its parameters are the same
// bit for bit.
TEST(ZeroDecay, WithoutOverridesOneRun) {
  auto status = run_ranks(2, [](const RankCtx &ctx) {
    weftComm_t comm;
    TRY_RC(init(ctx, &comm));
    std::vector<Param> plain = kModel;
    for (Param &q : plain) q.decay = -1;
    for (int stage = 0; stage <= 3; stage++)
      for (weftZeroOptimizer_t opt : {weftZeroAdamW, weftZeroSgdMomentum}) {
        const weftZeroConfig_t cfg = config({stage, opt});
        std::vector<float> a, b;
        weftZero_t za, zb;
        TRY_RC(run_model(ctx, comm, cfg, plain, 3, &a, &za));
        TRY_RC(run_model(ctx, comm, cfg, plain, 3, &b, &zb, true));
        FAIL_IF(za->ndecay_runs != 1 || zb->ndecay_runs != 1 ||
                    za->decay_runs[0].count != za->own_total,
                "stage %d: %zu and %zu runs", stage, za->ndecay_runs, zb->ndecay_runs);
        FAIL_IF(memcmp(a.data(), b.data(), a.size() * sizeof(float)) != 0,
                "stage %d: setting every decay to the configuration's changed the result", stage);
        weftZeroDestroy(za);
        weftZeroDestroy(zb);
      }
    weftCommDestroy(comm);
    return 0;
  });
  for (int r = 0; r < 2; r++) EXPECT_EQ(status[r], 0) << "rank " << r;
}

// The offloaded update on 3 host threads (parts of 64K elements at least:
// a model of about 235K owned elements at stage 0 on one rank, 118K at
// stage 2 on two), each walking the runs that meet its part: bit for bit a
// host context's, and within the reference's tolerance.
TEST(ZeroDecay, OffloadThreadsWalkTheRuns) {
  const std::vector<Param> big = {{0, 70001, -1}, {0, 3, 0},   {0, 65537, 0},  {0, 5, 0.2},
                                  {1, 1, 0},      {1, 99999, -1}, {1, 17, 0}};
  for (int n : {1, 2}) {
    auto status = run_ranks(n, [&big](const RankCtx &ctx) {
      weftComm_t comm;
      TRY_RC(init(ctx, &comm));
      const int stage = ctx.nranks == 1 ? 0 : 2;
      for (weftZeroOptimizer_t opt : {weftZeroAdamW, weftZeroSgdMomentum}) {
        const weftZeroConfig_t cfg = config({stage, opt});
        std::vector<float> host, off;
        weftZero_t z;
        TRY_RC(run_model(ctx, comm, cfg, big, 3, &host));
        TRY_RC(run_model(ctx, comm, cfg, big, 3, &off, &z, false, 3));
        // offload_run's parts are 64K elements at least: two threads or more
        FAIL_IF(z->own_total < 64 * 1024, "%zu owned elements: one thread", z->own_total);
        TRY_RC(check_runs(ctx, z, big, stage));
        weftZeroDestroy(z);
        FAIL_IF(memcmp(host.data(), off.data(), host.size() * sizeof(float)) != 0,
                "stage %d: the offloaded update differs from the host's", stage);
        const double diff = rel_diff(off, reference(big, cfg, ctx.nranks, 3));
        FAIL_IF(!(diff <= kTol), "stage %d offloaded: %g from the reference", stage, diff);
      }
      weftCommDestroy(comm);
      return 0;
    });
    for (int r = 0; r < n; r++) EXPECT_EQ(status[r], 0) << n << " ranks, rank " << r;
  }
}

// Refused: a context that is NULL, a parameter that does not exist, a decay
// that is negative or not finite (weftInvalidArgument), a call after
// weftZeroFinalize (weftInvalidUsage); nothing refused changes the decay.
TEST(ZeroDecay, RefusalsLeaveTheDecayAlone) {
  auto status = run_ranks(1, [](const RankCtx &ctx) {
    weftComm_t comm;
    TRY_RC(init(ctx, &comm));
    weftZeroConfig_t cfg = config({1, weftZeroAdamW});
    weftZero_t z;
    FAIL_IF(weftZeroCreate(&z, comm, &cfg) != weftSuccess, "create");
    FAIL_IF(weftZeroSetParamWeightDecay(z, 0, 0.0) != weftInvalidArgument, "no parameter yet");
    const float vals[3] = {1, 2, 3};
    int id;
    FAIL_IF(weftZeroAddParam(z, 0, 3, vals, &id) != weftSuccess, "add");
    FAIL_IF(weftZeroSetParamWeightDecay(nullptr, id, 0.0) != weftInvalidArgument, "NULL");
    FAIL_IF(weftZeroSetParamWeightDecay(z, -1, 0.0) != weftInvalidArgument, "id -1");
    FAIL_IF(weftZeroSetParamWeightDecay(z, id + 1, 0.0) != weftInvalidArgument, "id + 1");
    for (double bad : {-0.01, -(double)INFINITY, (double)INFINITY, (double)NAN}) {
      FAIL_IF(weftZeroSetParamWeightDecay(z, id, bad) != weftInvalidArgument, "decay %g", bad);
      FAIL_IF(strstr(weftZeroLastError(), "must be finite and >= 0") == nullptr, "%s",
              weftZeroLastError());
    }
    FAIL_IF(z->params[id].weight_decay != kDecay, "a refused decay was kept");
    FAIL_IF(weftZeroSetParamWeightDecay(z, id, 0.0) != weftSuccess, "decay 0: %s",
            weftZeroLastError());
    FAIL_IF(weftZeroFinalize(z) != weftSuccess, "finalize: %s", weftZeroLastError());
    FAIL_IF(weftZeroSetParamWeightDecay(z, id, 0.5) != weftInvalidUsage, "after finalize");
    FAIL_IF(strstr(weftZeroLastError(), "before weftZeroFinalize") == nullptr, "%s",
            weftZeroLastError());
    FAIL_IF(z->params[id].weight_decay != 0.0 || z->ndecay_runs != 1 ||
                z->decay_runs[0].weight_decay != 0.0,
            "the decay changed after finalize");
    weftZeroDestroy(z);
    weftCommDestroy(comm);
    return 0;
  });
  EXPECT_EQ(status[0], 0);
}

// Ranks whose decays differ (rank 1 exempts a parameter the others decay)
// are refused at weftZeroFinalize on every rank, naming the decays.
TEST(ZeroDecay, RanksThatDifferAreRefused) {
  for (int n : {2, 3}) {
    auto status = run_ranks(n, [](const RankCtx &ctx) {
      weftComm_t comm;
      TRY_RC(init(ctx, &comm));
      for (int stage = 0; stage <= 3; stage++) {
        weftZeroConfig_t cfg = config({stage, weftZeroAdamW});
        weftZero_t z;
        FAIL_IF(weftZeroCreate(&z, comm, &cfg) != weftSuccess, "create");
        const float vals[5] = {1, 2, 3, 4, 5};
        int a, b;
        FAIL_IF(weftZeroAddParam(z, 0, 3, vals, &a) != weftSuccess ||
                    weftZeroAddParam(z, 0, 2, vals + 3, &b) != weftSuccess,
                "add");
        if (ctx.rank == 1) FAIL_IF(weftZeroSetParamWeightDecay(z, b, 0.0) != weftSuccess, "set");
        const weftResult_t res = weftZeroFinalize(z);
        FAIL_IF(res != weftInvalidUsage ||
                    strstr(weftZeroLastError(), "parameters' weight decays") == nullptr,
                "stage %d: %s: %s", stage, weftGetErrorString(res), weftZeroLastError());
        if (ctx.rank == 0 && stage == 0) printf("refused: %s\n", weftZeroLastError());
        weftZeroDestroy(z);
      }
      weftCommDestroy(comm);
      return 0;
    });
    for (int r = 0; r < n; r++) EXPECT_EQ(status[r], 0) << n << " ranks, rank " << r;
  }
}

}  // namespace
