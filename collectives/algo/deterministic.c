/* WEFT_DETERMINISTIC=1: every reduction in one fixed order, so that its
 * result is bitwise the same whatever the message size, algorithm, protocol,
 * channel count or transport, for a given number of ranks.
 *
 * Element i of the result is
 *     (...((x_0[i] op x_1[i]) op x_2[i]) ... op x_{n-1}[i])      (/ n for avg)
 * with x_r rank r's input, in rank order 0 .. n-1. float32 and float64 take
 * each op in their own precision; float16, bfloat16 and the fp8 types are
 * widened to float32, reduced in that order in float32 and rounded once at
 * the end; integers are exact in any order.
 *
 * A reduction runs as point-to-point exchanges (collectives/algo/sendrecv.c),
 * with n ranks and the data cut into n blocks (all-reduce, reduce: equal,
 * 64-byte aligned shares of the buffer; reduce-scatter: the blocks of its
 * output):
 *   check:   each rank sends the call's signature to every other rank and
 *            compares all n (every rank finds a mismatch, the same one,
 *            before any data moves);
 *   scatter: rank r receives block r of every other rank's input, and sums
 *            the n contributions in rank order (the same bytes each rank
 *            sends as a ring's reduce-scatter);
 *   gather:  all-reduce: each rank sends its reduced block to every other
 *            rank (a ring all-gather's bytes); reduce: to the root only.
 * WEFT_ALGO and WEFT_PROTO do not apply to these reductions (their order is
 * the point); collectives that do not reduce run as the tuner says. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../transport/base/status.h"
#include "../core/comm.h"
#include "../core/params.h"
#include "../core/plan.h"
#include "../core/signature.h"
#include "../reduce/reduce_host.h"
#include "../reduce/reduce_ops.h"
#include "det_ops.h"
#include "deterministic.h"
#include "sendrecv.h"

/* A few elements at a time through float32, for the narrow types. */
#define DET_WIDE_BATCH 256

/* Element i of a narrow type's buffer (esize 1 or 2 bytes) as bits, and back. */
static inline uint32_t det_bits(size_t esize, const void *p, size_t i) {
  return esize == 2 ? ((const uint16_t *)p)[i] : ((const uint8_t *)p)[i];
}
static inline void det_bits_store(size_t esize, void *p, size_t i, uint32_t v) {
  if (esize == 2) ((uint16_t *)p)[i] = (uint16_t)v;
  else ((uint8_t *)p)[i] = (uint8_t)v;
}

void det_reduce(weftDataType_t t, weftRedOp_t op, int n, void *dst, const void *const *in,
                size_t count) {
  const int divisor = op == weftAvg ? n : 1;
  if (det_widened(t) && det_picks(op)) {
    const size_t esize = weftTypeSize(t);
    uint32_t acc[DET_WIDE_BATCH];
    for (size_t base = 0; base < count; base += DET_WIDE_BATCH) {
      const size_t m = count - base < DET_WIDE_BATCH ? count - base : DET_WIDE_BATCH;
      for (size_t i = 0; i < m; i++) acc[i] = det_bits(esize, in[0], base + i);
      for (int r = 1; r < n; r++)
        for (size_t i = 0; i < m; i++)
          acc[i] = det_pick(t, op, acc[i], det_bits(esize, in[r], base + i));
      for (size_t i = 0; i < m; i++) det_bits_store(esize, dst, base + i, acc[i]);
    }
    return;
  }
  if (det_widened(t)) {
    float acc[DET_WIDE_BATCH];
    for (size_t base = 0; base < count; base += DET_WIDE_BATCH) {
      const size_t m = count - base < DET_WIDE_BATCH ? count - base : DET_WIDE_BATCH;
      for (size_t i = 0; i < m; i++) acc[i] = det_widen(t, in[0], base + i);
      for (int r = 1; r < n; r++)
        for (size_t i = 0; i < m; i++)
          acc[i] = det_op_f32(op, acc[i], det_widen(t, in[r], base + i));
      if (divisor > 1)
        for (size_t i = 0; i < m; i++) acc[i] /= (float)divisor;
      for (size_t i = 0; i < m; i++) det_narrow(t, dst, base + i, acc[i]);
    }
    return;
  }
  /* elementwise loops: each element's value does not depend on how the
   * loop is vectorised, so this is the order above bit for bit */
  const weft_reduce_fn reduce = reduce_host_fn(t, op);
  for (int r = 1; r < n; r++)
    reduce(dst, NULL, r == 1 ? in[0] : dst, in[r], count, r == n - 1 ? divisor : 1);
}

