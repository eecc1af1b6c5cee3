/* User reduction ops (weftRedOpCreatePreMulSum): collectives/core/redop.c. */
#ifndef WEFT_REDOP_H
#define WEFT_REDOP_H

#include "plan.h"

/* Whether op is one of weft's own (sum, prod, max, min, avg): valid for
 * every datatype, nothing to capture. */
static inline int redop_is_builtin(weftRedOp_t op) { return (int)op >= 0 && op < weftNumOps; }

/* Whether op may reduce datatype on comm; a pre-multiply op's scalar copied
 * into the plan at the call (redop_check passed); and the plan's input
 * scaled by that scalar, in a buffer to free. */
weftResult_t redop_check(struct weftComm *comm, weftRedOp_t op, weftDataType_t datatype);
void redop_capture(const struct weftComm *comm, struct weft_plan *plan);
weftResult_t redop_premul(const struct weft_plan *plan, const void *src, size_t count,
                          void **scaled_out);

#endif
