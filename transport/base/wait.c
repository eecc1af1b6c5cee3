#include "wait.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <sched.h>
#include <signal.h>
#include <time.h>

#include "param.h"
#include "status.h"

enum { P_TIMEOUT, P_SPIN_NS, P_PROXY_KICK_US };

struct weft_param wait_params[] = {
    [P_TIMEOUT] = {.name = "WEFT_TIMEOUT", .type = PARAM_INT, .default_str = "600",
     .doc = "seconds any wait (peer data, credits, bootstrap) may last before it is an error; "
            "0 or less waits forever, and so does a value past 292 years (2^63 ns)"},
    [P_SPIN_NS] = {.name = "WEFT_SPIN_NS", .type = PARAM_INT, .default_str = "200000",
     .doc = "nanoseconds a wait spins before it yields the core (ignored when local ranks "
            "outnumber cores: then waits yield at once)"},
    [P_PROXY_KICK_US] = {.name = "WEFT_PROXY_KICK_US", .type = PARAM_INT, .default_str = "100",
     .doc = "microseconds a network proxy thread (socket, UCX) polls without sleeping once a "
            "rank begins an operation on one of its connections; a sleeping one is woken. More "
            "keeps a core busy longer for lower latency; `0` turns the kick off, and an idle "
            "proxy then notices new slots only after its sleep (up to 1 ms for UCX, 2 ms for "
            "sockets)",
     .see = "perf.md"},
    PARAM_END,
};

uint64_t wait_proxy_kick_ns(void) {
  int64_t us = param_int(&wait_params[P_PROXY_KICK_US]);
  return us > 0 ? (uint64_t)us * 1000u : 0;
}

uint64_t clock_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int pid_gone(pid_t pid, int exiting_counts) {
  if (kill(pid, 0) != 0) return errno == ESRCH;
  char path[64], buf[512];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT || errno == ESRCH; /* ended since kill(); else no /proc */
  ssize_t n = read(fd, buf, sizeof buf - 1);
  const int read_err = n < 0 ? errno : 0;
  close(fd);
  if (n <= 0) return read_err == ESRCH;
  buf[n] = '\0';
  const char *paren = strrchr(buf, ')'); /* the name may hold spaces and parentheses */
  char state = 0;
  unsigned long flags = 0;
  if (paren == NULL || sscanf(paren + 1, " %c %*d %*d %*d %*d %*d %lu", &state, &flags) != 2)
    return 0;
  if (state == 'Z' || state == 'X' || state == 'x') return 1;
  return exiting_counts && (flags & 0x4ul) != 0; /* PF_EXITING */
}

/* Holders of the oversubscribed mode (more local ranks or threads than usable
 * cores): communicators and connections whose peers share the host take a
 * hold while they live and give it back when they close, so the mode ends
 * with the last of them. Read by every wait_begin, from any thread. */
static uint32_t oversubscribed_holds;

static int oversubscribed(void) {
  return __atomic_load_n(&oversubscribed_holds, __ATOMIC_RELAXED) != 0;
}

int wait_oversubscribed_hold(int nlocal, int ncpus) {
  cpu_set_t set;
  if (ncpus <= 0) ncpus = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
  if (nlocal <= ncpus) return 0;
  if (__atomic_fetch_add(&oversubscribed_holds, 1, __ATOMIC_RELAXED) == 0)
    WEFT_INFO(LOG_INIT, "%d local ranks on %d cores: waits yield at once", nlocal, ncpus);
  return 1;
}

void wait_oversubscribed_release(void) {
  uint32_t before = __atomic_fetch_sub(&oversubscribed_holds, 1, __ATOMIC_RELAXED);
  if (before == 1) WEFT_INFO(LOG_INIT, "no longer oversubscribed: waits spin first again");
}

uint64_t wait_default_timeout_ns(void) {
  int64_t s = param_int(&wait_params[P_TIMEOUT]);
  /* past 2^63 ns the product would wrap to a short deadline: none instead */
  if (s <= 0 || (uint64_t)s > UINT64_MAX / 2 / 1000000000ull) return UINT64_MAX / 2;
  return (uint64_t)s * 1000000000ull;
}

