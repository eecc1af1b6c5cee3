/* What the device executor refuses, decided from the plan and the build's
 * kernel table alone, before any CUDA call: so a machine without a GPU
 * tests every refusal (device_host). CUDA builds only. */
#include <stdio.h>

#include "../../../transport/base/param.h"
#include "../../../transport/base/status.h"
#include "../../algo/deterministic.h"
#include "../../core/params.h"
#include "../../tune/tuner.h"
#include "dev_types.h"
#include "device.h"

/* Written by gen_kernels.py: [datatype][op][protocol], NULL outside the
 * matrix the build chose; op DEV_OP_PREMULSUM is the pre-multiply sum. */
extern const void *const (*const weft_dev_kernels[weftNumTypes])[DEV_NPROTOS];
extern const char weft_dev_matrix[];

static const char *const dtype_names[weftNumTypes] = {
    "int8", "uint8", "int32", "uint32", "int64", "uint64",
    "float16", "float32", "float64", "bfloat16", "float8e4m3", "float8e5m2"};
static const char *const op_names[DEV_NOPS] = {"sum", "prod", "max", "min", "avg", "premulsum"};

/* Whether WEFT_ALGO leaves coll an algorithm device memory has: the ring,
 * or for all-reduce the tree (the tuner's rules, parsed once per value). */
static int device_algo_allowed(enum coll_kind coll, const char **text_out) {
  *text_out = param_str(&coll_params[P_ALGO]);
  return tuner_algo_allowed(coll, ALGO_RING) ||
         (coll == COLL_ALLREDUCE && tuner_algo_allowed(coll, ALGO_TREE));
}

int device_op_index(weftRedOp_t op) {
  return (int)op >= 0 && op < weftNumOps ? (int)op : DEV_OP_PREMULSUM;
}

weftResult_t device_plan_refusal(const struct weft_plan *plan) {
  const char *name = coll_kind_name(plan->coll);
  if (plan_is_sendrecv(plan)) return weftSuccess; /* bytes: every datatype */
  if ((unsigned)plan->datatype >= weftNumTypes)
    return weft_error_set(weftInvalidArgument, "%s: invalid datatype %d", name,
                          (int)plan->datatype);
  /* WEFT_DETERMINISTIC's reductions need no kernel of the matrix, and
   * WEFT_ALGO does not apply to them (device_det.c) */
  if (det_applies(plan)) return weftSuccess;
  const char *algo;
  if (!device_algo_allowed(plan->coll, &algo))
    return weft_error_set(weftInvalidUsage,
                          "%s on device memory: WEFT_ALGO=%s excludes the ring, the only "
                          "algorithm device collectives have but for all-reduce's tree (rd, "
                          "cma and bulk run on host memory only)", name, algo);
  int op = device_op_index(plan->op);
  if (weft_dev_kernels[plan->datatype][op][DEV_PROTO_SIMPLE] == NULL)
    return weft_error_set(weftInvalidUsage,
                          "%s on device memory: no kernel for %s with op %s in this build "
                          "(device_matrix=%s; configure with -Ddevice_matrix=full)",
                          name, dtype_names[plan->datatype], op_names[op], weft_dev_matrix);
  return weftSuccess;
}
