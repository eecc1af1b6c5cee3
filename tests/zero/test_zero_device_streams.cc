// ZeRO contexts on streams and when a table fails (the suite test_zero_device_ctx.cc
// leaves to this one): stage 3's parameters handed out before their gather's
// event where a stream can wait for it; an optimizer update that fails part
// way refusing the next steps and saves until a load (a host table whose SGD
// fails); the staged table's step, its optimizer offloaded or not, on another
// host stream than the reductions, reading the gradients once they are over;
// and on a GPU (or cuda_emu): weftZeroReleaseOn ordering gathers after
// a compute stream, and a step on another stream than the reductions waiting
// for them before it zeroes its statistics. The parent process never touches
// CUDA: each rank looks for a GPU itself and the test skips when none has one.
#include <gtest/gtest.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "harness.h"
#include "weft_zero.h"
#include "zero_ranks.h"
extern "C" {
#include "zero/zero_internal.h"  // zero_ops_host, the table a test swaps
}
#if ZERO_TEST_CUDA
#include <cuda_runtime_api.h>
#endif

using namespace weft_test;

namespace {

const int kNoGpu = 77;

// Stage 3's weftZeroParam while the gather's event is pending (a host table
// whose events never complete): refused where the trainer must wait on the
// host, handed out where a stream can wait (the device table's
// stream_waits), so that kernels queued after cudaStreamWaitEvent read it.
int param_pending_rank(const RankCtx &ctx) {
  weftComm_t comm;
  TRY_RC(init(ctx, &comm));
  weftZeroConfig_t cfg;
  weftZeroConfigDefaults(&cfg);
  cfg.stage = 3;
  weftZero_t z;
  FAIL_IF(weftZeroCreate(&z, comm, &cfg) != weftSuccess, "create: %s", weftZeroLastError());
  std::vector<float> init(29);
  for (size_t i = 0; i < init.size(); i++) init[i] = 0.25f * (float)i - 3.0f;
  int id;
  FAIL_IF(weftZeroAddParam(z, 0, init.size(), init.data(), &id) != weftSuccess ||
              weftZeroFinalize(z) != weftSuccess,
          "register: %s", weftZeroLastError());
  static struct zero_ops pending;
  pending = zero_ops_host;
  pending.event_done = [](weftEvent_t) { return 0; };
  z->ops = &pending;
  FAIL_IF(weftZeroGather(z, 0, nullptr, nullptr) != weftSuccess, "gather: %s",
          weftZeroLastError());
  void *p = nullptr;
  pending.stream_waits = 0;
  FAIL_IF(weftZeroParam(z, id, &p) != weftInvalidUsage ||
              strstr(weftZeroLastError(), "gather event was not waited for") == nullptr,
          "handed out before the event on the host: %s", weftZeroLastError());
  pending.stream_waits = 1;
  FAIL_IF(weftZeroParam(z, id, &p) != weftSuccess, "refused: %s", weftZeroLastError());
  FAIL_IF(memcmp(p, init.data(), init.size() * sizeof(float)) != 0, "not the layer's values");
  FAIL_IF(weftZeroRelease(z, 0) != weftSuccess, "release: %s", weftZeroLastError());
  FAIL_IF(weftZeroParam(z, id, &p) != weftInvalidUsage ||
              strstr(weftZeroLastError(), "is not gathered") == nullptr,
          "a released layer handed out: %s", weftZeroLastError());
  z->ops = &zero_ops_host;
  FAIL_IF(weftZeroDestroy(z) != weftSuccess, "destroy: %s", weftZeroLastError());
  weftCommDestroy(comm);
  return 0;
}

// An update that fails part way (a table whose SGD fails, as a device
// launch may) leaves the engine refusing the next step and a save (the shard
// is partly moved), naming the update, until a load; then both work.
int failed_update_rank(const RankCtx &ctx, const char *dir) {
  weftComm_t comm;
  TRY_RC(init(ctx, &comm));
  weftZeroConfig_t cfg;
  weftZeroConfigDefaults(&cfg);
  cfg.stage = 1;
  cfg.optimizer = weftZeroSgdMomentum;
  weftZero_t z;
  FAIL_IF(weftZeroCreate(&z, comm, &cfg) != weftSuccess, "create: %s", weftZeroLastError());
  std::vector<float> init(1000, 0.5f);
  int id;
  FAIL_IF(weftZeroAddParam(z, 0, init.size(), init.data(), &id) != weftSuccess ||
              weftZeroFinalize(z) != weftSuccess || weftZeroSave(z, dir, nullptr) != weftSuccess,
          "set-up: %s", weftZeroLastError());
  static struct zero_ops failing;
  failing = zero_ops_host;
  failing.sgd = [](float *, float *, const float *, size_t, float, float, float,
                   weftStream_t) { return zero_fail(weftSystemError, "the update's kernel failed"); };
  for (int round = 0; round < 2; round++) {
    void *g;
    FAIL_IF(weftZeroGrad(z, id, &g) != weftSuccess, "grad: %s", weftZeroLastError());
    for (size_t i = 0; i < init.size(); i++) ((float *)g)[i] = 1.0f;
    FAIL_IF(weftZeroGradReady(z, 0, nullptr) != weftSuccess, "ready: %s", weftZeroLastError());
    weftZeroStepInfo_t info;
    if (round == 1) {
      FAIL_IF(weftZeroStep(z, nullptr, &info) != weftSuccess ||
                  weftZeroSave(z, dir, nullptr) != weftSuccess,
              "after the load: %s", weftZeroLastError());
      break;
    }
    z->ops = &failing;
    weftResult_t res = weftZeroStep(z, nullptr, &info);
    z->ops = &zero_ops_host;
    FAIL_IF(res != weftSystemError ||
                strstr(weftZeroLastError(), "the optimizer's update: the update's kernel failed") ==
                    nullptr,
            "the failed update: %d: %s", res, weftZeroLastError());
    FAIL_IF(weftZeroStep(z, nullptr, &info) != weftInvalidUsage ||
                strstr(weftZeroLastError(), "incomplete since the optimizer's update failed") ==
                    nullptr,
            "a step after it: %s", weftZeroLastError());
    FAIL_IF(weftZeroSave(z, dir, nullptr) != weftInvalidUsage ||
                strstr(weftZeroLastError(), "partly updated") == nullptr,
            "a save after it: %s", weftZeroLastError());
    FAIL_IF(weftZeroLoad(z, dir, nullptr) != weftSuccess, "load: %s", weftZeroLastError());
  }
  FAIL_IF(weftZeroDestroy(z) != weftSuccess, "destroy: %s", weftZeroLastError());
  weftCommDestroy(comm);
  return 0;
}

TEST(ZeroDeviceCtx, FailedUpdateRefusesStepsAndSavesUntilALoad) {
  on_one_and_two_ranks_with_dir("update", failed_update_rank);
}

TEST(ZeroDeviceCtx, StreamWaitsGetStage3ParamsBeforeTheEvent) {
  for (int n : {1, 2, 3}) {
    auto status = run_ranks(n, param_pending_rank);
    for (int r = 0; r < n; r++) EXPECT_EQ(status[r], 0) << "rank " << r << " of " << n;
  }
}

// The step on another host stream than the reductions, through the device
// path's branches (zero_ops_host_staged), the optimizer offloaded (its load
// copies the owned gradients at once, as the host's tables copy) or not:
// the step reads the gradients once the reductions queued on the first
// stream are over. Two steps of seeded gradients that differ by rank, at
// stages 0-3, against a plain host context on one stream: bit for bit.
weftResult_t cross_train(weftComm_t comm, const RankCtx &ctx, int stage, bool staged, bool offload,
                         weftStream_t ready, weftStream_t step, std::vector<float> *out) {
  weftZeroConfig_t cfg;
  weftZeroConfigDefaults(&cfg);
  cfg.stage = stage;
  cfg.optimizer = weftZeroSgdMomentum;
  const size_t n = 1 << 20;
  weftZero_t z;
  RES_TRY(weftZeroCreate(&z, comm, &cfg));
  if (staged) z->ops = &zero_ops_host_staged;
  if (offload) {
    z->cfg.offloadOptimizer = 1;
    z->offload_ops = &zero_ops_host;
  }
  Rng init_rng(test_seed() + 5);
  std::vector<float> vals(n);
  weftResult_t res = weftSuccess;
  for (int l = 0; l < 2 && res == weftSuccess; l++) {
    for (float &v : vals) v = (float)(init_rng.uniform() - 0.5);
    int id;
    res = weftZeroAddParam(z, l, n, vals.data(), &id);
  }
  if (res == weftSuccess) res = weftZeroFinalize(z);
  Rng rng(test_seed() + 31 * (uint64_t)ctx.rank);
  for (int s = 0; s < 2 && res == weftSuccess; s++) {
    for (int l = 1; l >= 0 && res == weftSuccess; l--) {
      void *g;
      for (float &v : vals) v = (float)(rng.uniform() - 0.5);
      res = weftZeroGrad(z, l, &g);
      if (res == weftSuccess) res = weftZeroAccumulate(g, cfg.paramType, vals.data(), n);
      if (res == weftSuccess) res = weftZeroGradReady(z, l, ready);
    }
    if (res == weftSuccess) res = weftZeroStep(z, step, nullptr);
  }
  out->assign(2 * n, NAN);
  if (res == weftSuccess) res = weftZeroGetParams(z, out->data(), nullptr);
  weftResult_t destroyed = weftZeroDestroy(z);
  return res != weftSuccess ? res : destroyed;
}

int cross_stream_rank(const RankCtx &ctx) {
  weftComm_t comm;
  TRY_RC(init(ctx, &comm));
  weftStream_t a, b;
  FAIL_IF(weftStreamCreate(&a) != weftSuccess || weftStreamCreate(&b) != weftSuccess, "streams");
  for (int stage = 0; stage <= 3; stage++) {
    std::vector<float> want, got;
    FAIL_IF(cross_train(comm, ctx, stage, false, false, a, a, &want) != weftSuccess,
            "stage %d, host: %s", stage, weftZeroLastError());
    for (bool offload : {false, true}) {
      FAIL_IF(cross_train(comm, ctx, stage, true, offload, a, b, &got) != weftSuccess,
              "stage %d, staged%s: %s", stage, offload ? ", offloaded" : "", weftZeroLastError());
      size_t wrong = 0;
      for (size_t i = 0; i < want.size(); i++) wrong += memcmp(&want[i], &got[i], 4) != 0;
      FAIL_IF(wrong != 0, "stage %d, staged%s: %zu of %zu parameters differ from the host's",
              stage, offload ? ", offloaded" : "", wrong, want.size());
    }
  }
  weftStreamDestroy(a);
  weftStreamDestroy(b);
  weftCommDestroy(comm);
  return 0;
}

TEST(ZeroDeviceCtx, StagedStepOnAnotherStreamWaitsForTheReductions) {
  RunOptions opts;
  opts.timeout_s = 120;
  auto status = run_ranks(2, cross_stream_rank, opts);
  for (size_t r = 0; r < status.size(); r++) EXPECT_EQ(status[r], 0) << "rank " << r;
}

// On a GPU: weftZeroReleaseOn with the compute on a stream of its own. Each
// round gathers four layers of one size on the gather stream; the compute
// stream waits for each layer's event, copies the layer out behind a large
// copy that keeps it busy, and releases the layer on itself, so that the
// prefetched gather of layer l+2 takes layer l's buffer while the compute
// stream may still be reading it. Every copy holds its layer's values, and
// after the first round no gather allocates.
int release_on_device_rank(const RankCtx &ctx) {
#if ZERO_TEST_CUDA
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) return kNoGpu;
  cudaSetDevice(0);
  weftComm_t comm;
  TRY_RC(init(ctx, &comm));
  weftZeroConfig_t cfg;
  weftZeroConfigDefaults(&cfg);
  cfg.stage = 3;
  cfg.memory = weftZeroDeviceMemory;
  weftZero_t z;
  FAIL_IF(weftZeroCreate(&z, comm, &cfg) != weftSuccess, "create: %s", weftZeroLastError());
  const int L = 4;
  const size_t n = 4099, busy = 512u << 20;
  std::vector<float> vals(L * n);
  for (size_t i = 0; i < vals.size(); i++) vals[i] = (float)i;
  int id;
  for (int l = 0; l < L; l++)
    FAIL_IF(weftZeroAddParam(z, l, n, vals.data() + l * n, &id) != weftSuccess, "add");
  FAIL_IF(weftZeroFinalize(z) != weftSuccess, "finalize: %s", weftZeroLastError());
  cudaStream_t gs, cs;
  void *busy_a, *busy_b;
  float *out;
  FAIL_IF(cudaStreamCreateWithFlags(&gs, cudaStreamNonBlocking) != cudaSuccess ||
              cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking) != cudaSuccess ||
              cudaMalloc(&busy_a, busy) != cudaSuccess || cudaMalloc(&busy_b, busy) != cudaSuccess ||
              cudaMallocHost((void **)&out, vals.size() * sizeof(float)) != cudaSuccess,
          "CUDA set-up");
  size_t allocs = 0;
  for (int round = 0; round < 3; round++) {
    memset(out, 0xff, vals.size() * sizeof(float));
    for (int l = 0; l < L; l++) {
      weftEvent_t ev;
      void *p;
      FAIL_IF(weftZeroGather(z, l, gs, &ev) != weftSuccess ||
                  cudaStreamWaitEvent(cs, (cudaEvent_t)ev, 0) != cudaSuccess ||
                  weftZeroParam(z, l, &p) != weftSuccess,
              "gather %d: %s", l, weftZeroLastError());
      FAIL_IF(cudaMemcpyAsync(busy_b, busy_a, busy, cudaMemcpyDeviceToDevice, cs) != cudaSuccess ||
                  cudaMemcpyAsync(out + l * n, p, n * sizeof(float), cudaMemcpyDeviceToHost,
                                  cs) != cudaSuccess,
              "copies");
      FAIL_IF(weftZeroReleaseOn(z, l, cs) != weftSuccess, "release: %s", weftZeroLastError());
    }
    FAIL_IF(cudaStreamSynchronize(cs) != cudaSuccess || cudaStreamSynchronize(gs) != cudaSuccess,
            "sync");
    FAIL_IF(memcmp(out, vals.data(), vals.size() * sizeof(float)) != 0,
            "round %d: a layer read on the compute stream was overwritten", round);
    weftZeroMemory_t r;
    weftZeroMemoryReport(z, &r);
    if (round == 0) allocs = r.gatheredAllocs;
    FAIL_IF(r.gatheredAllocs != allocs || allocs > 2, "round %d: %zu allocated, %zu at first",
            round, r.gatheredAllocs, allocs);
  }
  FAIL_IF(weftZeroDestroy(z) != weftSuccess, "destroy: %s", weftZeroLastError());
  cudaFreeHost(out);
  cudaFree(busy_a);
  cudaFree(busy_b);
  cudaStreamDestroy(gs);
  cudaStreamDestroy(cs);
  weftCommDestroy(comm);
  return 0;