__thread const struct wait_watcher *wait_thread_watcher;
__thread struct wait_prelude *wait_thread_prelude;

/* Calls the thread's watcher, if any, with itself taken away meanwhile (a
 * wait inside it does not call it again). */
static weftResult_t watcher_call(const struct weft_wait *w, enum wait_event event,
                                 uint64_t waited_ns) {
  const struct wait_watcher *watcher = wait_thread_watcher;
  if (watcher == NULL) return weftInProgress;
  wait_thread_watcher = NULL;
  weftResult_t res = watcher->fn(watcher->arg, event, w->peer_rank, waited_ns);
  wait_thread_watcher = watcher;
  return res == weftSuccess ? weftInProgress : res;
}

void wait_begin(struct weft_wait *w, uint64_t timeout_ns, const volatile uint32_t *abort_local,
                const volatile uint32_t *abort_remote, pid_t peer_pid, int peer_rank,
                const char *what) {
  wait_prelude_run();
  w->start_ns = 0; /* taken lazily on the first slow check: most waits are short */
  w->timeout_ns = timeout_ns;
  w->next_check_ns = 0;
  w->iter = 0;
  w->spin_mask = oversubscribed() ? 0 : 255;
  w->abort_local = abort_local;
  w->abort_remote = abort_remote;
  w->peer_pid = peer_pid;
  w->peer_gone = 0;
  w->peer_rank = peer_rank;
  w->what = what;
}

weftResult_t wait_check(struct weft_wait *w) {
  if (w->abort_local != NULL && __atomic_load_n(w->abort_local, __ATOMIC_ACQUIRE))
    return weft_error_set(weftRemoteError, "communicator aborted while waiting to %s rank %d",
                          w->what, w->peer_rank);
  /* a peer may store its last slot and then fail or exit between the
   * caller's look at the FIFO and this check: the caller looks once more
   * before the error */
  if (w->peer_gone == 1)
    return weft_error_set(weftRemoteError,
                          "rank %d failed or aborted (seen while waiting to %s it)",
                          w->peer_rank, w->what);
  if (w->peer_gone == 2)
    return weft_error_set(weftRemoteError, "rank %d (pid %d) died while waiting to %s it",
                          w->peer_rank, (int)w->peer_pid, w->what);
  if (w->abort_remote != NULL && __atomic_load_n(w->abort_remote, __ATOMIC_ACQUIRE)) {
    w->peer_gone = 1;
    return weftInProgress;
  }
  uint64_t now = clock_ns();
  if (w->start_ns == 0) {
    w->start_ns = now;
    w->next_check_ns = now + 50000000ull;
    return weftInProgress;
  }
  uint64_t waited = now - w->start_ns;
  if (waited > w->timeout_ns) {
    watcher_call(w, WAIT_TIMED_OUT, waited);
    return weft_error_set(weftRemoteError, "timed out after %.1f s waiting to %s rank %d",
                          (double)waited / 1e9, w->what, w->peer_rank);
  }
  if (now >= w->next_check_ns) {
    w->next_check_ns = now + 50000000ull;
    if (w->peer_pid > 0 && pid_gone(w->peer_pid, 0)) {
      w->peer_gone = 2;
      return weftInProgress;
    }
    weftResult_t res = watcher_call(w, WAIT_STALLED, waited);
    if (res != weftInProgress) return res;
  }
  /* back off: spin first, then yield, then sleep briefly */
  int over = oversubscribed();
  uint64_t spin_ns = over ? 0 : (uint64_t)param_int(&wait_params[P_SPIN_NS]);
  if (!over && waited > spin_ns * 100 + 20000000ull) {
    struct timespec ts = {0, 50000};
    nanosleep(&ts, NULL);
  } else if (waited > spin_ns) {
    sched_yield();
  }
  return weftInProgress;
}
