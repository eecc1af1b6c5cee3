/* A device comm's calls as its trace and its hang verdicts see them
 * (docs/diagnosis.md, "Calls on device memory"):
 * - each call is recorded as it is enqueued, with the comm's launches it
 *   went out as; its state is read from the words its kernels report in
 *   (launch_done.h) whenever the trace is read (a dump, a peer's question);
 * - weftCommGetAsyncError watches the comm: where its kernels have work
 *   and have ended nothing for WEFT_HANG_ASK_MS, it asks the peers where
 *   they are, and a different collective under the oldest unfinished
 *   call's number (ranks on different protocols or algorithms, a count of
 *   0 against others, chains whose roots differ: what the kernels' own
 *   comparison cannot see) breaks the comm at once on every rank;
 * - a kernel's failure (a timeout, a peer's that gave up first) gets the
 *   verdict as its error text, and the trace is dumped, as the host
 *   executor's failures are (hang.h). */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "../../core/comm.h"
#include "../../core/hang.h"
#include "../../core/trace.h"
#include "../../../transport/base/wait.h"
#include "device_mismatch.h"
#include "device_priv.h"

/* weftCommGetAsyncError may be polled in a loop: the comm's words are read
 * at most this often. */
#define WATCH_EVERY_NS 10000000ll

/* --- the trace's view of a call's launches --------------------------------- */

static void launch_probe(void *arg, const struct trace_launch *l, int32_t *state,
                         int32_t *result, int32_t *waiting_on) {
  struct device_comm *d = arg;
  const enum launch_state s = launch_done_state(device_ended_h(d), DEV_MAX_CHANNELS,
                                                device_failed_h(d), l->first, l->last,
                                                (int)l->nblocks);
  switch (s) {
    case LAUNCH_QUEUED: *state = TRACE_SCHEDULED; break;
    case LAUNCH_RUNNING: *state = TRACE_STARTED; break;
    case LAUNCH_OK: *state = TRACE_COMPLETED; *result = weftSuccess; break;
    default: {
      *state = TRACE_FAILED;
      const uint32_t why = __atomic_load_n(&d->flags_h[1], __ATOMIC_ACQUIRE);
      *result = why == DEV_GAVE_UP_MISMATCH || why == DEV_GAVE_UP_PEER_MISMATCH
                    ? weftInvalidUsage
                    : why == DEV_GAVE_UP_ABORT ? weftRemoteError : weftSystemError;
      const struct dev_stall *st = device_stall_first(device_stall_h(d), DEV_MAX_CHANNELS);
      if (st != NULL) *waiting_on = st->peer;
    }
  }
}

void device_watch_init(struct device_comm *d) {
  pthread_mutex_init(&d->watch.mutex, NULL);
  d->watch.since_ns = (int64_t)clock_ns();
}

void device_watch_open(struct weftComm *comm, struct device_comm *d) {
  pthread_mutex_lock(&d->watch.mutex);
  d->watch.next_ask_ns = trace_ask_after_ns(comm->trace);
  d->watch.idle_seen = 1; /* the first launch starts the stall clock */
  pthread_mutex_unlock(&d->watch.mutex);
  trace_launch_probe_set(comm->trace, launch_probe, d);
}

void device_watch_close(struct weftComm *comm, struct device_comm *d) {
  (void)d;
  trace_launch_probe_set(comm->trace, NULL, NULL); /* returns once no reader uses d */
}

void device_watch_fini(struct device_comm *d) { pthread_mutex_destroy(&d->watch.mutex); }

/* The last launch recorded and its blocks, in one word (any thread reads it). */
#define LAUNCHED_PACK(seq, nblocks) (((seq) << 8) | (uint64_t)(nblocks))

