/* Bounded waiting: every spin loop in weft polls a weft_wait, which fails the
 * wait on abort, on a poisoned connection, on a dead peer or after the
 * timeout, and backs off (yield, then sleep) when a wait drags on so that
 * ranks outnumbering cores still make progress. */
#ifndef WEFT_WAIT_H
#define WEFT_WAIT_H

#include <stdint.h>
#include <sys/types.h>

#include "../../include/weft.h"
#include "param_load.h"

/* The waits' settings: WEFT_TIMEOUT, WEFT_SPIN_NS, WEFT_PROXY_KICK_US. */
extern struct weft_param wait_params[];

struct weft_wait {
  uint64_t start_ns;
  uint64_t timeout_ns;
  uint64_t next_check_ns;
  uint32_t iter;
  uint32_t spin_mask; /* polls between slow checks, minus one (a power of two) */
  const volatile uint32_t *abort_local;  /* this rank's comm abort flag, or NULL */
  const volatile uint32_t *abort_remote; /* a connection's shared poison word, or NULL */
  pid_t peer_pid;                         /* same-host peer to watch, or 0 */
  int peer_gone; /* 1 poisoned, 2 dead: seen once, so the caller looks again */
  int peer_rank;
  const char *what; /* for the error text: "recv from", "send to" ... */
};

uint64_t clock_ns(void);

/* Whether process pid (of this pid namespace) has ended: no such process, or
 * a zombie. With exiting_counts, also a process past the point of exit
 * (PF_EXITING in /proc/<pid>/stat: its sockets close and its memory is torn
 * down before it becomes a zombie, so a peer may notice the death first).
 * Without /proc, kill() alone decides. */
int pid_gone(pid_t pid, int exiting_counts);

/* Default per-wait timeout from WEFT_TIMEOUT, in nanoseconds. */
uint64_t wait_default_timeout_ns(void);
/* WEFT_PROXY_KICK_US in nanoseconds (0: proxies are not kicked). */
uint64_t wait_proxy_kick_ns(void);

/* Starts a wait that is about to spin (its caller looked once and found
 * nothing): runs the thread's prelude first (below). */
void wait_begin(struct weft_wait *w, uint64_t timeout_ns, const volatile uint32_t *abort_local,
                const volatile uint32_t *abort_remote, pid_t peer_pid, int peer_rank,
                const char *what);

/* The slow half of wait_poll: clocks, flags, liveness, back-off. */
weftResult_t wait_check(struct weft_wait *w);

/* Tells the waits that nlocal ranks (or busy threads) share this host's
 * ncpus CPUs (0: this process's own). When they outnumber the CPUs, the waits
 * yield the core at once until the hold is given back: returns 1 when it took
 * a hold, which the caller releases with wait_oversubscribed_release() when
 * those ranks or threads are gone, else 0. Thread-safe. */
int wait_oversubscribed_hold(int nlocal, int ncpus);
void wait_oversubscribed_release(void);

/* What a thread's slow waits tell the layer above them (collectives/core/hang.c:
 * a collective that stalls): set per thread, called from wait_check only, never
 * from the spinning fast path, and never while it runs (a wait inside it does
 * not call it again). */
enum wait_event {
  WAIT_STALLED,   /* the wait has lasted waited_ns: called every 50 ms or so */
  WAIT_TIMED_OUT, /* the wait has passed its timeout: its error follows */
};
struct wait_watcher {
  /* weftInProgress (or weftSuccess) to go on; an error ends the wait with
   * it (the watcher set the error text) */
  weftResult_t (*fn)(void *arg, enum wait_event event, int peer_rank, uint64_t waited_ns);
  void *arg;
};
/* The calling thread's watcher (wait.c's; set through wait_watcher_set). */
extern __thread const struct wait_watcher *wait_thread_watcher;
/* Makes w (NULL: none) the calling thread's watcher; returns the one it
 * replaces. w must live until it is replaced. Inline: every host call sets
 * one and puts the old one back. */
static inline const struct wait_watcher *wait_watcher_set(const struct wait_watcher *w) {
  const struct wait_watcher *old = wait_thread_watcher;
  wait_thread_watcher = w;
  return old;
}

/* Work a call puts off until it first waits (collectives/core/hang.c: the
 * call's trace record): a wait runs it as it begins to spin (wait_begin),
 * when the call's first stores are on their way to a peer, so that it
 * overlaps their flight; the call runs it itself where it never waited.
 * Once: the thread's prelude is taken away before it runs. Per thread. */
struct wait_prelude {
  void (*fn)(void *arg);
  void *arg;
};
extern __thread struct wait_prelude *wait_thread_prelude;
/* Makes p (NULL: none) the thread's prelude; returns the one it replaces. */
static inline struct wait_prelude *wait_prelude_set(struct wait_prelude *p) {
  struct wait_prelude *old = wait_thread_prelude;
  wait_thread_prelude = p;
  return old;
}
/* Runs the thread's prelude, if any, and takes it away first. */
static inline void wait_prelude_run(void) {
  struct wait_prelude *p = wait_thread_prelude;
  if (p == NULL) return;
  wait_thread_prelude = NULL;
  p->fn(p->arg);
}

/* Call once per spin iteration. Returns weftInProgress to keep waiting, or an
 * error (weftRemoteError with a message naming the peer) to give up. */
static inline weftResult_t wait_poll(struct weft_wait *w) {
  if ((++w->iter & w->spin_mask) != 0) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ volatile("yield");
#endif
    return weftInProgress;
  }
  return wait_check(w);
}

#endif
