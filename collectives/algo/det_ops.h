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

/* The result of op, v, rounded into type t. Max and min picked an input,
 * which goes back as it was: e5m2's infinities stay infinite (elsewhere they
 * saturate to +-57344, as a sum's overflow does). */
WEFT_HD void det_narrow(int t, int op, void *out, size_t i, float v) {
  switch (t) {
    case weftFloat16: ((uint16_t *)out)[i] = weft_f32_to_f16(v); break;
    case weftBfloat16: ((uint16_t *)out)[i] = weft_f32_to_bf16(v); break;
    case weftFloat8e4m3: ((uint8_t *)out)[i] = weft_f32_to_e4m3(v); break;
    default:
      if ((op == weftMax || op == weftMin) && (weft_fp_f32_bits(v) & 0x7fffffffu) == 0x7f800000u)
        ((uint8_t *)out)[i] = (uint8_t)((weft_fp_f32_bits(v) >> 24) & 0x80u) | 0x7cu;
      else
        ((uint8_t *)out)[i] = weft_f32_to_e5m2(v);
      break;
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