/* The scratch of a communicator's calls, kept (comm_state_get): a 16 MiB
 * call would otherwise fault its pages in anew each time. */
struct det_comm {
  void *scratch;
  size_t nbytes;
};

static void det_scratch_release(void *state) {
  struct det_comm *d = state;
  free(d->scratch);
  d->scratch = NULL;
  d->nbytes = 0;
}

static uint64_t det_scratch_nbytes(const void *state) {
  return ((const struct det_comm *)state)->nbytes;
}

static void det_comm_destroy(void *state) {
  det_scratch_release(state);
  free(state);
}

static const struct comm_state_ops det_comm_ops = {
    .name = "deterministic",
    .destroy = det_comm_destroy,
    .scratch_nbytes = det_scratch_nbytes,
    .scratch_release = det_scratch_release,
};

/* At least nbytes of the comm's scratch. */
static weftResult_t det_scratch(struct weftComm *comm, size_t nbytes, char **out) {
  struct det_comm *d = comm_state_get(comm, &det_comm_ops);
  if (d == NULL) {
    d = calloc(1, sizeof *d);
    if (d == NULL) return weft_error_set(weftSystemError, "WEFT_DETERMINISTIC: out of memory");
    weftResult_t res = comm_state_set(comm, &det_comm_ops, d);
    if (res != weftSuccess) {
      free(d);
      return res;
    }
  }
  if (d->nbytes < nbytes) {
    det_scratch_release(d);
    if (posix_memalign(&d->scratch, 4096, nbytes) != 0)
      return weft_error_set(weftSystemError, "WEFT_DETERMINISTIC: cannot allocate %zu bytes",
                            nbytes);
    d->nbytes = nbytes;
  }
  *out = d->scratch;
  return weftSuccess;
}

/* The arrays of one call, for n ranks. */
struct det_arrays {
  struct weft_plan *ops;           /* 2n: a group's sends and receives */
  const struct weft_plan **ptrs;   /* 2n */
  struct signature_packed *packed; /* n */
  struct signature *sigs;          /* n */
  const void **in;                 /* n: the contributions to this rank's block */
};

static weftResult_t det_group(struct weftComm *comm, struct det_arrays *a, size_t nops) {
  for (size_t i = 0; i < nops; i++) a->ptrs[i] = &a->ops[i];
  return sendrecv_run_peers(comm, a->ptrs, nops);
}

size_t det_scatter_ops(const struct weft_plan *plan, int n, int rank, const struct det_blocks *b,
                       int j0, int j1, char *scratch, struct weft_plan *ops, int on_device) {
  const size_t esize = plan_type_size(plan->datatype), mine = det_len(b, rank);
  const char *src = plan->sendbuf;
  size_t nops = 0;
  for (int j = j0; j < j1; j++) {
    const int to = (rank + j) % n, from = (rank - j + n) % n;
    if (det_len(b, to) > 0)
      ops[nops++] = det_p2p(COLL_SEND, to, src + det_off(b, to) * esize, NULL,
                            det_len(b, to) * esize, on_device);
    if (mine > 0)
      ops[nops++] = det_p2p(COLL_RECV, from, NULL, scratch + (size_t)from * mine * esize,
                            mine * esize, on_device);
  }
  return nops;
}

size_t det_gather_ops(const struct weft_plan *plan, int n, int rank, const struct det_blocks *b,
                      int j0, int j1, const char *out, struct weft_plan *ops, int on_device) {
  const size_t esize = plan_type_size(plan->datatype), mine = det_len(b, rank);
  char *recv = plan->recvbuf;
  size_t nops = 0;
  for (int j = j0; j < j1; j++) {
    const int to = (rank + j) % n, from = (rank - j + n) % n;
    const int send = plan->coll == COLL_ALLREDUCE || to == plan->root;
    const int receive = plan->coll == COLL_ALLREDUCE || rank == plan->root;
    if (send && mine > 0) ops[nops++] = det_p2p(COLL_SEND, to, out, NULL, mine * esize, on_device);
    if (receive && det_len(b, from) > 0)
      ops[nops++] = det_p2p(COLL_RECV, from, NULL, recv + det_off(b, from) * esize,
                            det_len(b, from) * esize, on_device);
  }
  return nops;
}

