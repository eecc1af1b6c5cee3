/* User reduction ops: weftRedOpCreatePreMulSum makes an op that multiplies
 * each rank's input by a scalar, then sums. The host executor scales the
 * input (an all-reduce's into its output, other collectives' into a
 * scratch buffer) and runs a sum on it, so every algorithm and protocol
 * supports it unchanged (exec/host/run.c). */
#include <stdlib.h>
#include <string.h>

#include "../../transport/base/status.h"
#include "../exec/device/device.h"
#include "plan.h"
#include "../reduce/reduce_host.h"
#include "../reduce/reduce_ops.h"
#include "redop.h"

#define SCALE_BATCH 256 /* copies of the scalar fed to the prod loop at once */

static struct weft_redop *redop_slot(struct weftComm *comm, weftRedOp_t op) {
  int i = (int)op - weftNumOps;
  if (i < 0 || i >= WEFT_MAX_REDOPS || !comm->redops[i].in_use) return NULL;
  return &comm->redops[i];
}

weftResult_t weftRedOpCreatePreMulSum(weftRedOp_t *op, void *scalar, weftDataType_t datatype,
                                      weftScalarResidence_t residence, weftComm_t comm) {
  weft_error_clear();
  WEFT_TRY(comm_check(comm));
  /* only destroy after finalize (a revoked or aborted comm runs nothing either) */
  WEFT_TRY(comm_op_begin(comm, 0, "RedOpCreatePreMulSum"));
  if (op == NULL || scalar == NULL)
    return weft_error_set(weftInvalidArgument, "RedOpCreatePreMulSum: %s is NULL",
                          op == NULL ? "op" : "scalar");
  size_t esize = weftTypeSize(datatype);
  if (esize == 0)
    return weft_error_set(weftInvalidArgument, "RedOpCreatePreMulSum: invalid datatype %d",
                          (int)datatype);
  if (residence != weftScalarDevice && residence != weftScalarHostImmediate)
    return weft_error_set(weftInvalidArgument, "RedOpCreatePreMulSum: invalid residence %d",
                          (int)residence);
  for (int i = 0; i < WEFT_MAX_REDOPS; i++) {
    struct weft_redop *r = &comm->redops[i];
    if (r->in_use) continue;
    memset(r, 0, sizeof *r);
    r->in_use = 1;
    r->datatype = datatype;
    /* immediate: the value now; otherwise the pointer, read when an op runs */
    if (residence == weftScalarHostImmediate) memcpy(r->scalar, scalar, esize);
    else r->scalar_ptr = scalar;
    /* asked now, by the thread that made the scalar (a later caller's thread
     * may have no CUDA context to ask with) */
    r->scalar_device_only = residence == weftScalarDevice && device_ptr_device_only(scalar);
    *op = (weftRedOp_t)(weftNumOps + i);
    return weftSuccess;
  }
  return weft_error_set(weftInvalidUsage, "RedOpCreatePreMulSum: all %d user ops are in use",
                        WEFT_MAX_REDOPS);
}

weftResult_t weftRedOpDestroy(weftRedOp_t op, weftComm_t comm) {
  weft_error_clear();
  WEFT_TRY(comm_check(comm));
  struct weft_redop *r = redop_slot(comm, op);
  if (r == NULL)
    return weft_error_set(weftInvalidArgument, "RedOpDestroy: op %d is not a live user op",
                          (int)op);
  r->in_use = 0;
  return weftSuccess;
}

weftResult_t redop_check(struct weftComm *comm, weftRedOp_t op, weftDataType_t datatype) {
  if ((int)op >= 0 && op < weftNumOps) return weftSuccess;
  struct weft_redop *r = redop_slot(comm, op);
  if (r == NULL)
    return weft_error_set(weftInvalidArgument, "invalid reduction op %d", (int)op);
  if (r->datatype != datatype)
    return weft_error_set(weftInvalidArgument,
                          "reduction op %d was made for datatype %d, used with %d", (int)op,
                          (int)r->datatype, (int)datatype);
  return weftSuccess;
}

void redop_capture(const struct weftComm *comm, struct weft_plan *plan) {
  int i = (int)plan->op - weftNumOps;
  if (i < 0 || i >= WEFT_MAX_REDOPS || !comm->redops[i].in_use) return;
  memcpy(plan->premul_scalar, comm->redops[i].scalar, sizeof plan->premul_scalar);
  plan->premul_ptr = comm->redops[i].scalar_ptr;
  plan->premul_device_only = comm->redops[i].scalar_device_only;
}

void redop_premul(const struct weft_plan *plan, const void *src, size_t count, void *dst) {
  const weftDataType_t datatype = plan->datatype;
  size_t esize = weftTypeSize(datatype);
  char scalars[SCALE_BATCH * 8];
  const void *scalar = plan->premul_ptr != NULL ? plan->premul_ptr : plan->premul_scalar;
  for (int i = 0; i < SCALE_BATCH; i++) memcpy(scalars + i * esize, scalar, esize);
  weft_reduce_fn prod = reduce_host_fn(datatype, weftProd);
  for (size_t i = 0; i < count; i += SCALE_BATCH) {
    size_t n = count - i < SCALE_BATCH ? count - i : SCALE_BATCH;
    prod((char *)dst + i * esize, NULL, (const char *)src + i * esize, scalars, n, 1);
  }
}

void redop_avg_scalar(weftDataType_t datatype, int nranks, char out[8]) {
  memset(out, 0, 8);
  const float inv = 1.0f / (float)nranks;
  if (datatype == weftFloat16) {
    const uint16_t h = weft_f32_to_f16(inv);
    memcpy(out, &h, sizeof h);
  } else if (datatype == weftFloat8e4m3) {
    out[0] = (char)weft_f32_to_e4m3(inv);
  } else if (datatype == weftFloat8e5m2) {
    out[0] = (char)weft_f32_to_e5m2(inv);
  }
}
