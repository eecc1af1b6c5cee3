/* The host executor's dispatch. */
#include <stdint.h>
#include <string.h>

#include "../transport/status.h"
#include "plan.h"
#include "reduce_host.h"

static const algo_fn ring_algos[COLL_NUM_RING] = {
    [COLL_ALLREDUCE] = ring_allreduce,
    [COLL_ALLGATHER] = ring_allgather,
    [COLL_REDUCESCATTER] = ring_reducescatter,
    [COLL_BROADCAST] = ring_broadcast,
    [COLL_REDUCE] = ring_reduce,
};

/* With one rank every collective is a copy (avg divides by one). */
static void run_single_rank(const struct weft_plan *plan) {
  size_t nbytes = plan->count * weftTypeSize(plan->datatype); /* rank 0's block */
  if (plan->recvbuf != plan->sendbuf && nbytes > 0) memcpy(plan->recvbuf, plan->sendbuf, nbytes);
}

weftResult_t plan_run_host(struct weftComm *comm, const struct weft_plan *plan) {
  if (plan_is_p2p(plan)) return p2p_run(comm, &plan, 1);
  if (plan->count == 0) return weftSuccess;
  if (comm->nranks == 1) {
    run_single_rank(plan);
    return weftSuccess;
  }
  /* each channel takes a contiguous, 64-byte aligned share */
  size_t esize = weftTypeSize(plan->datatype);
  size_t align = 64 / esize;
  size_t share = (plan->count + (size_t)plan->nchannels - 1) / (size_t)plan->nchannels;
  share = (share + align - 1) / align * align;
  for (int c = 0; c < plan->nchannels; c++) {
    size_t offset = (size_t)c * share;
    if (offset >= plan->count) break;
    size_t count = plan->count - offset < share ? plan->count - offset : share;
    WEFT_TRY(ring_algos[plan->coll](comm, &comm->channels[c], plan, offset, count));
  }
  return weftSuccess;
}
