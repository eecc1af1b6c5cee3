/* Launching a group's operations now: each communicator's on a thread of its
 * own (the caller's for the first, kept workers for the others), collectives
 * in call order, then that communicator's sends and receives together. The
 * group calls (collectives/api/group.c) and the host streams' workers
 * (collectives/api/stream.c) both launch through here. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../../transport/base/status.h"
#include "../../algo/sendrecv.h"
#include "../../core/hang.h"
#include "../../core/signature.h"
#include "../../core/trace.h"
#include "run.h"
#include "launch.h"

/* launch_op_begin and launch_op_end, inline for this file's callers (a
 * global function of a shared object's code is not inlined). */
static inline weftResult_t op_begin(struct weftComm *comm) {
  WEFT_TRY(comm_op_begin(comm, COMM_OP_HOLD, NULL));
  if (comm_async_error(comm) != weftSuccess) return comm_broken_refusal(comm, NULL);
  comm_kick_conns(comm);
  return weftSuccess;
}

/* An op that a revoke cut short does not break the comm (the revoke keeps
 * it for split and shrink), but its failure is still the comm's last error,
 * saying why: the waits' own text only says the comm was aborted. */
static void op_revoked(struct weftComm *comm, weftResult_t res) {
  if (strstr(weft_error_text(), "revoked") == NULL) {
    char cause[768];
    snprintf(cause, sizeof cause, "%s", weft_error_text());
    weft_error_set(res, "cut short by a revoke of the communicator (weftCommRevoke): %s", cause);
  }
  comm_error_text_set(comm, weft_error_text());
}

static inline weftResult_t op_end(struct weftComm *comm, weftResult_t res) {
  if (res != weftSuccess) {
    if (!comm_life_revoked(comm)) comm_fail(comm, res);
    else op_revoked(comm, res);
  }
  comm_op_end(comm);
  return res;
}

weftResult_t launch_op_begin(struct weftComm *comm) { return op_begin(comm); }

weftResult_t launch_op_end(struct weftComm *comm, weftResult_t res) { return op_end(comm, res); }

/* A call refused before it ran is failed in the trace. */
static void op_refused(struct weftComm *comm, const uint64_t *ids, size_t nids,
                       weftResult_t res) {
  for (size_t i = 0; i < nids; i++) trace_set_state(comm->trace, ids[i], TRACE_FAILED, -1, res);
}

weftResult_t launch_collective(struct weftComm *comm, const struct weft_plan *plan,
                               int record) {
  weftResult_t res = op_begin(comm);
  if (res != weftSuccess) {
    /* recorded as never started: a verdict on the dumps leaves it out */
    const uint64_t id = record ? trace_record(comm->trace, plan, 0) : plan->trace_id;
    op_refused(comm, &id, 1, res);
    return op_end(comm, res);
  }
  struct hang_watch hw;
  const size_t nbytes = plan->count * plan_type_size(plan->datatype);
  if (record) hang_watch_record(&hw, comm, plan, nbytes);
  else hang_watch_begin(&hw, comm, &plan->trace_id, 1, nbytes, 0);
  res = signature_agree(comm, plan);
  if (res == weftSuccess) res = plan_run_host(comm, plan);
  res = hang_watch_end(&hw, res);
  return op_end(comm, res);
}

/* A launch's sends and receives, with the marks of its all-to-alls, gathers
 * and scatters among them in call order (plan_is_mark: they run nothing,
 * finished from the start in the executor, and are watched with the sends
 * and receives, whose waits are the marks' calls). */
