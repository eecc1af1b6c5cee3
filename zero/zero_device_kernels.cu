// The kernels of a device ZeRO context (zero_device.h): grid-stride loops
// over zero_math.h's per-element arithmetic, one launch per call on the
// caller's stream. Built with -fmad=false so that results equal the host's.
#include <cuda_runtime.h>

#include <utility>

#include "zero_device.h"
#include "zero_math.h"

namespace {

constexpr int kThreads = 256;
constexpr size_t kMaxBlocks = 4096;

unsigned blocks_for(size_t count) {
  size_t b = (count + kThreads - 1) / kThreads;
  return (unsigned)(b < kMaxBlocks ? b : kMaxBlocks);
}

__device__ float load_kind(const void *src, int kind, size_t i) {
  if (kind == 1) return zero_bf16_to_f32(((const uint16_t *)src)[i]);
  if (kind == 2) return zero_fp16_to_f32(((const uint16_t *)src)[i]);
  return ((const float *)src)[i];
}

__device__ void store_kind(void *dst, int kind, size_t i, float v) {
  if (kind == 1) ((uint16_t *)dst)[i] = zero_bf16_from_f32(v);
  else if (kind == 2) ((uint16_t *)dst)[i] = zero_fp16_from_f32(v);
  else ((float *)dst)[i] = v;
}

#define GRID_STRIDE(i, count)                                                        \
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (count);       \
       i += (size_t)gridDim.x * blockDim.x)

// Each block sums its threads' non-finite counts and squares in shared
// memory, then one thread adds the block's sums to stats.
__global__ void load_scaled_kernel(const void *src, int kind, float *dst, size_t count,
                                   double scale, double *stats) {
  struct shared_sums {
    double nonfinite[kThreads], sumsq[kThreads];
  };
#ifdef WEFT_CUDA_EMU
  shared_sums &sh = *static_cast<shared_sums *>(cuda_emu_shared(sizeof(shared_sums)));
#else
  __shared__ shared_sums sh;
#endif
  double *nonfinite = sh.nonfinite, *sumsq = sh.sumsq;
  double nf = 0, sq = 0;
  GRID_STRIDE(i, count) {
    float v = (float)((double)load_kind(src, kind, i) * scale);
    if (!isfinite(v)) nf += 1;
    sq += (double)v * v;
    dst[i] = v;
  }
  nonfinite[threadIdx.x] = nf;
  sumsq[threadIdx.x] = sq;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if ((int)threadIdx.x < half) {
      nonfinite[threadIdx.x] += nonfinite[threadIdx.x + half];
      sumsq[threadIdx.x] += sumsq[threadIdx.x + half];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    atomicAdd(&stats[0], nonfinite[0]);
    atomicAdd(&stats[1], sumsq[0]);
  }
}

__global__ void store_kernel(const float *src, int kind, void *dst, size_t count) {
  GRID_STRIDE(i, count) store_kind(dst, kind, i, src[i]);
}

__global__ void accumulate_kernel(void *dst, int kind, const float *src, size_t count) {
  GRID_STRIDE(i, count) store_kind(dst, kind, i, load_kind(dst, kind, i) + src[i]);
}

__global__ void add_kernel(void *dst, int kind, const void *src, size_t count) {
  GRID_STRIDE(i, count) store_kind(dst, kind, i, load_kind(dst, kind, i) + load_kind(src, kind, i));
}

__global__ void scale_kernel(float *g, size_t count, float factor) {
  GRID_STRIDE(i, count) g[i] *= factor;
}

__global__ void adamw_kernel(float *p, float *m, float *v, const float *g, size_t count,
                             zero_adamw_coef coef) {
  GRID_STRIDE(i, count) zero_adamw_elem(&p[i], &m[i], &v[i], g[i], &coef);
}

__global__ void sgd_kernel(float *p, float *m, const float *g, size_t count, float mu, float lr,
                           float wd) {
  GRID_STRIDE(i, count) zero_sgd_elem(&p[i], &m[i], g[i], mu, lr, wd);
}

#ifdef WEFT_CUDA_EMU // the host build for tests (tests/device/cuda_emu)
// a block's threads share its sums (fewer threads than kThreads leave the
// rest zero); the others are one thread per index
CUDA_EMU_KERNEL(&load_scaled_kernel)
CUDA_EMU_KERNEL_APART(&store_kernel)
CUDA_EMU_KERNEL_APART(&accumulate_kernel)
CUDA_EMU_KERNEL_APART(&add_kernel)
CUDA_EMU_KERNEL_APART(&scale_kernel)
CUDA_EMU_KERNEL_APART(&adamw_kernel)
CUDA_EMU_KERNEL_APART(&sgd_kernel)
#endif

// One launch of kernel over count elements on stream, returning the
// launch's own status (bad configuration, no device) from cudaLaunchKernel:
// an error the caller left pending is neither cleared nor taken for the
// launch's, as cudaGetLastError around a <<<>>> launch would do.
template <typename... Param, typename... Arg>
int launch(void (*kernel)(Param...), size_t count, void *stream, Arg &&...args) {
  if (count == 0) return 0;
  const bool pending = cudaPeekAtLastError() != cudaSuccess;
  const cudaError_t err = [&](Param... param) {
    void *argv[] = {(void *)&param...};
    return cudaLaunchKernel((const void *)kernel, dim3(blocks_for(count)), dim3(kThreads), argv, 0,
                            (cudaStream_t)stream);
  }(std::forward<Arg>(args)...);
  // the launch's own error is returned, not left for the caller's next look
  if (err != cudaSuccess && !pending) (void)cudaGetLastError();
  return (int)err;
}

}  // namespace

