// WEFT_DETERMINISTIC's reduction of one element on device memory
// (kernels_det.cu), written for CUDA's device and the host's C++ alike, so
// that tests/device/test_det_elem.cc checks it against the host executor's
// (collectives/algo/deterministic.c) on every machine, bit for bit.
#ifndef WEFT_DET_ELEM_H
#define WEFT_DET_ELEM_H

#include <stdint.h>
#include <string.h>

#include "collectives/algo/det_ops.h"
#include "collectives/exec/device/dev_det.h"

template <typename T>
WEFT_HD T det_load(const dev_det_work &w, int r, uint64_t i) {
  return reinterpret_cast<const T *>(static_cast<const char *>(w.in) + (uint64_t)r * w.stride)[i];
}

template <typename T>
WEFT_HD T det_scalar(const dev_det_work &w) {
  T s;
  if (w.scalar_ptr != nullptr) s = *static_cast<const T *>(w.scalar_ptr);
  else memcpy(&s, &w.scalar_bits, sizeof s);
  return s;
}

// The types reduced in their own arithmetic: the host's loop, step by step,
// the division after the last op.
#define DET_DIRECT(tag, T)                                                         \
  WEFT_HD void det_##tag(const dev_det_work &w, uint64_t i) {                      \
    const T s = w.premul ? det_scalar<T>(w) : T();                                 \
    T acc = det_load<T>(w, 0, i);                                                  \
    if (w.premul) acc = weft_##tag##_prod(acc, s);                                 \
    for (int r = 1; r < w.n; r++) {                                                \
      T x = det_load<T>(w, r, i);                                                  \
      if (w.premul) x = weft_##tag##_prod(x, s);                                   \
      switch (w.op) {                                                              \
        case weftProd: acc = weft_##tag##_prod(acc, x); break;                     \
        case weftMax: acc = weft_##tag##_max(acc, x); break;                       \
        case weftMin: acc = weft_##tag##_min(acc, x); break;                       \
        default: acc = weft_##tag##_sum(acc, x); break;                            \
      }                                                                            \
      if (r == w.n - 1 && w.divisor > 1) acc = weft_##tag##_div(acc, w.divisor);   \
    }                                                                              \
    static_cast<T *>(w.out)[i] = acc;                                              \
  }
DET_DIRECT(i8, int8_t)
DET_DIRECT(u8, uint8_t)
DET_DIRECT(i32, int32_t)
DET_DIRECT(u32, uint32_t)
DET_DIRECT(i64, int64_t)
DET_DIRECT(u64, uint64_t)
DET_DIRECT(f32, float)
DET_DIRECT(f64, double)
#undef DET_DIRECT

// A pre-multiply sum's scaling of a narrow type, in that type (as the host
// scales the whole input before reducing).
template <typename T>
WEFT_HD T det_scaled(int t, T x, T s) {
  switch (t) {
    case weftFloat16: return (T)weft_f16_prod((uint16_t)x, (uint16_t)s);
    case weftBfloat16: return (T)weft_bf16_prod((uint16_t)x, (uint16_t)s);
    case weftFloat8e4m3: return (T)weft_e4m3_prod((uint8_t)x, (uint8_t)s);
    default: return (T)weft_e5m2_prod((uint8_t)x, (uint8_t)s);
  }
}

// float16, bfloat16 and fp8: widened, combined in float32, rounded once.
template <typename T>
WEFT_HD void det_widened_block(const dev_det_work &w, uint64_t i) {
  const int t = w.datatype;
  if (det_picks(w.op)) { /* max, min: in the type itself (det_ops.h) */
    uint32_t bits = (uint32_t)det_load<T>(w, 0, i);
    for (int r = 1; r < w.n; r++) bits = det_pick(t, w.op, bits, (uint32_t)det_load<T>(w, r, i));
    static_cast<T *>(w.out)[i] = (T)bits;
    return;
  }
  const T s = w.premul ? det_scalar<T>(w) : T();
  float acc = 0;
  for (int r = 0; r < w.n; r++) {
    T x = det_load<T>(w, r, i);
    if (w.premul) x = det_scaled<T>(t, x, s);
    const float v = det_widen(t, &x, 0);
    acc = r == 0 ? v : det_op_f32(w.op, acc, v);
  }
  if (w.divisor > 1) acc /= (float)w.divisor;
  det_narrow(t, w.out, i, acc);
}

// Element i of w's block: the n contributions in rank order, into w.out.
WEFT_HD void det_reduce_elem(const dev_det_work &w, uint64_t i) {
  switch (w.datatype) {
    case weftInt8: det_i8(w, i); break;
    case weftUint8: det_u8(w, i); break;
    case weftInt32: det_i32(w, i); break;
    case weftUint32: det_u32(w, i); break;
    case weftInt64: det_i64(w, i); break;
    case weftUint64: det_u64(w, i); break;
    case weftFloat32: det_f32(w, i); break;
    case weftFloat64: det_f64(w, i); break;
    case weftFloat16:
    case weftBfloat16: det_widened_block<uint16_t>(w, i); break;
    default: det_widened_block<uint8_t>(w, i); break;
  }
}

#endif
