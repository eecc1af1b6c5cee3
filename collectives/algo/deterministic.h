/* WEFT_DETERMINISTIC=1: reductions in a fixed order (collectives/algo/deterministic.c). */
#ifndef WEFT_DETERMINISTIC_H
#define WEFT_DETERMINISTIC_H

#include "../core/params.h"
#include "../core/plan.h"

/* Whether plan's call runs in the fixed order: a reduction (all-reduce,
 * reduce-scatter, reduce) with WEFT_DETERMINISTIC=1. Inline, and the
 * setting's cached value read directly once loaded: every call asks. */
static inline int det_applies(const struct weft_plan *plan) {
  if (plan->coll != COLL_ALLREDUCE && plan->coll != COLL_REDUCESCATTER &&
      plan->coll != COLL_REDUCE)
    return 0;
  struct weft_param *p = &coll_params[P_DETERMINISTIC];
  if (__builtin_expect(__atomic_load_n(&p->loaded, __ATOMIC_ACQUIRE), 1)) return p->ival != 0;
  return param_int(p) != 0;
}

/* dst = in[0] op in[1] op ... op in[n-1] elementwise over count elements of
 * t, left to right (then / n for weftAvg): the fixed order's arithmetic on
 * the host (a pre-multiply sum's inputs come scaled, with op weftSum); dst
 * may be none of in[] but in[0]. */
void det_reduce(weftDataType_t t, weftRedOp_t op, int n, void *dst, const void *const *in,
                size_t count);

/* Runs plan's reduction in the fixed order, on the host executor, with two or
 * more ranks. Blocks (bounded by the comm's timeout). A mismatch between the
 * ranks' calls is weftInvalidUsage on every rank, found before data moves. */
weftResult_t det_run(struct weftComm *comm, const struct weft_plan *plan);

#endif
