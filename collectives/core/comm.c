/* The communicator's core, which every layer of collectives/ may call: its
 * liveness check, failure recording and poisoning, and the per-module state
 * table. It calls nothing else of collectives/. */
#include <pthread.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include "../../transport/base/log.h"
#include "../../transport/base/status.h"
#include "../../transport/base/wait.h"
#include "comm.h"

/* This process's id, cached (getpid is a system call) and renewed in a
 * forked child, so that every entry point can afford to compare it. */
static pid_t self_pid;
static pthread_once_t self_pid_once = PTHREAD_ONCE_INIT;
static void self_pid_refresh(void) { __atomic_store_n(&self_pid, getpid(), __ATOMIC_RELAXED); }
static void self_pid_init(void) {
  self_pid_refresh();
  pthread_atfork(NULL, NULL, self_pid_refresh);
}
pid_t comm_self_pid(void) {
  pthread_once(&self_pid_once, self_pid_init);
  return __atomic_load_n(&self_pid, __ATOMIC_RELAXED);
}

weftResult_t comm_check(const struct weftComm *comm) {
  if (comm == NULL) return weft_error_set(weftInvalidArgument, "comm is NULL");
  if (comm->magic != COMM_MAGIC)
    return weft_error_set(weftInvalidArgument, "comm %p is not a live communicator",
                          (const void *)comm);
  if (comm->pid != comm_self_pid())
    return weft_error_set(weftInvalidUsage,
                          "comm %p belongs to process %d; this process (%d) is a fork of it and "
                          "may not use it: create a communicator here",
                          (const void *)comm, (int)comm->pid, (int)comm_self_pid());
  return weftSuccess;
}

static void conn_kick(struct weft_conn *c, uint64_t *now) {
  if (c->transport == NULL || c->transport->kick == NULL) return;
  if (*now == 0) *now = clock_ns();
  c->transport->kick(c, *now);
}

void comm_kick_conns(struct weftComm *comm) {
  uint64_t now = 0; /* read once, by the first connection that kicks */
  for (int c = 0; c < comm->nchannels; c++) {
    conn_kick(&comm->channels[c].send, &now);
    conn_kick(&comm->channels[c].recv, &now);
  }
  for (int r = 0; comm->send_conns != NULL && r < comm->nranks; r++) {
    conn_kick(&comm->send_conns[r], &now);
    conn_kick(&comm->recv_conns[r], &now);
  }
}

void comm_poison_conns(struct weftComm *comm) {
  for (int c = 0; c < comm->nchannels; c++) {
    conn_poison(&comm->channels[c].send);
    conn_poison(&comm->channels[c].recv);
  }
  for (int r = 0; comm->send_conns != NULL && r < comm->nranks; r++) {
    conn_poison(&comm->send_conns[r]);
    conn_poison(&comm->recv_conns[r]);
  }
}

void comm_poison(struct weftComm *comm) {
  comm_poison_conns(comm);
  bootstrap_poison(comm->bs); /* peers waiting on the bootstrap learn it too */
}

weftResult_t comm_fail(struct weftComm *comm, weftResult_t res) {
  snprintf(comm->last_error, sizeof comm->last_error, "%s", weft_error_text());
  if (res == weftRemoteError || res == weftSystemError || res == weftInternalError) {
    comm_async_error_set(comm, res);
    comm_poison(comm);
  }
  return res;
}

weftResult_t comm_fail_alone(struct weftComm *comm, weftResult_t res) {
  snprintf(comm->last_error, sizeof comm->last_error, "%s", weft_error_text());
  comm_async_error_set(comm, res);
  comm_poison(comm);
  return res;
}

/* The table is read by any thread that plans a call (the tuner asks modules
 * about their state) while the one thread running the comm's calls adds to
 * it: a slot is written whole before the count that publishes it, and the
 * state pointers are atomic. */
void *comm_state_get(const struct weftComm *comm, const struct comm_state_ops *ops) {
  const int n = __atomic_load_n(&comm->nstates, __ATOMIC_ACQUIRE);
  for (int i = 0; i < n; i++)
    if (comm->states[i].ops == ops) return __atomic_load_n(&comm->states[i].state, __ATOMIC_ACQUIRE);
  return NULL;
}

weftResult_t comm_state_set(struct weftComm *comm, const struct comm_state_ops *ops, void *state) {
  const int n = comm->nstates; /* only this thread changes it */
  for (int i = 0; i < n; i++)
    if (comm->states[i].ops == ops) {
      __atomic_store_n(&comm->states[i].state, state, __ATOMIC_RELEASE);
      return weftSuccess;
    }
  if (n == COMM_MAX_STATES)
    return weft_error_set(weftInternalError, "%s: comm holds %d modules' state already", ops->name,
                          COMM_MAX_STATES);
  comm->states[n] = (struct comm_state_slot){.ops = ops, .state = state};
  __atomic_store_n(&comm->nstates, n + 1, __ATOMIC_RELEASE);
  return weftSuccess;
}

