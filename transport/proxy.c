/* The proxy core (proxy.h): private FIFOs, poison, and the threads that
 * move the network transports' slots. A thread spins (yielding the core)
 * while there is work, then sleeps in ppoll() on its network's descriptors
 * and a wake eventfd, a little longer each time it finds nothing to do. */
#include "proxy.h"

#include <errno.h>
#include <stddef.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "base/log.h"
#include "base/status.h"
#include "topology/topo.h"
#include "base/wait.h"

#define PROXY_SPIN_NS 100000ull /* idle time spent spinning before sleeping */
#define PROXY_DRAIN_POLL_NS 50000 /* proxy_conn_drain's nap between looks */

/* --- the FIFO ------------------------------------------------------------ */

weftResult_t proxy_fifo_alloc(struct proxy_conn *c, uint32_t nslots, size_t slot_nbytes,
                              const struct proxy_fifo_mem *mem) {
  _Static_assert(sizeof(struct conn_ctrl) <= PROXY_CTRL_NBYTES, "ctrl fits its page");
  /* the kernels' view of the ctrl page (struct dev_fifo_ctrl) */
  _Static_assert(offsetof(struct conn_ctrl, tail) == 0, "tail where the kernels look");
  _Static_assert(offsetof(struct conn_ctrl, head) == 64, "head where the kernels look");
  _Static_assert(offsetof(struct conn_ctrl, poison) == 128, "poison where the kernels look");
  size_t nbytes = PROXY_CTRL_NBYTES + (size_t)nslots * slot_nbytes;
  if (mem != NULL) {
    void *host, *dev;
    WEFT_TRY(mem->alloc(nbytes, &host, &dev));
    c->mem = mem;
    c->fifo_dev = dev;
    c->fifo = host;
    c->fifo_nbytes = nbytes;
    c->nslots = nslots;
    c->slot_nbytes = slot_nbytes;
    c->ctrl = host;
    c->slots = (char *)host + PROXY_CTRL_NBYTES;
    return weftSuccess;
  }
  /* anonymous pages: zeroed, page-aligned, never shared with a child */
  void *fifo = mmap(NULL, nbytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (fifo == MAP_FAILED)
    return weft_error_errno(weftSystemError, "allocating a %zu-byte %s FIFO", nbytes,
                            c->ops->name);
  topo_mem_place(fifo, nbytes); /* on the rank's NUMA node, before the first touch */
  c->fifo = fifo;
  c->fifo_nbytes = nbytes;
  c->nslots = nslots;
  c->slot_nbytes = slot_nbytes;
  c->ctrl = fifo;
  c->slots = (char *)fifo + PROXY_CTRL_NBYTES;
  return weftSuccess;
}

void proxy_fifo_free(struct proxy_conn *c) {
  if (c->fifo != NULL && c->mem != NULL) c->mem->free(c->fifo, c->fifo_nbytes);
  else if (c->fifo != NULL) munmap(c->fifo, c->fifo_nbytes);
  c->fifo = NULL;
  c->ctrl = NULL;
  c->slots = NULL;
}

int proxy_conn_slot_used(struct proxy_conn *c, uint64_t step, uint32_t *used_out) {
  uint32_t used = c->ctrl->slot_used_nbytes[slot_index(step, c->nslots)];
  if ((used & PROXY_USED_NBYTES_MASK) > c->slot_nbytes) {
    proxy_conn_fail(c, "a slot claims more bytes than it holds", NULL);
    return -1;
  }
  *used_out = used;
  return 0;
}

int proxy_conn_publish_head(struct proxy_conn *c, uint64_t head) {
  if (head == __atomic_load_n(&c->ctrl->head, __ATOMIC_RELAXED)) return 0;
  __atomic_store_n(&c->ctrl->head, head, __ATOMIC_RELEASE);
  return 1;
}

int proxy_conn_publish_tail(struct proxy_conn *c, uint64_t tail) {
  if (tail == __atomic_load_n(&c->ctrl->tail, __ATOMIC_RELAXED)) return 0;
  __atomic_store_n(&c->ctrl->tail, tail, __ATOMIC_RELEASE);
  return 1;
}

/* --- poison and liveness -------------------------------------------------- */

void proxy_conn_fail(struct proxy_conn *c, const char *why, const char *detail) {
  if (c->failed) return;
  c->failed = 1;
  __atomic_store_n(&c->ctrl->poison, 1u, __ATOMIC_RELEASE);
  c->ops->notify_fail(c);
  WEFT_INFO(LOG_NET, "%s connection %s rank %d is down: %s%s%s", c->ops->name,
            c->is_send ? "to" : "from", c->peer_rank, why, detail != NULL ? ": " : "",
            detail != NULL ? detail : "");
}

void proxy_conn_drain(struct proxy_conn *c) {
  uint64_t deadline = clock_ns() + wait_default_timeout_ns();
  while (__atomic_load_n(&c->sent_step, __ATOMIC_ACQUIRE) < proxy_conn_tail(c)) {
    if (__atomic_load_n(&c->ctrl->poison, __ATOMIC_ACQUIRE)) return; /* failed either end */
    if (clock_ns() > deadline) {
      WEFT_INFO(LOG_NET, "%s connection to rank %d: closing with slots unsent", c->ops->name,
                c->peer_rank);
      return;
    }
    struct timespec ts = {0, PROXY_DRAIN_POLL_NS};
    nanosleep(&ts, NULL);
  }
}

/* One pass over a connection end. Returns whether anything happened. */
static int proxy_conn_progress(struct proxy_conn *c) {
  if (c->failed) return 0;
  /* slots filled or arrived before a failure still go out or in, as far as
   * the network takes them without waiting (a shm peer would see them too);
   * then the poison reaches the peer */
  int aborted = __atomic_load_n(&c->ctrl->poison, __ATOMIC_ACQUIRE) != 0;
  int moved = c->ops->progress(c);
  if (c->failed) return 1;
  if (aborted || __atomic_load_n(&c->ctrl->poison, __ATOMIC_ACQUIRE)) {
    proxy_conn_fail(c, "the local rank failed or aborted", NULL);
    return 1;
  }
  return moved;
}

/* --- the thread ------------------------------------------------------------ */

void proxy_lock(struct proxy *p) {
  __atomic_add_fetch(&p->waiters, 1u, __ATOMIC_RELAXED);
  pthread_mutex_lock(&p->mutex);
  __atomic_sub_fetch(&p->waiters, 1u, __ATOMIC_RELAXED);
}

void proxy_unlock(struct proxy *p) { pthread_mutex_unlock(&p->mutex); }

int proxy_pass(struct proxy *p) {
  int moved = p->ops->pass != NULL ? p->ops->pass(p) : 0;
  for (struct proxy_conn *c = p->conns; c != NULL; c = c->next) moved |= proxy_conn_progress(c);
  return moved;
}

static void proxy_wake(struct proxy *p) {
  uint64_t one = 1;
  if (p->wake_fd >= 0 && write(p->wake_fd, &one, sizeof one) < 0)
    one = 0; /* counter full: awake anyway */
}

void proxy_kick_at(struct proxy *p, uint64_t now, uint64_t for_ns) {
  uint64_t until = __atomic_load_n(&p->busy_until_ns, __ATOMIC_RELAXED);
  if (until >= now + for_ns / 2) return;
  __atomic_store_n(&p->busy_until_ns, now + for_ns, __ATOMIC_SEQ_CST);
  if (__atomic_load_n(&p->sleeping, __ATOMIC_SEQ_CST)) proxy_wake(p); /* a system call */
}

void proxy_kick(struct proxy *p, uint64_t for_ns) { proxy_kick_at(p, clock_ns(), for_ns); }

void proxy_conn_kick_for(const struct weft_conn *conn, uint64_t now_ns, uint64_t for_ns) {
  const struct proxy_conn *pc = conn->priv;
  if (pc != NULL && pc->proxy != NULL && for_ns > 0) proxy_kick_at(pc->proxy, now_ns, for_ns);
}

/* What the rank has done of an end's slots: filled (sender), drained (receiver). */
static uint64_t proxy_conn_done(const struct proxy_conn *c) {
  return c->is_send ? proxy_conn_tail(c) : proxy_conn_head(c);
}

void proxy_conn_expect(const struct weft_conn *conn, uint64_t nslots, uint64_t now_ns) {
  struct proxy_conn *pc = conn->priv;
  if (pc == NULL || nslots == 0) return;
  __atomic_store_n(&pc->expect_ns, now_ns, __ATOMIC_RELAXED);
  /* only this rank's calling thread announces, but the CAS keeps it exact */
  uint64_t old = __atomic_load_n(&pc->expect, __ATOMIC_RELAXED), want;
  do {
    uint64_t done = proxy_conn_done(pc);
    want = (old > done ? old : done) + nslots;
  } while (!__atomic_compare_exchange_n(&pc->expect, &old, want, 0, __ATOMIC_SEQ_CST,
                                        __ATOMIC_RELAXED));
  /* a sleeping thread wakes, then stays up on the expectation */
  if (pc->proxy != NULL) proxy_kick_at(pc->proxy, now_ns, PROXY_SPIN_NS);
}

/* Under the mutex: whether an end's counter lags what its rank announced
 * (proxy_conn_expect), so the thread must not sleep. */
static int proxy_owed(const struct proxy *p, uint64_t now) {
  for (const struct proxy_conn *c = p->conns; c != NULL; c = c->next) {
    if (c->failed) continue;
    uint64_t want = __atomic_load_n(&c->expect, __ATOMIC_SEQ_CST);
    if (want == 0 || proxy_conn_done(c) >= want) continue;
    if (__atomic_load_n(&c->ctrl->poison, __ATOMIC_RELAXED) != 0) continue; /* a kernel gave up */
    uint64_t at = __atomic_load_n(&c->expect_ns, __ATOMIC_RELAXED);
    if (now > at && now - at > PROXY_EXPECT_MAX_NS) continue;
    return 1;
  }
  return 0;
}

void proxy_conn_kick(const struct weft_conn *conn, uint64_t now_ns) {
  proxy_conn_kick_for(conn, now_ns, wait_proxy_kick_ns());
}

/* Under the mutex: the poll set for the next sleep (the wake eventfd first,
 * then each connection's descriptors). Returns its size. */
static int proxy_poll_set(struct proxy *p) {
  int need = 1;
  for (struct proxy_conn *c = p->conns; c != NULL; c = c->next)
    if (!c->failed && c->ops->poll_fill != NULL) need += c->npoll;
  if (need > p->pfds_cap) {
    struct pollfd *pfds = realloc(p->pfds, sizeof *pfds * (size_t)need);
    if (pfds != NULL) p->pfds = pfds;
    struct proxy_conn **owners = realloc(p->pfd_conns, sizeof *owners * (size_t)need);
    if (owners != NULL) p->pfd_conns = owners;
    int *index = realloc(p->pfd_index, sizeof *index * (size_t)need);
    if (index != NULL) p->pfd_index = index;
    if (pfds == NULL || owners == NULL || index == NULL) need = 1; /* then the wake fd only */
    else p->pfds_cap = need;
  }
  int n = 0;
  p->pfds[n++] = (struct pollfd){.fd = p->wake_fd, .events = POLLIN};
  for (struct proxy_conn *c = p->conns; c != NULL && n < need; c = c->next) {
    if (c->failed || c->ops->poll_fill == NULL) continue;
    c->ops->poll_fill(c, &p->pfds[n]);
    for (int i = 0; i < c->npoll; i++) {
      p->pfd_conns[n + i] = c;
      p->pfd_index[n + i] = i;
    }
    n += c->npoll;
  }
  return n;
}

/* Sleeps until a descriptor is ready, the thread is woken, or the timeout;
 * then hands the connections what ppoll saw (unless one was removed
 * meanwhile: its descriptors may be closed and their numbers reused). */
static void proxy_sleep(struct proxy *p, int npfds, uint64_t gen, uint64_t idle_ns) {
  uint64_t timeout_ns = idle_ns / 4;
  if (timeout_ns < p->ops->sleep_min_ns) timeout_ns = p->ops->sleep_min_ns;
  if (timeout_ns > p->ops->sleep_max_ns) timeout_ns = p->ops->sleep_max_ns;
  struct timespec ts = {(time_t)(timeout_ns / 1000000000ull), (long)(timeout_ns % 1000000000ull)};
  /* with proxy_kick_at: either the kicker sees sleeping and wakes the
   * thread, or the thread sees the kicker's window and stays up */
  __atomic_store_n(&p->sleeping, 1, __ATOMIC_SEQ_CST);
  if (clock_ns() < __atomic_load_n(&p->busy_until_ns, __ATOMIC_SEQ_CST)) {
    __atomic_store_n(&p->sleeping, 0, __ATOMIC_RELAXED);
    return;
  }
  __atomic_add_fetch(&p->sleeps, 1, __ATOMIC_RELAXED);
  int ready = ppoll(p->pfds, (nfds_t)npfds, &ts, NULL);
  __atomic_store_n(&p->sleeping, 0, __ATOMIC_RELAXED);
  if (ready <= 0) return;
  if (p->pfds[0].revents & POLLIN) {
    uint64_t count;
    if (read(p->wake_fd, &count, sizeof count) < 0) count = 0; /* drained already */
  }
  if (npfds == 1) return;
  proxy_lock(p);
  if (p->gen == gen) {
    for (int i = 1; i < npfds; i++) {
      struct proxy_conn *c = p->pfd_conns[i];
      if (p->pfds[i].revents != 0 && !c->failed)
        c->ops->poll_event(c, p->pfd_index[i], &p->pfds[i]);
    }
  }
  proxy_unlock(p);
}

/* A rank pinned to one CPU (weftrun --bind-to core) would share it with its
 * proxy: where the network says so, the proxy may run on any CPU the kernel
 * allows this process. */
static void proxy_thread_unpin(void) {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) != 0 || CPU_COUNT(&set) != 1) return;
  long ncpus = sysconf(_SC_NPROCESSORS_CONF);
  CPU_ZERO(&set);
  for (long cpu = 0; cpu < ncpus && cpu < CPU_SETSIZE; cpu++) CPU_SET(cpu, &set);
  pthread_setaffinity_np(pthread_self(), sizeof set, &set); /* best effort */
}

