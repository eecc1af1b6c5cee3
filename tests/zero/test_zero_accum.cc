// The ZeRO context with streams and gradient accumulation on real ranks: the
// step waits for reductions queued on another stream, collectives wait for
// gathers queued on another stream, and accumulation over
// micro-steps with and without reduceEveryMicroStep.
#include <gtest/gtest.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <string>
#include <vector>

#include "harness.h"
#include "weft_zero.h"
#include "zero_ranks.h"

using namespace weft_test;

namespace {

// Gradients marked ready on a host stream, the step on the NULL stream or
// on another host stream: the step waits for the reductions queued on the
// first (it read half-reduced gradients at stage 2, or its statistics'
// all-reduce passed them on the communicator: "ranks disagree"). SGD, lr 1,
// no momentum, a gradient of 1 everywhere: every parameter goes from its
// value to value - 1.
TEST(ZeroStreams, StepWaitsForReductionsOnAnotherStream) {
  for (int stage = 0; stage <= 3; stage++) {
    for (bool step_on_stream : {false, true}) {
      SCOPED_TRACE("stage " + std::to_string(stage) + (step_on_stream ? ", step on a stream" : ""));
      auto status = run_ranks(2, [stage, step_on_stream](const RankCtx &ctx) {
        weftComm_t comm;
        if (int rc = init(ctx, &comm)) return rc;
        weftZeroConfig_t cfg;
        weftZeroConfigDefaults(&cfg);
        cfg.stage = stage;
        cfg.optimizer = weftZeroSgdMomentum;
        cfg.momentum = 0;
        cfg.lr = 1;
        const size_t n = 1 << 21;
        weftZero_t z;
        std::vector<float> before;
        if (int rc = make_ctx(ctx, comm, cfg, {{n}, {n}}, &z, nullptr, &before)) return rc;
        weftStream_t s;
        if (weftStreamCreate(&s) != weftSuccess) return rank_fail(ctx, "stream");
        std::vector<float> ones(n, 1.0f);
        for (int l = 1; l >= 0; l--) {
          void *g;
          if (weftZeroGrad(z, l, &g) != weftSuccess ||
              weftZeroAccumulate(g, cfg.paramType, ones.data(), n) != weftSuccess ||
              weftZeroGradReady(z, l, s) != weftSuccess)
            return rank_fail(ctx, "layer %d: %s", l, weftZeroLastError());
        }
        weftStream_t step_stream = nullptr;
        if (step_on_stream && weftStreamCreate(&step_stream) != weftSuccess)
          return rank_fail(ctx, "stream");
        weftZeroStepInfo_t info;
        if (weftZeroStep(z, step_stream, &info) != weftSuccess)
          return rank_fail(ctx, "step: %s", weftZeroLastError());
        if (step_stream != nullptr) weftStreamDestroy(step_stream);
        std::vector<float> after(2 * n);
        if (weftZeroGetParams(z, after.data(), nullptr) != weftSuccess)
          return rank_fail(ctx, "get: %s", weftZeroLastError());
        size_t wrong = 0;
        for (size_t i = 0; i < after.size(); i++) wrong += after[i] != before[i] - 1.0f;
        if (wrong != 0 || fabs(info.gradNorm - sqrt(2.0 * n)) > 1e-3 * sqrt(2.0 * n))
          return rank_fail(ctx, "%zu of %zu parameters wrong, grad norm %g (want %g)", wrong,
                           after.size(), info.gradNorm, sqrt(2.0 * n));
        weftStreamSynchronize(s);
        weftStreamDestroy(s);
        weftZeroDestroy(z);
        weftCommDestroy(comm);
        return 0;
      });
      for (int st : status) EXPECT_EQ(st, 0);
    }
  }
}

// Collectives on another stream than the gathers still queued: a step on
// stream s leaves its parameter all-gathers (stages 1-2) in flight on s, and
// stage 3 prefetches on s; weftZeroGetParams, weftZeroSave and weftZeroLoad
// on the NULL stream, and the next step's reductions on stream s2, start
// their collectives after them on every rank (they did so before them on
// some ranks: "ranks disagree on a collective"). A stage 3 layer gathered
// before weftZeroGetParams stays gathered. SGD, lr 1, no momentum, a
// gradient of 1: each step takes 1 from every parameter.
TEST(ZeroStreams, CollectivesWaitForGathersOnAnotherStream) {
  for (int stage = 1; stage <= 3; stage++) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    char dir[] = "/tmp/weft_zero_xstream_XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    auto status = run_ranks(2, [stage, &dir](const RankCtx &ctx) {
      weftComm_t comm;
      if (int rc = init(ctx, &comm)) return rc;
      weftZeroConfig_t cfg;
      weftZeroConfigDefaults(&cfg);
      cfg.stage = stage;
      cfg.optimizer = weftZeroSgdMomentum;
      cfg.momentum = 0;
      cfg.lr = 1;
      const int L = 8;
      const size_t n = 1 << 20;
      weftZero_t z;
      std::vector<float> before;
      if (int rc = make_ctx(ctx, comm, cfg, std::vector<std::vector<size_t>>(L, {n}), &z,
                            nullptr, &before))
        return rc;
      weftStream_t s, s2;
      if (weftStreamCreate(&s) != weftSuccess || weftStreamCreate(&s2) != weftSuccess)
        return rank_fail(ctx, "stream");
      std::vector<float> ones(n, 1.0f), got(L * n);
      // backward from the last layer: stage 3 gathers on s (prefetching the
      // layer below), the reductions on ready
      auto step = [&](weftStream_t ready) {
        for (int l = L - 1; l >= 0; l--) {
          weftEvent_t ev;
          void *g;
          if (weftZeroGather(z, l, s, &ev) != weftSuccess ||
              (stage == 3 && weftEventSynchronize(ev) != weftSuccess) ||
              weftZeroGrad(z, l, &g) != weftSuccess ||
              weftZeroAccumulate(g, cfg.paramType, ones.data(), n) != weftSuccess ||
              weftZeroRelease(z, l) != weftSuccess || weftZeroGradReady(z, l, ready) != weftSuccess)
            return rank_fail(ctx, "layer %d: %s", l, weftZeroLastError());
        }
        if (weftZeroStep(z, ready, nullptr) != weftSuccess)
          return rank_fail(ctx, "step: %s", weftZeroLastError());
        return 0;
      };
      auto expect_steps = [&](float steps, const char *what) {
        if (weftZeroGetParams(z, got.data(), nullptr) != weftSuccess)
          return rank_fail(ctx, "%s: get params: %s", what, weftZeroLastError());
        for (size_t i = 0; i < got.size(); i++)
          if (got[i] != before[i] - steps)
            return rank_fail(ctx, "%s: parameter %zu is %g, want %g", what, i, got[i],
                             before[i] - steps);
        return 0;
      };
      if (int rc = step(s)) return rc;
      weftEvent_t ev;
      if (stage == 3 && weftZeroGather(z, 0, s, &ev) != weftSuccess)  // and prefetches layer 1
        return rank_fail(ctx, "gather: %s", weftZeroLastError());
      if (int rc = expect_steps(1, "after a step on s")) return rc;
      if (stage == 3) {
        void *p;
        if (weftEventSynchronize(ev) != weftSuccess || weftZeroParam(z, 0, &p) != weftSuccess ||
            *(float *)p != before[0] - 1)
          return rank_fail(ctx, "layer 0 after get params: %s", weftZeroLastError());
        if (weftZeroGather(z, 1, s, &ev) != weftSuccess)  // layer 2 prefetched
          return rank_fail(ctx, "gather: %s", weftZeroLastError());
      }
      if (weftZeroSave(z, dir, nullptr) != weftSuccess)
        return rank_fail(ctx, "save: %s", weftZeroLastError());
      for (int l = 0; l < L; l++) weftZeroRelease(z, l);
      if (int rc = step(s2)) return rc;  // after the gathers of s
      if (stage == 3 && weftZeroGather(z, 0, s2, &ev) != weftSuccess)
        return rank_fail(ctx, "gather: %s", weftZeroLastError());
      if (weftZeroLoad(z, dir, nullptr) != weftSuccess)
        return rank_fail(ctx, "load: %s", weftZeroLastError());
      if (int rc = expect_steps(1, "after the load")) return rc;
      weftStreamSynchronize(s);
      weftStreamSynchronize(s2);
      weftZeroDestroy(z);
      weftStreamDestroy(s);
      weftStreamDestroy(s2);
      weftCommDestroy(comm);
      return 0;
    });
    for (int st : status) EXPECT_EQ(st, 0);
    std::string rm = std::string("rm -rf ") + dir;
    EXPECT_EQ(system(rm.c_str()), 0);
  }
}

