/* The UCX transport's worker and proxy thread: one UCP context and worker
 * per process, made on first use and destroyed with the last connection; one
 * thread progresses the worker and moves every connection's slots. It spins
 * (yielding the core) while there is work, then sleeps a little longer each
 * time it finds none, up to a millisecond. */
#include "ucx_proxy.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../status.h"
#include "../wait.h"

#define PROXY_SPIN_NS 100000ull      /* idle time spent spinning before sleeping */
#define PROXY_SLEEP_MIN_NS 20000ull  /* the first sleep; later ones grow ... */
#define PROXY_SLEEP_MAX_NS 1000000ull /* ... up to this */
#define PROXY_PROGRESS_MAX 64        /* worker progress calls per pass, at most */

static pthread_mutex_t ucx_mutex = PTHREAD_MUTEX_INITIALIZER; /* the state below */
static struct {
  pid_t pid; /* the process that made the worker: a forked child makes its own */
  int nrefs;
  struct ucx_worker w;
  /* the proxy */
  int running;
  int stop;
  pthread_t tid;
  struct ucx_conn *conns;
  struct ucx_conn *retired; /* closed ends whose peer may still write */
  uint32_t waiters; /* threads waiting for ucx_mutex: the proxy lets them in */
} ucx;

weftResult_t ucx_error(ucs_status_t status, const char *what, ...) {
  char buf[384];
  va_list ap;
  va_start(ap, what);
  vsnprintf(buf, sizeof buf, what, ap);
  va_end(ap);
  weftResult_t code;
  switch (status) {
  case UCS_ERR_NO_MEMORY:
  case UCS_ERR_NO_RESOURCE:
  case UCS_ERR_NO_DEVICE:
  case UCS_ERR_IO_ERROR:
  case UCS_ERR_EXCEEDS_LIMIT:
  case UCS_ERR_UNSUPPORTED:
  case UCS_ERR_BUSY:
    code = weftSystemError;
    break;
  case UCS_ERR_UNREACHABLE:
  case UCS_ERR_CONNECTION_RESET:
  case UCS_ERR_ENDPOINT_TIMEOUT:
  case UCS_ERR_NOT_CONNECTED:
  case UCS_ERR_REJECTED:
  case UCS_ERR_TIMED_OUT:
  case UCS_ERR_CANCELED:
  case UCS_ERR_MESSAGE_TRUNCATED:
    code = weftRemoteError;
    break;
  case UCS_ERR_INVALID_PARAM:
  case UCS_ERR_INVALID_ADDR:
    code = weftInvalidArgument;
    break;
  default:
    code = weftInternalError;
    break;
  }
  return weft_error_set(code, "%s: %s (UCX)", buf, ucs_status_string(status));
}

/* --- one connection end --------------------------------------------------- */

/* Marks the connection failed: poison for the local rank, and (best effort)
 * for the peer's. The proxy keeps the end until it is removed. */
static void conn_fail(struct ucx_conn *c, const char *why, ucs_status_t status) {
  if (c->failed) return;
  c->failed = 1;
  __atomic_store_n(&c->ctrl->poison, 1u, __ATOMIC_RELEASE);
  if (c->ep != NULL && c->ep_status == UCS_OK) {
    ucp_request_param_t param = {.op_attr_mask = 0};
    c->ext->poison_src = 1;
    ucs_status_ptr_t req =
        ucp_put_nbx(c->ep, &c->ext->poison_src, sizeof c->ext->poison_src,
                    c->remote_fifo + offsetof(struct conn_ctrl, poison), c->rkey, &param);
    if (UCS_PTR_IS_PTR(req)) ucp_request_free(req); /* released once done */
  }
  WEFT_INFO(LOG_NET, "ucx connection %s rank %d is down: %s%s%s", c->is_send ? "to" : "from",
            c->peer_rank, why, status != UCS_OK ? ": " : "",
            status != UCS_OK ? ucs_status_string(status) : "");
}

/* Puts nbytes at src into the peer's FIFO at offset. Returns 0, or -1 after
 * failing the connection. Local completion is not waited for: callers keep
 * src unchanged until a later flush completes. */