char *det_out(const struct weft_plan *plan, int n, int rank, const struct det_blocks *b,
              char *scratch) {
  const size_t esize = plan_type_size(plan->datatype);
  if (plan->coll == COLL_REDUCESCATTER) return plan->recvbuf;
  if (plan->coll == COLL_ALLREDUCE || rank == plan->root)
    return (char *)plan->recvbuf + det_off(b, rank) * esize;
  return scratch + (size_t)n * det_len(b, rank) * esize;
}

/* Every rank sends its signature of the call to every other and compares. */
static weftResult_t det_check(struct weftComm *comm, const struct weft_plan *plan,
                              struct det_arrays *a) {
  const int n = comm->nranks, rank = comm->rank;
  signature_pack(&a->packed[rank], plan);
  size_t nops = 0;
  for (int j = 1; j < n; j++) {
    const int to = (rank + j) % n, from = (rank - j + n) % n;
    a->ops[nops++] = det_p2p(COLL_SEND, to, &a->packed[rank], NULL, sizeof a->packed[0], 0);
    a->ops[nops++] = det_p2p(COLL_RECV, from, NULL, &a->packed[from], sizeof a->packed[0], 0);
  }
  WEFT_TRY(det_group(comm, a, nops));
  for (int r = 0; r < n; r++) signature_unpack(&a->sigs[r], &a->packed[r]);
  const weftResult_t res = signature_compare(a->sigs, n, "ranks disagree on a collective");
  /* every rank sees the same: out of step, each breaks its comm */
  if (res != weftSuccess && signature_out_of_step(a->sigs, n))
    return comm_fail_alone(comm, res);
  return res;
}

static weftResult_t det_run_with(struct weftComm *comm, const struct weft_plan *plan,
                                 struct det_arrays *a);

weftResult_t det_run(struct weftComm *comm, const struct weft_plan *plan) {
  const size_t n = (size_t)comm->nranks;
  struct det_arrays a = {.ops = calloc(2 * n, sizeof *a.ops),
                         .ptrs = calloc(2 * n, sizeof *a.ptrs),
                         .packed = calloc(n, sizeof *a.packed),
                         .sigs = calloc(n, sizeof *a.sigs),
                         .in = calloc(n, sizeof *a.in)};
  weftResult_t res = weftSystemError;
  if (a.ops != NULL && a.ptrs != NULL && a.packed != NULL && a.sigs != NULL && a.in != NULL)
    res = det_run_with(comm, plan, &a);
  else
    weft_error_set(res, "WEFT_DETERMINISTIC: out of memory");
  free(a.in);
  free(a.sigs);
  free(a.packed);
  free(a.ptrs);
  free(a.ops);
  return res;
}

static weftResult_t det_run_with(struct weftComm *comm, const struct weft_plan *plan,
                                 struct det_arrays *a) {
  const int n = comm->nranks, rank = comm->rank;
  const size_t esize = weftTypeSize(plan->datatype);
  struct weft_plan *ops = a->ops;
  const void **in = a->in;
  WEFT_TRY(det_check(comm, plan, a));

  const struct det_blocks b = det_blocks_of(plan, n);
  const size_t mine = det_len(&b, rank);
  /* scratch: the other ranks' block `rank` and this rank's own (kept apart,
   * so that an in-place call does not reduce into an input it still reads);
   * a reduce's non-root ranks also put their reduced block there */
  char *scratch = NULL;
  WEFT_TRY(det_scratch(comm, (size_t)(n + 1) * (mine > 0 ? mine : 1) * esize, &scratch));
  const size_t nops = det_scatter_ops(plan, n, rank, &b, 1, n, scratch, ops, 0);
  for (int r = 0; r < n; r++) in[r] = scratch + (size_t)r * mine * esize;
  memcpy(scratch + (size_t)rank * mine * esize,
         (const char *)plan->sendbuf + det_off(&b, rank) * esize, mine * esize);
  weftResult_t res = det_group(comm, a, nops);
  char *out = det_out(plan, n, rank, &b, scratch);
  if (res == weftSuccess && mine > 0) det_reduce(plan->datatype, plan->op, n, out, in, mine);
  if (res == weftSuccess && plan->coll != COLL_REDUCESCATTER)
    res = det_group(comm, a, det_gather_ops(plan, n, rank, &b, 1, n, out, ops, 0));
  return res;
}
