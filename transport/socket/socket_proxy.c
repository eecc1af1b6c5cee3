/* Proxy threads of the socket transport: each one owns a list of connection
 * ends and moves their slots between the local FIFOs and the sockets, with
 * non-blocking I/O only. It spins (yielding the core) while there is work,
 * then sleeps in ppoll() with a timeout that grows to a few ms when idle. */
#include "socket_proxy.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "../param.h"
#include "../status.h"
#include "../topo.h"
#include "../wait.h"

#define PROXY_SPIN_NS 100000ull     /* idle time spent spinning before sleeping */
#define PROXY_POLL_MIN_NS 50000ull  /* the first sleep; later ones grow ... */
#define PROXY_POLL_MAX_NS 2000000ull /* ... up to this */
#define HDR_NBYTES sizeof(struct socket_part_hdr)

struct socket_proxy {
  int index;
  pthread_t tid;
  int wake_fd; /* an eventfd: registry changes interrupt ppoll() */
  int nregistered; /* under pool_mutex */
  pthread_mutex_t mutex;
  pthread_cond_t cond;
  /* under mutex */
  uint32_t changed; /* also read without the mutex, as a hint */
  int stop;
  struct socket_conn *adds; /* a list through next, for the thread to take */
  /* the proxy thread's own */
  struct socket_conn *conns; /* a list through next */
  struct pollfd *pfds;
  struct socket_conn **pfd_conns;
  int pfds_cap;
};

static pthread_mutex_t pool_mutex = PTHREAD_MUTEX_INITIALIZER;
static struct socket_proxy pool[SOCKET_MAX_THREADS];

void socket_part_range(size_t slot_nbytes, int nsocks, int part, size_t *off_out,
                       size_t *nbytes_out) {
  /* whole 64-byte lines per part; the last non-empty part takes the rest */
  size_t lines = (slot_nbytes + 63) / 64;
  size_t per = (lines + (size_t)nsocks - 1) / (size_t)nsocks * 64;
  size_t off = per * (size_t)part, end = off + per;
  if (off > slot_nbytes) off = slot_nbytes;
  if (end > slot_nbytes) end = slot_nbytes;
  *off_out = off;
  *nbytes_out = end - off;
}

/* --- one connection end ------------------------------------------------- */

/* Marks the connection failed: poison for the local rank, shut sockets for
 * the peer (it reads EOF). The proxy keeps the end until it is removed. */
static void proxy_conn_fail(struct socket_conn *c, const char *why, int err) {
  if (c->failed) return;
  c->failed = 1;
  __atomic_store_n(&c->ctrl->poison, 1u, __ATOMIC_RELEASE);
  for (int s = 0; s < c->nsocks; s++) shutdown(c->streams[s].fd, SHUT_RDWR);
  WEFT_INFO(LOG_NET, "socket connection %s rank %d is down: %s%s%s", c->is_send ? "to" : "from",
            c->peer_rank, why, err ? ": " : "", err ? strerror(err) : "");
}

/* Sends what socket s can of the slots before tail. Returns 1 if bytes
 * moved, 0 if none could, -1 when the connection failed. */