static int conn_put(struct ucx_conn *c, const void *src, size_t nbytes, uint64_t offset) {
  ucp_request_param_t param = {.op_attr_mask = UCP_OP_ATTR_FIELD_MEMH, .memh = c->memh};
  ucs_status_ptr_t req = ucp_put_nbx(c->ep, src, nbytes, c->remote_fifo + offset, c->rkey, &param);
  if (UCS_PTR_IS_ERR(req)) {
    conn_fail(c, "put failed", UCS_PTR_STATUS(req));
    return -1;
  }
  if (req != NULL) ucp_request_free(req); /* released once done */
  return 0;
}

/* Sender: hands back the slots of flushed batches and publishes the tail. */
static int conn_send_retire(struct ucx_conn *c) {
  int moved = 0;
  while (c->nbatches > 0) {
    struct ucx_batch *b = &c->batches[c->batch_first];
    if (b->req != NULL) {
      ucs_status_t st = ucp_request_check_status(b->req);
      if (st == UCS_INPROGRESS) break;
      ucp_request_free(b->req);
      b->req = NULL;
      if (st != UCS_OK) {
        conn_fail(c, "flush failed", st);
        return 1;
      }
    }
    /* the batch's slots are in the peer's memory: the tail may say so */
    c->ext->tail_src = b->end;
    if (conn_put(c, &c->ext->tail_src, sizeof c->ext->tail_src,
                 offsetof(struct conn_ctrl, tail)) != 0)
      return 1;
    __atomic_store_n(&c->ctrl->head, b->end, __ATOMIC_RELEASE);
    c->batch_first = (c->batch_first + 1) % CONN_MAX_SLOTS;
    c->nbatches--;
    moved = 1;
  }
  return moved;
}

/* Sender: puts the filled slots the receiver has room for, then flushes. */
static int conn_send_post(struct ucx_conn *c) {
  uint64_t tail = __atomic_load_n(&c->ctrl->tail, __ATOMIC_ACQUIRE);
  uint64_t remote_head = __atomic_load_n(&c->ext->remote_head, __ATOMIC_ACQUIRE);
  uint64_t start = c->put_step;
  while (c->put_step < tail && c->put_step - remote_head < c->nslots &&
         c->put_step - start < c->max_batch && c->nbatches < CONN_MAX_SLOTS) {
    size_t slot = c->put_step % c->nslots;
    uint32_t used = c->ctrl->slot_used_nbytes[slot];
    size_t nbytes = used & UCX_USED_NBYTES_MASK;
    if (nbytes > c->slot_nbytes) {
      conn_fail(c, "a slot claims more bytes than it holds", UCS_OK);
      return 1;
    }
    uint64_t off = UCX_CTRL_NBYTES + slot * c->slot_nbytes;
    if (nbytes > 0 && conn_put(c, c->slots + slot * c->slot_nbytes, nbytes, off) != 0) return 1;
    if (conn_put(c, &c->ctrl->slot_used_nbytes[slot], sizeof used,
                 offsetof(struct conn_ctrl, slot_used_nbytes) + slot * sizeof used) != 0)
      return 1;
    c->put_step++;
  }
  if (c->put_step == start) return 0;
  /* the flush completes once every put before it is in the peer's memory */
  ucp_request_param_t param = {.op_attr_mask = 0};
  ucs_status_ptr_t req = ucp_ep_flush_nbx(c->ep, &param);
  if (UCS_PTR_IS_ERR(req)) {
    conn_fail(c, "flush failed", UCS_PTR_STATUS(req));
    return 1;
  }
  uint32_t i = (c->batch_first + c->nbatches) % CONN_MAX_SLOTS;
  c->batches[i] = (struct ucx_batch){.end = c->put_step, .req = req};
  c->nbatches++;
  return 1;
}

/* Receiver: returns the credits, putting the head into the sender's page. */
static int conn_recv_credit(struct ucx_conn *c) {
  uint64_t head = __atomic_load_n(&c->ctrl->head, __ATOMIC_ACQUIRE);
  if (head == c->head_sent) return 0;
  c->ext->head_src = head;
  if (conn_put(c, &c->ext->head_src, sizeof c->ext->head_src,
               UCX_EXT_OFFSET + offsetof(struct ucx_ctrl_ext, remote_head)) != 0)
    return 1;
  c->head_sent = head;
  return 1;
}

