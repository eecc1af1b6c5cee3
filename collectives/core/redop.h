/* User reduction ops (weftRedOpCreatePreMulSum): collectives/core/redop.c. */
#ifndef WEFT_REDOP_H
#define WEFT_REDOP_H

#include "plan.h"

/* Whether op may reduce datatype on comm, and
 * the input scaled by a pre-multiply op's scalar, in a buffer to free. */
weftResult_t redop_check(struct weftComm *comm, weftRedOp_t op, weftDataType_t datatype);
weftResult_t redop_premul(struct weftComm *comm, weftRedOp_t op, weftDataType_t datatype,
                          const void *src, size_t count, void **scaled_out);

#endif