/* Unpinned when asked (at the start, where the network says so), then on
 * the CPUs of the rank's NUMA node where the topology knows them. */
static void proxy_thread_bind(int unpin) {
  if (unpin) proxy_thread_unpin();
  topo_thread_place();
}

static void *proxy_main(void *arg) {
  struct proxy *p = arg;
  proxy_thread_bind(p->ops->unpin);
  uint64_t idle_since = 0, passes = 0, moved_passes = 0;
  int unpinned = p->ops->unpin;
  for (;;) {
    pthread_mutex_lock(&p->mutex);
    if (!unpinned && p->device_conns > 0) {
      /* a GPU fills these FIFOs while its rank's thread waits on the GPU
       * (spinning, as CUDA's synchronizations do by default), never driving
       * the proxy: on that thread's one CPU the proxy would run only when
       * the scheduler takes the CPU from it, milliseconds apart */
      unpinned = 1;
      proxy_thread_bind(1);
      WEFT_INFO(LOG_NET, "%s proxy thread %d: device FIFOs, off its rank's CPU", p->ops->name,
                p->index);
    }
    while (p->drivers > 0 && !p->stop) {
      pthread_cond_wait(&p->undriven, &p->mutex);
      idle_since = 0;
    }
    if (p->stop) {
      pthread_mutex_unlock(&p->mutex);
      break;
    }
    int moved = proxy_pass(p);
    passes++;
    moved_passes += moved != 0;
    uint64_t now = moved ? 0 : clock_ns();
    if (!moved && idle_since == 0) idle_since = now;
    int sleep = !moved && now - idle_since >= PROXY_SPIN_NS &&
                now >= __atomic_load_n(&p->busy_until_ns, __ATOMIC_RELAXED) &&
                !proxy_owed(p, now);
    int npfds = sleep ? proxy_poll_set(p) : 0;
    uint64_t gen = p->gen;
    pthread_mutex_unlock(&p->mutex);
    if (moved) {
      idle_since = 0;
      if (__atomic_load_n(&p->waiters, __ATOMIC_RELAXED) != 0) sched_yield();
      continue;
    }
    if (!sleep) sched_yield(); /* gives the core to ranks */
    else proxy_sleep(p, npfds, gen, now - idle_since);
  }
  WEFT_INFO(LOG_NET, "%s proxy thread %d stops after %llu passes (%llu moved something), %llu sleeps",
            p->ops->name, p->index, (unsigned long long)passes, (unsigned long long)moved_passes,
            (unsigned long long)__atomic_load_n(&p->sleeps, __ATOMIC_RELAXED));
  return NULL;
}