/* One pass over a connection end. Returns whether anything happened. */
static int conn_progress(struct ucx_conn *c) {
  if (c->failed) return 0;
  if (c->ep_status != UCS_OK) {
    conn_fail(c, "the peer is unreachable", c->ep_status);
    return 1;
  }
  if (__atomic_load_n(&c->ctrl->poison, __ATOMIC_ACQUIRE)) {
    conn_fail(c, "the local rank failed or aborted, or the peer did", UCS_OK);
    return 1;
  }
  if (!c->is_send) return conn_recv_credit(c);
  int moved = conn_send_retire(c);
  if (!c->failed) moved |= conn_send_post(c);
  return moved;
}

/* --- the thread ------------------------------------------------------------ */

static void ucx_lock(void) {
  __atomic_add_fetch(&ucx.waiters, 1u, __ATOMIC_RELAXED);
  pthread_mutex_lock(&ucx_mutex);
  __atomic_sub_fetch(&ucx.waiters, 1u, __ATOMIC_RELAXED);
}

static void *proxy_main(void *arg) {
  (void)arg;
  uint64_t idle_since = 0;
  for (;;) {
    pthread_mutex_lock(&ucx_mutex);
    if (ucx.stop) {
      pthread_mutex_unlock(&ucx_mutex);
      break;
    }
    int moved = 0;
    for (int i = 0; i < PROXY_PROGRESS_MAX && ucp_worker_progress(ucx.w.worker) != 0; i++)
      moved = 1;
    for (struct ucx_conn *c = ucx.conns; c != NULL; c = c->next) moved |= conn_progress(c);
    pthread_mutex_unlock(&ucx_mutex);
    if (__atomic_load_n(&ucx.waiters, __ATOMIC_RELAXED) != 0) sched_yield();
    if (moved) {
      idle_since = 0;
      continue;
    }
    uint64_t now = clock_ns();
    if (idle_since == 0) idle_since = now;
    uint64_t idle_ns = now - idle_since;
    if (idle_ns < PROXY_SPIN_NS) {
      sched_yield(); /* gives the core to ranks */
      continue;
    }
    uint64_t sleep_ns = idle_ns / 4;
    if (sleep_ns < PROXY_SLEEP_MIN_NS) sleep_ns = PROXY_SLEEP_MIN_NS;
    if (sleep_ns > PROXY_SLEEP_MAX_NS) sleep_ns = PROXY_SLEEP_MAX_NS;
    struct timespec ts = {0, (long)sleep_ns};
    nanosleep(&ts, NULL);
  }
  WEFT_INFO(LOG_NET, "ucx proxy thread stops: no connections left");
  return NULL;
}

/* Under ucx_mutex. */
static weftResult_t proxy_start(void) {
  ucx.stop = 0;
  /* signals go to the application's threads, never to the proxy */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int rc = pthread_create(&ucx.tid, NULL, proxy_main, NULL);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (rc != 0) {
    errno = rc;
    return weft_error_errno(weftSystemError, "starting the ucx proxy thread");
  }
  pthread_setname_np(ucx.tid, "weft-ucx");
  ucx.running = 1;
  WEFT_INFO(LOG_NET, "ucx proxy thread started");
  return weftSuccess;
}

weftResult_t ucx_proxy_add(struct ucx_conn *conn) {
  weftResult_t res = weftSuccess;
  ucx_lock();
  if (!ucx.running) res = proxy_start();
  if (res == weftSuccess) {
    conn->next = ucx.conns;
    ucx.conns = conn;
    conn->registered = 1;
  }
  pthread_mutex_unlock(&ucx_mutex);
  return res;
}

void ucx_proxy_remove(struct ucx_conn *conn) {
  ucx_lock();
  for (struct ucx_conn **link = &ucx.conns; *link != NULL; link = &(*link)->next) {
    if (*link != conn) continue;
    conn_progress(conn); /* a last pass: an abort may have come just now */
    *link = conn->next;
    break;
  }
  conn->next = NULL;
  conn->registered = 0;
  pthread_mutex_unlock(&ucx_mutex);
}

