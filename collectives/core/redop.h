/* User reduction ops (weftRedOpCreatePreMulSum): collectives/core/redop.c. */
#ifndef WEFT_REDOP_H
#define WEFT_REDOP_H

#include "plan.h"

/* Whether op is one of weft's own (sum, prod, max, min, avg): valid for
 * every datatype, nothing to capture. */
static inline int redop_is_builtin(weftRedOp_t op) { return (int)op >= 0 && op < weftNumOps; }

/* Whether op may reduce datatype on comm; and a pre-multiply op's scalar
 * copied into the plan at the call (redop_check passed). */
weftResult_t redop_check(struct weftComm *comm, weftRedOp_t op, weftDataType_t datatype);
void redop_capture(const struct weftComm *comm, struct weft_plan *plan);
/* dst[count] = src[count] times the plan's pre-multiply scalar (premul_ptr,
 * or else premul_scalar), in its datatype; dst may be src. */
void redop_premul(const struct weft_plan *plan, const void *src, size_t count, void *dst);

/* Whether weftAvg of datatype scales every rank's input by 1/n and sums
 * (a pre-multiply sum, as NCCL's avg of floating types is), rather than
 * dividing the sum: the narrow floating types, whose sum overflows where
 * their mean does not (float16 past 65504, fp8 e4m3 past 448, e5m2 past
 * 57344). bfloat16, float32 and float64 (float32's range or more) divide
 * the sum, a rounding fewer per element; integers divide it as NCCL does. */
static inline int redop_avg_prescales(weftDataType_t datatype) {
  return datatype == weftFloat16 || datatype == weftFloat8e4m3 || datatype == weftFloat8e5m2;
}
/* 1/nranks in datatype (redop_avg_prescales' types), as a pre-multiply
 * scalar's bits: out's first bytes, the rest zero. */
void redop_avg_scalar(weftDataType_t datatype, int nranks, char out[8]);

#endif