#else
  (void)ctx;
  return kNoGpu;
#endif
}

// On a GPU: the gradients reduced through an fp32 copy on one stream (held
// back by a host function), the step on another. The copies add into the
// scratch that the step's statistics use, so the step waits for every
// reduction before it zeroes it: the norm is the gradient's (all ones:
// sqrt(n)), not that plus the copies' squares.
int norm_across_streams_rank(const RankCtx &ctx) {
#if ZERO_TEST_CUDA
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) return kNoGpu;
  cudaSetDevice(0);
  weftComm_t comm;
  TRY_RC(init(ctx, &comm));
  weftZeroConfig_t cfg;
  weftZeroConfigDefaults(&cfg);
  cfg.stage = 2;
  cfg.memory = weftZeroDeviceMemory;
  cfg.paramType = weftBfloat16;
  cfg.reduceType = weftFloat32;
  weftZero_t z;
  FAIL_IF(weftZeroCreate(&z, comm, &cfg) != weftSuccess, "create: %s", weftZeroLastError());
  const size_t n = 1u << 16;
  std::vector<float> init(n, 0.5f);
  int id;
  FAIL_IF(weftZeroAddParam(z, 0, n, init.data(), &id) != weftSuccess ||
              weftZeroFinalize(z) != weftSuccess,
          "register: %s", weftZeroLastError());
  cudaStream_t a, b;
  FAIL_IF(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking) != cudaSuccess ||
              cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking) != cudaSuccess,
          "streams");
  std::vector<uint16_t> ones(n, 0x3f80);  // bf16 1.0
  for (int step = 0; step < 2; step++) {
    void *g;
    FAIL_IF(weftZeroGrad(z, id, &g) != weftSuccess, "grad: %s", weftZeroLastError());
    FAIL_IF(cudaMemcpy(g, ones.data(), n * 2, cudaMemcpyHostToDevice) != cudaSuccess, "copy");
    FAIL_IF(cudaLaunchHostFunc(a, [](void *) { usleep(200000); }, nullptr) != cudaSuccess,
            "host function");
    weftZeroStepInfo_t info;
    FAIL_IF(weftZeroGradReady(z, 0, a) != weftSuccess || weftZeroStep(z, b, &info) != weftSuccess,
            "step %d: %s", step, weftZeroLastError());
    const double want = sqrt((double)n);  // every rank's ones, averaged
    FAIL_IF(fabs(info.gradNorm - want) > 1e-3 * want, "step %d: gradient norm %g, not %g", step,
            info.gradNorm, want);
  }
  FAIL_IF(weftZeroDestroy(z) != weftSuccess, "destroy: %s", weftZeroLastError());
  cudaStreamDestroy(a);
  cudaStreamDestroy(b);
  weftCommDestroy(comm);
  return 0;
#else
  (void)ctx;
  return kNoGpu;
#endif
}

TEST(ZeroDeviceCtx, StepOnAnotherStreamWaitsForTheReductionsStatistics) {
  for (int n : {1, 2}) {
    auto status = run_ranks(n, norm_across_streams_rank);
    if (status[0] == kNoGpu) GTEST_SKIP() << "no CUDA device";
    for (int r = 0; r < n; r++) EXPECT_EQ(status[r], 0) << "rank " << r << " of " << n;
  }
}

TEST(ZeroDeviceCtx, ReleaseOnOrdersGathersAfterAComputeStream) {
  for (int n : {1, 2}) {
    auto status = run_ranks(n, release_on_device_rank);
    if (status[0] == kNoGpu) GTEST_SKIP() << "no CUDA device";
    for (int r = 0; r < n; r++) EXPECT_EQ(status[r], 0) << "rank " << r << " of " << n;
  }
}

}  // namespace