static int proxy_stream_send(struct socket_conn *c, int s, uint64_t tail) {
  struct socket_stream *st = &c->streams[s];
  int moved = 0;
  while (st->step < tail) {
    size_t slot = st->step % c->nslots, off, nbytes;
    if (st->done == 0) {
      uint32_t used = c->ctrl->slot_used_nbytes[slot];
      if ((used & SOCKET_USED_NBYTES_MASK) > c->slot_nbytes) {
        proxy_conn_fail(c, "a slot claims more bytes than it holds", 0);
        return -1;
      }
      socket_part_range(used & SOCKET_USED_NBYTES_MASK, c->nsocks, s, &off, &nbytes);
      st->hdr = (struct socket_part_hdr){
          .step = st->step, .slot_used = used, .part_nbytes = (uint32_t)nbytes};
    }
    socket_part_range(st->hdr.slot_used & SOCKET_USED_NBYTES_MASK, c->nsocks, s, &off, &nbytes);
    struct iovec iov[2];
    int niov = 0;
    if (st->done < HDR_NBYTES)
      iov[niov++] = (struct iovec){(char *)&st->hdr + st->done, HDR_NBYTES - st->done};
    size_t body_done = st->done > HDR_NBYTES ? st->done - HDR_NBYTES : 0;
    if (body_done < nbytes)
      iov[niov++] = (struct iovec){c->slots + slot * c->slot_nbytes + off + body_done,
                                   nbytes - body_done};
    struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)niov};
    ssize_t n = sendmsg(st->fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      proxy_conn_fail(c, "send failed", errno);
      return -1;
    }
    moved = 1;
    st->done += (size_t)n;
    if (st->done == HDR_NBYTES + nbytes) {
      st->step++;
      st->done = 0;
    }
  }
  return moved;
}

/* Reads into buf; returns the byte count, 0 when nothing is there yet, or -1
 * after failing the connection (closed_why: what an EOF here means). */
