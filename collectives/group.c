/* Groups: weftGroupStart/End record operations and launch them together,
 * now on the calling thread (and one thread per further communicator) or
 * later on a host stream's worker. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "../transport/status.h"
#include "device.h"
#include "stream.h"

static _Thread_local int group_depth;
static _Thread_local struct group_op *group_ops;
static _Thread_local size_t group_nops, group_cap;
static _Thread_local weftResult_t group_error; /* first failure while recording */

int group_active(void) { return group_depth > 0; }

void group_fail(weftResult_t res) {
  if (group_depth > 0 && group_error == weftSuccess) group_error = res;
}

weftResult_t group_record(struct weftComm *comm, const struct weft_plan *plan,
                          weftStream_t stream) {
  if (group_nops == group_cap) {
    size_t cap = group_cap ? group_cap * 2 : 16;
    struct group_op *ops = realloc(group_ops, cap * sizeof *ops);
    if (ops == NULL) return weft_error_set(weftSystemError, "out of memory");
    group_ops = ops;
    group_cap = cap;
  }
  group_ops[group_nops++] = (struct group_op){.comm = comm, .plan = *plan, .stream = stream};
  return weftSuccess;
}

/* --- running ------------------------------------------------------------- */

/* Marks the comm busy, so that an abort waits; fails if it is unusable. */
static weftResult_t op_begin(struct weftComm *comm) {
  __atomic_add_fetch(&comm->active, 1, __ATOMIC_SEQ_CST);
  if (__atomic_load_n(&comm->abort_flag, __ATOMIC_SEQ_CST))
    return weft_error_set(weftRemoteError, "communicator was aborted");
  if (comm->async_error != weftSuccess)
    return weft_error_set(comm->async_error, "communicator is broken by an earlier error: %s",
                          comm->last_error);
  return weftSuccess;
}

static weftResult_t op_end(struct weftComm *comm, weftResult_t res) {
  if (res != weftSuccess) comm_fail(comm, res);
  __atomic_sub_fetch(&comm->active, 1, __ATOMIC_SEQ_CST);
  return res;
}

static weftResult_t op_run_collective(struct weftComm *comm, const struct weft_plan *plan) {
  weftResult_t res = op_begin(comm);
  if (res == weftSuccess) res = check_signatures(comm, plan);
  if (res == weftSuccess) res = plan_run_host(comm, plan);
  return op_end(comm, res);
}

static weftResult_t op_run_p2p(struct weftComm *comm, const struct weft_plan *const *ops,
                               size_t nops) {
  weftResult_t res = op_begin(comm);
  if (res == weftSuccess) res = p2p_run(comm, ops, nops);
  return op_end(comm, res);
}

/* The operations of one communicator in a launch, run by one thread. */
struct comm_batch {
  struct weftComm *comm;
  const struct group_op *all; /* every op of the launch; this batch runs its comm's */
  size_t nall;
  weftResult_t res;
  char error[1024];
  pthread_t tid;
};

/* Collectives run in call order; then all sends and receives together. */
static void *batch_main(void *p) {
  struct comm_batch *b = p;
  const struct weft_plan **p2p = malloc(sizeof *p2p * (b->nall ? b->nall : 1));
  size_t np2p = 0;
  b->res = p2p ? weftSuccess : weft_error_set(weftSystemError, "out of memory");
  for (size_t i = 0; i < b->nall && b->res == weftSuccess; i++) {
    if (b->all[i].comm != b->comm) continue;
    if (plan_is_p2p(&b->all[i].plan)) p2p[np2p++] = &b->all[i].plan;
    else b->res = op_run_collective(b->comm, &b->all[i].plan);
  }
  if (b->res == weftSuccess && np2p > 0) b->res = op_run_p2p(b->comm, p2p, np2p);
  if (b->res != weftSuccess) snprintf(b->error, sizeof b->error, "%s", weft_error_text());
  free(p2p);
  return NULL;
}

weftResult_t group_launch(const struct group_op *ops, size_t nops) {
  /* one collective, the common case: run it here, without the batches */
  if (nops == 1 && !plan_is_p2p(&ops[0].plan)) return op_run_collective(ops[0].comm, &ops[0].plan);
  size_t nbatches = 0;
  struct comm_batch *batches = calloc(nops ? nops : 1, sizeof *batches);
  if (batches == NULL) return weft_error_set(weftSystemError, "out of memory");
  for (size_t i = 0; i < nops; i++) {
    size_t b = 0;
    while (b < nbatches && batches[b].comm != ops[i].comm) b++;
    if (b == nbatches)
      batches[nbatches++] = (struct comm_batch){.comm = ops[i].comm, .all = ops, .nall = nops};
  }
  /* one thread per further comm: one caller may drive several ranks */
  weftResult_t res = weftSuccess;
  size_t started = 0;
  for (size_t b = 1; b < nbatches; b++, started++)
    if (pthread_create(&batches[b].tid, NULL, batch_main, &batches[b]) != 0) {
      res = weft_error_errno(weftSystemError, "starting a group thread");
      break;
    }
  if (nbatches > 0 && res == weftSuccess) batch_main(&batches[0]);
  for (size_t b = 1; b <= started; b++) pthread_join(batches[b].tid, NULL);
  for (size_t b = 0; b < nbatches && res == weftSuccess; b++)
    if (batches[b].res != weftSuccess)
      res = weft_error_set(batches[b].res, "%s", batches[b].error);
  free(batches);
  return res;
}

