/* The host executor's dispatch. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../../transport/base/status.h"
#include "../../algo/algo.h"
#include "../../algo/bulk.h"
#include "../../algo/cma.h"
#include "../../algo/deterministic.h"
#include "../../algo/sendrecv.h"
#include "../../algo/ring_steps.h"
#include "../../core/plan.h"
#include "../../core/redop.h"
#include "../../reduce/reduce_host.h"
#include "run.h"

/* With one rank every collective is a copy (avg divides by one). */
static void run_single_rank(const struct weft_plan *plan) {
  size_t nbytes = plan->count * plan_type_size(plan->datatype); /* rank 0's block */
  if (plan->recvbuf != plan->sendbuf && nbytes > 0) memcpy(plan->recvbuf, plan->sendbuf, nbytes);
}

/* A pre-multiply op runs as a sum over the scaled input, and so does avg of
 * the narrow floating types (redop_avg_prescales), with 1/n for scalar and
 * avg in its signature, so that a rank calling a sum still differs. An
 * all-reduce scales into its output and sums there in place; the other
 * collectives, whose output is smaller or absent, scale into a buffer. */
static weftResult_t run_premul(struct weftComm *comm, const struct weft_plan *plan) {
  size_t count = plan->count;
  if (plan->coll == COLL_REDUCESCATTER) count *= (size_t)comm->nranks;
  struct weft_plan sum = *plan;
  sum.op = weftSum;
  sum.avg_prescaled = plan->op == weftAvg;
  void *scaled = plan->recvbuf;
  if (plan->coll != COLL_ALLREDUCE) {
    scaled = malloc(count * plan_type_size(plan->datatype) + 1);
    if (scaled == NULL)
      return weft_error_set(weftSystemError, "%s: out of memory for a pre-scaled input",
                            coll_kind_name(plan->coll));
  }
  redop_premul(plan, plan->sendbuf, count, scaled);
  sum.sendbuf = scaled;
  weftResult_t res = plan_run_host(comm, &sum);
  if (scaled != plan->recvbuf) free(scaled);
  return res;
}

/* Avg of a narrow floating type: a sum of the input scaled by 1/n. */
static weftResult_t run_avg_prescaled(struct weftComm *comm, const struct weft_plan *plan) {
  struct weft_plan avg = *plan;
  redop_avg_scalar(plan->datatype, comm->nranks, avg.premul_scalar);
  avg.premul_ptr = NULL;
  return run_premul(comm, &avg);
}

weftResult_t plan_run_host(struct weftComm *comm, const struct weft_plan *plan) {
  if (plan_is_sendrecv(plan)) return sendrecv_run(comm, &plan, 1);
  if (plan->count == 0) /* the ranks agree that it moves nothing */
    return comm->nranks > 1 ? ring_empty_run(comm, &comm->channels[0], plan) : weftSuccess;
  if ((int)plan->op >= weftNumOps) return run_premul(comm, plan);
  if (comm->nranks == 1) {
    run_single_rank(plan);
    return weftSuccess;
  }
  if (det_applies(plan)) return det_run(comm, plan); /* narrow types widened: avg divides */
  if (plan->op == weftAvg && redop_avg_prescales(plan->datatype))
    return run_avg_prescaled(comm, plan);
  if (plan->algo == ALGO_CMA) return cma_run(comm, plan);
  if (plan->algo == ALGO_BULK) return bulk_run(comm, plan);
  /* a pipelined algorithm over the whole buffer on channel 0 (the other
   * channels' connections carry bulk's chunks) */
  algo_fn fn = ring_run;
  if (plan->coll == COLL_ALLREDUCE && plan->algo == ALGO_TREE) fn = tree_allreduce;
  if (plan->coll == COLL_ALLREDUCE && plan->algo == ALGO_RD) fn = rd_allreduce;
  if (plan->coll == COLL_ALLREDUCE && plan->algo == ALGO_DIRECT) fn = direct_allreduce;
  if (plan->coll == COLL_BROADCAST && plan->algo == ALGO_DIRECT) fn = direct_broadcast;
  if (plan->coll == COLL_REDUCE && plan->algo == ALGO_DIRECT) fn = direct_reduce;
  return fn(comm, &comm->channels[0], plan, 0, plan->count);
}