static ssize_t proxy_stream_read(struct socket_conn *c, struct socket_stream *st, void *buf,
                                 size_t nbytes, const char *closed_why) {
  for (;;) {
    ssize_t n = recv(st->fd, buf, nbytes, MSG_DONTWAIT);
    if (n > 0) return n;
    if (n == 0) {
      if (closed_why != NULL) {
        proxy_conn_fail(c, closed_why, 0);
        return -1;
      }
      st->eof = 1;
      return 0;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    proxy_conn_fail(c, "receive failed", errno);
    return -1;
  }
}

/* Receives on socket s into the free slots of the local FIFO. Returns 1 if
 * bytes moved, 0 if none could, -1 when the connection failed. */
static int proxy_stream_recv(struct socket_conn *c, int s) {
  struct socket_stream *st = &c->streams[s];
  int moved = 0;
  while (!st->eof && st->step - __atomic_load_n(&c->ctrl->head, __ATOMIC_ACQUIRE) < c->nslots) {
    size_t slot = st->step % c->nslots, off, nbytes;
    if (st->done < HDR_NBYTES) {
      /* an EOF between slots is the peer closing; wait for the other sockets */
      ssize_t n = proxy_stream_read(c, st, (char *)&st->hdr + st->done, HDR_NBYTES - st->done,
                                    st->done == 0 ? NULL : "closed in the middle of a slot");
      if (n <= 0) return n < 0 ? -1 : moved;
      moved = 1;
      st->done += (size_t)n;
      if (st->done < HDR_NBYTES) continue;
      size_t used_nbytes = st->hdr.slot_used & SOCKET_USED_NBYTES_MASK;
      socket_part_range(used_nbytes, c->nsocks, s, &off, &nbytes);
      if (st->hdr.step != st->step || used_nbytes > c->slot_nbytes ||
          st->hdr.part_nbytes != nbytes) {
        proxy_conn_fail(c, "malformed data (not a weft peer?)", 0);
        return -1;
      }
      c->ctrl->slot_used_nbytes[slot] = st->hdr.slot_used;
    }
    socket_part_range(st->hdr.slot_used & SOCKET_USED_NBYTES_MASK, c->nsocks, s, &off, &nbytes);
    size_t body_done = st->done - HDR_NBYTES;
    if (body_done < nbytes) {
      ssize_t n = proxy_stream_read(c, st, c->slots + slot * c->slot_nbytes + off + body_done,
                                    nbytes - body_done, "closed in the middle of a slot");
      if (n <= 0) return n < 0 ? -1 : moved;
      moved = 1;
      st->done += (size_t)n;
      if (st->done - HDR_NBYTES < nbytes) continue;
    }
    st->step++;
    st->done = 0;
  }
  return moved;
}

/* Moves what the sockets take now, in either direction. Returns whether
 * anything happened. */
static int proxy_conn_move(struct socket_conn *c) {
  int moved = 0, neof = 0;
  uint64_t low = UINT64_MAX;
  uint64_t tail = c->is_send ? __atomic_load_n(&c->ctrl->tail, __ATOMIC_ACQUIRE) : 0;
  for (int s = 0; s < c->nsocks; s++) {
    int r = c->is_send ? proxy_stream_send(c, s, tail) : proxy_stream_recv(c, s);
    if (r < 0) return 1;
    moved |= r;
    neof += c->streams[s].eof;
    if (c->streams[s].step < low) low = c->streams[s].step;
  }
  /* a slot is done once every socket is past it: the sender gets the credit
   * back, the receiver's rank may read it */
  uint64_t *counter = c->is_send ? &c->ctrl->head : &c->ctrl->tail;
  if (low > *counter) __atomic_store_n(counter, low, __ATOMIC_RELEASE);
  /* the peer closed every socket between slots: once the rank has read all
   * that came (so no wait of its own can race the poison), it is news */
  if (neof == c->nsocks && __atomic_load_n(&c->ctrl->head, __ATOMIC_ACQUIRE) == low) {
    proxy_conn_fail(c, "the peer closed the connection", 0);
    return 1;
  }
  return moved;
}

/* One pass over a connection end. Returns whether anything happened. */
static int proxy_conn_progress(struct socket_conn *c) {
  if (c->failed) return 0;
  if (__atomic_load_n(&c->ctrl->poison, __ATOMIC_ACQUIRE)) {
    /* slots the rank filled before it failed still go out, as far as the
     * sockets take them without waiting (shm's peer would see them too);
     * then the peer reads EOF */
    if (c->is_send) proxy_conn_move(c);
    proxy_conn_fail(c, "the local rank failed or aborted", 0);
    return 1;
  }
  return proxy_conn_move(c);
}

/* The sender's sockets carry nothing back: readable means closed or reset. */
static void proxy_send_check_peer(struct socket_conn *c, int fd) {
  char byte;
  ssize_t n = recv(fd, &byte, 1, MSG_DONTWAIT);
  if (n == 0) proxy_conn_fail(c, "the peer closed the connection", 0);
  else if (n > 0) proxy_conn_fail(c, "unexpected data from the receiver", 0);
  else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
    proxy_conn_fail(c, "connection error", errno);
}

/* --- the thread ----------------------------------------------------------- */

/* Takes new connection ends and lets go of removed ones. Returns whether the
 * thread should end. */
static int proxy_registry_sync(struct socket_proxy *p) {
  pthread_mutex_lock(&p->mutex);
  while (p->adds != NULL) {
    struct socket_conn *c = p->adds;
    p->adds = c->next;
    c->next = p->conns;
    p->conns = c;
  }
  int acked = 0;
  for (struct socket_conn **link = &p->conns; *link != NULL;) {
    struct socket_conn *c = *link;
    if (!c->remove_requested) {
      link = &c->next;
      continue;
    }
    proxy_conn_progress(c); /* a last pass: an abort may have come just now */
    *link = c->next;
    c->removed = 1;
    acked = 1;
  }
  if (acked) pthread_cond_broadcast(&p->cond);
  __atomic_store_n(&p->changed, 0u, __ATOMIC_RELAXED);
  int stop = p->stop && p->conns == NULL;
  pthread_mutex_unlock(&p->mutex);
  return stop;
}

/* Sleeps until a socket is ready, the registry changes, or the timeout. */
static void proxy_sleep(struct socket_proxy *p, uint64_t idle_ns) {
  uint64_t timeout_ns = idle_ns / 4;
  if (timeout_ns < PROXY_POLL_MIN_NS) timeout_ns = PROXY_POLL_MIN_NS;
  if (timeout_ns > PROXY_POLL_MAX_NS) timeout_ns = PROXY_POLL_MAX_NS;
  struct timespec ts = {0, (long)timeout_ns};
  int need = 1;
  for (struct socket_conn *c = p->conns; c != NULL; c = c->next) need += c->nsocks;
  if (need > p->pfds_cap) {
    struct pollfd *pfds = realloc(p->pfds, sizeof *pfds * (size_t)need);
    if (pfds != NULL) p->pfds = pfds;
    struct socket_conn **owners = realloc(p->pfd_conns, sizeof *owners * (size_t)need);
    if (owners != NULL) p->pfd_conns = owners;
    if (pfds == NULL || owners == NULL) {
      nanosleep(&ts, NULL); /* no memory for the poll set: just wait */
      return;
    }
    p->pfds_cap = need;
  }
  int n = 0;
  p->pfds[n++] = (struct pollfd){.fd = p->wake_fd, .events = POLLIN};
  for (struct socket_conn *c = p->conns; c != NULL; c = c->next) {
    if (c->failed) continue;
    uint64_t tail = __atomic_load_n(&c->ctrl->tail, __ATOMIC_ACQUIRE);
    uint64_t head = __atomic_load_n(&c->ctrl->head, __ATOMIC_ACQUIRE);
    for (int s = 0; s < c->nsocks; s++) {
      struct socket_stream *st = &c->streams[s];
      short events = c->is_send ? (short)(POLLIN | (st->step < tail ? POLLOUT : 0))
                                : (short)(st->step - head < c->nslots ? POLLIN : 0);
      p->pfd_conns[n] = c;
      p->pfds[n++] = (struct pollfd){.fd = st->eof ? -1 : st->fd, .events = events};
    }
  }
  if (ppoll(p->pfds, (nfds_t)n, &ts, NULL) <= 0) return;
  if (p->pfds[0].revents & POLLIN) {
    uint64_t count;
    if (read(p->wake_fd, &count, sizeof count) < 0) count = 0; /* drained already */
  }
  for (int i = 1; i < n; i++) {
    struct socket_conn *c = p->pfd_conns[i];
    short re = p->pfds[i].revents;
    if (re == 0 || c->failed) continue;
    if (c->is_send && (re & (POLLIN | POLLHUP | POLLERR))) {
      proxy_send_check_peer(c, p->pfds[i].fd);
    } else if (!c->is_send && (re & (POLLHUP | POLLERR)) && !(re & POLLIN)) {
      /* reset while the FIFO is full: nothing more will arrive */
      int err = 0;
      socklen_t len = sizeof err;
      getsockopt(p->pfds[i].fd, SOL_SOCKET, SO_ERROR, &err, &len);
      proxy_conn_fail(c, "connection reset", err);
    }
  }
}

/* A rank pinned to one CPU (weftrun --bind-to core) would share it with its
 * proxy: the proxy may run on any CPU the kernel allows this process. */
static void proxy_unpin(void) {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) != 0 || CPU_COUNT(&set) != 1) return;
  long ncpus = sysconf(_SC_NPROCESSORS_CONF);
  CPU_ZERO(&set);
  for (long c = 0; c < ncpus && c < CPU_SETSIZE; c++) CPU_SET(c, &set);
  pthread_setaffinity_np(pthread_self(), sizeof set, &set); /* best effort */
}