weftResult_t proxy_start(struct proxy *p, int index) {
  p->index = index;
  p->stop = 0;
  p->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (p->wake_fd < 0)
    return weft_error_errno(weftSystemError, "eventfd for a %s proxy", p->ops->name);
  /* signals go to the application's threads, never to the proxy */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int rc = pthread_create(&p->tid, NULL, proxy_main, p);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (rc != 0) {
    errno = rc;
    weft_error_errno(weftSystemError, "starting %s proxy thread %d", p->ops->name, index);
    goto close_wake;
  }
  char name[16];
  snprintf(name, sizeof name, "weft-%.4s-%d", p->ops->name, index);
  pthread_setname_np(p->tid, name); /* named before any caller looks */
  p->running = 1;
  WEFT_INFO(LOG_NET, "%s proxy thread %d started", p->ops->name, index);
  return weftSuccess;
close_wake:
  close(p->wake_fd);
  p->wake_fd = -1;
  return weftSystemError;
}

void proxy_stop(struct proxy *p) {
  proxy_lock(p);
  int running = p->running;
  p->stop = 1;
  pthread_cond_broadcast(&p->undriven);
  proxy_wake(p);
  proxy_unlock(p);
  if (running) pthread_join(p->tid, NULL);
  proxy_lock(p);
  p->running = 0;
  if (p->wake_fd >= 0) close(p->wake_fd);
  p->wake_fd = -1;
  free(p->pfds);
  free(p->pfd_conns);
  free(p->pfd_index);
  p->pfds = NULL;
  p->pfd_conns = NULL;
  p->pfd_index = NULL;
  p->pfds_cap = 0;
  proxy_unlock(p);
}

