/* WEFT_DETERMINISTIC's arithmetic (collectives/algo/deterministic.c), shared
 * by the host executor and the device kernel (exec/device/kernels_det.cu),
 * so that both give the same bits: element i of the result is
 *     (...((x_0[i] op x_1[i]) op x_2[i]) ... op x_{n-1}[i])      (/ n for avg)
 * in rank order; float32 and float64 in their own precision, through
 * reduce_ops.h's functions; float16, bfloat16 and the fp8 types widened to
 * float32, combined there and rounded once at the end. Compiles as C, C++
 * and CUDA (host and device). */
#ifndef WEFT_DET_OPS_H
#define WEFT_DET_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "../reduce/reduce_ops.h"
#include "../../include/weft.h"

/* float16, bfloat16 and fp8: widened to float32 for the reduction. */
WEFT_HD int det_widened(int t) {
  return t == weftFloat16 || t == weftBfloat16 || t == weftFloat8e4m3 || t == weftFloat8e5m2;
}

WEFT_HD float det_widen(int t, const void *in, size_t i) {
  switch (t) {
    case weftFloat16: return weft_f16_to_f32(((const uint16_t *)in)[i]);
    case weftBfloat16: return weft_bf16_to_f32(((const uint16_t *)in)[i]);
    case weftFloat8e4m3: return weft_e4m3_to_f32(((const uint8_t *)in)[i]);
    default: return weft_e5m2_to_f32(((const uint8_t *)in)[i]);
  }
}

WEFT_HD void det_narrow(int t, void *out, size_t i, float v) {
  switch (t) {
    case weftFloat16: ((uint16_t *)out)[i] = weft_f32_to_f16(v); break;
    case weftBfloat16: ((uint16_t *)out)[i] = weft_f32_to_bf16(v); break;
    case weftFloat8e4m3: ((uint8_t *)out)[i] = weft_f32_to_e4m3(v); break;
    default: ((uint8_t *)out)[i] = weft_f32_to_e5m2(v); break;
  }
}

/* Max and min of the widened types pick an input, so they are combined in
 * the type itself, in rank order (reduce_ops.h's functions): widened and
 * narrowed back, a NaN's payload or e5m2's infinity would not keep its bits. */
WEFT_HD int det_picks(int op) { return op == weftMax || op == weftMin; }

WEFT_HD uint32_t det_pick(int t, int op, uint32_t a, uint32_t b) {
  const int max = op == weftMax;
  switch (t) {
    case weftFloat16:
      return max ? weft_f16_max((uint16_t)a, (uint16_t)b) : weft_f16_min((uint16_t)a, (uint16_t)b);
    case weftBfloat16:
      return max ? weft_bf16_max((uint16_t)a, (uint16_t)b)
                 : weft_bf16_min((uint16_t)a, (uint16_t)b);
    case weftFloat8e4m3:
      return max ? weft_e4m3_max((uint8_t)a, (uint8_t)b) : weft_e4m3_min((uint8_t)a, (uint8_t)b);
    default:
      return max ? weft_e5m2_max((uint8_t)a, (uint8_t)b) : weft_e5m2_min((uint8_t)a, (uint8_t)b);
  }
}

/* One step of the widened types' order, in float32: reduce_ops.h's rules
 * (NaN wins; max(-0, +0) = +0 and min = -0 in either order). */
WEFT_HD float det_op_f32(int op, float a, float b) {
  switch (op) {
    case weftProd: return a * b;
    case weftMax: return weft_f32_max(a, b);
    case weftMin: return weft_f32_min(a, b);
    default: return a + b; /* sum, avg */
  }
}

#endif
