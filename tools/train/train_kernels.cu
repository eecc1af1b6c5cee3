// weft-train's MLP on the GPU (--device cuda): train_model.c's loops as
// kernels, one thread per output element, each summing in the host loop's
// order from the same start; built with -fmad=false, so that products and
// sums round as the host's do (tanhf may differ in its last bit).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "train_device.h"
#include "train_launch.cuh"

namespace {

// kind: 0 fp32, 1 bf16, 2 fp16 (round to nearest even, as weftZeroFromFloat)
__device__ float load_kind(const void *p, int kind, size_t i) {
  if (kind == 1) return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
  if (kind == 2) return __half2float(((const __half *)p)[i]);
  return ((const float *)p)[i];
}

__device__ void store_kind(void *p, int kind, size_t i, float v) {
  if (kind == 1) ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v);
  else if (kind == 2) ((__half *)p)[i] = __float2half_rn(v);
  else ((float *)p)[i] = v;
}

#define THREAD_INDEX(k, total)                                   \
  size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x;      \
  if (k >= (total)) return

__global__ void to_float_kernel(const void *src, int kind, float *dst, size_t count) {
  THREAD_INDEX(k, count);
  dst[k] = load_kind(src, kind, k);
}

__global__ void accumulate_kernel(void *dst, int kind, const float *src, size_t count) {
  THREAD_INDEX(k, count);
  store_kind(dst, kind, k, load_kind(dst, kind, k) + src[k]);
}

// y[s][j] = act(b[j] + sum_i w[j][i] x[s][i])
__global__ void linear_kernel(const float *w, const float *b, const float *x, float *y, int n,
                              int in, int out, int use_tanh) {
  THREAD_INDEX(k, (size_t)n * out);
  size_t s = k / out, j = k % out;
  float acc = b[j];
  for (int i = 0; i < in; i++) acc += w[j * in + i] * x[s * in + i];
  y[k] = use_tanh ? tanhf(acc) : acc;
}

// d = 2 (y - t) / denom: the mean squared error's gradient
__global__ void out_delta_kernel(const float *y, const float *t, float *d, size_t count,
                                 float denom) {
  THREAD_INDEX(k, count);
  d[k] = 2.0f * (y[k] - t[k]) / denom;
}

// gw[j][i] = sum_s (d[s][j] scale) x[s][i]; gb[j] = sum_s d[s][j] scale
__global__ void grad_kernel(const float *d, const float *x, float *gw, float *gb, int n, int in,
                            int out, float scale) {
  THREAD_INDEX(k, (size_t)out * (in + 1));
  if (k < (size_t)out * in) {
    size_t j = k / in, i = k % in;
    float acc = 0;
    for (size_t s = 0; s < (size_t)n; s++) acc += (d[s * out + j] * scale) * x[s * in + i];
    gw[k] = acc;
  } else {
    size_t j = k - (size_t)out * in;
    float acc = 0;
    for (size_t s = 0; s < (size_t)n; s++) acc += d[s * out + j] * scale;
    gb[j] = acc;
  }
}

// dp[s][i] = (sum_j d[s][j] w[j][i]) (1 - x[s][i]^2): through tanh
__global__ void back_delta_kernel(const float *d, const float *w, const float *x, float *dp, int n,
                                  int in, int out) {
  THREAD_INDEX(k, (size_t)n * in);
  size_t s = k / in, i = k % in;
  float acc = 0;
  for (size_t j = 0; j < (size_t)out; j++) acc += d[s * out + j] * w[j * in + i];
  float a = x[k];
  dp[k] = acc * (1.0f - a * a);
}

TRAIN_KERNEL_APART(to_float_kernel);
TRAIN_KERNEL_APART(accumulate_kernel);
TRAIN_KERNEL_APART(linear_kernel);
TRAIN_KERNEL_APART(out_delta_kernel);
TRAIN_KERNEL_APART(grad_kernel);
TRAIN_KERNEL_APART(back_delta_kernel);

}  // namespace

#define LAUNCH(total, kernel, ...) return train_launch(kernel, total, stream, __VA_ARGS__)

extern "C" int train_kern_to_float(const void *src, int kind, float *dst, size_t count,
                                   void *stream) {
  LAUNCH(count, to_float_kernel, src, kind, dst, count);
}

extern "C" int train_kern_accumulate(void *dst, int kind, const float *src, size_t count,
                                     void *stream) {
  LAUNCH(count, accumulate_kernel, dst, kind, src, count);
}

extern "C" int train_kern_linear(const float *w, const float *b, const float *x, float *y, int n,
                                 int in, int out, int use_tanh, void *stream) {
  LAUNCH((size_t)n * out, linear_kernel, w, b, x, y, n, in, out, use_tanh);
}

extern "C" int train_kern_out_delta(const float *y, const float *t, float *d, size_t count,
                                    float denom, void *stream) {
  LAUNCH(count, out_delta_kernel, y, t, d, count, denom);
}

extern "C" int train_kern_grad(const float *d, const float *x, float *gw, float *gb, int n, int in,
                               int out, float scale, void *stream) {
  LAUNCH((size_t)out * (in + 1), grad_kernel, d, x, gw, gb, n, in, out, scale);
}

extern "C" int train_kern_back_delta(const float *d, const float *w, const float *x, float *dp,
                                     int n, int in, int out, void *stream) {
  LAUNCH((size_t)n * in, back_delta_kernel, d, w, x, dp, n, in, out);
}