void device_trace_call(struct weftComm *comm, const struct weft_plan *plan,
                       const struct trace_launch *l, weftResult_t res) {
  if (l == NULL || l->last == 0) {
    trace_record_done(comm->trace, plan, res); /* refused, or nothing went out before */
    return;
  }
  trace_record_launched(comm->trace, plan, l); /* its kernels, or the launch before it */
  struct device_comm *d = comm->device;
  if (l->first > l->last || d == NULL) return; /* no launch of its own */
  struct device_watch *w = &d->watch;
  /* work after a look that found none: a stall is timed from now */
  if (__atomic_exchange_n(&w->idle_seen, 0, __ATOMIC_ACQ_REL))
    __atomic_store_n(&w->busy_since_ns, (int64_t)clock_ns(), __ATOMIC_RELEASE);
  /* the newest (a group's send/recv kernel goes out after its collectives);
   * only the calling thread stores it */
  if (l->last > __atomic_load_n(&w->launched, __ATOMIC_RELAXED) >> 8)
    __atomic_store_n(&w->launched, LAUNCHED_PACK(l->last, l->nblocks), __ATOMIC_RELEASE);
}

/* --- the verdict ------------------------------------------------------------ */

/* Holds comm as an operation does while its peers are asked (a quarter or
 * half a second; weftCommGetAsyncError's thread takes no hold otherwise):
 * an abort or destroy on another thread waits for it. 0, holding nothing,
 * where comm is not ready (aborted, finalized, suspended, revoked): no
 * question then. */
static int hold(struct weftComm *comm) {
  __atomic_add_fetch(&comm->active, 1, __ATOMIC_SEQ_CST);
  if (comm_life(comm) == COMM_READY) return 1;
  comm_op_end(comm);
  return 0;
}

/* The verdict found (res, text), kept: later asks return it. Under the mutex. */
static weftResult_t verdict_keep(struct device_comm *d, weftResult_t res, const char *text) {
  snprintf(d->watch.verdict, sizeof d->watch.verdict, "%s", text);
  __atomic_store_n(&d->watch.verdict_res, res, __ATOMIC_RELEASE);
  return weft_error_set(res, "%s", d->watch.verdict);
}

weftResult_t device_watch_kept(struct device_comm *d) {
  const weftResult_t res = __atomic_load_n(&d->watch.verdict_res, __ATOMIC_ACQUIRE);
  if (res == weftSuccess) return weftSuccess;
  return weft_error_set(res, "%s", d->watch.verdict);
}

weftResult_t device_watch_failure(struct weftComm *comm, struct device_comm *d, uint32_t why,
                                  weftResult_t res) {
  /* an abort on this rank is no hang to explain; a mismatch a kernel
   * compared names itself */
  if (why == DEV_GAVE_UP_ABORT || why == DEV_GAVE_UP_MISMATCH || comm->trace == NULL ||
      comm->nranks < 2 || __atomic_load_n(&comm->abort_flag, __ATOMIC_ACQUIRE) != 0)
    return res;
  char cause[1024];
  snprintf(cause, sizeof cause, "%s", weft_error_text());
  pthread_mutex_lock(&d->watch.mutex);
  if (__atomic_load_n(&d->watch.verdict_res, __ATOMIC_ACQUIRE) != weftSuccess) {
    res = device_watch_kept(d); /* another thread judged meanwhile */
    pthread_mutex_unlock(&d->watch.mutex);
    return res;
  }
  struct trace_call subject;
  if (!hold(comm)) {
    pthread_mutex_unlock(&d->watch.mutex); /* going away: its kernels' word alone */
    return res;
  }
  if (!trace_oldest_unfinished(comm->trace, &subject)) {
    res = verdict_keep(d, res, cause);
  } else {
    char how[64], text[1024], both[2200];
    if (why == DEV_GAVE_UP_TIMEOUT)
      snprintf(how, sizeof how, "timed out after %.1f s on device memory",
               (double)comm_timeout_ns(comm) / 1e9);
    else snprintf(how, sizeof how, "failed on device memory");
    const weftResult_t judged = hang_judge(comm, &subject, how, 0, text, sizeof text);
    if (judged != weftSuccess) {
      res = verdict_keep(d, judged, text);
      comm_fail_alone(comm, res);
    } else {
      snprintf(both, sizeof both, "%s (rank %d: %s)", text, comm->rank, cause);
      res = verdict_keep(d, res, both);
    }
  }
  trace_dump_to_dir(comm->trace, why == DEV_GAVE_UP_TIMEOUT ? TRACE_ON_TIMEOUT : TRACE_ON_FAILURE,
                    d->watch.verdict);
  /* unlocked before the hold ends: an abort waiting for it frees d after */
  pthread_mutex_unlock(&d->watch.mutex);
  comm_op_end(comm);
  return res;
}