static void *proxy_main(void *arg) {
  struct socket_proxy *p = arg;
  proxy_unpin();
  uint64_t idle_since = 0;
  topo_thread_place();
  for (;;) {
    if (__atomic_load_n(&p->changed, __ATOMIC_RELAXED) && proxy_registry_sync(p)) break;
    int moved = 0;
    for (struct socket_conn *c = p->conns; c != NULL; c = c->next) moved |= proxy_conn_progress(c);
    if (moved) {
      idle_since = 0;
      continue;
    }
    uint64_t now = clock_ns();
    if (idle_since == 0) idle_since = now;
    if (now - idle_since < PROXY_SPIN_NS) sched_yield(); /* gives the core to ranks */
    else proxy_sleep(p, now - idle_since);
  }
  WEFT_INFO(LOG_NET, "socket proxy thread %d stops: no connections left", p->index);
  return NULL;
}

/* --- the pool ------------------------------------------------------------- */

static void proxy_wake(struct socket_proxy *p) {
  uint64_t one = 1;
  if (write(p->wake_fd, &one, sizeof one) < 0) one = 0; /* counter full: awake anyway */
}

static weftResult_t proxy_start(struct socket_proxy *p, int index) {
  memset(p, 0, sizeof *p);
  p->index = index;
  p->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (p->wake_fd < 0) return weft_error_errno(weftSystemError, "eventfd for a socket proxy");
  pthread_mutex_init(&p->mutex, NULL);
  pthread_cond_init(&p->cond, NULL);
  /* signals go to the application's threads, never to the proxy */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int rc = pthread_create(&p->tid, NULL, proxy_main, p);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (rc != 0) {
    errno = rc;
    weft_error_errno(weftSystemError, "starting socket proxy thread %d", index);
    goto close_wake;
  }
  char name[16];
  snprintf(name, sizeof name, "weft-sock-%d", index);
  pthread_setname_np(p->tid, name); /* named before any caller looks */
  WEFT_INFO(LOG_NET, "socket proxy thread %d started", index);
  return weftSuccess;
close_wake:
  pthread_cond_destroy(&p->cond);
  pthread_mutex_destroy(&p->mutex);
  close(p->wake_fd);
  p->wake_fd = -1;
  return weftSystemError;
}