void proxy_forget(struct proxy *p) {
  /* the parent's wake fd is shared with it: the child closes its copy */
  if (p->wake_fd >= 0) close(p->wake_fd);
  p->wake_fd = -1;
  p->running = 0;
  p->stop = 0;
  p->nconns = 0;
  p->device_conns = 0;
  p->drivers = 0;
  p->conns = NULL;
  p->pfds = NULL; /* the parent's allocations: left alone */
  p->pfd_conns = NULL;
  p->pfd_index = NULL;
  p->pfds_cap = 0;
}

uint32_t transport_kickable_conns;

void proxy_add_locked(struct proxy *p, struct proxy_conn *c) {
  __atomic_add_fetch(&transport_kickable_conns, 1, __ATOMIC_RELAXED);
  c->proxy = p;
  c->next = p->conns;
  p->conns = c;
  p->nconns++;
  p->device_conns += c->mem != NULL;
  proxy_wake(p);
}

void proxy_remove_locked(struct proxy_conn *c) {
  struct proxy *p = c->proxy;
  if (p == NULL) return;
  for (struct proxy_conn **link = &p->conns; *link != NULL; link = &(*link)->next) {
    if (*link != c) continue;
    proxy_conn_progress(c); /* a last pass: an abort may have come just now */
    *link = c->next;
    p->nconns--;
    p->device_conns -= c->mem != NULL;
    p->gen++;
    break;
  }
  c->next = NULL;
  c->proxy = NULL;
  __atomic_sub_fetch(&transport_kickable_conns, 1, __ATOMIC_RELAXED);
}

