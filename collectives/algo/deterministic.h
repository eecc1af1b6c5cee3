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

/* The blocks of a reduction over n ranks: block r is elements
 * [det_off(b, r), det_off(b, r) + det_len(b, r)) of every input. All-reduce
 * and reduce: equal, 64-byte aligned shares of the buffer; reduce-scatter:
 * the blocks of its output. */
struct det_blocks {
  size_t stride, total;
};

static inline struct det_blocks det_blocks_of(const struct weft_plan *plan, int n) {
  if (plan->coll == COLL_REDUCESCATTER)
    return (struct det_blocks){plan->count, plan->count * (size_t)n};
  const size_t align = 64 / plan_type_size(plan->datatype);
  size_t block = (plan->count + (size_t)n - 1) / (size_t)n;
  block = (block + align - 1) / align * align;
  return (struct det_blocks){block, plan->count};
}

static inline size_t det_off(const struct det_blocks *b, int r) {
  return (size_t)r * b->stride < b->total ? (size_t)r * b->stride : b->total;
}

static inline size_t det_len(const struct det_blocks *b, int r) {
  return det_off(b, r + 1) - det_off(b, r);
}

/* A send (coll COLL_SEND) or receive of nbytes to or from peer, as the
 * exchanges' groups take them. */
static inline struct weft_plan det_p2p(enum coll_kind coll, int peer, const void *sendbuf,
                                       void *recvbuf, size_t nbytes, int on_device) {
  return (struct weft_plan){.coll = coll, .sendbuf = sendbuf, .recvbuf = recvbuf,
                            .count = nbytes, .datatype = weftUint8, .op = weftSum, .root = peer,
                            .on_device = on_device};
}

/* The exchanges of a call on this rank (rank of n) with the ranks j places
 * after and before it, for j in [j0, j1) (every rank the same range; [1, n)
 * for all of them), into ops (2 (j1 - j0) at most), returning how many.
 * det_scatter_ops: block `to` of plan's input to every other rank, block
 *   `rank` of every other rank's input into scratch (mine elements each, at
 *   their rank's place);
 * det_gather_ops: all-reduce: this rank's reduced block (at out) to every
 *   other rank, theirs into their places of the output; reduce: to the root.
 * det_out: where this rank's reduced block goes: the output, its place in
 *   it (all-reduce, reduce's root), or scratch's block n (reduce's others). */
size_t det_scatter_ops(const struct weft_plan *plan, int n, int rank, const struct det_blocks *b,
                       int j0, int j1, char *scratch, struct weft_plan *ops, int on_device);
size_t det_gather_ops(const struct weft_plan *plan, int n, int rank, const struct det_blocks *b,
                      int j0, int j1, const char *out, struct weft_plan *ops, int on_device);
char *det_out(const struct weft_plan *plan, int n, int rank, const struct det_blocks *b,
              char *scratch);

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
