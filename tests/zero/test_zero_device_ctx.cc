// ZeRO contexts in device memory (weftZeroConfig_t.memory =
// weftZeroDeviceMemory). Everywhere: the device choice is refused with
// weftInvalidUsage and a message when weft_zero has no CUDA or the machine
// no GPU, before anything is allocated; and host contexts that take every
// branch of the device path (zero_ops_host_staged: state and statistics
// staged through copies) match plain host contexts bit for bit, and pass
// checkpoints to them and back. On a GPU: 1-4 ranks in processes
// sharing GPU 0 train the same model on a host context and on a device
// context, stages 0-3 x fp32/bf16/fp16 x AdamW/SGD, and the parameters
// after 10 steps agree within the host tests' bounds; the memory reports
// are equal and follow the formulas; checkpoints pass from device to host
// contexts and back at other rank counts and stages, bit for bit. The
// parent process never touches CUDA (a forked rank could not use it then):
// each rank looks for a GPU itself and the test skips when none has one.
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
extern "C" {
#include "zero/zero_internal.h"  // zero_ops_host_staged
}
#if ZERO_TEST_CUDA
#include <cuda_runtime_api.h>
#endif

using namespace weft_test;

namespace {

// Returns call's failure, as zero/'s own WEFT_TRY.
#define RES_TRY(call)                                 \
  do {                                                \
    weftResult_t res_ = (call);                       \
    if (res_ != weftSuccess) return res_;             \
  } while (0)

const int kNoGpu = 77;
const int kHasGpu = 78;

int init(const RankCtx &ctx, weftComm_t *comm) {
  if (weftCommInitRank(comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
    return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
  return 0;
}

// Whether this process sees a CUDA device, asked apart from weft_zero.
bool gpu_here() {
#if ZERO_TEST_CUDA
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
#else
  return false;
#endif
}

// The refusal, in a rank of its own: without a GPU (or CUDA), creating a
// device context is weftInvalidUsage saying why, the output untouched; with
// one it works (kHasGpu). An unknown memory kind is weftInvalidArgument.
int refusal_rank(const RankCtx &ctx) {
  const bool gpu = gpu_here();
  weftComm_t comm;
  TRY_RC(init(ctx, &comm));
  weftZeroConfig_t cfg;
  weftZeroConfigDefaults(&cfg);
  FAIL_IF(cfg.memory != weftZeroHostMemory, "the default memory is %d, not host", cfg.memory);
  cfg.memory = (weftZeroMemoryKind_t)7;
  weftZero_t zero = (weftZero_t)&cfg;  // a sentinel: a refusal leaves it
  weftResult_t res = weftZeroCreate(&zero, comm, &cfg);
  FAIL_IF(res != weftInvalidArgument || zero != (weftZero_t)&cfg ||
              strstr(weftZeroLastError(), "not host (0) or device (1)") == nullptr,
          "memory 7: %d, %s", res, weftZeroLastError());
  // offloading the optimizer is a device context's: a host one refuses it
  cfg.memory = weftZeroHostMemory;
  cfg.offloadOptimizer = 1;
  res = weftZeroCreate(&zero, comm, &cfg);
  FAIL_IF(res != weftInvalidUsage || zero != (weftZero_t)&cfg ||
              strstr(weftZeroLastError(), "memory is the host's already") == nullptr,
          "offload on a host context: %d, %s", res, weftZeroLastError());
  cfg.offloadOptimizer = 2;
  res = weftZeroCreate(&zero, comm, &cfg);
  FAIL_IF(res != weftInvalidArgument || zero != (weftZero_t)&cfg ||
              strstr(weftZeroLastError(), "offloadOptimizer 2 is not 0 or 1") == nullptr,
          "offloadOptimizer 2: %d, %s", res, weftZeroLastError());
  cfg.offloadOptimizer = 0;
  for (int threads : {-1, 65}) {
    cfg.offloadThreads = threads;
    res = weftZeroCreate(&zero, comm, &cfg);
    FAIL_IF(res != weftInvalidArgument || zero != (weftZero_t)&cfg ||
                strstr(weftZeroLastError(), "offloadThreads") == nullptr,
            "offloadThreads %d: %d, %s", threads, res, weftZeroLastError());
  }
  cfg.offloadThreads = 0;
  cfg.memory = weftZeroDeviceMemory;
  res = weftZeroCreate(&zero, comm, &cfg);
  if (res == weftSuccess) {
    weftZeroDestroy(zero);
    weftCommDestroy(comm);
    FAIL_IF(!gpu, "a device context was made without a GPU or CUDA");
    return kHasGpu;
  }
  FAIL_IF(gpu, "a GPU is here, but the device context was refused: %s", weftZeroLastError());
  const char *why = weftZeroLastError();
  FAIL_IF(res != weftInvalidUsage || zero != (weftZero_t)&cfg, "device memory: %d, %s", res, why);
  FAIL_IF(strstr(why, ZERO_TEST_CUDA ? "no CUDA device is visible" : "built without CUDA") ==
              nullptr,
          "the refusal does not say why: %s", why);
  weftCommDestroy(comm);
  return 0;
}

TEST(ZeroDeviceCtx, RefusedWithoutCudaOrAGpu) {
  for (int n : {1, 2}) {
    auto status = run_ranks(n, refusal_rank);
    if (status[0] == kHasGpu) GTEST_SKIP() << "a GPU is here: device contexts are not refused";
    for (int r = 0; r < n; r++) EXPECT_EQ(status[r], 0) << "rank " << r << " of " << n;
  }
}

// The device table's CUDA failures, without a GPU (a rank of its own): each
// is an error code with what was being done and the runtime's text, never a
// crash; a build without CUDA says it has none.
int device_ops_rank(const RankCtx &ctx) {
  if (gpu_here()) return kHasGpu;
  const weftResult_t want = ZERO_TEST_CUDA ? weftUnhandledCudaError : weftInvalidUsage;
  const struct zero_ops *ops = &zero_ops_device;
  void *p = (void *)&ctx;  // a sentinel: a failed allocation leaves it
  weftResult_t res = ops->alloc(&p, 64);
  FAIL_IF(res != want || p != (void *)&ctx, "alloc: %d", res);
  FAIL_IF(ZERO_TEST_CUDA && strstr(weftZeroLastError(), "allocating 64 bytes of device memory: ") ==
                                nullptr,
          "alloc's message: %s", weftZeroLastError());
  weftEvent_t ev = nullptr;
  res = ops->event_create(&ev);
  FAIL_IF(res != want || ev != nullptr, "event create: %d", res);
  FAIL_IF(ZERO_TEST_CUDA && strstr(weftZeroLastError(), "creating a CUDA event: ") == nullptr,
          "event's message: %s", weftZeroLastError());
  res = ops->sync(nullptr, nullptr, "finishing the reductions");
  FAIL_IF(res != want || strstr(weftZeroLastError(), "finishing the reductions: ") == nullptr,
          "sync: %d, %s", res, weftZeroLastError());
  float f = 0;
  res = ops->store(&f, weftFloat32, &f, 1, nullptr);
  FAIL_IF(res == weftSuccess, "a kernel launched without a GPU");
  // pinned host memory (an offloaded optimizer's) asks the runtime too
  p = (void *)&ctx;
  res = zero_ops_pinned.alloc(&p, 64);
  FAIL_IF(res != want || p != (void *)&ctx, "pinned alloc: %d", res);
  FAIL_IF(ZERO_TEST_CUDA &&
              strstr(weftZeroLastError(), "allocating 64 bytes of pinned host memory: ") == nullptr,
          "pinned alloc's message: %s", weftZeroLastError());
  return 0;
}

TEST(ZeroDeviceCtx, DeviceTableFailuresAreErrorsWithText) {
  auto status = run_ranks(1, device_ops_rank);
  if (status[0] == kHasGpu) GTEST_SKIP() << "a GPU is here: these calls succeed";
  EXPECT_EQ(status[0], 0);
}

// The model: three layers of odd sizes (padding on every rank count), the
// gradient of each element pulling it towards a target, plus a term that
// differs by rank and step so that the reductions matter.
const size_t kParams[] = {37, 1, 129, 6, 1001};
const int kLayerOf[] = {0, 0, 1, 1, 2};
const int kParamsN = 5, kLayers = 3;

// Where a context's state lives: host memory, host memory through the
// device path's branches, or a GPU.
// kStagedOffload: a staged context with its optimizer state offloaded to
// plain host memory (the pinned kind's work, without CUDA's allocator);
// kDeviceOffload: a device context with offloadOptimizer.
enum Kind { kHost, kStaged, kDevice, kStagedOffload, kDeviceOffload };
const char *kind_name(Kind k) {
  static const char *const names[] = {"host", "staged", "device", "staged_offload",
                                      "device_offload"};
  return names[k];
}
bool on_device(Kind k) { return k == kDevice || k == kDeviceOffload; }
bool staged(Kind k) { return k == kStaged || k == kStagedOffload; }

struct Case {
  int stage;
  weftDataType_t type;
  weftZeroOptimizer_t opt;
  int accum = 1; // micro-steps a step
  int every = 0; // reduceEveryMicroStep
};

std::string case_text(const Case &c) {
  const char *t = c.type == weftFloat32 ? "fp32" : c.type == weftBfloat16 ? "bf16" : "fp16";
  std::string text = "stage " + std::to_string(c.stage) + " " + t + " " +
                     (c.opt == weftZeroAdamW ? "adamw" : "sgd");
  if (c.accum > 1)
    text += ", " + std::to_string(c.accum) + " micro-steps" + (c.every ? " each reduced" : "");
  return text;
}

// Reads and writes context memory from the host: plain copies, or
// cudaMemcpy for a device context, whose failure (an earlier kernel's
// fault, say) is printed with the runtime's text and returned.
struct Access {
  bool dev;
  weftResult_t copy(void *dst, const void *src, size_t nbytes, bool to_dev) const {
#if ZERO_TEST_CUDA
    if (dev) {
      cudaError_t err =
          cudaMemcpy(dst, src, nbytes, to_dev ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost);
      if (err == cudaSuccess) return weftSuccess;
      fprintf(stderr, "cudaMemcpy of %zu bytes: %s\n", nbytes, cudaGetErrorString(err));
      return weftUnhandledCudaError;
    }
#endif
    (void)to_dev;
    memcpy(dst, src, nbytes);
    return weftSuccess;
  }
  weftResult_t get(void *dst, const void *src, size_t nbytes) const {
    return copy(dst, src, nbytes, false);
  }
  weftResult_t put(void *dst, const void *src, size_t nbytes) const {
    return copy(dst, src, nbytes, true);
  }
  weftResult_t wait(weftEvent_t ev) const {
#if ZERO_TEST_CUDA
    if (dev) {
      cudaError_t err = cudaEventSynchronize((cudaEvent_t)ev);
      if (err == cudaSuccess) return weftSuccess;
      fprintf(stderr, "waiting for a gather: %s\n", cudaGetErrorString(err));
      return weftUnhandledCudaError;
    }
#endif
    return weftEventSynchronize(ev);
  }
};

struct Run {
  std::vector<float> params;
  weftZeroMemory_t mem;
  long steps;
};

weftZeroConfig_t case_config(const Case &c, Kind kind) {
  weftZeroConfig_t cfg;
  weftZeroConfigDefaults(&cfg);
  cfg.stage = c.stage;
  cfg.paramType = c.type;
  cfg.reduceType = c.type == weftFloat16 ? weftFloat32 : c.type;  // both paths of a copy
  cfg.optimizer = c.opt;
  cfg.lr = c.opt == weftZeroAdamW ? 1e-2 : 5e-2;
  cfg.weightDecay = 0.01;
  cfg.maxGradNorm = 0.5;
  cfg.bucketBytes = 512;  // several stage 0 buckets; stage 2-3 buckets wait
  cfg.memory = on_device(kind) ? weftZeroDeviceMemory : weftZeroHostMemory;
  cfg.offloadOptimizer = kind == kDeviceOffload;
  cfg.accumSteps = c.accum;
  cfg.reduceEveryMicroStep = c.every;
  return cfg;
}

// This step's gradient of one parameter (times the loss scale) from its values.
void case_grad(const float *w, size_t n, int p, int step, int rank, double scale, float *g) {
  for (size_t i = 0; i < n; i++) {
    double target = 0.3 * cos(0.11 * (double)(i + 17 * p));
    double noise = 0.02 * sin((double)i + 7.0 * step + 13.0 * rank + p);
    g[i] = (float)(((w[i] - target) * (1.0 + 0.1 * rank) + noise) * scale);
  }
}

// One micro-step: gather each layer, compute the gradients from its values,
// then add them (last layer first) and mark each layer ready.
weftResult_t case_micro(weftZero_t zero, const Access &a, const Case &c, int rank, int step,
                        const int *ids, void *stream) {
  std::vector<std::vector<float>> grads(kParamsN);
  size_t ts = weftTypeSize(c.type);
  double scale = weftZeroLossScale(zero);
  for (int l = 0; l < kLayers; l++) {
    weftEvent_t ev;
    RES_TRY(weftZeroGather(zero, l, stream, &ev));
    RES_TRY(a.wait(ev));
    for (int p = 0; p < kParamsN; p++) {
      if (kLayerOf[p] != l) continue;
      void *ptr;
      RES_TRY(weftZeroParam(zero, ids[p], &ptr));
      std::vector<char> raw(kParams[p] * ts);
      std::vector<float> w(kParams[p]);
      RES_TRY(a.get(raw.data(), ptr, raw.size()));
      weftZeroToFloat(raw.data(), c.type, w.data(), kParams[p]);
      grads[p].resize(kParams[p]);
      case_grad(w.data(), kParams[p], p, step, rank, scale, grads[p].data());
    }
    RES_TRY(weftZeroRelease(zero, l));
  }
  for (int l = kLayers - 1; l >= 0; l--) {
    for (int p = 0; p < kParamsN; p++) {
      if (kLayerOf[p] != l) continue;
      void *ptr;
      RES_TRY(weftZeroGrad(zero, ids[p], &ptr));
      std::vector<char> raw(kParams[p] * ts);
      RES_TRY(a.get(raw.data(), ptr, raw.size()));
      weftZeroAccumulate(raw.data(), c.type, grads[p].data(), kParams[p]);
      RES_TRY(a.put(ptr, raw.data(), raw.size()));
    }
    RES_TRY(weftZeroGradReady(zero, l, stream));
  }
  return weftSuccess;
}

// One step of c.accum micro-steps, each with its own noise.
weftResult_t case_step(weftZero_t zero, const Access &a, const Case &c, int rank, int step,
                       const int *ids, void *stream) {
  for (int micro = 0; micro < c.accum; micro++) {
    RES_TRY(weftZeroSetSync(zero, micro == c.accum - 1));
    RES_TRY(case_micro(zero, a, c, rank, step * c.accum + micro, ids, stream));
  }
  return weftZeroStep(zero, stream, nullptr);
}

// Trains the model for steps (after loading load_dir when given), then reads
// the parameters and the memory report and saves to save_dir when given.
weftResult_t case_train(weftComm_t comm, void *stream, Kind kind, const Case &c, int steps,
                        Run *out, const char *load_dir = nullptr,
                        const char *save_dir = nullptr) {
  weftZeroConfig_t cfg = case_config(c, kind);
  Access a{on_device(kind)};
  int rank;
  weftCommUserRank(comm, &rank);
  weftZero_t zero;
  RES_TRY(weftZeroCreate(&zero, comm, &cfg));
  if (staged(kind)) zero->ops = &zero_ops_host_staged;
  if (kind == kStagedOffload) {
    zero->cfg.offloadOptimizer = 1;
    zero->offload_ops = &zero_ops_host;
  }
  int ids[kParamsN];
  size_t psi = 0;
  weftResult_t res = weftSuccess;
  for (int p = 0; p < kParamsN && res == weftSuccess; p++) {
    std::vector<float> init(kParams[p]);
    for (size_t i = 0; i < kParams[p]; i++) init[i] = (float)(0.5 * sin(0.37 * (double)i + p));
    res = weftZeroAddParam(zero, kLayerOf[p], kParams[p], init.data(), &ids[p]);
    psi += kParams[p];
  }
  if (res == weftSuccess) res = weftZeroFinalize(zero);
#if ZERO_TEST_CUDA
  // where the state is: the device's, or pinned host memory when offloaded
  if (res == weftSuccess && on_device(kind)) {
    const cudaMemoryType want = kind == kDeviceOffload ? cudaMemoryTypeHost : cudaMemoryTypeDevice;
    const void *state_bufs[] = {zero->master, zero->moment1,   zero->moment2,
                                zero->off_grad, zero->off_stage, zero->off_params};
    const void *all_bufs[] = {zero->master,      zero->moment1,      zero->moment2,
                              zero->off_grad,    zero->off_stage,    zero->off_params,
                              zero->params_full, zero->params_shard, zero->grads_full,
                              zero->grad_shard};
    for (const void *p : all_bufs) {
      cudaPointerAttributes at;
      if (p == nullptr) continue;
      bool state = false;
      for (const void *q : state_bufs) state = state || p == q;
      if (cudaPointerGetAttributes(&at, p) != cudaSuccess ||
          at.type != (state ? want : cudaMemoryTypeDevice)) {
        fprintf(stderr, "%s: a buffer is in memory of type %d\n", kind_name(kind), (int)at.type);
        res = weftInternalError;
      }
    }
  }
#endif
  if (res == weftSuccess && load_dir != nullptr) res = weftZeroLoad(zero, load_dir, stream);
  for (long s = weftZeroStepCount(zero); res == weftSuccess && s < steps; s++)
    res = case_step(zero, a, c, rank, (int)s, ids, stream);
  out->params.assign(psi, NAN);
  if (res == weftSuccess) res = weftZeroGetParams(zero, out->params.data(), stream);
  if (res == weftSuccess) res = weftZeroMemoryReport(zero, &out->mem);
  out->steps = weftZeroStepCount(zero);
  if (res == weftSuccess && save_dir != nullptr) res = weftZeroSave(zero, save_dir, stream);
  weftResult_t destroyed = weftZeroDestroy(zero);
  return res != weftSuccess ? res : destroyed;
}

// The largest difference relative to a's largest magnitude; infinite when
// the sizes differ or either holds a NaN or an infinity (the model's
// parameters stay finite, and a NaN on both sides must not compare equal).
double rel_diff(const std::vector<float> &a, const std::vector<float> &b) {
  if (a.size() != b.size() || a.empty()) return INFINITY;
  double diff = 0, mag = 0;
  for (size_t i = 0; i < a.size(); i++) {
    if (!isfinite(a[i]) || !isfinite(b[i])) return INFINITY;
    diff = fmax(diff, fabs((double)a[i] - b[i]));
    mag = fmax(mag, fabs((double)a[i]));
  }
  return diff / fmax(mag, 1e-30);
}

// Staged host contexts run the same arithmetic on the same data: bit for
// bit. Device contexts: the host tests' bounds (tests/zero/test_zero_train.cc,
// docs/zero.md), as the norm's sum of squares is added in another order.
double case_tolerance(Kind kind, const Case &c, const std::vector<float> &ref, int steps) {
  if (staged(kind)) return 0;
  if (c.type == weftFloat32) return 1e-6;
  if (c.type == weftFloat16) return 1e-3;  // reduced in fp32
  if (c.opt == weftZeroSgdMomentum) return 1e-2;
  double mag = 0;
  for (float v : ref) mag = fmax(mag, fabs(v));
  return 2 * 1e-2 * steps / mag;  // bf16 reduced in bf16, AdamW: 2 lr steps absolute
}

// This rank's communicators and streams: a host communicator and stream;
// with a GPU (device kinds), GPU 0, a device communicator split from the
// host one and a CUDA stream. open returns 0, kNoGpu or a failure.
struct RankEnv {
  weftComm_t host = nullptr, dev = nullptr;
  weftStream_t hstream = nullptr;
  void *dstream = nullptr;
  int open(const RankCtx &ctx, bool gpu) {
#if ZERO_TEST_CUDA
    int ndev = 0;
    if (gpu && (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0)) return kNoGpu;
    if (gpu) cudaSetDevice(0);
#else
    if (gpu) return kNoGpu;
#endif
    TRY_RC(init(ctx, &host));
    FAIL_IF(weftStreamCreate(&hstream) != weftSuccess, "host stream");
    if (!gpu) return 0;
    FAIL_IF(weftCommSplit(host, 0, ctx.rank, &dev, nullptr) != weftSuccess, "split: %s",
            weftGetLastError(host));
#if ZERO_TEST_CUDA
    FAIL_IF(cudaStreamCreate((cudaStream_t *)&dstream) != cudaSuccess, "CUDA stream");
#endif
    return 0;
  }
  weftComm_t comm(Kind k) const { return on_device(k) ? dev : host; }
  void *stream(Kind k) const { return on_device(k) ? dstream : hstream; }
  ~RankEnv() {
    if (hstream != nullptr) weftStreamDestroy(hstream);
#if ZERO_TEST_CUDA
    if (dstream != nullptr) cudaStreamDestroy((cudaStream_t)dstream);
#endif
    if (dev != nullptr) weftCommDestroy(dev);
    if (host != nullptr) weftCommDestroy(host);
  }
};

// The report's fixed parts and stage 3's gathered peak (prefetch and release
// decide it, alike on both); the buckets' peak depends on when reductions
// finish, so it may differ.
bool same_memory(const weftZeroMemory_t &a, const weftZeroMemory_t &b) {
  return a.psi == b.psi && a.psiPadded == b.psiPadded && a.params == b.params &&
         a.grads == b.grads && a.optimizer == b.optimizer && a.gatheredPeak == b.gatheredPeak;
}

// Every case on one rank count: a context of kind against a host one.
int match_rank(const RankCtx &ctx, Kind kind) {
  RankEnv e;
  TRY_RC(e.open(ctx, on_device(kind)));
  const int steps = 10;
  std::vector<Case> cases;
  for (int stage = 0; stage <= 3; stage++)
    for (weftDataType_t t : {weftFloat32, weftBfloat16, weftFloat16})
      for (weftZeroOptimizer_t opt : {weftZeroAdamW, weftZeroSgdMomentum})
        cases.push_back({stage, t, opt});
  // accumulation, summed locally or reduced every micro-step (stages 2-3:
  // the device's add, the offloaded copy behind the last reduction)
  cases.push_back({2, weftBfloat16, weftZeroAdamW, 3, 1});
  cases.push_back({3, weftFloat16, weftZeroSgdMomentum, 2, 1});
  cases.push_back({3, weftFloat32, weftZeroAdamW, 2, 1});
  cases.push_back({2, weftFloat32, weftZeroSgdMomentum, 2, 0});
  for (const Case &c : cases) {
    const int stage = c.stage;
    const weftDataType_t t = c.type;
    const weftZeroOptimizer_t opt = c.opt;
    std::string what = case_text(c) + ", " + kind_name(kind);
    Run h, d;
    FAIL_IF(case_train(e.host, e.hstream, kHost, c, steps, &h) != weftSuccess,
            "%s: host: %s", what.c_str(), weftZeroLastError());
    FAIL_IF(case_train(e.comm(kind), e.stream(kind), kind, c, steps, &d) != weftSuccess,
            "%s: %s", what.c_str(), weftZeroLastError());
    double diff = rel_diff(h.params, d.params), tol = case_tolerance(kind, c, h.params, steps);
    FAIL_IF(!(diff <= tol), "%s: differs from host by %.3g (bound %.3g)", what.c_str(), diff,
            tol);
    FAIL_IF(h.steps != steps || d.steps != steps, "%s: %ld and %ld steps", what.c_str(),
            h.steps, d.steps);
    // the same training as summing locally, within rounding, where the sums
    // are in one type (reduced in fp32, the shard sums the micro-steps in
    // fp32 where the local sum's fp16 buffer overflowed: a step skipped)
    if (c.every && case_config(c, kHost).reduceType == c.type) {
      Case local = c;
      local.every = 0;
      Run l;
      FAIL_IF(case_train(e.host, e.hstream, kHost, local, steps, &l) != weftSuccess,
              "%s: host, summed locally: %s", what.c_str(), weftZeroLastError());
      double dl = rel_diff(l.params, h.params), tl = case_tolerance(kDevice, c, l.params, steps);
      FAIL_IF(!(dl <= tl), "%s: differs from summing locally by %.3g (bound %.3g)", what.c_str(),
              dl, tl);
    }
    // the formulas count gradient shards in paramType: fp16 reduces in fp32 here
    size_t formula = weftZeroMemoryFormula(stage, d.mem.psiPadded, ctx.nranks, t, opt);
    FAIL_IF(case_config(c, kind).reduceType == t &&
                d.mem.params + d.mem.grads + d.mem.optimizer != formula,
            "%s: holds %zu + %zu + %zu bytes, the formula says %zu", what.c_str(),
            d.mem.params, d.mem.grads, d.mem.optimizer, formula);
    FAIL_IF(!same_memory(h.mem, d.mem), "%s: the report differs from the host's",
            what.c_str());
    // offloaded: the state, and of staging 8 bytes an owned element and
    // its parameter
    const bool off = kind == kStagedOffload || kind == kDeviceOffload;
    const size_t own = d.mem.optimizer / (4 * (opt == weftZeroAdamW ? 3 : 2));
    const size_t staging = (8 + weftTypeSize(t)) * own;
    FAIL_IF(d.mem.offloaded != (off ? d.mem.optimizer + staging : 0) || h.mem.offloaded != 0,
            "%s: %zu bytes offloaded (optimizer %zu), the host context %zu", what.c_str(),
            d.mem.offloaded, d.mem.optimizer, h.mem.offloaded);
  }
  return 0;
}

// The offloaded update on several threads: a model large enough that the
// owned range splits into parts (64K elements a part at least), odd sizes so
// that the parts' ends fall mid-layer, trained as a staged context with its
// state offloaded on 1, 3, 4 and 7 threads and as a plain host context; the
// parameters agree bit for bit (the update is elementwise). The sizes make
// the owned ranges (431234 elements at stage 0, 215617 at stages 1-3 on 2
// ranks) split unevenly where an even share rounds down to whole lines (3
// and 4 threads at every stage), so that a split that drops the range's
// tail leaves parameters the host context updates.
weftResult_t threads_train(weftComm_t comm, weftStream_t stream, const Case &c, int threads,
                           std::vector<float> *out) {
  const size_t sizes[] = {300007, 131075, 149};
  weftZeroConfig_t cfg = case_config(c, kHost);
  cfg.bucketBytes = 1 << 20;
  weftZero_t zero;
  RES_TRY(weftZeroCreate(&zero, comm, &cfg));
  if (threads > 0) {
    zero->ops = &zero_ops_host_staged;
    zero->cfg.offloadOptimizer = 1;
    zero->cfg.offloadThreads = threads;
    zero->offload_ops = &zero_ops_host;
  }
  int rank;
  weftCommUserRank(comm, &rank);
  int ids[3];
  size_t psi = 0;
  weftResult_t res = weftSuccess;
  for (int p = 0; p < 3 && res == weftSuccess; p++) {
    std::vector<float> init(sizes[p]);
    for (size_t i = 0; i < sizes[p]; i++) init[i] = (float)(0.5 * sin(0.37 * (double)i + p));
    res = weftZeroAddParam(zero, p, sizes[p], init.data(), &ids[p]);
    psi += sizes[p];
  }
  if (res == weftSuccess) res = weftZeroFinalize(zero);
  for (int step = 0; step < 3 && res == weftSuccess; step++) {
    std::vector<std::vector<float>> grads(3);
    for (int l = 0; l < 3 && res == weftSuccess; l++) {
      weftEvent_t ev;
      void *ptr;
      res = weftZeroGather(zero, l, stream, &ev);
      if (res == weftSuccess) res = weftEventSynchronize(ev);
      if (res == weftSuccess) res = weftZeroParam(zero, ids[l], &ptr);
      if (res != weftSuccess) break;
      std::vector<float> w(sizes[l]);
      weftZeroToFloat(ptr, c.type, w.data(), sizes[l]);
      grads[l].resize(sizes[l]);
      case_grad(w.data(), sizes[l], l, step, rank, weftZeroLossScale(zero), grads[l].data());
      res = weftZeroRelease(zero, l);
    }
    for (int l = 2; l >= 0 && res == weftSuccess; l--) {
      void *ptr;
      res = weftZeroGrad(zero, ids[l], &ptr);
      if (res == weftSuccess) weftZeroAccumulate(ptr, c.type, grads[l].data(), sizes[l]);
      if (res == weftSuccess) res = weftZeroGradReady(zero, l, stream);
    }
    if (res == weftSuccess) res = weftZeroStep(zero, stream, nullptr);
  }
  out->assign(psi, NAN);
  if (res == weftSuccess) res = weftZeroGetParams(zero, out->data(), stream);
  weftResult_t destroyed = weftZeroDestroy(zero);
  return res != weftSuccess ? res : destroyed;
}

int threads_rank(const RankCtx &ctx) {
  RankEnv e;
  TRY_RC(e.open(ctx, false));
  for (Case c : {Case{1, weftFloat32, weftZeroAdamW}, Case{3, weftBfloat16, weftZeroSgdMomentum},
                 Case{0, weftFloat16, weftZeroAdamW}}) {
    std::vector<float> host, off;
    FAIL_IF(threads_train(e.host, e.hstream, c, 0, &host) != weftSuccess, "%s, host: %s",
            case_text(c).c_str(), weftZeroLastError());
    for (int threads : {1, 3, 4, 7}) {
      FAIL_IF(threads_train(e.host, e.hstream, c, threads, &off) != weftSuccess,
              "%s, %d threads: %s", case_text(c).c_str(), threads, weftZeroLastError());
      FAIL_IF(memcmp(host.data(), off.data(), host.size() * sizeof(float)) != 0,
              "%s, offloaded on %d threads: differs from the host context", case_text(c).c_str(),
              threads);
    }
  }
  return 0;
}

TEST(ZeroDeviceCtx, OffloadThreadsChangeNoBit) {
  RunOptions opts;
  opts.timeout_s = 120;
  auto status = run_ranks(2, threads_rank, opts);
  for (size_t r = 0; r < status.size(); r++) EXPECT_EQ(status[r], 0) << "rank " << r;
}

struct MatchCase {
  Kind kind;
  int nranks;
};

class ZeroDeviceCtxMatch : public testing::TestWithParam<MatchCase> {};

TEST_P(ZeroDeviceCtxMatch, TenStepsMatchTheHost) {
  MatchCase m = GetParam();
  RunOptions opts;
  opts.timeout_s = 170;
  opts.env = {{"WEFT_TIMEOUT", "30"}};
  auto status = run_ranks(m.nranks, [m](const RankCtx &ctx) { return match_rank(ctx, m.kind); },
                          opts);
  if (status[0] == kNoGpu) GTEST_SKIP() << "no CUDA device";
  for (size_t r = 0; r < status.size(); r++) EXPECT_EQ(status[r], 0) << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(Kinds, ZeroDeviceCtxMatch,
                         testing::Values(MatchCase{kStaged, 1}, MatchCase{kStaged, 2},
                                         MatchCase{kStaged, 3}, MatchCase{kStaged, 4},
                                         MatchCase{kStagedOffload, 1},
                                         MatchCase{kStagedOffload, 2},
                                         MatchCase{kStagedOffload, 3},
                                         MatchCase{kDevice, 1}, MatchCase{kDevice, 2},
                                         MatchCase{kDevice, 3}, MatchCase{kDevice, 4},
                                         MatchCase{kDeviceOffload, 1},
                                         MatchCase{kDeviceOffload, 2},
                                         MatchCase{kDeviceOffload, 3}),
                         [](const testing::TestParamInfo<MatchCase> &i) {
                           return std::string(kind_name(i.param.kind)) + "_" +
                                  std::to_string(i.param.nranks) + "ranks";
                         });

// A checkpoint's side: trains (or only loads, with steps 0) on a context of
// a kind, then writes the step count and parameters to dir/params-<tag>.bin
// from rank 0.
struct CkptSide {
  Kind kind;
  Case c;
  int steps;
  const char *load, *save, *tag;
};

int ckpt_rank(const RankCtx &ctx, const CkptSide &s, bool gpu, const std::string &dir) {
  RankEnv e;
  TRY_RC(e.open(ctx, gpu));
  Run r;
  std::string load = s.load ? dir + "/" + s.load : "", save = s.save ? dir + "/" + s.save : "";
  weftResult_t res = case_train(e.comm(s.kind), e.stream(s.kind), s.kind, s.c, s.steps, &r,
                                s.load ? load.c_str() : nullptr, s.save ? save.c_str() : nullptr);
  FAIL_IF(res != weftSuccess, "%s, %s: %s", case_text(s.c).c_str(), kind_name(s.kind),
          weftZeroLastError());
  if (ctx.rank != 0) return 0;
  FILE *f = fopen((dir + "/params-" + s.tag + ".bin").c_str(), "wb");
  FAIL_IF(f == nullptr, "cannot write params");
  fwrite(&r.steps, sizeof r.steps, 1, f);
  fwrite(r.params.data(), sizeof(float), r.params.size(), f);
  fclose(f);
  return 0;
}

std::vector<char> slurp(const std::string &path) {
  std::vector<char> v;
  FILE *f = fopen(path.c_str(), "rb");
  if (f == nullptr) return v;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, f)) > 0;) v.insert(v.end(), buf, buf + n);
  fclose(f);
  return v;
}

// Saved by one side at one rank count, loaded by the other at another: the
// loaded parameters and step count equal the saved ones bit for bit.
void ckpt_across(int n_save, const CkptSide &save, int n_load, const CkptSide &load) {
  bool gpu = on_device(save.kind) || on_device(load.kind);
  char templ[] = "/tmp/weft-zero-devckpt-XXXXXX";
  ASSERT_NE(mkdtemp(templ), nullptr);
  std::string dir = templ;
  RunOptions opts;
  opts.timeout_s = 120;
  auto st = run_ranks(
      n_save, [&](const RankCtx &ctx) { return ckpt_rank(ctx, save, gpu, dir); }, opts);
  if (st[0] == kNoGpu) {
    rmdir(templ);
    GTEST_SKIP() << "no CUDA device";
  }
  for (int r = 0; r < n_save; r++) ASSERT_EQ(st[r], 0) << "saving, rank " << r;
  st = run_ranks(
      n_load, [&](const RankCtx &ctx) { return ckpt_rank(ctx, load, gpu, dir); }, opts);
  for (int r = 0; r < n_load; r++) ASSERT_EQ(st[r], 0) << "loading, rank " << r;
  std::vector<char> a = slurp(dir + "/params-" + save.tag + ".bin");
  std::vector<char> b = slurp(dir + "/params-" + load.tag + ".bin");
  ASSERT_EQ(a.size(), sizeof(long) + 1174 * sizeof(float));
  EXPECT_EQ(a, b) << "the loaded parameters or step differ from the saved ones";
  std::string rm = "rm -rf '" + dir + "'";
  EXPECT_EQ(system(rm.c_str()), 0);
}

// Each test passes a checkpoint one way between two kinds, at other rank
// counts, stages, types and optimizers.
struct CkptCase {
  const char *name;
  int n_save;
  CkptSide save;
  int n_load;
  CkptSide load;
};

const Case kS3f32{3, weftFloat32, weftZeroAdamW}, kS1f32{1, weftFloat32, weftZeroAdamW};
const Case kS2bf16{2, weftBfloat16, weftZeroSgdMomentum}, kS0bf16{0, weftBfloat16, weftZeroSgdMomentum};
const Case kS1fp16{1, weftFloat16, weftZeroAdamW}, kS3fp16{3, weftFloat16, weftZeroAdamW};

class ZeroDeviceCtxCkpt : public testing::TestWithParam<CkptCase> {};

TEST_P(ZeroDeviceCtxCkpt, LoadsBitForBit) {
  const CkptCase &c = GetParam();
  ckpt_across(c.n_save, c.save, c.n_load, c.load);
}

INSTANTIATE_TEST_SUITE_P(
    Ways, ZeroDeviceCtxCkpt,
    testing::Values(
        CkptCase{"staged_s3_3_to_host_s1_2", 3, {kStaged, kS3f32, 4, nullptr, "ck", "a"}, 2,
                 {kHost, kS1f32, 0, "ck", nullptr, "b"}},
        CkptCase{"host_s2_2_to_staged_s0_4", 2, {kHost, kS2bf16, 3, nullptr, "ck", "a"}, 4,
                 {kStaged, kS0bf16, 0, "ck", nullptr, "b"}},
        CkptCase{"device_s3_3_to_host_s1_2", 3, {kDevice, kS3f32, 4, nullptr, "ck", "a"}, 2,
                 {kHost, kS1f32, 0, "ck", nullptr, "b"}},
        CkptCase{"host_s2_2_to_device_s0_4", 2, {kHost, kS2bf16, 3, nullptr, "ck", "a"}, 4,
                 {kDevice, kS0bf16, 0, "ck", nullptr, "b"}},
        CkptCase{"device_s1_4_to_device_s3_1", 4, {kDevice, kS1fp16, 5, nullptr, "ck", "a"}, 1,
                 {kDevice, kS3fp16, 0, "ck", nullptr, "b"}},
        CkptCase{"staged_offload_s2_3_to_host_s3_2", 3,
                 {kStagedOffload, kS2bf16, 4, nullptr, "ck", "a"}, 2,
                 {kHost, {3, weftBfloat16, weftZeroSgdMomentum}, 0, "ck", nullptr, "b"}},
        CkptCase{"device_offload_s3_2_to_device_s1_3", 2,
                 {kDeviceOffload, kS3fp16, 4, nullptr, "ck", "a"}, 3,
                 {kDevice, kS1fp16, 0, "ck", nullptr, "b"}},
        CkptCase{"device_s0_2_to_device_offload_s2_3", 2,
                 {kDevice, kS0bf16, 3, nullptr, "ck", "a"}, 3,
                 {kDeviceOffload, {2, weftBfloat16, weftZeroSgdMomentum}, 0, "ck", nullptr,
                  "b"}}),
    [](const testing::TestParamInfo<CkptCase> &i) { return std::string(i.param.name); });

}  // namespace