// Accumulation over 3 micro-steps at stages 2 and 3. With
// reduceEveryMicroStep each micro-step's gradients are reduce-scattered into
// the shard as each layer is marked ready, so a rank holds the buckets in
// flight (about bucketBytes) where the micro-steps before the last
// otherwise hold every layer's full gradient; the step applies exactly the
// sum over ranks and micro-steps either way (SGD, lr 1, no momentum, small
// integer gradients: every sum is exact in bf16 and fp16 too). A layer
// given no gradient in a micro-step, and one marked ready twice in a
// micro-step with none asked for between, add nothing. With two streams,
// micro-steps alternate between them (their reductions were started in
// different orders on different ranks: "ranks disagree").
struct AccumCase {
  int nranks, stage;
  weftDataType_t param, reduce;
  int streams = 1;
};

int accum_rank(const RankCtx &ctx, const AccumCase &c, int every) {
  weftComm_t comm;
  if (int rc = init(ctx, &comm)) return rc;
  const int L = 8, kMicro = 3, kSteps = 2;
  const size_t count = 1001; // padded on 2 and 3 ranks
  const size_t padded = (count + ctx.nranks - 1) / ctx.nranks * ctx.nranks;
  const size_t ps = weftTypeSize(c.param), rs = weftTypeSize(c.reduce);
  weftZeroConfig_t cfg;
  weftZeroConfigDefaults(&cfg);
  cfg.stage = c.stage;
  cfg.paramType = c.param;
  cfg.reduceType = c.reduce;
  cfg.optimizer = weftZeroSgdMomentum;
  cfg.momentum = 0;
  cfg.lr = 1;
  cfg.lossScale = 1; // fp16: the gradients as they are
  cfg.accumSteps = kMicro;
  cfg.bucketBytes = 2 * padded * ps;
  cfg.reduceEveryMicroStep = every;
  weftZero_t z;
  std::vector<int> ids;
  std::vector<float> want;
  if (int rc = make_ctx(ctx, comm, cfg, std::vector<std::vector<size_t>>(L, {count}), &z, &ids,
                        &want))
    return rc;
  weftStream_t ss[2];
  for (weftStream_t &x : ss)
    if (weftStreamCreate(&x) != weftSuccess) return rank_fail(ctx, "stream");
  const weftStream_t s = ss[0];
  std::vector<float> grad(count);
  for (int step = 0; step < kSteps; step++) {
    std::vector<double> sum(L * count, 0.0);
    for (int micro = 0; micro < kMicro; micro++) {
      weftZeroSetSync(z, micro == kMicro - 1);
      for (int l = L - 1; l >= 0; l--) {
        if (!(micro == 1 && l == 3)) { // layer 3 has no gradient in micro-step 1
          void *g;
          if (weftZeroGrad(z, ids[l], &g) != weftSuccess)
            return rank_fail(ctx, "grad: %s", weftZeroLastError());
          for (size_t i = 0; i < count; i++)
            grad[i] = (float)(ctx.rank + 1 + micro + step + (int)(i % 5) + l);
          weftZeroAccumulate(g, c.param, grad.data(), count);
        }
        for (int r = 0; r < ctx.nranks && !(micro == 1 && l == 3); r++)
          for (size_t i = 0; i < count; i++) sum[l * count + i] += r + 1 + micro + step + (int)(i % 5) + l;
        const weftStream_t on = ss[micro % c.streams];
        if (weftZeroGradReady(z, l, on) != weftSuccess ||
            (micro == 0 && l == 5 && weftZeroGradReady(z, l, on) != weftSuccess))
          return rank_fail(ctx, "ready: %s", weftZeroLastError());
      }
      if (step == 0 && micro == 1) {
        weftZeroMemory_t r;
        weftZeroMemoryReport(z, &r);
        // every layer's full gradient, or the buckets in flight and their
        // reduceType copies
        const size_t all = L * padded * ps;
        const size_t bound = cfg.bucketBytes + 2 * padded * (ps + (rs != ps ? rs : 0));
        if (every ? r.bucketsPeak > bound : r.buckets != all)
          return rank_fail(ctx, "every %d: buckets %zu, peak %zu (all layers %zu, bound %zu)",
                           every, r.buckets, r.bucketsPeak, all, bound);
      }
    }
    if (weftZeroStep(z, s, nullptr) != weftSuccess)
      return rank_fail(ctx, "step: %s", weftZeroLastError());
    const double scale = 1.0 / ((double)ctx.nranks * kMicro);
    for (size_t i = 0; i < want.size(); i++) want[i] -= (float)(sum[i] * scale);
  }
  std::vector<float> got(want.size());
  if (weftZeroGetParams(z, got.data(), s) != weftSuccess)
    return rank_fail(ctx, "get: %s", weftZeroLastError());
  for (size_t i = 0; i < got.size(); i++)
    if (got[i] != want[i])
      return rank_fail(ctx, "every %d: parameter %zu (layer %zu) is %.9g, want %.9g", every, i,
                       i / count, got[i], want[i]);
  for (weftStream_t x : ss) weftStreamDestroy(x);
  weftZeroDestroy(z);
  weftCommDestroy(comm);
  return 0;
}

TEST(ZeroAccumulation, ReduceEveryMicroStepHoldsTheShardOnly) {
  const AccumCase cases[] = {{2, 2, weftFloat32, weftFloat32},
                             {3, 3, weftBfloat16, weftBfloat16},
                             {2, 3, weftBfloat16, weftFloat32},
                             {3, 2, weftFloat16, weftFloat32},
                             {2, 2, weftFloat32, weftFloat32, 2},
                             {3, 3, weftBfloat16, weftFloat32, 2}};
  for (const AccumCase &c : cases)
    for (int every : {0, 1}) {
      SCOPED_TRACE(testing::Message() << c.nranks << " ranks, stage " << c.stage << ", types "
                                      << c.param << "/" << c.reduce << ", every " << every
                                      << ", " << c.streams << " stream(s)");
      auto status = run_ranks(c.nranks, [&](const RankCtx &ctx) { return accum_rank(ctx, c, every); });
      for (int st : status) EXPECT_EQ(st, 0);
    }
}

}  // namespace