/* --- the public calls ---------------------------------------------------- */

weftResult_t weftGroupStart(void) {
  if (group_depth == 0) group_error = weftSuccess;
  group_depth++;
  return weftSuccess;
}

/* Enqueues the group's operations on device memory on their CUDA streams, in
 * call order, once the whole group is known. */
static weftResult_t group_dispatch_device(const struct group_op *ops, size_t nops) {
  size_t n = 0;
  for (size_t i = 0; i < nops; i++) n += ops[i].plan.on_device != 0;
  if (n == 0) return weftSuccess;
  struct weftComm **comms = malloc(sizeof *comms * n);
  const struct weft_plan **plans = malloc(sizeof *plans * n);
  void **streams = malloc(sizeof *streams * n);
  weftResult_t res = comms && plans && streams
                         ? weftSuccess
                         : weft_error_set(weftSystemError, "out of memory");
  n = 0;
  for (size_t i = 0; i < nops && res == weftSuccess; i++)
    if (ops[i].plan.on_device) {
      comms[n] = ops[i].comm;
      plans[n] = &ops[i].plan;
      streams[n++] = ops[i].stream;
    }
  if (res == weftSuccess) res = device_enqueue_group(comms, plans, streams, n);
  free(comms);
  free(plans);
  free(streams);
  return res;
}

/* Launches ops: each stream's as one item of that stream, the rest now. */
static weftResult_t group_dispatch(const struct group_op *ops, size_t nops) {
  /* a comm's ops run as one batch, so they must agree on their stream */
  for (size_t i = 0; i < nops; i++)
    for (size_t j = 0; j < i; j++)
      if (ops[j].comm == ops[i].comm && ops[j].stream != ops[i].stream)
        return weft_error_set(weftInvalidUsage,
                              "a group uses two streams for one communicator (rank %d)",
                              ops[i].comm->rank);
  struct group_op *part = malloc(sizeof *part * (nops ? nops : 1));
  if (part == NULL) return weft_error_set(weftSystemError, "out of memory");
  weftResult_t res = group_dispatch_device(ops, nops);
  for (size_t i = 0; i < nops && res == weftSuccess; i++) {
    int first = ops[i].stream != NULL && !ops[i].plan.on_device;
    for (size_t j = 0; j < i && first; j++) first = ops[j].stream != ops[i].stream;
    if (!first) continue;
    struct host_stream *s;
    res = stream_lookup(ops[i].stream, &s);
    size_t n = 0;
    for (size_t j = i; j < nops; j++)
      if (ops[j].stream == ops[i].stream) part[n++] = ops[j];
    if (res == weftSuccess) res = stream_enqueue(s, part, n);
  }
  size_t n = 0;
  for (size_t i = 0; i < nops; i++)
    if (ops[i].stream == NULL && !ops[i].plan.on_device) part[n++] = ops[i];
  if (res == weftSuccess && n > 0) res = group_launch(part, n);
  free(part);
  return res;
}

weftResult_t weftGroupEnd(void) {
  if (group_depth == 0)
    return weft_error_set(weftInvalidUsage, "weftGroupEnd without weftGroupStart");
  if (--group_depth > 0) return weftSuccess;
  struct group_op *ops = group_ops;
  size_t nops = group_nops;
  group_ops = NULL;
  group_nops = group_cap = 0;
  weftResult_t res = group_error;
  if (res == weftSuccess) res = group_dispatch(ops, nops);
  free(ops);
  return res;
}

weftResult_t weftGroupSimulateEnd(float *estimatedUs) {
  if (group_depth == 0)
    return weft_error_set(weftInvalidUsage, "weftGroupSimulateEnd without weftGroupStart");
  if (--group_depth > 0) return weftSuccess;
  /* one comm's operations run one after another, comms side by side */
  double longest = 0;
  for (size_t i = 0; i < group_nops; i++) {
    int first = 1;
    for (size_t j = 0; j < i && first; j++) first = group_ops[j].comm != group_ops[i].comm;
    if (!first) continue;
    double us = 0;
    for (size_t j = i; j < group_nops; j++)
      if (group_ops[j].comm == group_ops[i].comm)
        us += plan_estimate_us(group_ops[j].comm, &group_ops[j].plan);
    if (us > longest) longest = us;
  }
  free(group_ops);
  group_ops = NULL;
  group_nops = group_cap = 0;
  weftResult_t res = group_error;
  if (res == weftSuccess && estimatedUs != NULL) *estimatedUs = (float)longest;
  return res;
}
