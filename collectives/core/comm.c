/* The communicator's core, which every layer of collectives/ may call: its
 * liveness check, failure recording and poisoning, and the per-module state
 * table. It calls nothing else of collectives/. */
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../../transport/base/log.h"
#include "../../transport/base/status.h"
#include "../../transport/base/wait.h"
#include "comm.h"

/* This process's id, cached (getpid is a system call) and renewed in a
 * forked child, so that every entry point can afford to compare it. */
pid_t comm_pid_cached;
static pthread_once_t self_pid_once = PTHREAD_ONCE_INIT;
static void self_pid_refresh(void) { __atomic_store_n(&comm_pid_cached, getpid(), __ATOMIC_RELAXED); }
static void self_pid_init(void) {
  self_pid_refresh();
  pthread_atfork(NULL, NULL, self_pid_refresh);
}
pid_t comm_self_pid(void) {
  pthread_once(&self_pid_once, self_pid_init);
  return __atomic_load_n(&comm_pid_cached, __ATOMIC_RELAXED);
}

weftResult_t comm_check_slow(const struct weftComm *comm) {
  if (comm == NULL) return weft_error_set(weftInvalidArgument, "comm is NULL");
  const uint64_t magic = __atomic_load_n(&comm->magic, __ATOMIC_ACQUIRE);
  if (magic == COMM_MAGIC_CREATING && comm->pid == comm_self_pid())
    return weft_error_set(weftInvalidArgument,
                          "comm %p is being created without blocking (config blocking = 0), or "
                          "its creation failed: use it once weftCommGetAsyncError gives "
                          "weftSuccess (destroy or abort it otherwise)",
                          (const void *)comm);
  if (magic != COMM_MAGIC)
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
  if (!transport_kicks_matter()) return; /* no proxy moves any connection of the process */
  uint64_t now = 0; /* read once, by the first connection that kicks */
  for (int c = 0; c < comm->nchannels; c++) {
    conn_kick(&comm->channels[c].send, &now);
    conn_kick(&comm->channels[c].recv, &now);
  }
  const int n = comm->send_conns != NULL && comm->p2p_send_conns != NULL ? comm->nranks : 0;
  for (int r = 0; r < n; r++) {
    conn_kick(&comm->send_conns[r], &now);
    conn_kick(&comm->recv_conns[r], &now);
    conn_kick(&comm->p2p_send_conns[r], &now);
    conn_kick(&comm->p2p_recv_conns[r], &now);
  }
}

void comm_poison_conns(struct weftComm *comm) {
  for (int c = 0; c < comm->nchannels; c++) {
    conn_poison(&comm->channels[c].send);
    conn_poison(&comm->channels[c].recv);
  }
  const int n = comm->send_conns != NULL && comm->p2p_send_conns != NULL ? comm->nranks : 0;
  for (int r = 0; r < n; r++) {
    conn_poison(&comm->send_conns[r]);
    conn_poison(&comm->recv_conns[r]);
    conn_poison(&comm->p2p_send_conns[r]);
    conn_poison(&comm->p2p_recv_conns[r]);
  }
  /* before the caller returns and its buffers are reused: a peer that sees
   * the poison sees it before any later store (a release store alone lets
   * later stores pass it on weakly ordered processors) */
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
}

void comm_poison(struct weftComm *comm) {
  comm_poison_conns(comm);
  bootstrap_poison(comm->bs); /* peers waiting on the bootstrap learn it too */
}

static void error_lock(struct weftComm *comm) {
  while (__atomic_exchange_n(&comm->error_lock, 1, __ATOMIC_ACQUIRE) != 0)
    while (__atomic_load_n(&comm->error_lock, __ATOMIC_RELAXED) != 0) sched_yield();
}

static void error_unlock(struct weftComm *comm) {
  __atomic_store_n(&comm->error_lock, 0, __ATOMIC_RELEASE);
}

void comm_error_text_set(struct weftComm *comm, const char *text) {
  error_lock(comm);
  snprintf(comm->last_error, sizeof comm->last_error, "%s", text);
  error_unlock(comm);
}

void comm_error_text_copy(struct weftComm *comm, char *out, size_t n) {
  error_lock(comm);
  snprintf(out, n, "%s", comm->last_error);
  error_unlock(comm);
}