void comm_states_destroy(struct weftComm *comm) {
  while (comm->nstates > 0) {
    struct comm_state_slot *slot = &comm->states[--comm->nstates];
    slot->ops->destroy(slot->state);
  }
}

uint64_t comm_states_scratch_nbytes(const struct weftComm *comm) {
  uint64_t n = 0;
  for (int i = 0; i < comm->nstates; i++)
    if (comm->states[i].ops->scratch_nbytes != NULL)
      n += comm->states[i].ops->scratch_nbytes(comm->states[i].state);
  return n;
}

void comm_states_scratch_release(struct weftComm *comm) {
  for (int i = 0; i < comm->nstates; i++)
    if (comm->states[i].ops->scratch_release != NULL)
      comm->states[i].ops->scratch_release(comm->states[i].state);
}

/* suspended: 0, or 1 once suspended; 2 while comm_suspend decides, which
 * an operation that marked the comm active waits out (comm_suspend_settled)
 * instead of refusing on a suspension that may yet fail. */
enum { SUSPEND_NONE = 0, SUSPEND_DONE = 1, SUSPEND_DECIDING = 2 };

weftResult_t comm_suspend(struct weftComm *comm, int release_scratch, const char *fn) {
  /* the mark first, seq_cst as the operations' mark and their look at it */
  uint32_t none = SUSPEND_NONE;
  if (!__atomic_compare_exchange_n(&comm->suspended, &none, SUSPEND_DECIDING, 0,
                                   __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
    return weft_error_set(weftInvalidUsage, "%s: already suspended", fn);
  if (__atomic_load_n(&comm->active, __ATOMIC_SEQ_CST) != 0 ||
      __atomic_load_n(&comm->pending, __ATOMIC_SEQ_CST) != 0) {
    __atomic_store_n(&comm->suspended, SUSPEND_NONE, __ATOMIC_SEQ_CST);
    return weft_error_set(weftInvalidUsage,
                          "%s: operations are still running or queued on a stream; "
                          "synchronize first", fn);
  }
  if (release_scratch) {
    uint64_t n = comm_states_scratch_nbytes(comm);
    comm_states_scratch_release(comm);
    WEFT_INFO(LOG_INIT, "comm %p rank %d suspended, %llu scratch bytes freed", (void *)comm,
              comm->rank, (unsigned long long)n);
  }
  __atomic_store_n(&comm->suspended, SUSPEND_DONE, __ATOMIC_SEQ_CST);
  return weftSuccess;
}

int comm_resume(struct weftComm *comm) {
  uint32_t done = SUSPEND_DONE;
  return __atomic_compare_exchange_n(&comm->suspended, &done, SUSPEND_NONE, 0, __ATOMIC_SEQ_CST,
                                     __ATOMIC_SEQ_CST);
}

/* For an operation that has marked comm active: whether comm is suspended,
 * once a suspension being decided is decided (it then fails: the mark is
 * seen). */
static int comm_suspend_settled(const struct weftComm *comm) {
  uint32_t v;
  while ((v = __atomic_load_n(&comm->suspended, __ATOMIC_SEQ_CST)) == SUSPEND_DECIDING) {
    struct timespec ts = {0, 1000};
    nanosleep(&ts, NULL);
  }
  return v == SUSPEND_DONE;
}

weftResult_t comm_op_mark(struct weftComm *comm) {
  __atomic_add_fetch(&comm->active, 1, __ATOMIC_SEQ_CST);
  if (__atomic_load_n(&comm->revoked, __ATOMIC_SEQ_CST))
    return weft_error_set(weftInvalidUsage, "communicator was revoked (weftCommRevoke)");
  if (comm_suspend_settled(comm))
    return weft_error_set(weftInvalidUsage, "communicator is suspended: resume it first");
  if (__atomic_load_n(&comm->finalized, __ATOMIC_ACQUIRE))
    return weft_error_set(weftInvalidUsage, "communicator was finalized");
  if (__atomic_load_n(&comm->abort_flag, __ATOMIC_SEQ_CST))
    return weft_error_set(weftRemoteError, "communicator was aborted");
  return weftSuccess;
}

int comm_suspended(const struct weftComm *comm) {
  return __atomic_load_n(&comm->suspended, __ATOMIC_SEQ_CST) == SUSPEND_DONE;
}

