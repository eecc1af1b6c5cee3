// The ZeRO context's API on real ranks: the memory report against the ZeRO
// formulas, loss scaling that agrees across ranks, stage 3 prefetch under a
// byte bound, the stage 1-2 parameter gather overlapping the next forward,
// and errors for misuse (streams and accumulation: test_zero_accum.cc).
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/resource.h>

#include <math.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include <vector>

#include "harness.h"
#include "weft_zero.h"
#include "zero_ranks.h"

using namespace weft_test;

namespace {

// The paper's formulas, written out: Psi parameters, N ranks, 2-byte
// parameters and gradients, K = 12 bytes of AdamW state.
size_t paper_bytes(int stage, size_t psi, size_t n) {
  switch (stage) {
  case 0: return 16 * psi;
  case 1: return 4 * psi + 12 * psi / n;
  case 2: return 2 * psi + 14 * psi / n;
  default: return 16 * psi / n;
  }
}

TEST(ZeroMemory, FollowsTheFormulas) {
  for (int n = 1; n <= 4; n++) {
    auto status = run_ranks(n, [](const RankCtx &ctx) {
      weftComm_t comm;
      if (int rc = init(ctx, &comm)) return rc;
      size_t n = (size_t)ctx.nranks;
      // layer sizes that divide by N, for several Psi
      for (size_t unit : {1ul, 7ul, 1000ul}) {
        std::vector<std::vector<size_t>> layers = {{12 * n * unit, 5 * n}, {n * unit}, {3 * n}};
        size_t psi = 12 * n * unit + 5 * n + n * unit + 3 * n;
        for (int stage = 0; stage <= 3; stage++) {
          // bf16 AdamW, fp32 SGD with momentum, bf16 AdamW reduced in fp32
          for (int variant = 0; variant < 3; variant++) {
            weftZeroConfig_t cfg;
            weftZeroConfigDefaults(&cfg);
            cfg.stage = stage;
            cfg.paramType = variant == 1 ? weftFloat32 : weftBfloat16;
            cfg.reduceType = variant == 2 ? weftFloat32 : cfg.paramType;
            cfg.optimizer = variant == 1 ? weftZeroSgdMomentum : weftZeroAdamW;
            weftZero_t z;
            if (int rc = make_ctx(ctx, comm, cfg, layers, &z)) return rc;
            weftZeroMemory_t r;
            weftZeroMemoryReport(z, &r);
            size_t total = r.params + r.grads + r.optimizer;
            size_t want = variant == 0   ? paper_bytes(stage, psi, n)
                          : variant == 1 ? (size_t[]){16 * psi, 8 * psi + 8 * psi / n,
                                                      4 * psi + 12 * psi / n, 16 * psi / n}[stage]
                                         : (size_t[]){16 * psi, 4 * psi + 12 * psi / n,
                                                      2 * psi + 16 * psi / n, 18 * psi / n}[stage];
            const size_t same_types = weftZeroMemoryFormula(stage, psi, ctx.nranks, cfg.paramType,
                                                            cfg.optimizer);
            if (r.psi != psi || r.psiPadded != psi || total != want ||
                total != weftZeroMemoryFormulaFor(&cfg, psi, ctx.nranks) ||
                (variant != 2 && total != same_types))
              return rank_fail(ctx, "stage %d psi %zu variant %d: %zu bytes, want %zu", stage,
                               psi, variant, total, want);
            if (r.buckets != 0 || r.gathered != 0)
              return rank_fail(ctx, "temporary buffers held after finalize");
            weftZeroDestroy(z);
          }
        }
      }
      // sizes that do not divide: the formula holds for the padded count
      std::vector<std::vector<size_t>> odd = {{1001, 3}, {77}, {5}};
      for (int stage = 0; stage <= 3; stage++) {
        weftZeroConfig_t cfg;
        weftZeroConfigDefaults(&cfg);
        cfg.stage = stage;
        cfg.paramType = cfg.reduceType = weftBfloat16;
        weftZero_t z;
        if (int rc = make_ctx(ctx, comm, cfg, odd, &z)) return rc;
        weftZeroMemory_t r;
        weftZeroMemoryReport(z, &r);
        size_t padded = weftZeroPadded(1004, ctx.nranks) + weftZeroPadded(77, ctx.nranks) +
                        weftZeroPadded(5, ctx.nranks);
        if (r.psi != 1086 || r.psiPadded != padded ||
            r.params + r.grads + r.optimizer != paper_bytes(stage, padded, n))
          return rank_fail(ctx, "odd sizes, stage %d: %zu + %zu + %zu bytes, want %zu", stage,
                           r.params, r.grads, r.optimizer, paper_bytes(stage, padded, n));
        // held buffers show up: a stage 2-3 gradient bucket, a stage 3 gathered layer
        void *g;
        weftZeroGrad(z, 2, &g);
        weftZeroMemoryReport(z, &r);
        size_t bucket = stage >= 2 ? weftZeroPadded(77, ctx.nranks) * 2 : 0;
        if (r.buckets != bucket || r.bucketsIdle != 0 || r.bucketsAllocs != (bucket ? 1u : 0u))
          return rank_fail(ctx, "bucket %zu (idle %zu, %zu allocated), want %zu", r.buckets,
                           r.bucketsIdle, r.bucketsAllocs, bucket);
        weftEvent_t ev;
        if (weftZeroGather(z, 0, nullptr, &ev) != weftSuccess)
          return rank_fail(ctx, "gather: %s", weftZeroLastError());
        weftZeroMemoryReport(z, &r);
        size_t gathered = stage == 3 ? (weftZeroPadded(1004, ctx.nranks) +
                                        weftZeroPadded(77, ctx.nranks)) * 2 : 0;  // + prefetch
        if (r.gathered != gathered)
          return rank_fail(ctx, "stage %d gathered %zu, want %zu", stage, r.gathered, gathered);
        weftZeroRelease(z, 0);
        weftZeroRelease(z, 1);
        weftZeroMemoryReport(z, &r);
        if (r.gathered != 0 || r.gatheredPeak != gathered)
          return rank_fail(ctx, "after release %zu held, peak %zu", r.gathered, r.gatheredPeak);
        // stage 3: the two buffers stay in the gather pool, counted apart
        if (r.gatheredIdle != gathered || r.gatheredAllocs != (stage == 3 ? 2u : 0u))
          return rank_fail(ctx, "stage %d: %zu idle, %zu allocated", stage, r.gatheredIdle,
                           r.gatheredAllocs);
        // gathered again: the same buffers, nothing allocated
        weftZeroGather(z, 0, nullptr, &ev);
        weftZeroMemoryReport(z, &r);
        if (r.gathered != gathered || r.gatheredIdle != 0 ||
            r.gatheredAllocs != (stage == 3 ? 2u : 0u) || r.gatheredPeak != gathered)
          return rank_fail(ctx, "stage %d regathered: %zu held, %zu idle, %zu allocated", stage,
                           r.gathered, r.gatheredIdle, r.gatheredAllocs);
        weftZeroDestroy(z);
      }
      weftCommDestroy(comm);
      return 0;
    });
    for (size_t r = 0; r < status.size(); r++) EXPECT_EQ(status[r], 0) << n << " ranks, rank " << r;
  }
}

// fp16: one rank's overflow skips the step on every rank and halves the
// scale everywhere; clean steps update, and the scale doubles after a window,
// within [1, 2^24] (gradients of base * scale, which stay finite).
struct ScaleCase {
  double base;
  std::vector<double> scales;  // before each step; step 0 overflows
};
const ScaleCase kScaleCases[] = {{0.01, {1024, 512, 512, 1024, 1024, 2048}},
                                 {0.01, {1, 1, 1, 2, 2, 4}},
                                 {1e-6, {1 << 24, 1 << 23, 1 << 23, 1 << 24, 1 << 24, 1 << 24}}};
TEST(ZeroLossScale, OverflowOnOneRankSkipsEverywhere) {
  auto status = run_ranks(3, [](const RankCtx &ctx) {
    weftComm_t comm;
    if (int rc = init(ctx, &comm)) return rc;
    for (int stage = 0; stage <= 3; stage++)
      for (const ScaleCase &sc : kScaleCases) {
      weftZeroConfig_t cfg;
      weftZeroConfigDefaults(&cfg);
      cfg.stage = stage;
      cfg.paramType = weftFloat16;
      cfg.reduceType = weftFloat32;
      cfg.optimizer = weftZeroSgdMomentum;
      cfg.lr = 0.1;
      cfg.lossScale = sc.scales[0];
      cfg.lossScaleWindow = 2;
      weftZero_t z;
      std::vector<int> ids;
      std::vector<float> init_vals;
      if (int rc = make_ctx(ctx, comm, cfg, {{100}, {31}}, &z, &ids, &init_vals)) return rc;
      std::vector<float> before(init_vals.size()), after(init_vals.size());
      for (size_t step = 0; step < sc.scales.size(); step++) {
        double scale = weftZeroLossScale(z);
        if (scale != sc.scales[step])
          return rank_fail(ctx, "stage %d step %zu: scale %g, want %g", stage, step, scale,
                           sc.scales[step]);
        weftZeroGetParams(z, before.data(), nullptr);
        for (int l = 1; l >= 0; l--) {
          weftEvent_t ev;
          weftZeroGather(z, l, nullptr, &ev);
          void *g;
          weftZeroGrad(z, ids[l], &g);
          size_t n = l == 0 ? 100 : 31;
          std::vector<float> grad(n, (float)(sc.base * (ctx.rank + 1) * scale));
          if (step == 0 && ctx.rank == 1 && l == 1) grad[7] = INFINITY;  // only here
          weftZeroAccumulate(g, weftFloat16, grad.data(), n);
          weftZeroRelease(z, l);
          weftZeroGradReady(z, l, nullptr);
        }
        weftZeroStepInfo_t info;
        if (weftZeroStep(z, nullptr, &info) != weftSuccess)
          return rank_fail(ctx, "step: %s", weftZeroLastError());
        weftZeroGetParams(z, after.data(), nullptr);
        bool moved = before != after;
        if (info.skipped != (step == 0) || moved == (step == 0))
          return rank_fail(ctx, "stage %d step %zu: skipped %d, parameters moved %d", stage,
                           step, info.skipped, moved);
        // averaged gradient 2 base per element: p -= lr * momentum buffer
        if (step == 1 && fabs(after[0] - (before[0] - 0.2 * sc.base)) > 1e-6)
          return rank_fail(ctx, "stage %d: update %g, want %g", stage, after[0] - before[0],
                           -0.2 * sc.base);
      }
      weftZeroDestroy(z);
    }
    weftCommDestroy(comm);
    return 0;
  });
  for (int s : status) EXPECT_EQ(s, 0);
}

// The next forward's ask for layer k of L on stream (ready: its event), and
// a look at layer k+1's prefetched gather (next: its event, NULL after the
// last layer), counted in *in_flight_seen while it is still running.
static int gather_and_peek(const RankCtx &ctx, weftZero_t z, int k, int L, weftStream_t stream,
                           weftEvent_t *ready, weftEvent_t *next, int *in_flight_seen) {
  *next = nullptr;
  if (weftZeroGather(z, k, stream, ready) != weftSuccess)
    return rank_fail(ctx, "gather %d: %s", k, weftZeroLastError());
  if (k + 1 < L) {
    weftZeroGatherEvent(z, k + 1, next);
    if (weftEventQuery(*next) == weftInProgress) ++*in_flight_seen;
  }
  return 0;
}

// Stage 3 with prefetch: while layer k computes, the gather of layer k+1 is
// already queued and finishes without another call; gathered bytes never
// pass the bound, and the gathered values are the parameters.
TEST(ZeroPrefetch, NextLayerGathersDuringCompute) {
  auto status = run_ranks(2, [](const RankCtx &ctx) {
    weftComm_t comm;
    if (int rc = init(ctx, &comm)) return rc;
    const int L = 6;
    const size_t count = (1u << 19) + 3;  // 2 MiB a layer, odd
    size_t layer_bytes = weftZeroPadded(count, ctx.nranks) * sizeof(float);
    weftZeroConfig_t cfg;
    weftZeroConfigDefaults(&cfg);
    cfg.stage = 3;
    cfg.prefetchLayers = 2;
    cfg.gatherBoundBytes = 2 * layer_bytes;  // the layer in use and one ahead
    weftZero_t z;
    std::vector<int> ids;
    std::vector<float> values;
    if (int rc = make_ctx(ctx, comm, cfg, std::vector<std::vector<size_t>>(L, {count}), &z, &ids,
                          &values))
      return rc;
    weftStream_t stream;
    weftStreamCreate(&stream);
    int in_flight_seen = 0;
    for (int k = 0; k < L; k++) {
      weftEvent_t ready, next;
      if (int rc = gather_and_peek(ctx, z, k, L, stream, &ready, &next, &in_flight_seen)) return rc;
      weftEventSynchronize(ready);
      weftZeroMemory_t r;
      weftZeroMemoryReport(z, &r);
      size_t want = (k + 1 < L ? 2 : 1) * layer_bytes;  // bound: only one ahead
      if (r.gathered != want)
        return rank_fail(ctx, "layer %d: %zu bytes gathered, want %zu", k, r.gathered, want);
      void *p;
      if (weftZeroParam(z, ids[k], &p) != weftSuccess)
        return rank_fail(ctx, "param %d: %s", k, weftZeroLastError());
      if (memcmp(p, values.data() + k * count, count * sizeof(float)) != 0)
        return rank_fail(ctx, "layer %d gathered wrong values", k);
      usleep(100000);  // compute layer k: no weft call
      if (next != nullptr && weftEventQuery(next) != weftSuccess)
        return rank_fail(ctx, "layer %d's gather did not finish during layer %d's compute", k + 1,
                         k);
      weftZeroRelease(z, k);
    }
    if (in_flight_seen == 0)
      return rank_fail(ctx, "no prefetched gather was ever seen in flight");
    weftZeroMemory_t r;
    weftZeroMemoryReport(z, &r);
    if (r.gatheredPeak > cfg.gatherBoundBytes)
      return rank_fail(ctx, "peak %zu over the bound %zu", r.gatheredPeak, cfg.gatherBoundBytes);
    // over the bound on demand: a clear error, nothing queued
    weftEvent_t ev;
    weftZeroGather(z, 0, stream, &ev);
    weftZeroGather(z, 2, stream, &ev);  // two layers held: the bound
    weftResult_t res = weftZeroGather(z, 3, stream, &ev);
    if (res != weftInvalidUsage || strstr(weftZeroLastError(), "bound") == nullptr)
      return rank_fail(ctx, "a gather over the bound gave %d: %s", res, weftZeroLastError());
    weftStreamSynchronize(stream);
    weftZeroDestroy(z);
    weftStreamDestroy(stream);
    weftCommDestroy(comm);
    return 0;
  });
  for (int s : status) EXPECT_EQ(s, 0);
}

// Stages 1-2: the step queues each layer's all-gather of the updated
// parameters and returns with them in flight; the next forward waits for
// layer k's event while later layers still arrive, and layer k+1's gather
// finishes during layer k's compute without another call. The values are,
// bit for bit, those of the synchronous path (the NULL stream) and of the
// updated master weights.
struct GatherOverlapCase {
  int stage;
  int nranks;
  weftDataType_t type;
};

// One step of random gradients (the same for a given step, layer and rank
// in every context), marked ready from the last layer as backward does.
int overlap_step(const RankCtx &ctx, weftZero_t z, const std::vector<int> &ids, size_t count,
                 weftDataType_t type, int step, weftStream_t stream) {
  std::vector<float> g(count);
  for (int k = (int)ids.size() - 1; k >= 0; k--) {
    Rng rng(test_seed() + 1000003ull * step + 1009ull * k + ctx.rank);
    for (float &v : g) v = (float)(rng.uniform() - 0.5);
    void *gp;
    if (weftZeroGrad(z, ids[k], &gp) != weftSuccess ||
        weftZeroAccumulate(gp, type, g.data(), count) != weftSuccess ||
        weftZeroGradReady(z, k, stream) != weftSuccess)
      return rank_fail(ctx, "step %d layer %d: %s", step, k, weftZeroLastError());
  }
  if (weftZeroStep(z, stream, nullptr) != weftSuccess)
    return rank_fail(ctx, "step %d: %s", step, weftZeroLastError());
  return 0;
}

// One run of a GatherOverlapCase: the ranks' counts of gathers seen in
// flight are summed into *in_flight_total.
static void run_gather_overlap(const GatherOverlapCase &c, int *in_flight_total) {
  // gathers by the ring in 4 KiB slots: each slot waits for the peer's
  // stream thread, so a gather takes longer the busier the machine is, as
  // does a rank's look after its step (single-copy gathers take one copy,
  // however loaded: with 2 ranks, all 6 of them finished before either
  // rank looked in a loaded full run)
  RunOptions opts;
  opts.env = {{"WEFT_ALGO", "ring"}, {"WEFT_SLOT_BYTES", "4096"}};
  auto status = run_ranks(c.nranks, [c, in_flight_total](const RankCtx &ctx) {
    weftComm_t comm;
    if (int rc = init(ctx, &comm)) return rc;
    const int L = 3, steps = 2;
    const size_t count = (1u << 18) + 3;  // 1 MiB a layer in fp32, odd
    const size_t nbytes = count * weftTypeSize(c.type);
    weftZeroConfig_t cfg;
    weftZeroConfigDefaults(&cfg);
    cfg.stage = c.stage;
    cfg.paramType = cfg.reduceType = c.type;
    cfg.lr = 1e-2;
    std::vector<std::vector<size_t>> layers(L, {count});
    // the synchronous path first (the NULL stream: complete on return),
    // so that the two contexts' collectives never interleave on comm
    std::vector<std::vector<char>> want(steps * L, std::vector<char>(nbytes));
    {
      weftZero_t z;
      std::vector<int> ids;
      if (int rc = make_ctx(ctx, comm, cfg, layers, &z, &ids)) return rc;
      for (int s = 0; s < steps; s++) {
        if (int rc = overlap_step(ctx, z, ids, count, c.type, s, nullptr)) return rc;
        for (int k = 0; k < L; k++) {
          void *p;
          weftEvent_t ready;
          if (weftZeroGather(z, k, nullptr, &ready) != weftSuccess ||
              weftEventQuery(ready) != weftSuccess)
            return rank_fail(ctx, "the NULL stream left layer %d's gather in flight", k);
          if (weftZeroParam(z, ids[k], &p) != weftSuccess)
            return rank_fail(ctx, "param %d: %s", k, weftZeroLastError());
          memcpy(want[s * L + k].data(), p, nbytes);
        }
      }
      weftZeroDestroy(z);
    }
    weftZero_t z;
    std::vector<int> ids;
    if (int rc = make_ctx(ctx, comm, cfg, layers, &z, &ids)) return rc;
    weftStream_t stream;
    weftStreamCreate(&stream);
    int in_flight_seen = 0;
    std::vector<float> master(L * count), converted(count * 2);
    for (int s = 0; s < steps; s++) {
      // rank 1 comes late to each step, so that the gathers rank 0's step
      // leaves wait on it for a while: a machine too busy to let rank 0 look
      // before the gathers end then does not hide the overlap
      if (ctx.rank == 1) usleep(200000);
      if (int rc = overlap_step(ctx, z, ids, count, c.type, s, stream)) return rc;
      for (int k = 0; k < L; k++) {  // the gathers the step left
        weftEvent_t ev;
        weftZeroGatherEvent(z, k, &ev);
        if (weftEventQuery(ev) == weftInProgress) in_flight_seen++;
      }
      for (int k = 0; k < L; k++) {  // the next forward
        weftEvent_t ready, next;
        if (int rc = gather_and_peek(ctx, z, k, L, stream, &ready, &next, &in_flight_seen))
          return rc;
        if (weftEventSynchronize(ready) != weftSuccess)
          return rank_fail(ctx, "layer %d's gather failed: %s", k, weftGetLastError(nullptr));
        void *p;
        if (weftZeroParam(z, ids[k], &p) != weftSuccess)
          return rank_fail(ctx, "param %d: %s", k, weftZeroLastError());
        if (memcmp(p, want[s * L + k].data(), nbytes) != 0)
          return rank_fail(ctx, "step %d layer %d: not the synchronous path's values", s, k);
        // compute layer k: 100 ms slices, no weft call but a query; on a
        // loaded machine layer k+1 may take more than one slice, never 20
        int slices = 0;
        do usleep(100000);
        while (next != nullptr && weftEventQuery(next) != weftSuccess && ++slices < 20);
        if (next != nullptr && weftEventQuery(next) != weftSuccess)
          return rank_fail(ctx, "layer %d's gather did not finish during layer %d's compute",
                           k + 1, k);
      }
      // the gathered values are the updated master weights, rounded
      if (weftZeroGetParams(z, master.data(), stream) != weftSuccess)
        return rank_fail(ctx, "get params: %s", weftZeroLastError());
      for (int k = 0; k < L; k++) {
        void *p;
        weftZeroParam(z, ids[k], &p);
        weftZeroFromFloat(master.data() + k * count, c.type, converted.data(), count);
        if (memcmp(p, converted.data(), nbytes) != 0)
          return rank_fail(ctx, "step %d layer %d: not the master weights", s, k);
      }
    }
    __atomic_add_fetch(in_flight_total, in_flight_seen, __ATOMIC_RELAXED);
    weftZeroDestroy(z);
    weftStreamDestroy(stream);
    weftCommDestroy(comm);
    return 0;
  }, opts);
  for (int s : status) EXPECT_EQ(s, 0);
}

TEST(ZeroPrefetch, Stage12GatherOverlapsNextForward) {
  const GatherOverlapCase cases[] = {
      {1, 2, weftFloat32}, {2, 3, weftBfloat16}, {1, 4, weftBfloat16}, {2, 2, weftFloat32}};
  for (const GatherOverlapCase &c : cases) {
    SCOPED_TRACE(testing::Message() << "stage " << c.stage << ", " << c.nranks << " ranks");
    // gathers seen in flight, summed over the ranks: a fast gather may finish
    // before one rank looks, but with a step that waits for its gathers no
    // rank ever sees one
    int *in_flight_total = (int *)mmap(nullptr, sizeof(int), PROT_READ | PROT_WRITE,
                                       MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(in_flight_total, MAP_FAILED);
    // a rank descheduled for as long as the gathers take, right after each
    // step, sees none in flight: up to 3 attempts, while a step that waits
    // for its gathers gives 0 in every one
    for (int attempt = 1; attempt <= 3; attempt++) {
      *in_flight_total = 0;
      run_gather_overlap(c, in_flight_total);
      printf("stage %d, %d ranks, attempt %d: %d gathers seen in flight\n", c.stage, c.nranks,
             attempt, *in_flight_total);
      if (*in_flight_total > 0 || HasFailure()) break;
    }
    EXPECT_GT(*in_flight_total, 0)
        << "in 3 attempts, no rank ever saw a parameter gather in flight after a step";
    munmap(in_flight_total, sizeof(int));
  }
}

// Backward overlap: a layer's reduction, queued by GradReady, runs while the
// trainer computes the next layer, before the step is called. The step then
// applies exactly the averaged gradient (SGD, lr 0.5, no momentum).
TEST(ZeroOverlap, ReductionsRunDuringBackward) {
  for (int stage = 0; stage <= 3; stage++) {
    auto status = run_ranks(2, [stage](const RankCtx &ctx) {
      weftComm_t comm;
      if (int rc = init(ctx, &comm)) return rc;
      const int L = 3;
      const size_t count = (1u << 18) + 1;
      weftZeroConfig_t cfg;
      weftZeroConfigDefaults(&cfg);
      cfg.stage = stage;
      cfg.optimizer = weftZeroSgdMomentum;
      cfg.momentum = 0;
      cfg.lr = 0.5;
      cfg.bucketBytes = 1;  // stage 0: one bucket a layer
      weftZero_t z;
      std::vector<int> ids;
      std::vector<float> init_vals;
      if (int rc = make_ctx(ctx, comm, cfg, std::vector<std::vector<size_t>>(L, {count}), &z,
                            &ids, &init_vals))
        return rc;
      weftStream_t stream;
      weftStreamCreate(&stream);
      int in_flight = 0;
      std::vector<float> grad(count);
      for (int l = L - 1; l >= 0; l--) {
        weftEvent_t ev;
        weftZeroGather(z, l, stream, &ev);
        weftEventSynchronize(ev);
        for (size_t i = 0; i < count; i++) grad[i] = (float)((ctx.rank + 1) * ((i % 7) + l));
        void *g;
        if (weftZeroGrad(z, ids[l], &g) != weftSuccess)
          return rank_fail(ctx, "grad: %s", weftZeroLastError());
        weftZeroAccumulate(g, weftFloat32, grad.data(), count);
        weftZeroRelease(z, l);
        // rank 1 marks its layers ready late, so rank 0's reduction cannot
        // have finished when GradReady returns there: it must not block
        if (ctx.rank == 1) usleep(50000);
        if (weftZeroGradReady(z, l, stream) != weftSuccess)
          return rank_fail(ctx, "ready: %s", weftZeroLastError());
        if (weftStreamQuery(stream) == weftInProgress) in_flight++;
        else if (ctx.rank == 0)
          return rank_fail(ctx, "stage %d: layer %d's reduction finished inside GradReady",
                           stage, l);
        // the next layer's backward: no weft call but queries, which only
        // read the stream's state (its worker thread does the work); a
        // loaded machine may take long, so the bound is generous
        usleep(20000);
        for (int waited_ms = 20; weftStreamQuery(stream) == weftInProgress; waited_ms += 10) {
          if (waited_ms > 20000)
            return rank_fail(ctx, "stage %d: layer %d's reduction did not run during compute",
                             stage, l);
          usleep(10000);
        }
        if (weftStreamQuery(stream) != weftSuccess)
          return rank_fail(ctx, "stage %d: layer %d's reduction failed", stage, l);
      }
      if (ctx.rank == 0 && in_flight != L)
        return rank_fail(ctx, "stage %d: %d of %d reductions seen in flight", stage, in_flight, L);
      if (weftZeroStep(z, stream, nullptr) != weftSuccess)
        return rank_fail(ctx, "step: %s", weftZeroLastError());
      std::vector<float> after(init_vals.size());
      weftZeroGetParams(z, after.data(), stream);
      for (int l = 0; l < L; l++)
        for (size_t i = 0; i < count; i++) {
          float avg = 1.5f * (float)((i % 7) + l);  // (1 + 2) / 2 ranks
          float want = init_vals[l * count + i] - 0.5f * avg;
          if (after[l * count + i] != want)
            return rank_fail(ctx, "stage %d layer %d [%zu]: %g, want %g", stage, l, i,
                             after[l * count + i], want);
        }
      weftZeroDestroy(z);
      weftStreamDestroy(stream);
      weftCommDestroy(comm);
      return 0;
    });
    for (int s : status) EXPECT_EQ(s, 0) << "stage " << stage;
  }
}

// A rank that dies between steps: the others get an error from the step
// within the timeout, at every stage, instead of hanging.
TEST(ZeroErrors, DeadPeerFailsTheStep) {
  for (int stage = 0; stage <= 3; stage++) {
    RunOptions opts;
    opts.env = {{"WEFT_TIMEOUT", "5"}};
    opts.allow_warnings = true;  // the dead peer is reported
    opts.timeout_s = 30;
    auto status = run_ranks(3, [stage](const RankCtx &ctx) {
      weftComm_t comm;
      if (int rc = init(ctx, &comm)) return rc;
      weftZeroConfig_t cfg;
      weftZeroConfigDefaults(&cfg);
      cfg.stage = stage;
      weftZero_t z;
      std::vector<int> ids;
      if (int rc = make_ctx(ctx, comm, cfg, {{1000}, {333}}, &z, &ids)) return rc;
      weftStream_t stream;
      weftStreamCreate(&stream);
      for (int step = 0; step < 5; step++) {
        if (step == 2 && ctx.rank == 2) _exit(0);  // dies without a word
        for (int l = 1; l >= 0; l--) {
          weftEvent_t ev;
          weftZeroGather(z, l, stream, &ev);
          weftEventSynchronize(ev);
          void *g;
          weftZeroGrad(z, ids[l], &g);
          weftZeroRelease(z, l);
          weftZeroGradReady(z, l, stream);
        }
        weftResult_t res = weftZeroStep(z, stream, nullptr);
        if (step < 2 && res != weftSuccess)
          return rank_fail(ctx, "stage %d step %d: %s", stage, step, weftZeroLastError());
        if (step == 2) {
          if (res != weftRemoteError)
            return rank_fail(ctx, "stage %d: the step after a peer died gave %d: %s", stage, res,
                             weftZeroLastError());
          break;
        }
      }
      weftCommAbort(comm);
      return 0;
    }, opts);
    for (int s : status) EXPECT_EQ(s, 0) << "stage " << stage;
  }
}

// Parameters whose buffers' sizes in bytes would not fit size_t (4 bytes an
// element, the widest type, and up to nranks - 1 of padding a layer) are
// refused at registration with weftInvalidArgument, instead of a size that
// wraps (a small allocation written past at Finalize) or a capacity that
// doubles to 0 (a hang); the context stays usable.
TEST(ZeroErrors, HugeParametersAreRefused) {
  RunOptions opts;
  opts.timeout_s = 60;  // a registration that never returns fails here
  auto status = run_ranks(2, [](const RankCtx &ctx) {
    weftComm_t comm;
    if (int rc = init(ctx, &comm)) return rc;
    weftZeroConfig_t cfg;
    weftZeroConfigDefaults(&cfg);
    cfg.stage = 3;
    cfg.optimizer = weftZeroSgdMomentum;
    weftZero_t z;
    if (weftZeroCreate(&z, comm, &cfg) != weftSuccess)
      return rank_fail(ctx, "create: %s", weftZeroLastError());
    std::vector<float> init(64, 0.5f);
    int id;
    const size_t max_elems = SIZE_MAX / 4;
    // with 2 ranks, one element of padding for the layer
    for (size_t count : {(size_t)1 << 62, max_elems, SIZE_MAX / 2, SIZE_MAX - 1, SIZE_MAX}) {
      if (weftZeroAddParam(z, 0, count, init.data(), &id) != weftInvalidArgument ||
          strstr(weftZeroLastError(), "would not fit size_t") == nullptr)
        return rank_fail(ctx, "a parameter of %zu elements: %s", count, weftZeroLastError());
    }
    if (weftZeroAddParam(z, 0, 64, init.data(), &id) != weftSuccess)
      return rank_fail(ctx, "add: %s", weftZeroLastError());
    // 64 added, and one element of padding for each of two layers: one over
    for (size_t count : {max_elems - 64 - 1, max_elems})
      if (weftZeroAddParam(z, 1, count, init.data(), &id) != weftInvalidArgument)
        return rank_fail(ctx, "a second parameter of %zu elements: %s", count,
                         weftZeroLastError());
    if (weftZeroFinalize(z) != weftSuccess)
      return rank_fail(ctx, "finalize: %s", weftZeroLastError());
    weftZeroMemory_t m;
    weftZeroMemoryReport(z, &m);
    if (m.psi != 64 || m.psiPadded != 64)
      return rank_fail(ctx, "psi %zu, padded %zu after the refusals", m.psi, m.psiPadded);
    std::vector<float> out(64);
    if (weftZeroGetParams(z, out.data(), nullptr) != weftSuccess || out[0] != 0.5f ||
        out[63] != 0.5f)
      return rank_fail(ctx, "get params: %s", weftZeroLastError());
    if (weftZeroDestroy(z) != weftSuccess) return rank_fail(ctx, "destroy");
    weftCommDestroy(comm);
    return 0;
  }, opts);
  for (int s : status) EXPECT_EQ(s, 0);
}

TEST(ZeroErrors, MisuseIsRefused) {
  auto status = run_ranks(2, [](const RankCtx &ctx) {
    weftComm_t comm;
    if (int rc = init(ctx, &comm)) return rc;
    weftZeroConfig_t cfg;
    weftZeroConfigDefaults(&cfg);
    weftZero_t z;
    cfg.stage = 4;
    if (weftZeroCreate(&z, comm, &cfg) != weftInvalidArgument)
      return rank_fail(ctx, "stage 4 accepted");
    cfg.stage = 3;
    cfg.paramType = weftInt32;
    if (weftZeroCreate(&z, comm, &cfg) != weftInvalidArgument)
      return rank_fail(ctx, "int32 parameters accepted");
    cfg.paramType = weftBfloat16;
    cfg.reduceType = weftFloat16;
    if (weftZeroCreate(&z, comm, &cfg) != weftInvalidArgument)
      return rank_fail(ctx, "bf16 reduced in fp16 accepted");
    cfg.paramType = cfg.reduceType = weftFloat16;
    for (double bad : {0.5, 33554432.0, (double)INFINITY})
      if (cfg.lossScale = bad, weftZeroCreate(&z, comm, &cfg) != weftInvalidArgument)
        return rank_fail(ctx, "fp16 loss scale %g accepted", bad);
    cfg.lossScale = 65536;
    // what would wreck training while the steps report success (a beta of 1:
    // NaN everywhere after one step; a window of 0: the scale doubling every step)
    struct Bad {
      const char *what;
      void (*set)(weftZeroConfig_t *);
    };
    const Bad bads[] = {
        {"beta1 1", [](weftZeroConfig_t *c) { c->beta1 = 1; }},
        {"beta2 1", [](weftZeroConfig_t *c) { c->beta2 = 1; }},
        {"beta1 -0.1", [](weftZeroConfig_t *c) { c->beta1 = -0.1; }},
        {"eps NaN", [](weftZeroConfig_t *c) { c->eps = NAN; }},
        {"eps -1", [](weftZeroConfig_t *c) { c->eps = -1; }},
        {"weightDecay -0.1", [](weftZeroConfig_t *c) { c->weightDecay = -0.1; }},
        {"lr inf", [](weftZeroConfig_t *c) { c->lr = INFINITY; }},
        {"maxGradNorm NaN", [](weftZeroConfig_t *c) { c->maxGradNorm = NAN; }},
        {"lossScaleWindow 0 (fp16)", [](weftZeroConfig_t *c) { c->lossScaleWindow = 0; }},
        {"SGD momentum -1",
         [](weftZeroConfig_t *c) { c->optimizer = weftZeroSgdMomentum, c->momentum = -1; }},
        {"reduceEveryMicroStep 2", [](weftZeroConfig_t *c) { c->reduceEveryMicroStep = 2; }},
    };
    for (const Bad &b : bads) {
      weftZeroConfig_t bad = cfg;
      b.set(&bad);
      if (weftZeroCreate(&z, comm, &bad) != weftInvalidArgument)
        return rank_fail(ctx, "%s accepted", b.what);
    }
    {  // beta1 1 means nothing to SGD, a window of 0 nothing to bf16's fixed scale
      weftZeroConfig_t fine = cfg;
      fine.optimizer = weftZeroSgdMomentum;
      fine.beta1 = 1;
      fine.paramType = fine.reduceType = weftBfloat16;
      fine.lossScaleWindow = 0;
      if (weftZeroCreate(&z, comm, &fine) != weftSuccess)
        return rank_fail(ctx, "SGD with beta1 1, bf16 with window 0: %s", weftZeroLastError());
      weftZeroDestroy(z);
    }
    cfg.paramType = cfg.reduceType = weftBfloat16;
    if (weftZeroCreate(&z, comm, &cfg) != weftSuccess) return rank_fail(ctx, "create");
    if (weftZeroSetLr(z, INFINITY) != weftInvalidArgument) return rank_fail(ctx, "lr inf set");
    float init[10] = {0};
    int id;
    if (weftZeroAddParam(z, 1, 10, init, &id) != weftInvalidArgument)
      return rank_fail(ctx, "layer 1 before layer 0 accepted");
    if (weftZeroFinalize(z) != weftInvalidUsage) return rank_fail(ctx, "empty model finalized");
    weftZeroAddParam(z, 0, 10, init, &id);
    void *p;
    if (weftZeroParam(z, id, &p) != weftInvalidUsage) return rank_fail(ctx, "param before finalize");
    weftZeroFinalize(z);
    if (weftZeroAddParam(z, 0, 10, init, &id) != weftInvalidUsage)
      return rank_fail(ctx, "add after finalize accepted");
    if (weftZeroParam(z, id, &p) != weftInvalidUsage ||
        strstr(weftZeroLastError(), "not gathered") == nullptr)
      return rank_fail(ctx, "stage 3 param without a gather: %s", weftZeroLastError());
    if (weftZeroStep(z, nullptr, nullptr) != weftInvalidUsage)
      return rank_fail(ctx, "step without gradients accepted");
    weftZeroGradReady(z, 0, nullptr);
    if (weftZeroGradReady(z, 0, nullptr) != weftInvalidUsage)
      return rank_fail(ctx, "a layer marked ready twice");
    if (weftZeroGrad(z, id, &p) != weftInvalidUsage)
      return rank_fail(ctx, "gradient handed out during its reduction");
    if (weftZeroStep(z, nullptr, nullptr) != weftSuccess) return rank_fail(ctx, "step");
    if (weftZeroGather(z, 5, nullptr, nullptr) != weftInvalidArgument)
      return rank_fail(ctx, "layer 5 gathered");
    if (weftZeroLoad(z, "/nonexistent/weft", nullptr) == weftSuccess)
      return rank_fail(ctx, "loaded a missing checkpoint");
    weftZeroDestroy(z);
    weftCommDestroy(comm);
    return 0;
  });
  for (int s : status) EXPECT_EQ(s, 0);
}


// A stage 3 gather that weft refuses (a stream that is not weft's) leaves
// the layer released, its pool buffer idle: weftZeroParam refuses it, and a
// second gather writes the layer's own values into the buffer instead of
// handing out what the buffer held before (another layer's parameters).
TEST(ZeroErrors, RefusedGatherLeavesTheLayerReleased) {
  auto status = run_ranks(1, [](const RankCtx &ctx) {
    weftComm_t comm;
    if (int rc = init(ctx, &comm)) return rc;
    weftZeroConfig_t cfg;
    weftZeroConfigDefaults(&cfg);
    cfg.stage = 3;
    cfg.prefetchLayers = 0;
    weftZero_t z;
    std::vector<int> ids;
    std::vector<float> vals;
    if (int rc = make_ctx(ctx, comm, cfg, {{77}, {77}}, &z, &ids, &vals)) return rc;
    void *p;
    if (weftZeroGather(z, 0, nullptr, nullptr) != weftSuccess ||
        weftZeroRelease(z, 0) != weftSuccess)
      return rank_fail(ctx, "layer 0: %s", weftZeroLastError());
    int not_a_stream = 0;
    if (weftZeroGather(z, 1, (weftStream_t)&not_a_stream, nullptr) != weftInvalidArgument)
      return rank_fail(ctx, "a gather on a bad stream: %s", weftZeroLastError());
    if (weftZeroParam(z, ids[1], &p) != weftInvalidUsage)
      return rank_fail(ctx, "the refused layer's parameters handed out");
    weftZeroMemory_t r;
    weftZeroMemoryReport(z, &r);
    if (r.gathered != 0 || r.gatheredIdle != 77 * sizeof(float))
      return rank_fail(ctx, "held %zu, idle %zu", r.gathered, r.gatheredIdle);
    if (weftZeroGather(z, 1, nullptr, nullptr) != weftSuccess ||
        weftZeroParam(z, ids[1], &p) != weftSuccess)
      return rank_fail(ctx, "gather again: %s", weftZeroLastError());
    if (memcmp(p, vals.data() + 77, 77 * sizeof(float)) != 0)
      return rank_fail(ctx, "layer 1 holds another layer's values");
    if (weftZeroDestroy(z) != weftSuccess) return rank_fail(ctx, "destroy");
    weftCommDestroy(comm);
    return 0;
  });
  for (int s : status) EXPECT_EQ(s, 0);
}

// A reduction that fails once its layer counts as marked (here the fp32
// copy's allocation, under an address-space limit) leaves the step's
// gradients incomplete: the step, and marking more layers, are refused,
// naming it, instead of applying the last step's gradient shard; a load
// makes the engine sound again.
TEST(ZeroErrors, FailedReductionRefusesTheStepUntilALoad) {
  char dir[] = "/tmp/weft_zero_broken_XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  auto status = run_ranks(1, [&](const RankCtx &ctx) {
    weftComm_t comm;
    if (int rc = init(ctx, &comm)) return rc;
    weftZeroConfig_t cfg;
    weftZeroConfigDefaults(&cfg);
    cfg.stage = 2;
    cfg.paramType = weftBfloat16;
    cfg.reduceType = weftFloat32;  // reduced through an fp32 copy: 64 MiB
    cfg.optimizer = weftZeroSgdMomentum;
    weftZero_t z;
    std::vector<int> ids;
    const size_t n = 16u << 20;
    if (int rc = make_ctx(ctx, comm, cfg, {{n}}, &z, &ids)) return rc;
    if (weftZeroSave(z, dir, nullptr) != weftSuccess)
      return rank_fail(ctx, "save: %s", weftZeroLastError());
    void *g;
    if (weftZeroGrad(z, ids[0], &g) != weftSuccess)
      return rank_fail(ctx, "grad: %s", weftZeroLastError());
    memset(g, 0x3f, n * 2);  // bf16 0.74
    // room for 16 MiB more than is mapped now: the copy's 64 MiB fail
    long pages = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f == nullptr || fscanf(f, "%ld", &pages) != 1) return rank_fail(ctx, "statm");
    fclose(f);
    struct rlimit old_lim, lim;
    getrlimit(RLIMIT_AS, &old_lim);
    lim = old_lim;
    lim.rlim_cur = (rlim_t)pages * sysconf(_SC_PAGESIZE) + (16u << 20);
    setrlimit(RLIMIT_AS, &lim);
    weftResult_t ready = weftZeroGradReady(z, 0, nullptr);
    std::string why = weftZeroLastError();
    setrlimit(RLIMIT_AS, &old_lim);
    printf("marking ready: %s\n", why.c_str());
    if (ready == weftSuccess) return rank_fail(ctx, "the reduction did not fail");
    if (why.find("marking layer 0's gradients ready: ") == std::string::npos ||
        why.find("the training state is incomplete") == std::string::npos)
      return rank_fail(ctx, "the failure says: %s", why.c_str());
    weftZeroStepInfo_t info;
    for (int k = 0; k < 2; k++) {
      weftResult_t res = k == 0 ? weftZeroStep(z, nullptr, &info) : weftZeroGradReady(z, 0, nullptr);
      why = weftZeroLastError();
      if (res != weftInvalidUsage ||
          why.find("incomplete since marking layer 0's gradients ready failed") == std::string::npos)
        return rank_fail(ctx, "%s after the failure: %d: %s", k == 0 ? "a step" : "marking again",
                         res, why.c_str());
    }
    if (weftZeroLoad(z, dir, nullptr) != weftSuccess)
      return rank_fail(ctx, "load: %s", weftZeroLastError());
    if (weftZeroGrad(z, ids[0], &g) != weftSuccess || weftZeroGradReady(z, 0, nullptr) != weftSuccess ||
        weftZeroStep(z, nullptr, &info) != weftSuccess)
      return rank_fail(ctx, "a step after the load: %s", weftZeroLastError());
    if (weftZeroDestroy(z) != weftSuccess) return rank_fail(ctx, "destroy");
    weftCommDestroy(comm);
    return 0;
  });
  for (int s : status) EXPECT_EQ(s, 0);
  std::string rm = std::string("rm -rf ") + dir;
  EXPECT_EQ(system(rm.c_str()), 0);
}

}  // namespace
