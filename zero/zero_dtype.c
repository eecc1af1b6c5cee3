/* fp32 <-> bf16 / fp16 conversions, rounding to nearest even. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "zero_internal.h"

static uint32_t float_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static float bits_float(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static uint16_t bf16_from_float(float f) {
  uint32_t u = float_bits(f);
  if (isnan(f)) return (uint16_t)((u >> 16) | 0x40); /* stay a NaN */
  u += 0x7fff + ((u >> 16) & 1);
  return (uint16_t)(u >> 16);
}

static float bf16_to_float(uint16_t h) { return bits_float((uint32_t)h << 16); }

static uint16_t fp16_from_float(float f) {
  uint32_t u = float_bits(f);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
  uint32_t abs = u & 0x7fffffff;
  if (abs >= 0x7f800000) /* inf or nan */
    return sign | 0x7c00 | (abs > 0x7f800000 ? 0x200 : 0);
  if (abs >= 0x477ff000) return sign | 0x7c00; /* rounds past 65504: inf */
  if (abs < 0x38800000) { /* below the smallest normal: a subnormal, or 0 */
    if (abs < 0x33000000) return sign; /* under half the smallest subnormal */
    uint32_t mant = (abs & 0x7fffff) | 0x800000;
    int shift = 126 - (int)(abs >> 23); /* 14..24 */
    uint32_t half = mant >> shift;
    uint32_t rest = mant & ((1u << shift) - 1);
    uint32_t mid = 1u << (shift - 1);
    if (rest > mid || (rest == mid && (half & 1))) half++;
    return sign | (uint16_t)half;
  }
  uint32_t r = abs - 0x38000000; /* rebias the exponent from 127 to 15 */
  r += 0xfff + ((r >> 13) & 1);
  return sign | (uint16_t)(r >> 13);
}

static float fp16_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  if (exp == 0) { /* zero or subnormal: mant * 2^-24 */
    float v = (float)mant * 0x1p-24f;
    return sign ? -v : v;
  }
  if (exp == 31) return bits_float(sign | 0x7f800000 | (mant << 13));
  return bits_float(sign | ((exp + 112) << 23) | (mant << 13));
}

int zero_type_ok(weftDataType_t type) {
  return type == weftFloat32 || type == weftBfloat16 || type == weftFloat16;
}

float zero_load(const void *src, weftDataType_t type, size_t i) {
  switch (type) {
  case weftBfloat16: return bf16_to_float(((const uint16_t *)src)[i]);
  case weftFloat16: return fp16_to_float(((const uint16_t *)src)[i]);
  default: return ((const float *)src)[i];
  }
}

void zero_store(void *dst, weftDataType_t type, size_t i, float v) {
  switch (type) {
  case weftBfloat16: ((uint16_t *)dst)[i] = bf16_from_float(v); break;
  case weftFloat16: ((uint16_t *)dst)[i] = fp16_from_float(v); break;
  default: ((float *)dst)[i] = v; break;
  }
}

weftResult_t weftZeroToFloat(const void *src, weftDataType_t type, float *dst, size_t count) {
  if (!zero_type_ok(type))
    return zero_fail(weftInvalidArgument, "type %d is not fp32, bf16 or fp16", type);
  if (count > 0 && (src == NULL || dst == NULL))
    return zero_fail(weftInvalidArgument, "NULL buffer");
  for (size_t i = 0; i < count; i++) dst[i] = zero_load(src, type, i);
  return weftSuccess;
}

weftResult_t weftZeroFromFloat(const float *src, weftDataType_t type, void *dst, size_t count) {
  if (!zero_type_ok(type))
    return zero_fail(weftInvalidArgument, "type %d is not fp32, bf16 or fp16", type);
  if (count > 0 && (src == NULL || dst == NULL))
    return zero_fail(weftInvalidArgument, "NULL buffer");
  for (size_t i = 0; i < count; i++) zero_store(dst, type, i, src[i]);
  return weftSuccess;
}

weftResult_t weftZeroAccumulate(void *dst, weftDataType_t type, const float *src, size_t count) {
  if (!zero_type_ok(type))
    return zero_fail(weftInvalidArgument, "type %d is not fp32, bf16 or fp16", type);
  if (count > 0 && (src == NULL || dst == NULL))
    return zero_fail(weftInvalidArgument, "NULL buffer");
  for (size_t i = 0; i < count; i++) zero_store(dst, type, i, zero_load(dst, type, i) + src[i]);
  return weftSuccess;
}