void ucx_enter(void) { ucx_lock(); }

void ucx_leave(void) { pthread_mutex_unlock(&ucx_mutex); }

void ucx_worker_progress_once(void) {
  ucx_lock();
  if (ucx.nrefs > 0) ucp_worker_progress(ucx.w.worker);
  pthread_mutex_unlock(&ucx_mutex);
}

/* Under ucx_mutex: frees the retired ends the peer is done with (all of them
 * when the worker is gone). */
static void retired_sweep(int all) {
  for (struct ucx_conn **link = &ucx.retired; *link != NULL;) {
    struct ucx_conn *c = *link;
    if (!all && !__atomic_load_n(&c->ext->peer_closed, __ATOMIC_ACQUIRE)) {
      link = &c->next;
      continue;
    }
    *link = c->next;
    c->free_fn(c);
  }
}

void ucx_retire(struct ucx_conn *conn, void (*free_fn)(struct ucx_conn *)) {
  ucx_lock();
  conn->free_fn = free_fn;
  conn->next = ucx.retired;
  ucx.retired = conn;
  retired_sweep(0);
  pthread_mutex_unlock(&ucx_mutex);
}

/* --- the worker ------------------------------------------------------------ */

weftResult_t ucx_worker_get(struct ucx_worker **worker_out) {
  weftResult_t res = weftSuccess;
  ucx_lock();
  if (ucx.nrefs > 0 && ucx.pid != getpid()) {
    /* inherited from the parent across fork(): not ours to use or destroy */
    memset(&ucx, 0, sizeof ucx);
  }
  if (ucx.nrefs == 0) {
    ucp_config_t *config;
    ucs_status_t st = ucp_config_read(NULL, NULL, &config); /* UCX_* variables apply */
    if (st != UCS_OK) {
      res = ucx_error(st, "reading the UCX configuration");
      goto unlock;
    }
    ucp_params_t params = {.field_mask = UCP_PARAM_FIELD_FEATURES,
                           .features = UCP_FEATURE_RMA};
    st = ucp_init(&params, config, &ucx.w.context);
    ucp_config_release(config);
    if (st != UCS_OK) {
      res = ucx_error(st, "initialising UCX");
      goto unlock;
    }
    /* the proxy and the ranks' threads (set-up, close) both call in */
    ucp_worker_params_t wparams = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                                   .thread_mode = UCS_THREAD_MODE_MULTI};
    st = ucp_worker_create(ucx.w.context, &wparams, &ucx.w.worker);
    if (st != UCS_OK) {
      res = ucx_error(st, "creating a UCX worker");
      ucp_cleanup(ucx.w.context);
      goto unlock;
    }
    ucx.pid = getpid();
    WEFT_INFO(LOG_NET, "ucx worker created");
  }
  ucx.nrefs++;
  *worker_out = &ucx.w;
unlock:
  pthread_mutex_unlock(&ucx_mutex);
  return res;
}

void ucx_worker_put(void) {
  ucx_lock();
  if (ucx.nrefs == 0 || --ucx.nrefs > 0) {
    pthread_mutex_unlock(&ucx_mutex);
    return;
  }
  int running = ucx.running;
  ucx.stop = 1;
  pthread_mutex_unlock(&ucx_mutex);
  if (running) pthread_join(ucx.tid, NULL);
  ucx_lock();
  if (ucx.nrefs == 0) { /* nobody came back meanwhile */
    ucx.running = 0;
    ucp_worker_destroy(ucx.w.worker);
    retired_sweep(1); /* nothing can write into them any more */
    ucp_cleanup(ucx.w.context);
    memset(&ucx.w, 0, sizeof ucx.w);
    WEFT_INFO(LOG_NET, "ucx worker destroyed");
  } else if (running) {
    ucx.running = 0;
    proxy_start(); /* a connection came while the proxy stopped */
  }
  pthread_mutex_unlock(&ucx_mutex);
}