/* --- the pool ---------------------------------------------------------------- */

weftResult_t proxy_pool_add(struct proxy_pool *pool, struct proxy_conn *c, int nthreads) {
  if (nthreads < 1 || nthreads > PROXY_MAX_THREADS)
    return weft_error_set(weftInvalidArgument, "%d %s proxy threads: must be 1 to %d", nthreads,
                          pool->ops->name, PROXY_MAX_THREADS);
  weftResult_t res = weftSuccess;
  pthread_mutex_lock(&pool->mutex);
  int best = 0; /* the least loaded thread */
  for (int i = 1; i < nthreads; i++)
    if (pool->threads[i].nconns < pool->threads[best].nconns) best = i;
  struct proxy *p = &pool->threads[best];
  if (!p->running) {
    *p = (struct proxy)PROXY_INITIALIZER(pool->ops);
    WEFT_TRY_GOTO(proxy_start(p, best), res, unlock_pool);
  }
  proxy_lock(p);
  proxy_add_locked(p, c);
  proxy_unlock(p);
unlock_pool:
  pthread_mutex_unlock(&pool->mutex);
  return res;
}

void proxy_pool_remove(struct proxy_pool *pool, struct proxy_conn *c) {
  struct proxy *p = c->proxy;
  if (p == NULL) return;
  pthread_mutex_lock(&pool->mutex);
  proxy_lock(p);
  proxy_remove_locked(c);
  int idle = p->nconns == 0 && !p->ops->linger;
  proxy_unlock(p);
  if (idle) proxy_stop(p);
  pthread_mutex_unlock(&pool->mutex);
}

/* --- passes on a rank's thread ----------------------------------------------- */

void proxy_drive_begin(struct proxy *p) {
  proxy_lock(p);
  p->drivers++;
  proxy_unlock(p);
}

void proxy_drive_end(struct proxy *p) {
  proxy_lock(p);
  if (--p->drivers == 0) pthread_cond_broadcast(&p->undriven);
  proxy_unlock(p);
}
