// Compiles zero_math.h as device code: the conversions and optimizer updates
// the host runs, as kernels over arrays, so that the header the host is tested
// with also builds for GPUs (the device context's kernels start from these).
#include "zero/zero_math.h"

__global__ void zero_adamw_kernel(float *p, float *m, float *v, const float *g, size_t n,
                                  struct zero_adamw_coef c) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) zero_adamw_elem(&p[i], &m[i], &v[i], g[i], &c);
}

__global__ void zero_sgd_kernel(float *p, float *m, const float *g, size_t n, float mu, float lr,
                                float wd) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) zero_sgd_elem(&p[i], &m[i], g[i], mu, lr, wd);
}

__global__ void zero_convert_kernel(uint16_t *bf16, uint16_t *fp16, float *back, const float *src,
                                    size_t n) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  bf16[i] = zero_bf16_from_f32(src[i]);
  fp16[i] = zero_fp16_from_f32(src[i]);
  back[i] = zero_bf16_to_f32(bf16[i]) + zero_fp16_to_f32(fp16[i]);
}
