/* The ZeRO layer's per-element arithmetic, one source for the host code and
 * device kernels: fp32 <-> bf16 / fp16 conversions (round to nearest even,
 * integer bit manipulation only, so results do not depend on the FPU's
 * flush-to-zero mode or on conversion instructions) and the AdamW and SGD
 * with momentum updates of one element. Compiles as C11, C++ and CUDA (host
 * and device). A device build matches the host's updates bit for bit only
 * without fused multiply-adds on either side (nvcc -fmad=false, and
 * -ffp-contract=off for the host compilers, zero/meson.build).
 * fp16 and bf16 values travel as their bit patterns (uint16_t). */
#ifndef WEFT_ZERO_MATH_H
#define WEFT_ZERO_MATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define ZERO_HD static __host__ __device__ __forceinline__
#else
#define ZERO_HD static inline
#endif

ZERO_HD uint32_t zero_f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

ZERO_HD float zero_f32_from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

ZERO_HD uint16_t zero_bf16_from_f32(float f) {
  uint32_t u = zero_f32_bits(f);
  if ((u & 0x7fffffff) > 0x7f800000) return (uint16_t)((u >> 16) | 0x40); /* stay a NaN */
  u += 0x7fff + ((u >> 16) & 1);
  return (uint16_t)(u >> 16);
}

ZERO_HD float zero_bf16_to_f32(uint16_t h) { return zero_f32_from_bits((uint32_t)h << 16); }

ZERO_HD uint16_t zero_fp16_from_f32(float f) {
  uint32_t u = zero_f32_bits(f);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
  uint32_t abs = u & 0x7fffffff;
  if (abs >= 0x7f800000) /* inf or nan */
    return (uint16_t)(sign | 0x7c00 | (abs > 0x7f800000 ? 0x200 : 0));
  if (abs >= 0x477ff000) return (uint16_t)(sign | 0x7c00); /* rounds past 65504: inf */
  if (abs < 0x38800000) { /* below the smallest normal: a subnormal, or 0 */
    if (abs < 0x33000000) return sign; /* under half the smallest subnormal */
    uint32_t mant = (abs & 0x7fffff) | 0x800000;
    int shift = 126 - (int)(abs >> 23); /* 14..24 */
    uint32_t half = mant >> shift;
    uint32_t rest = mant & ((1u << shift) - 1);
    uint32_t mid = 1u << (shift - 1);
    if (rest > mid || (rest == mid && (half & 1))) half++;
    return (uint16_t)(sign | half);
  }
  uint32_t r = abs - 0x38000000; /* rebias the exponent from 127 to 15 */
  r += 0xfff + ((r >> 13) & 1);
  return (uint16_t)(sign | (r >> 13));
}

ZERO_HD float zero_fp16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  if (exp == 0) { /* zero or subnormal: mant * 2^-24 */
    float v = (float)mant * 0x1p-24f;
    return sign ? -v : v;
  }
  if (exp == 31) return zero_f32_from_bits(sign | 0x7f800000 | (mant << 13));
  return zero_f32_from_bits(sign | ((exp + 112) << 23) | (mant << 13));
}

/* AdamW's factors for one step, in fp32 (the host derives them in double
 * from the configuration and the update count). */
struct zero_adamw_coef {
  float b1, b2;         /* beta1, beta2 */
  float step;           /* lr / (1 - beta1^t) */
  float wd;             /* lr * weightDecay (decoupled) */
  float inv_sqrt_bc2;   /* 1 / sqrt(1 - beta2^t) */
  float eps;
};

/* One element of AdamW: moments m and v, then the parameter p. */
ZERO_HD void zero_adamw_elem(float *p, float *m, float *v, float g,
                             const struct zero_adamw_coef *c) {
  *m = c->b1 * *m + (1.0f - c->b1) * g;
  *v = c->b2 * *v + (1.0f - c->b2) * g * g;
  float denom = sqrtf(*v) * c->inv_sqrt_bc2 + c->eps;
  *p -= c->step * *m / denom + c->wd * *p;
}

/* One element of SGD with momentum mu, weight decay wd added to the gradient. */
ZERO_HD void zero_sgd_elem(float *p, float *m, float g, float mu, float lr, float wd) {
  float gi = g + wd * *p;
  *m = mu * *m + gi;
  *p -= lr * *m;
}

#endif
