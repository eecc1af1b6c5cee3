/* fp32 <-> bf16 / fp16 conversions of buffers, rounding to nearest even
 * (the arithmetic is zero_math.h's, shared with device code). */
#include <stdint.h>

#include "zero_internal.h"
#include "zero_math.h"

int zero_type_ok(weftDataType_t type) {
  return type == weftFloat32 || type == weftBfloat16 || type == weftFloat16;
}

float zero_load(const void *src, weftDataType_t type, size_t i) {
  switch (type) {
  case weftBfloat16: return zero_bf16_to_f32(((const uint16_t *)src)[i]);
  case weftFloat16: return zero_fp16_to_f32(((const uint16_t *)src)[i]);
  default: return ((const float *)src)[i];
  }
}

void zero_store(void *dst, weftDataType_t type, size_t i, float v) {
  switch (type) {
  case weftBfloat16: ((uint16_t *)dst)[i] = zero_bf16_from_f32(v); break;
  case weftFloat16: ((uint16_t *)dst)[i] = zero_fp16_from_f32(v); break;
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