void comm_error_text_replace(struct weftComm *comm, const char *old, const char *text) {
  error_lock(comm);
  if (strcmp(comm->broken_cause, old) == 0)
    snprintf(comm->broken_cause, sizeof comm->broken_cause, "%s", text);
  if (strcmp(comm->last_error, old) == 0)
    snprintf(comm->last_error, sizeof comm->last_error, "%s", text);
  error_unlock(comm);
}

/* Once comm is broken, the first text it failed with is its cause. */
static void broken_cause_keep(struct weftComm *comm) {
  error_lock(comm);
  if (comm->broken_cause[0] == '\0' && comm_async_error(comm) != weftSuccess)
    snprintf(comm->broken_cause, sizeof comm->broken_cause, "%s", comm->last_error);
  error_unlock(comm);
}

weftResult_t comm_fail(struct weftComm *comm, weftResult_t res) {
  comm_error_text_set(comm, weft_error_text());
  if (res == weftRemoteError || res == weftSystemError || res == weftInternalError) {
    comm_async_error_set(comm, res);
    comm_poison(comm);
  }
  broken_cause_keep(comm);
  return res;
}

weftResult_t comm_broken_refusal(struct weftComm *comm, const char *call) {
  char cause[sizeof comm->broken_cause];
  error_lock(comm);
  snprintf(cause, sizeof cause, "%s",
           comm->broken_cause[0] != '\0' ? comm->broken_cause : comm->last_error);
  error_unlock(comm);
  return weft_error_set(comm_async_error(comm), "%s%scommunicator is broken by an earlier error: %s",
                        call != NULL ? call : "", call != NULL ? ": " : "", cause);
}