extern "C" int zero_kern_load_scaled(const void *src, int kind, float *dst, size_t count,
                                     double scale, double *stats, void *stream) {
  return launch(load_scaled_kernel, count, stream, src, kind, dst, count, scale, stats);
}

extern "C" int zero_kern_store(const float *src, int kind, void *dst, size_t count, void *stream) {
  return launch(store_kernel, count, stream, src, kind, dst, count);
}

extern "C" int zero_kern_accumulate(void *dst, int kind, const float *src, size_t count,
                                    void *stream) {
  return launch(accumulate_kernel, count, stream, dst, kind, src, count);
}

extern "C" int zero_kern_add(void *dst, int kind, const void *src, size_t count, void *stream) {
  return launch(add_kernel, count, stream, dst, kind, src, count);
}

extern "C" int zero_kern_scale(float *g, size_t count, float factor, void *stream) {
  return launch(scale_kernel, count, stream, g, count, factor);
}

extern "C" int zero_kern_adamw(float *p, float *m, float *v, const float *g, size_t count,
                               const struct zero_adamw_coef *coef, void *stream) {
  return launch(adamw_kernel, count, stream, p, m, v, g, count, *coef);
}

extern "C" int zero_kern_sgd(float *p, float *m, const float *g, size_t count, float mu, float lr,
                             float wd, void *stream) {
  return launch(sgd_kernel, count, stream, p, m, g, count, mu, lr, wd);
}

extern "C" int zero_kern_device_count(void) {
  const bool pending = cudaPeekAtLastError() != cudaSuccess;
  int n = 0;
  if (cudaGetDeviceCount(&n) == cudaSuccess) return n;
  if (!pending) (void)cudaGetLastError(); /* answered: no device (a caller's error stays) */
  return 0;
}

extern "C" const char *zero_kern_error(int err) { return cudaGetErrorString((cudaError_t)err); }

// Memory, copies, streams and events of a device context (zero_ops.h's
// device side). Zeroing and copies wait for their stream, so that they are
// complete on return as the host's are.
extern "C" int zero_kern_malloc(void **ptr_out, size_t nbytes) {
  return (int)cudaMalloc(ptr_out, nbytes > 0 ? nbytes : 1);
}

extern "C" int zero_kern_free(void *ptr) { return (int)cudaFree(ptr); }

// Pinned host memory (an offloaded optimizer's state and staging): copies
// to and from the device run at the link's speed, without a bounce buffer.
extern "C" int zero_kern_host_malloc(void **ptr_out, size_t nbytes) {
  cudaError_t err = cudaMallocHost(ptr_out, nbytes > 0 ? nbytes : 1);
  if (err == cudaSuccess) memset(*ptr_out, 0, nbytes);
  return (int)err;
}

extern "C" int zero_kern_host_free(void *ptr) { return (int)cudaFreeHost(ptr); }

extern "C" int zero_kern_memset(void *ptr, size_t nbytes, void *stream) {
  cudaError_t err = cudaMemsetAsync(ptr, 0, nbytes, (cudaStream_t)stream);
  if (err == cudaSuccess) err = cudaStreamSynchronize((cudaStream_t)stream);
  return (int)err;
}

extern "C" int zero_kern_copy(void *dst, const void *src, size_t nbytes, void *stream) {
  cudaError_t err = cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, (cudaStream_t)stream);
  if (err == cudaSuccess) err = cudaStreamSynchronize((cudaStream_t)stream);
  return (int)err;
}

extern "C" int zero_kern_copy_async(void *dst, const void *src, size_t nbytes, void *stream) {
  return (int)cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, (cudaStream_t)stream);
}

extern "C" int zero_kern_sync(void *stream) {
  return (int)cudaStreamSynchronize((cudaStream_t)stream);
}

extern "C" int zero_kern_event_create(void **event_out) {
  cudaEvent_t ev;
  cudaError_t err = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
  if (err == cudaSuccess) *event_out = (void *)ev;
  return (int)err;
}

extern "C" int zero_kern_event_destroy(void *event) {
  return (int)cudaEventDestroy((cudaEvent_t)event);
}

extern "C" int zero_kern_event_record(void *event, void *stream) {
  return (int)cudaEventRecord((cudaEvent_t)event, (cudaStream_t)stream);
}

extern "C" int zero_kern_event_sync(void *event) {
  return (int)cudaEventSynchronize((cudaEvent_t)event);
}

// 0 done, 1 not yet, else -(the error)
extern "C" int zero_kern_event_query(void *event) {
  cudaError_t err = cudaEventQuery((cudaEvent_t)event);
  if (err == cudaSuccess) return 0;
  if (err == cudaErrorNotReady) return 1;
  return -(int)err;
}

extern "C" int zero_kern_stream_wait(void *stream, void *event) {
  return (int)cudaStreamWaitEvent((cudaStream_t)stream, (cudaEvent_t)event, 0);
}

extern "C" int zero_kern_device_sync(void) { return (int)cudaDeviceSynchronize(); }

// A stream that does not wait for the legacy default stream, nor it for this
extern "C" int zero_kern_stream_create(void **stream_out) {
  cudaStream_t s;
  cudaError_t err = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  if (err == cudaSuccess) *stream_out = (void *)s;
  return (int)err;
}

extern "C" int zero_kern_stream_destroy(void *stream) {
  return (int)cudaStreamDestroy((cudaStream_t)stream);
}

extern "C" int zero_kern_current_device(int *device_out) {
  return (int)cudaGetDevice(device_out);
}
