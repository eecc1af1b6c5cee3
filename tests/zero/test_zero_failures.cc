// ZeRO contexts whose table fails on cue (the host's or the staged one's
// work, one function failing): a stage 3 gather whose wait fails or whose
// all-gather is refused gives its buffer back, ordered after its last user,
// and leaves the step's write-back to be waited for; a step that fails on
// one rank only is not run again there (its collectives would pair with the
// peers' next ones) and the peers get an error; a failed wait for the
// reductions is returned by a load and by destroy.
#include <gtest/gtest.h>

#include <stdlib.h>
#include <string.h>

#include <string>
#include <vector>

#include "harness.h"
#include "weft_zero.h"
#include "zero_ranks.h"
extern "C" {
#include "zero/zero_internal.h"  // the tables a test wraps, the pool a gather takes from
}

using namespace weft_test;

namespace {

// What the cue table does (each rank is a process of its own): records
// every stream_wait; fails the one for fail_wait, once; lets bad_stream
// (not weft's) wait for nothing, so that a gather on it reaches its
// all-gather; fails every event_sync of an event in fail_syncs.
struct Wait {
  weftStream_t stream;
  weftEvent_t event;
};
struct Cues {
  const struct zero_ops *base = &zero_ops_host_staged;
  std::vector<Wait> waits;
  weftEvent_t fail_wait = nullptr;
  weftStream_t bad_stream = nullptr;
  std::vector<weftEvent_t> fail_syncs;
} cues;

weftResult_t cue_stream_wait(weftStream_t stream, weftEvent_t event) {
  cues.waits.push_back({stream, event});
  if (event != nullptr && event == cues.fail_wait) {
    cues.fail_wait = nullptr;
    return zero_fail(weftSystemError, "ordering a stream after an event failed (cue)");
  }
  if (stream != nullptr && stream == cues.bad_stream) return weftSuccess;
  return cues.base->stream_wait(stream, event);
}

weftResult_t cue_event_sync(weftEvent_t event) {
  for (weftEvent_t e : cues.fail_syncs)
    if (e == event) return zero_fail(weftSystemError, "waiting for a reduction failed (cue)");
  return cues.base->event_sync(event);
}

const struct zero_ops *cue_table(const struct zero_ops *base) {
  static struct zero_ops t;
  cues.base = base;
  t = *base;
  t.stream_wait = cue_stream_wait;
  t.event_sync = cue_event_sync;
  return &t;
}

bool waited(weftStream_t stream, weftEvent_t event) {
  for (const Wait &w : cues.waits)
    if (w.stream == stream && w.event == event) return true;
  return false;
}

const int kLayers = 3;
const size_t kCount = 77;

// A stage 3 context on ops, without prefetch: three layers of kCount
// seeded parameters (one a layer, whose id is the layer's).
weftResult_t make_stage3(weftComm_t comm, const struct zero_ops *ops, weftZero_t *out) {
  weftZeroConfig_t cfg;
  weftZeroConfigDefaults(&cfg);
  cfg.stage = 3;
  cfg.prefetchLayers = 0;
  cfg.optimizer = weftZeroSgdMomentum;
  RES_TRY(weftZeroCreate(out, comm, &cfg));
  (*out)->ops = ops;
  Rng rng(test_seed() + 3);
  std::vector<float> init(kCount);
  for (int l = 0; l < kLayers; l++) {
    for (float &v : init) v = (float)(rng.uniform() - 0.5);
    int id;
    RES_TRY(weftZeroAddParam(*out, l, kCount, init.data(), &id));
  }
  return weftZeroFinalize(*out);
}

// One step of seeded gradients (rng: this rank's), marked ready and stepped
// on stream.
weftResult_t seeded_step(weftZero_t z, Rng &rng, weftStream_t stream) {
  std::vector<float> grad(kCount);
  for (int l = kLayers - 1; l >= 0; l--) {
    for (float &v : grad) v = (float)(rng.uniform() - 0.5);
    void *g;
    RES_TRY(weftZeroGrad(z, l, &g));
    RES_TRY(weftZeroAccumulate(g, weftFloat32, grad.data(), kCount));
    RES_TRY(weftZeroGradReady(z, l, stream));
  }
  return weftZeroStep(z, stream, nullptr);
}

// The parameters after two such steps on a plain host context.
weftResult_t host_params(const RankCtx &ctx, weftComm_t comm, weftStream_t stream,
                         std::vector<float> *out) {
  weftZero_t z;
  RES_TRY(make_stage3(comm, &zero_ops_host, &z));
  Rng rng(test_seed() + 11 * (uint64_t)ctx.rank);
  weftResult_t res = seeded_step(z, rng, stream);
  if (res == weftSuccess) res = seeded_step(z, rng, stream);
  out->assign(kLayers * kCount, 0);
  if (res == weftSuccess) res = weftZeroGetParams(z, out->data(), nullptr);
  weftResult_t destroyed = weftZeroDestroy(z);
  return res != weftSuccess ? res : destroyed;
}

// The second step and its checks: nothing stays gathered, and the
// parameters are the host context's bit for bit.
int finish(const RankCtx &ctx, weftZero_t z, Rng &rng, weftStream_t stream,
           const std::vector<float> &want) {
  FAIL_IF(seeded_step(z, rng, stream) != weftSuccess, "step 2: %s", weftZeroLastError());
  weftZeroMemory_t r;
  weftZeroMemoryReport(z, &r);
  FAIL_IF(r.gathered != 0, "%zu bytes still gathered after the step", r.gathered);
  std::vector<float> got(want.size());
  FAIL_IF(weftZeroGetParams(z, got.data(), nullptr) != weftSuccess, "get: %s",
          weftZeroLastError());
  FAIL_IF(memcmp(got.data(), want.data(), want.size() * sizeof(float)) != 0,
          "the parameters differ from the host context's");
  return 0;
}

// A gather whose wait for the step's write-back (queued on stream s) fails,
// on stream s2, after its take queued a wait for the buffer's last user (a
// release on the compute stream c): the layer stays released and the buffer
// is back in the pool, not counted as gathered; the gather again, on s3,
// takes the same buffer and waits for that release (passed on through s2)
// and for the write-back. Every rank fails alike.
int wait_fails_rank(const RankCtx &ctx) {
  weftComm_t comm;
  TRY_RC(init(ctx, &comm));
  weftStream_t s, s2, s3, c;
  FAIL_IF(weftStreamCreate(&s) != weftSuccess || weftStreamCreate(&s2) != weftSuccess ||
              weftStreamCreate(&s3) != weftSuccess || weftStreamCreate(&c) != weftSuccess,
          "streams");
  std::vector<float> want;
  FAIL_IF(host_params(ctx, comm, s, &want) != weftSuccess, "host: %s", weftZeroLastError());
  weftZero_t z;
  FAIL_IF(make_stage3(comm, cue_table(&zero_ops_host_staged), &z) != weftSuccess, "create: %s",
          weftZeroLastError());
  Rng rng(test_seed() + 11 * (uint64_t)ctx.rank);
  FAIL_IF(seeded_step(z, rng, s) != weftSuccess, "step 1: %s", weftZeroLastError());
  weftEvent_t ev;
  FAIL_IF(weftZeroGather(z, 1, s, &ev) != weftSuccess || weftEventSynchronize(ev) != weftSuccess ||
              weftZeroReleaseOn(z, 1, c) != weftSuccess,
          "layer 1: %s", weftZeroLastError());
  cues.fail_wait = z->layers[0].gather_ev;
  weftResult_t res = weftZeroGather(z, 0, s2, &ev);
  FAIL_IF(res != weftSystemError || strstr(weftZeroLastError(), "(cue)") == nullptr,
          "the gather whose wait failed: %d: %s", res, weftZeroLastError());
  weftZeroMemory_t r;
  weftZeroMemoryReport(z, &r);
  const size_t nbytes = weftZeroPadded(kCount, ctx.nranks) * sizeof(float);
  FAIL_IF(r.gathered != 0 || r.gatheredIdle != nbytes, "after the failure: %zu held, %zu idle",
          r.gathered, r.gatheredIdle);
  void *p;
  FAIL_IF(weftZeroParam(z, 0, &p) != weftInvalidUsage, "the failed layer handed out");
  const size_t allocs = r.gatheredAllocs;
  cues.waits.clear();
  FAIL_IF(weftZeroGather(z, 0, s3, &ev) != weftSuccess || weftEventSynchronize(ev) != weftSuccess ||
              weftZeroParam(z, 0, &p) != weftSuccess,
          "gather again: %s", weftZeroLastError());
  weftZeroMemoryReport(z, &r);
  FAIL_IF(r.gatheredAllocs != allocs, "a new buffer (%zu allocated, %zu before)",
          r.gatheredAllocs, allocs);
  weftEvent_t release = nullptr;
  for (int i = 0; i < z->gather_pool.n; i++)
    if (z->gather_pool.bufs[i].ptr == p) release = z->gather_pool.bufs[i].release_ev;
  FAIL_IF(release == nullptr || !waited(s3, release),
          "the gather again did not wait for the buffer's last release");
  FAIL_IF(!waited(s3, z->layers[0].gather_ev),
          "the gather again did not wait for the step's write-back");
  FAIL_IF(weftZeroRelease(z, 0) != weftSuccess, "release: %s", weftZeroLastError());
  TRY_RC(finish(ctx, z, rng, s, want));
  FAIL_IF(weftZeroDestroy(z) != weftSuccess, "destroy: %s", weftZeroLastError());
  for (weftStream_t st : {s, s2, s3, c}) weftStreamDestroy(st);
  weftCommDestroy(comm);
  return 0;
}

TEST(ZeroFailures, GatherWhoseWaitFailsGivesItsBufferBack) {
  for (int n : {1, 2}) {
    auto status = run_ranks(n, wait_fails_rank);
    for (int r = 0; r < n; r++) EXPECT_EQ(status[r], 0) << "rank " << r << " of " << n;
  }
}

// A gather that weft refuses (a stream that is not weft's; one rank, as a
// refusal breaks a communicator of more) after the step's write-back on
// stream s: the write-back is still to be waited for, so the gather on s2
// that follows waits for it.
int refused_rank(const RankCtx &ctx) {
  weftComm_t comm;
  TRY_RC(init(ctx, &comm));
  weftStream_t s, s2;
  FAIL_IF(weftStreamCreate(&s) != weftSuccess || weftStreamCreate(&s2) != weftSuccess, "streams");
  std::vector<float> want;
  FAIL_IF(host_params(ctx, comm, s, &want) != weftSuccess, "host: %s", weftZeroLastError());
  weftZero_t z;
  FAIL_IF(make_stage3(comm, cue_table(&zero_ops_host_staged), &z) != weftSuccess, "create: %s",
          weftZeroLastError());
  Rng rng(test_seed() + 11 * (uint64_t)ctx.rank);
  FAIL_IF(seeded_step(z, rng, s) != weftSuccess, "step 1: %s", weftZeroLastError());
  int not_a_stream = 0;
  cues.bad_stream = (weftStream_t)&not_a_stream;
  weftEvent_t ev;
  weftResult_t res = weftZeroGather(z, 0, cues.bad_stream, &ev);
  FAIL_IF(res != weftInvalidArgument, "a gather on a bad stream: %d: %s", res,
          weftZeroLastError());
  weftZeroMemory_t r;
  weftZeroMemoryReport(z, &r);
  FAIL_IF(r.gathered != 0, "%zu bytes held after the refusal", r.gathered);
  cues.waits.clear();
  FAIL_IF(weftZeroGather(z, 0, s2, &ev) != weftSuccess || weftEventSynchronize(ev) != weftSuccess,
          "gather again: %s", weftZeroLastError());
  FAIL_IF(!waited(s2, z->layers[0].gather_ev),
          "the gather after the refusal did not wait for the step's write-back");
  FAIL_IF(weftZeroRelease(z, 0) != weftSuccess, "release: %s", weftZeroLastError());
  TRY_RC(finish(ctx, z, rng, s, want));
  FAIL_IF(weftZeroDestroy(z) != weftSuccess, "destroy: %s", weftZeroLastError());
  weftStreamDestroy(s);
  weftStreamDestroy(s2);
  weftCommDestroy(comm);
  return 0;
}

TEST(ZeroFailures, RefusedGatherLeavesTheWriteBackToWaitFor) {
  auto status = run_ranks(1, refused_rank);
  EXPECT_EQ(status[0], 0);
}

// A step that fails on rank 1 only, before the statistics' all-reduce (the
// gradient's load) or after it (the clipping), while rank 0 goes into the
// all-reduce or on to its update and publication: rank 1's failure says the
// state is incomplete, and its second try is refused (weftInvalidUsage,
// naming the failure) instead of pairing its collectives with rank 0's; once
// rank 1 aborts its communicator, rank 0's step fails too.
enum FailAt { kLoad, kClip };

weftResult_t cue_load_scaled(const void *, weftDataType_t, float *, size_t, double, double *,
                             weftStream_t) {
  return zero_fail(weftSystemError, "the gradient's load failed (cue)");
}
weftResult_t cue_scale(float *, size_t, float, weftStream_t) {
  return zero_fail(weftSystemError, "the clipping failed (cue)");
}

int one_rank_fails(const RankCtx &ctx, FailAt at) {
  weftComm_t comm;
  TRY_RC(init(ctx, &comm));
  weftZeroConfig_t cfg;
  weftZeroConfigDefaults(&cfg);
  cfg.stage = 1;
  cfg.optimizer = weftZeroSgdMomentum;
  cfg.maxGradNorm = 1e-3;  // every step clips
  weftZero_t z;
  std::vector<int> ids;
  TRY_RC(make_ctx(ctx, comm, cfg, {{1000}, {333}}, &z, &ids));
  static struct zero_ops failing;
  failing = zero_ops_host;
  if (at == kLoad) failing.load_scaled = cue_load_scaled;
  else failing.scale = cue_scale;
  Rng rng(test_seed() + 17 * (uint64_t)ctx.rank);
  const size_t sizes[] = {1000, 333};
  for (int step = 0; step < 2; step++) {
    for (int l = 1; l >= 0; l--) {
      std::vector<float> grad(sizes[l]);
      for (float &v : grad) v = (float)(rng.uniform() - 0.5);
      void *g;
      FAIL_IF(weftZeroGrad(z, ids[l], &g) != weftSuccess ||
                  weftZeroAccumulate(g, cfg.paramType, grad.data(), sizes[l]) != weftSuccess ||
                  weftZeroGradReady(z, l, nullptr) != weftSuccess,
              "step %d, layer %d: %s", step, l, weftZeroLastError());
    }
    if (step == 1 && ctx.rank == 1) {
      z->ops = &failing;
      weftResult_t res = weftZeroStep(z, nullptr, nullptr);
      z->ops = &zero_ops_host;
      const std::string why = weftZeroLastError();
      FAIL_IF(res != weftSystemError || why.find("(cue)") == std::string::npos,
              "the failed step: %d: %s", res, why.c_str());
      const char *since = at == kLoad ? "incomplete since step 2 failed (the gradient's load"
                                      : "incomplete since clipping the gradients failed";
      res = weftZeroStep(z, nullptr, nullptr);
      FAIL_IF(res != weftInvalidUsage || strstr(weftZeroLastError(), since) == nullptr,
              "the step again: %d: %s", res, weftZeroLastError());
      FAIL_IF(why.find("the training state is incomplete") == std::string::npos,
              "the failure does not say the state is incomplete: %s", why.c_str());
      weftCommAbort(comm);
      weftZeroDestroy(z);
      return 0;
    }
    weftResult_t res = weftZeroStep(z, nullptr, nullptr);
    FAIL_IF(step == 0 && res != weftSuccess, "step 1: %s", weftZeroLastError());
    FAIL_IF(step == 1 && res == weftSuccess, "step 2 passed without rank 1");
  }
  weftCommAbort(comm);
  weftZeroDestroy(z);
  return 0;
}

TEST(ZeroFailures, StepFailingOnOneRankIsNotTriedAgain) {
  for (FailAt at : {kLoad, kClip}) {
    SCOPED_TRACE(at == kLoad ? "the load fails" : "the clipping fails");
    RunOptions opts;
    opts.env = {{"WEFT_TIMEOUT", "5"}};
    opts.allow_warnings = true;  // the aborted peer is reported
    opts.timeout_s = 30;
    auto status = run_ranks(2, [at](const RankCtx &ctx) { return one_rank_fails(ctx, at); }, opts);
    for (int r = 0; r < 2; r++) EXPECT_EQ(status[r], 0) << "rank " << r;
  }
}

// The reductions of marked layers, waited for by a load or a destroy (no
// step has): a failed wait is their failure, the load's on every rank (the
// engine then refuses steps until a load), the destroy's after it frees
// everything.
int reset_wait_rank(const RankCtx &ctx, const char *dir) {
  weftComm_t comm;
  TRY_RC(init(ctx, &comm));
  weftZeroConfig_t cfg;
  weftZeroConfigDefaults(&cfg);
  cfg.stage = 2;
  cfg.optimizer = weftZeroSgdMomentum;
  weftZero_t z;
  std::vector<int> ids;
  TRY_RC(make_ctx(ctx, comm, cfg, {{500}, {21}}, &z, &ids));
  FAIL_IF(weftZeroSave(z, dir, nullptr) != weftSuccess, "save: %s", weftZeroLastError());
  const struct zero_ops *cue = cue_table(&zero_ops_host);
  cues.fail_syncs = {z->layers[0].red_ev, z->layers[1].red_ev};
  weftStream_t s;
  FAIL_IF(weftStreamCreate(&s) != weftSuccess, "stream");
  for (int round = 0; round < 2; round++) {
    for (int l = 1; l >= 0; l--) {
      void *g;
      FAIL_IF(weftZeroGrad(z, ids[l], &g) != weftSuccess ||
                  weftZeroGradReady(z, l, s) != weftSuccess,
              "layer %d: %s", l, weftZeroLastError());
    }
    // the reductions are over: only the wait for them fails
    FAIL_IF(weftStreamSynchronize(s) != weftSuccess, "sync");
    z->ops = cue;
    if (round == 1) break;
    weftResult_t res = weftZeroLoad(z, dir, nullptr);
    z->ops = &zero_ops_host;
    FAIL_IF(res != weftSystemError || strstr(weftZeroLastError(), "(cue)") == nullptr,
            "a load whose wait failed: %d: %s", res, weftZeroLastError());
    FAIL_IF(weftZeroStep(z, nullptr, nullptr) != weftInvalidUsage ||
                strstr(weftZeroLastError(), "incomplete since") == nullptr,
            "a step after it: %s", weftZeroLastError());
    FAIL_IF(weftZeroLoad(z, dir, nullptr) != weftSuccess, "load: %s", weftZeroLastError());
  }
  weftResult_t res = weftZeroDestroy(z);
  FAIL_IF(res != weftSystemError || strstr(weftZeroLastError(), "(cue)") == nullptr,
          "a destroy whose wait failed: %d: %s", res, weftZeroLastError());
  weftStreamDestroy(s);
  weftCommDestroy(comm);
  return 0;
}

TEST(ZeroFailures, FailedWaitForTheReductionsIsReported) {
  on_one_and_two_ranks_with_dir("resetwait", reset_wait_rank);
}

}  // namespace