static weftResult_t op_run_sendrecv(struct weftComm *comm, const struct weft_plan *const *ops,
                                    size_t nops) {
  uint64_t ids_fixed[16], *ids = nops <= 16 ? ids_fixed : malloc(sizeof *ids * nops);
  size_t nids = 0, nbytes = 0;
  for (size_t i = 0; ids != NULL && i < nops; i++) {
    if (ops[i]->trace_id != 0) ids[nids++] = ops[i]->trace_id;
    if (!plan_is_mark(ops[i])) nbytes += ops[i]->count * weftTypeSize(ops[i]->datatype);
  }
  weftResult_t res = launch_op_begin(comm);
  if (res != weftSuccess) {
    op_refused(comm, ids, nids, res);
  } else {
    struct hang_watch hw;
    hang_watch_begin(&hw, comm, ids, nids, nbytes, 0);
    res = sendrecv_run(comm, ops, nops);
    res = hang_watch_end(&hw, res);
  }
  if (ids != ids_fixed) free(ids);
  return launch_op_end(comm, res);
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

/* Collectives run in call order; then all sends and receives together, with
 * the marks of the all-to-alls, gathers and scatters among them (compared
 * in call order where WEFT_CHECK asks). */
static void batch_run(struct comm_batch *b) {
  /* held by group_launch from before the first op to after the last, as
   * each op holds itself: an abort or a revoke on another thread (which
   * wait until no thread holds the comm) frees or reuses nothing that the
   * batch still touches between its ops (the marks' comparison, the trace
   * of the sends and receives a failed collective leaves unrun) */
  /* a launch's few ops list on the stack */
  const struct weft_plan *few[16];
  const struct weft_plan **sendrecv =
      b->nall <= 16 ? few : malloc(sizeof *sendrecv * (b->nall ? b->nall : 1));
  size_t nsendrecv = 0;
  b->res = sendrecv ? weftSuccess : weft_error_set(weftSystemError, "out of memory");
  for (size_t i = 0; i < b->nall && b->res == weftSuccess; i++) {
    const struct weft_plan *plan = &b->all[i].plan;
    if (b->all[i].comm != b->comm) continue;
    if (plan_is_mark(plan)) {
      sendrecv[nsendrecv++] = plan;
      b->res = comm_op_begin(b->comm, 0, NULL); /* an aborted or revoked comm compares nothing */
      if (b->res == weftSuccess) b->res = signature_agree(b->comm, plan);
      if (b->res != weftSuccess) comm_fail(b->comm, b->res); /* the comm's last error */
    } else if (plan_is_sendrecv(plan)) {
      sendrecv[nsendrecv++] = plan;
    } else {
      b->res = launch_collective(b->comm, plan, 0);
    }
  }
  if (b->res == weftSuccess && nsendrecv > 0) {
    b->res = op_run_sendrecv(b->comm, sendrecv, nsendrecv);
  } else if (b->res != weftSuccess) {
    /* a collective before them failed: they never run, failed in the trace */
    for (size_t i = 0; i < b->nall; i++) {
      const struct weft_plan *plan = &b->all[i].plan;
      if (b->all[i].comm == b->comm && plan->trace_id != 0 &&
          (plan_is_mark(plan) || plan_is_sendrecv(plan)))
        trace_set_state(b->comm->trace, plan->trace_id, TRACE_FAILED, -1, b->res);
    }
  }
  if (b->res != weftSuccess) snprintf(b->error, sizeof b->error, "%s", weft_error_text());
  if (sendrecv != few) free(sendrecv);
  comm_op_end(b->comm);
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

/* Ends the caller's hold of each op's comm (group_launch's caller_holds). */
static void caller_holds_end(const struct group_op *ops, size_t nops, int caller_holds) {
  for (size_t i = 0; caller_holds && i < nops; i++) comm_op_end(ops[i].comm);
}

weftResult_t group_launch(const struct group_op *ops, size_t nops, int caller_holds) {
  /* one collective, the common case: run it here, without the batches */
  if (nops == 1 && !plan_is_sendrecv(&ops[0].plan) && !plan_is_mark(&ops[0].plan)) {
    const weftResult_t res = launch_collective(ops[0].comm, &ops[0].plan, 0);
    caller_holds_end(ops, nops, caller_holds);
    return res;
  }
  size_t nbatches = 0;
  /* one comm's ops (the common case) need no allocation */
  struct comm_batch one[1];
  int single = 1;
  for (size_t i = 1; i < nops && single; i++) single = ops[i].comm == ops[0].comm;
  struct comm_batch *batches = single ? one : calloc(nops ? nops : 1, sizeof *batches);
  if (batches == NULL) {
    caller_holds_end(ops, nops, caller_holds);
    return weft_error_set(weftSystemError, "out of memory");
  }
  for (size_t i = 0; i < nops; i++) {
    size_t b = 0;
    while (b < nbatches && batches[b].comm != ops[i].comm) b++;
    if (b == nbatches) { /* field by field: a literal would zero the error text too */
      struct comm_batch *nb = &batches[nbatches++];
      nb->comm = ops[i].comm;
      nb->all = ops;
      nb->nall = nops;
      nb->res = weftSuccess;
      nb->error[0] = '\0';
      nb->finished = 0;
      comm_hold(nb->comm); /* batch_run ends it */
    }
  }
  caller_holds_end(ops, nops, caller_holds);
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
  else if (nbatches > 0) comm_op_end(batches[0].comm); /* not run */
  for (size_t b = handed; b < nbatches; b++) comm_op_end(batches[b].comm); /* not handed over */
  if (nbatches > 1) {
    pthread_mutex_lock(&pool.mutex);
    for (size_t b = 1; b < handed; b++)
      while (!batches[b].finished) pthread_cond_wait(&pool.finished, &pool.mutex);
    pthread_mutex_unlock(&pool.mutex);
  }
  for (size_t b = 0; b < handed && res == weftSuccess; b++)
    if (batches[b].res != weftSuccess)
      res = weft_error_set(batches[b].res, "%s", batches[b].error);
  if (batches != one) free(batches);
  return res;
}