weftResult_t comm_fail_alone(struct weftComm *comm, weftResult_t res) {
  comm_error_text_set(comm, weft_error_text());
  comm_async_error_set(comm, res);
  broken_cause_keep(comm);
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

/* --- The life cycle (comm.h's table) ------------------------------------------ */

const char *comm_life_name(enum comm_life life) {
  static const char *const names[] = {
      [COMM_INITIALIZING] = "initializing", [COMM_READY] = "ready",
      [COMM_SUSPENDING] = "suspending",     [COMM_SUSPENDED] = "suspended",
      [COMM_REVOKING] = "revoking",         [COMM_REVOKED] = "revoked",
      [COMM_FINALIZED] = "finalized",       [COMM_ABORTED] = "aborted"};
  return (unsigned)life < sizeof names / sizeof names[0] ? names[life] : "unknown";
}

/* from -> to, if comm is in from; seq_cst, as the holds and their looks at
 * the state: of an operation and a transition, one sees the other. */
static int life_move(struct weftComm *comm, enum comm_life from, enum comm_life to) {
  uint32_t expected = from;
  return __atomic_compare_exchange_n(&comm->life, &expected, (uint32_t)to, 0, __ATOMIC_SEQ_CST,
                                     __ATOMIC_SEQ_CST);
}

/* The pause between two looks at a transition that another thread is
 * deciding (a suspension: microseconds; a revoke: up to the operations it
 * stops). */
static void life_pause(long ns) {
  struct timespec ts = {0, ns};
  nanosleep(&ts, NULL);
}

/* comm's state once no suspension or revoke is being decided. */
static enum comm_life life_settled(const struct weftComm *comm) {
  enum comm_life v;
  while ((v = comm_life(comm)) == COMM_SUSPENDING || v == COMM_REVOKING)
    life_pause(v == COMM_SUSPENDING ? 1000 : 100000);
  return v;
}

void comm_life_ready(struct weftComm *comm) { life_move(comm, COMM_INITIALIZING, COMM_READY); }

weftResult_t comm_life_suspend(struct weftComm *comm, int release_scratch, const char *fn) {
  /* the state first, then the holds: an operation holds, then asks */
  if (!life_move(comm, COMM_READY, COMM_SUSPENDING)) {
    enum comm_life v = comm_life(comm);
    if (v == COMM_SUSPENDING || v == COMM_SUSPENDED)
      return weft_error_set(weftInvalidUsage, "%s: already suspended", fn);
    return weft_error_set(weftInvalidUsage, "%s: communicator is %s", fn, comm_life_name(v));
  }
  if (__atomic_load_n(&comm->active, __ATOMIC_SEQ_CST) != 0 ||
      __atomic_load_n(&comm->pending, __ATOMIC_SEQ_CST) != 0) {
    life_move(comm, COMM_SUSPENDING, COMM_READY);
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
  life_move(comm, COMM_SUSPENDING, COMM_SUSPENDED);
  return weftSuccess;
}

int comm_life_resume(struct weftComm *comm) {
  return life_move(comm, COMM_SUSPENDED, COMM_READY);
}

int comm_life_revoke_begin(struct weftComm *comm, enum comm_life *from_out) {
  for (;;) {
    enum comm_life v = life_settled(comm);
    if (v != COMM_READY && v != COMM_SUSPENDED && v != COMM_FINALIZED) return 0;
    if (life_move(comm, v, COMM_REVOKING)) {
      __atomic_store_n(&comm->abort_flag, 1u, __ATOMIC_SEQ_CST);
      *from_out = v;
      return 1;
    }
  }
}

void comm_life_revoke_end(struct weftComm *comm, enum comm_life from) {
  __atomic_store_n(&comm->abort_flag, 0u, __ATOMIC_SEQ_CST);
  if (!life_move(comm, COMM_REVOKING, from == COMM_FINALIZED ? COMM_FINALIZED : COMM_REVOKED))
    __atomic_store_n(&comm->abort_flag, 1u, __ATOMIC_SEQ_CST); /* aborted meanwhile */
}

void comm_life_finalize(struct weftComm *comm) {
  for (;;) {
    enum comm_life v = life_settled(comm);
    if (v == COMM_FINALIZED || v == COMM_ABORTED || life_move(comm, v, COMM_FINALIZED)) return;
  }
}

void comm_life_abort(struct weftComm *comm) {
  __atomic_store_n(&comm->life, (uint32_t)COMM_ABORTED, __ATOMIC_SEQ_CST);
  __atomic_store_n(&comm->abort_flag, 1u, __ATOMIC_SEQ_CST);
}

int comm_life_revoked(const struct weftComm *comm) {
  enum comm_life v = comm_life(comm);
  return v == COMM_REVOKING || v == COMM_REVOKED;
}

weftResult_t comm_op_begin_state(struct weftComm *comm, int flags, const char *fn,
                                  enum comm_life v) {
  const int rebuild = (flags & COMM_OP_REBUILD) != 0;
  /* a suspension being decided sees the hold and fails: wait for it */
  if (flags & COMM_OP_HOLD)
    while (v == COMM_SUSPENDING) {
      life_pause(1000);
      v = comm_life(comm);
    }
  const char *sep = fn != NULL ? ": " : "";
  if (fn == NULL) fn = "";
  switch (v) {
    case COMM_READY:
      return weftSuccess;
    case COMM_SUSPENDING: /* only asked: the hold, when it runs, settles it */
    case COMM_SUSPENDED:
      if (rebuild || v == COMM_SUSPENDING) return weftSuccess;
      return weft_error_set(weftInvalidUsage, "%s%scommunicator is suspended: resume it first",
                            fn, sep);
    case COMM_REVOKED:
      if (rebuild) return weftSuccess;
      /* fall through */
    case COMM_REVOKING:
      if (rebuild)
        return weft_error_set(weftRemoteError,
                              "%s%scommunicator is being revoked on another thread", fn, sep);
      return weft_error_set(weftInvalidUsage,
                            "%s%scommunicator was revoked (weftCommRevoke): it can be split, "
                            "shrunk, destroyed or aborted, nothing else", fn, sep);
    case COMM_FINALIZED:
      return weft_error_set(weftInvalidUsage, "%s%scommunicator was finalized", fn, sep);
    case COMM_ABORTED:
      return weft_error_set(weftRemoteError, "%s%scommunicator was aborted", fn, sep);
    case COMM_INITIALIZING:
      break;
  }
  return weft_error_set(weftInvalidUsage, "%s%scommunicator is %s", fn, sep, comm_life_name(v));
}

void comm_device_bind(struct weftComm *comm, int dev) {
  if (comm != NULL && dev >= 0 && comm->cuda_dev < 0) comm->cuda_dev = dev;
}