/* --- the stall watch -------------------------------------------------------- */

weftResult_t device_watch_stall(struct weftComm *comm, struct device_comm *d) {
  struct device_watch *w = &d->watch;
  const uint64_t ask_after = trace_ask_after_ns(comm->trace);
  if (comm->trace == NULL || comm->nranks < 2 || ask_after == 0 ||
      __atomic_load_n(&comm->abort_flag, __ATOMIC_ACQUIRE) != 0)
    return weftSuccess;
  const int64_t now = (int64_t)clock_ns();
  if (now - __atomic_load_n(&w->checked_ns, __ATOMIC_RELAXED) < WATCH_EVERY_NS) return weftSuccess;
  /* one watcher at a time, and never waiting for another */
  if (pthread_mutex_trylock(&w->mutex) != 0) return weftSuccess;
  if (__atomic_load_n(&w->verdict_res, __ATOMIC_ACQUIRE) != weftSuccess) {
    pthread_mutex_unlock(&w->mutex); /* judged meanwhile: device_comm_error says it */
    return weftSuccess;
  }
  __atomic_store_n(&w->checked_ns, now, __ATOMIC_RELAXED);
  weftResult_t res = weftSuccess;
  int held = 0;
  const uint64_t packed = __atomic_load_n(&w->launched, __ATOMIC_ACQUIRE);
  const struct launch_done last = {.seq = packed >> 8, .nblocks = (int)(packed & 0xff)};
  const uint64_t newest = launch_done_newest(device_ended_h(d), DEV_MAX_CHANNELS);
  const int idle = last.seq == 0 || launch_done_ended(&last, device_ended_h(d));
  if (idle) __atomic_store_n(&w->idle_seen, 1, __ATOMIC_RELEASE);
  if (newest != w->seen_newest || idle) {
    /* progress, or nothing to do: the next stall is timed from here */
    w->seen_newest = newest;
    w->since_ns = now;
    w->next_ask_ns = ask_after;
  } else {
    /* nothing ended since the last look that saw progress, nor since the
     * first launch after the comm was last seen idle */
    const int64_t busy = __atomic_load_n(&w->busy_since_ns, __ATOMIC_ACQUIRE);
    const int64_t from = busy > w->since_ns ? busy : w->since_ns;
    if (now - from >= (int64_t)w->next_ask_ns) {
      w->next_ask_ns *= 2; /* asked again after twice as long, and so on */
      struct trace_call subject;
      if (trace_oldest_unfinished(comm->trace, &subject) && subject.on_device &&
          subject.state != TRACE_FAILED && hold(comm)) {
        char how[64], text[1024];
        snprintf(how, sizeof how, "has ended nothing for %.1f s on device memory",
                 (double)(now - from) / 1e9);
        const weftResult_t judged = hang_judge(comm, &subject, how, 1, text, sizeof text);
        if (judged == weftSuccess) {
          WEFT_INFO(LOG_COLL, "rank %d: %s", comm->rank, text);
        } else {
          /* the kernels stop (and poison their channels, which stops the
           * peers' too); every rank's own question finds the same */
          res = verdict_keep(d, judged, text);
          comm_fail_alone(comm, res);
          __atomic_store_n(&d->flags_h[0], 1u, __ATOMIC_RELEASE); /* the kernels' abort flag */
          trace_dump_to_dir(comm->trace, TRACE_ON_FAILURE, text);
        }
        held = 1;
      }
    }
  }
  pthread_mutex_unlock(&w->mutex);
  if (held) comm_op_end(comm); /* after the unlock: an abort waiting for it frees d after */
  return res;
}
