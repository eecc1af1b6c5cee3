/* Groups: weftGroupStart/End record operations and launch them together,
 * now on the calling thread (and a kept worker thread per further
 * communicator) or later on a host stream's worker. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../transport/status.h"
#include "device.h"
#include "p2p.h"
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
  if (comm_async_error(comm) != weftSuccess)
    return weft_error_set(comm_async_error(comm), "communicator is broken by an earlier error: %s",
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
  int finished; /* under the pool's mutex, for a batch a worker runs */
};

/* Collectives run in call order; then all sends and receives together. */
static void batch_run(struct comm_batch *b) {
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
}

/* Worker threads for the batches beyond the caller's own: started when a
 * launch needs more than are idle, then kept for later launches, so a
 * caller driving several ranks does not start threads per call. */
struct group_worker {
  pthread_t tid;
  pthread_cond_t wake;       /* batch was handed over */
  struct comm_batch *batch;  /* the batch to run; NULL while idle */
  struct group_worker *next; /* in the idle list */
};

static struct {
  pthread_mutex_t mutex;
  pthread_cond_t finished; /* some worker finished its batch */
  struct group_worker *idle;
  int nworkers;
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, NULL, 0};
static pthread_once_t pool_once = PTHREAD_ONCE_INIT;

static void *worker_main(void *p) {
  struct group_worker *w = p;
  pthread_setname_np(pthread_self(), "weft-group");
  pthread_mutex_lock(&pool.mutex);
  for (;;) {
    while (w->batch == NULL) pthread_cond_wait(&w->wake, &pool.mutex);
    struct comm_batch *b = w->batch;
    pthread_mutex_unlock(&pool.mutex);
    batch_run(b);
    pthread_mutex_lock(&pool.mutex);
    b->finished = 1;
    w->batch = NULL;
    w->next = pool.idle;
    pool.idle = w;
    pthread_cond_broadcast(&pool.finished);
  }
  return NULL;
}

/* A forked child has none of its parent's threads: it starts its own pool
 * (the parent's workers, idle at the fork, are left behind unused). */
static void pool_fork_prepare(void) { pthread_mutex_lock(&pool.mutex); }
static void pool_fork_parent(void) { pthread_mutex_unlock(&pool.mutex); }
static void pool_fork_child(void) {
  pthread_mutex_init(&pool.mutex, NULL);
  pthread_cond_init(&pool.finished, NULL);
  pool.idle = NULL;
  pool.nworkers = 0;
}
static void pool_init(void) { pthread_atfork(pool_fork_prepare, pool_fork_parent, pool_fork_child); }

/* Hands b to an idle worker, or to a new one. Call with the pool's mutex. */
static weftResult_t pool_hand_over(struct comm_batch *b) {
  struct group_worker *w = pool.idle;
  if (w != NULL) {
    pool.idle = w->next;
  } else {
    w = calloc(1, sizeof *w);
    if (w == NULL) return weft_error_set(weftSystemError, "out of memory");
    pthread_cond_init(&w->wake, NULL);
    int err = pthread_create(&w->tid, NULL, worker_main, w);
    if (err != 0) {
      pthread_cond_destroy(&w->wake);
      free(w);
      errno = err;
      return weft_error_errno(weftSystemError, "starting a group worker thread");
    }
    pthread_detach(w->tid);
    pool.nworkers++;
    WEFT_INFO(LOG_COLL, "group worker %d started", pool.nworkers);
  }
  w->batch = b;
  pthread_cond_signal(&w->wake);
  return weftSuccess;
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
  /* a worker per further comm: one caller may drive several ranks */
  weftResult_t res = weftSuccess;
  size_t handed = 1;
  if (nbatches > 1) {
    pthread_once(&pool_once, pool_init);
    pthread_mutex_lock(&pool.mutex);
    for (; handed < nbatches && res == weftSuccess; handed++)
      res = pool_hand_over(&batches[handed]);
    if (res != weftSuccess) handed--;
    pthread_mutex_unlock(&pool.mutex);
  }
  if (nbatches > 0 && res == weftSuccess) batch_run(&batches[0]);
  if (nbatches > 1) {
    pthread_mutex_lock(&pool.mutex);
    for (size_t b = 1; b < handed; b++)
      while (!batches[b].finished) pthread_cond_wait(&pool.finished, &pool.mutex);
    pthread_mutex_unlock(&pool.mutex);
  }
  for (size_t b = 0; b < handed && res == weftSuccess; b++)
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