static void proxy_stop(struct socket_proxy *p) {
  pthread_mutex_lock(&p->mutex);
  p->stop = 1;
  __atomic_store_n(&p->changed, 1u, __ATOMIC_RELAXED);
  pthread_mutex_unlock(&p->mutex);
  proxy_wake(p);
  pthread_join(p->tid, NULL);
  free(p->pfds);
  free(p->pfd_conns);
  pthread_cond_destroy(&p->cond);
  pthread_mutex_destroy(&p->mutex);
  close(p->wake_fd);
  memset(p, 0, sizeof *p);
}

weftResult_t socket_proxy_add(struct socket_conn *conn) {
  int64_t nthreads = param_int(&socket_params[SOCKET_P_NTHREADS]);
  if (nthreads < 1 || nthreads > SOCKET_MAX_THREADS)
    return weft_error_set(weftInvalidArgument, "WEFT_SOCKET_NTHREADS=%lld: must be 1 to %d",
                          (long long)nthreads, SOCKET_MAX_THREADS);
  weftResult_t res = weftSuccess;
  pthread_mutex_lock(&pool_mutex);
  int best = 0; /* the least loaded thread */
  for (int i = 1; i < nthreads; i++)
    if (pool[i].nregistered < pool[best].nregistered) best = i;
  struct socket_proxy *p = &pool[best];
  if (p->nregistered == 0) WEFT_TRY_GOTO(proxy_start(p, best), res, unlock_pool);
  pthread_mutex_lock(&p->mutex);
  conn->proxy = p;
  conn->next = p->adds;
  p->adds = conn;
  __atomic_store_n(&p->changed, 1u, __ATOMIC_RELAXED);
  pthread_mutex_unlock(&p->mutex);
  proxy_wake(p);
  p->nregistered++;
unlock_pool:
  pthread_mutex_unlock(&pool_mutex);
  return res;
}

void socket_proxy_remove(struct socket_conn *conn) {
  struct socket_proxy *p = conn->proxy;
  if (p == NULL) return;
  pthread_mutex_lock(&pool_mutex);
  pthread_mutex_lock(&p->mutex);
  conn->remove_requested = 1;
  __atomic_store_n(&p->changed, 1u, __ATOMIC_RELAXED);
  proxy_wake(p);
  while (!conn->removed) pthread_cond_wait(&p->cond, &p->mutex);
  pthread_mutex_unlock(&p->mutex);
  conn->proxy = NULL;
  if (--p->nregistered == 0) proxy_stop(p);
  pthread_mutex_unlock(&pool_mutex);
}
