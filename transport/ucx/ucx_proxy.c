/* The UCX transport's worker and how its slots move: one UCP context and
 * worker per process, made on first use and destroyed with the last
 * connection; one thread of the proxy core (../proxy.c) progresses the
 * worker and moves every connection's slots, sleeping a little longer each
 * time it finds nothing to do, up to a millisecond. */
#include "ucx_proxy.h"

#include <dirent.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../base/status.h"
#include "../base/wait.h"

#define UCX_SLEEP_MIN_NS 20000ull   /* the first sleep once idle; later ones grow ... */
#define UCX_SLEEP_MAX_NS 1000000ull /* ... up to this */
#define UCX_PROGRESS_MAX 64         /* worker progress calls per pass, at most */
#define UCX_BEATS_PER_TIMEOUT 4     /* heartbeats each end sends per WEFT_TIMEOUT */

/* The proxy's mutex guards the state below as well as the worker. */
static struct proxy ucx_proxy = PROXY_INITIALIZER(&ucx_net_ops);
static struct {
  pid_t pid; /* the process that made the worker: a forked child makes its own */
  int nrefs;
  struct ucx_worker w;
  struct ucx_conn *retired; /* closed ends whose peer may still write */
  struct bulk_peer *bulk_peers;
  uint64_t now_ns;     /* the clock at the start of the pass */
  uint64_t silence_ns; /* WEFT_TIMEOUT: a peer unheard that long is down (0: never) */
} ucx;

/* A peer worker's endpoint for bulk transfers (ucx_bulk_ep). */
struct bulk_peer {
  struct bulk_peer *next;
  ucp_ep_h ep;
  size_t address_nbytes;
  uint8_t address[];
};

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

static const uint32_t ctrl_payload = 1u; /* what a poison or heartbeat message carries */

/* A poison or heartbeat message (word: UCX_CTRL_*) for the peer (best effort). */
static void conn_send_ctrl(struct ucx_conn *c, uint32_t word) {
  if (c->ep != NULL && c->ep_status == UCS_OK) {
    ucp_request_param_t param = {.op_attr_mask = 0};
    unsigned kind = c->pc.is_send ? UCX_TAG_POISON_TO_RECEIVER : UCX_TAG_POISON_TO_SENDER;
    ucs_status_ptr_t req = ucp_tag_send_nbx(c->ep, &ctrl_payload, sizeof ctrl_payload,
                                            ucx_tag(c->token, kind, word), &param);
    if (UCS_PTR_IS_PTR(req)) ucp_request_free(req); /* released once done */
  }
}

static void ucx_notify_fail(struct proxy_conn *pc) {
  conn_send_ctrl((struct ucx_conn *)pc, UCX_CTRL_POISON);
}

/* Marks the connection failed (proxy_conn_fail), with UCX's words for status. */
static void conn_fail(struct ucx_conn *c, const char *why, ucs_status_t status) {
  proxy_conn_fail(&c->pc, why, status != UCS_OK ? ucs_status_string(status) : NULL);
}

/* Posts the receive for the peer's poison or heartbeat message. */
static int conn_post_poison_recv(struct ucx_conn *c) {
  unsigned kind = c->pc.is_send ? UCX_TAG_POISON_TO_SENDER : UCX_TAG_POISON_TO_RECEIVER;
  ucp_request_param_t param = {.op_attr_mask = UCP_OP_ATTR_FLAG_NO_IMM_CMPL};
  ucs_status_ptr_t req = ucp_tag_recv_nbx(c->worker, &c->poison_in, sizeof c->poison_in,
                                          ucx_tag(c->token, kind, 0), UCX_TAG_MATCH_MASK, &param);
  if (UCS_PTR_IS_ERR(req)) {
    conn_fail(c, "posting a receive failed", UCS_PTR_STATUS(req));
    return -1;
  }
  c->poison_req = req;
  return 0;
}

/* Sender: takes in the credit messages that arrived and keeps a receive
 * posted for the next. Returns whether the credits grew. */
static int conn_credit_progress(struct ucx_conn *c) {
  int moved = 0;
  for (;;) {
    if (c->credit_req != NULL) {
      if (ucp_request_check_status(c->credit_req) == UCS_INPROGRESS) return moved;
      ucp_tag_recv_info_t info;
      ucs_status_t st = ucp_tag_recv_request_test(c->credit_req, &info);
      ucp_request_free(c->credit_req);
      c->credit_req = NULL;
      if (st != UCS_OK || info.length != sizeof c->credit_buf) {
        conn_fail(c, "receiving credits failed", st);
        return 1;
      }
      c->heard_ns = ucx.now_ns;
      if (c->credit_buf > c->credit_step) {
        c->credit_step = c->credit_buf;
        moved = 1;
      }
    }
    ucp_request_param_t param = {.op_attr_mask = UCP_OP_ATTR_FLAG_NO_IMM_CMPL};
    ucs_status_ptr_t req =
        ucp_tag_recv_nbx(c->worker, &c->credit_buf, sizeof c->credit_buf,
                         ucx_tag(c->token, UCX_TAG_CREDIT, 0), UCX_TAG_MATCH_MASK, &param);
    if (UCS_PTR_IS_ERR(req)) {
      conn_fail(c, "posting a receive failed", UCS_PTR_STATUS(req));
      return 1;
    }
    c->credit_req = req; /* complete already when a credit was waiting */
  }
}

/* Sender: hands back the slots UCX is done with, then sends the filled ones
 * the credits allow. Returns whether anything happened. */
static int conn_send_progress(struct ucx_conn *c) {
  int moved = conn_credit_progress(c);
  if (c->pc.failed) return 1;
  uint64_t done = c->done_step;
  while (done < c->posted_step) {
    ucs_status_ptr_t *req = &c->reqs[done % c->pc.nslots];
    if (*req != NULL) {
      ucs_status_t st = ucp_request_check_status(*req);
      if (st == UCS_INPROGRESS) break;
      ucp_request_free(*req);
      *req = NULL;
      if (st != UCS_OK) {
        conn_fail(c, "send failed", st);
        return 1;
      }
    }
    done++;
  }
  c->done_step = done;
  proxy_conn_publish_sent(&c->pc, done); /* a closing rank waits for it */
  /* the rank may fill a slot once UCX is done with it and the receiver has
   * room for it: what the rank filled can go out at once, so data a send
   * returned on reaches the peer even if this end aborts right after */
  uint64_t head = c->done_step < c->credit_step ? c->done_step : c->credit_step;
  moved |= proxy_conn_publish_head(&c->pc, head);
  /* head <= credit_step: every slot up to tail is within the credits */
  uint64_t tail = proxy_conn_tail(&c->pc);
  while (c->posted_step < tail) {
    size_t slot = c->posted_step % c->pc.nslots;
    uint32_t used;
    if (proxy_conn_slot_used(&c->pc, c->posted_step, &used) != 0) return 1;
    size_t nbytes = used & PROXY_USED_NBYTES_MASK;
    /* done when UCX no longer needs the slot (an eager send: at once) */
    ucp_request_param_t param = {.op_attr_mask = UCP_OP_ATTR_FIELD_MEMH, .memh = c->memh};
    ucs_status_ptr_t req = ucp_tag_send_nbx(c->ep, proxy_slot(&c->pc, c->posted_step), nbytes,
                                            ucx_tag(c->token, UCX_TAG_DATA, used), &param);
    if (UCS_PTR_IS_ERR(req)) {
      conn_fail(c, "send failed", UCS_PTR_STATUS(req));
      return 1;
    }
    c->reqs[slot] = UCS_PTR_IS_PTR(req) ? req : NULL;
    c->posted_step++;
    moved = 1;
  }
  return moved;
}

/* Receiver: publishes the slots that arrived, in order. Returns whether any
 * did. */
static int conn_recv_complete(struct ucx_conn *c) {
  int moved = 0;
  while (c->done_step < c->posted_step) {
    size_t slot = c->done_step % c->pc.nslots;
    ucp_tag_recv_info_t info;
    ucs_status_t st = ucp_tag_recv_request_test(c->reqs[slot], &info);
    if (st == UCS_INPROGRESS) break;
    ucp_request_free(c->reqs[slot]);
    c->reqs[slot] = NULL;
    if (st != UCS_OK) {
      conn_fail(c, "receive failed", st);
      return 1;
    }
    uint32_t used = (uint32_t)info.sender_tag;
    if ((used & PROXY_USED_NBYTES_MASK) != info.length) {
      conn_fail(c, "malformed data (not a weft peer?)", UCS_OK);
      return 1;
    }
    proxy_conn_slot_set_used(&c->pc, c->done_step, used);
    c->heard_ns = ucx.now_ns;
    c->done_step++;
    moved = 1;
  }
  if (moved) proxy_conn_publish_tail(&c->pc, c->done_step);
  return moved;
}

/* Receiver: publishes the slots that arrived, then posts receives into the
 * slots the rank has drained. Returns whether anything happened. */
static int conn_recv_progress(struct ucx_conn *c) {
  int moved = conn_recv_complete(c);
  if (c->pc.failed) return 1;
  uint64_t head = proxy_conn_head(&c->pc);
  while (c->posted_step < head + c->pc.nslots) {
    size_t slot = c->posted_step % c->pc.nslots;
    ucp_request_param_t param = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_MEMH | UCP_OP_ATTR_FLAG_NO_IMM_CMPL, .memh = c->memh};
    ucs_status_ptr_t req =
        ucp_tag_recv_nbx(c->worker, proxy_slot(&c->pc, c->posted_step), c->pc.slot_nbytes,
                         ucx_tag(c->token, UCX_TAG_DATA, 0), UCX_TAG_MATCH_MASK, &param);
    if (UCS_PTR_IS_ERR(req)) {
      conn_fail(c, "posting a receive failed", UCS_PTR_STATUS(req));
      return 1;
    }
    c->reqs[slot] = req;
    c->posted_step++;
    moved = 1;
  }
  /* a receive posted for a message that was already there completes at once */
  moved |= conn_recv_complete(c);
  if (c->pc.failed) return 1;
  /* the credits: every slot below head + nslots has its receive posted */
  ucs_status_t st = c->credit_req != NULL ? ucp_request_check_status(c->credit_req) : UCS_OK;
  if (c->credit_req != NULL && st != UCS_INPROGRESS) {
    ucp_request_free(c->credit_req);
    c->credit_req = NULL;
    if (st != UCS_OK) {
      conn_fail(c, "sending credits failed", st);
      return 1;
    }
  }
  if (c->credit_req == NULL && c->credit_step < head) {
    c->credit_buf = head; /* UCX may still read it until the send completes */
    ucp_request_param_t param = {.op_attr_mask = 0};
    ucs_status_ptr_t req = ucp_tag_send_nbx(c->ep, &c->credit_buf, sizeof c->credit_buf,
                                            ucx_tag(c->token, UCX_TAG_CREDIT, 0), &param);
    if (UCS_PTR_IS_ERR(req)) {
      conn_fail(c, "sending credits failed", UCS_PTR_STATUS(req));
      return 1;
    }
    c->credit_req = UCS_PTR_IS_PTR(req) ? req : NULL;
    c->credit_step = head;
    moved = 1;
  }
  return moved;
}

/* Takes in the peer's heartbeats; returns 1 once the peer's poison came. */
static int conn_ctrl_progress(struct ucx_conn *c) {
  while (ucp_request_check_status(c->poison_req) != UCS_INPROGRESS) {
    ucp_tag_recv_info_t info;
    ucs_status_t st = ucp_tag_recv_request_test(c->poison_req, &info);
    uint32_t word = (uint32_t)info.sender_tag;
    if (st != UCS_OK || (word != UCX_CTRL_ALIVE && word != UCX_CTRL_READY)) return 1;
    ucp_request_free(c->poison_req);
    c->poison_req = NULL;
    c->heard_ns = ucx.now_ns;
    if (word == UCX_CTRL_READY) __atomic_store_n(&c->peer_ready, 1, __ATOMIC_RELEASE);
    if (conn_post_poison_recv(c) != 0) return 0; /* failed already */
  }
  return 0;
}

/* Sends the heartbeat when due; fails c when the peer has been silent for
 * WEFT_TIMEOUT. Returns whether c failed. */
static int conn_liveness(struct ucx_conn *c) {
  if (ucx.silence_ns == 0) return 0;
  if (c->heard_ns == 0) c->heard_ns = c->beat_ns = ucx.now_ns; /* just registered */
  if (ucx.now_ns >= c->beat_ns) {
    conn_send_ctrl(c, UCX_CTRL_ALIVE);
    c->beat_ns = ucx.now_ns + ucx.silence_ns / UCX_BEATS_PER_TIMEOUT;
  }
  if (ucx.now_ns - c->heard_ns < ucx.silence_ns) return 0;
  c->peer_gone = 1;
  char why[96];
  snprintf(why, sizeof why, "nothing heard from the peer for %.1f s (WEFT_TIMEOUT)",
           (double)(ucx.now_ns - c->heard_ns) / 1e9);
  conn_fail(c, why, UCS_OK);
  return 1;
}

/* One pass over a connection end. Returns whether anything happened. */
static int ucx_progress(struct proxy_conn *pc) {
  struct ucx_conn *c = (struct ucx_conn *)pc;
  if (c->poison_req == NULL && conn_post_poison_recv(c) != 0) return 1;
  /* slots filled or arrived before a failure still go out or in (a shm peer
   * would see them too); then the poison */
  int moved = c->pc.is_send ? conn_send_progress(c) : conn_recv_progress(c);
  if (c->pc.failed) return 1;
  if (c->ep_status != UCS_OK) {
    c->peer_gone = 1;
    conn_fail(c, "the peer is unreachable", c->ep_status);
    return 1;
  }
  if (conn_ctrl_progress(c)) {
    c->peer_gone = 1;
    conn_fail(c, "the peer failed or aborted", UCS_OK);
    return 1;
  }
  if (c->pc.failed || conn_liveness(c)) return 1;
  return moved; /* the core checks the local poison */
}

/* --- the thread ------------------------------------------------------------ */

static void ucx_lock(void) { proxy_lock(&ucx_proxy); }

static void ucx_unlock(void) { proxy_unlock(&ucx_proxy); }

/* Under the proxy's mutex, once per pass: the worker's progress. */
static int ucx_pass(struct proxy *p) {
  (void)p;
  ucx.now_ns = clock_ns();
  int moved = 0;
  for (int i = 0; i < UCX_PROGRESS_MAX && ucp_worker_progress(ucx.w.worker) != 0; i++)
    moved = 1;
  return moved;
}

const struct proxy_net_ops ucx_net_ops = {
    .name = "ucx",
    .sleep_min_ns = UCX_SLEEP_MIN_NS,
    .sleep_max_ns = UCX_SLEEP_MAX_NS,
    .linger = 1, /* until the worker goes: retired ends still need its progress */
    .unpin = 0,
    .progress = ucx_progress,
    .notify_fail = ucx_notify_fail,
    .pass = ucx_pass,
    .poll_fill = NULL,
    .poll_event = NULL,
};

weftResult_t ucx_proxy_add(struct ucx_conn *conn) {
  weftResult_t res = weftSuccess;
  ucx_lock();
  if (!ucx_proxy.running) res = proxy_start(&ucx_proxy, 0);
  if (res == weftSuccess) proxy_add_locked(&ucx_proxy, &conn->pc);
  ucx_unlock();
  return res;
}

void ucx_conn_ready(struct ucx_conn *conn) {
  ucx_lock();
  conn_send_ctrl(conn, UCX_CTRL_READY);
  ucx_unlock();
}

void ucx_proxy_remove(struct ucx_conn *conn) {
  ucx_lock();
  proxy_remove_locked(&conn->pc);
  ucx_unlock();
}

#define KILL_WAIT_NS 2000000000ull /* for the forced close */

void ucx_conn_kill(struct ucx_conn *c, const char *why) {
  ucx_lock();
  conn_fail(c, why, UCS_OK);
  c->peer_gone = 1; /* nothing left to flush at close */
  ucs_status_ptr_t req = NULL;
  if (c->ep != NULL) {
    ucp_request_param_t param = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                                 .flags = UCP_EP_CLOSE_FLAG_FORCE};
    req = ucp_ep_close_nbx(c->ep, &param);
    c->ep = NULL;
  }
  ucx_unlock();
  if (!UCS_PTR_IS_PTR(req)) return;
  uint64_t deadline = clock_ns() + KILL_WAIT_NS;
  while (ucp_request_check_status(req) == UCS_INPROGRESS && clock_ns() < deadline)
    ucx_worker_progress_once();
  ucx_lock();
  ucp_request_free(req);
  ucx_unlock();
}

void ucx_enter(void) { ucx_lock(); }

void ucx_leave(void) { ucx_unlock(); }

void ucx_worker_progress_once(void) {
  ucx_lock();
  if (ucx.nrefs > 0) ucp_worker_progress(ucx.w.worker);
  ucx_unlock();
}

void ucx_drive_begin(void) { proxy_drive_begin(&ucx_proxy); }

void ucx_drive_pass(void) {
  ucx_lock();
  if (ucx.nrefs > 0) proxy_pass(&ucx_proxy);
  ucx_unlock();
}

void ucx_drive_end(void) { proxy_drive_end(&ucx_proxy); }

/* Whether UCX still holds requests on c's FIFO. */
static int ucx_conn_busy(struct ucx_conn *c) {
  for (uint32_t i = 0; i < c->pc.nslots; i++)
    if (c->reqs[i] != NULL && ucp_request_check_status(c->reqs[i]) == UCS_INPROGRESS) return 1;
  if (c->credit_req != NULL && ucp_request_check_status(c->credit_req) == UCS_INPROGRESS) return 1;
  return c->poison_req != NULL && ucp_request_check_status(c->poison_req) == UCS_INPROGRESS;
}

/* Under the proxy's mutex: frees the retired ends the peer is done with (all of them
 * when the worker is gone). */
static void retired_sweep(int all) {
  for (struct ucx_conn **link = &ucx.retired; *link != NULL;) {
    struct ucx_conn *c = *link;
    if (!all && ucx_conn_busy(c)) {
      link = &c->retired_next;
      continue;
    }
    *link = c->retired_next;
    c->free_fn(c);
  }
}

void ucx_retire(struct ucx_conn *conn, void (*free_fn)(struct ucx_conn *)) {
  ucx_lock();
  conn->free_fn = free_fn;
  conn->retired_next = ucx.retired;
  ucx.retired = conn;
  retired_sweep(0);
  ucx_unlock();
}

/* --- the worker ------------------------------------------------------------ */

/* Whether slots go by UCX's eager protocol whatever their size. Without
 * remote memory access (TCP) a rendezvous costs round trips through both
 * proxies per slot and saves no copy; over InfiniBand or RoCE it moves the
 * slot zero-copy, so UCX's own threshold stays. */
static int ucx_slots_eager(void) {
  int64_t eager = param_int(&ucx_params[UCX_P_EAGER]);
  if (eager >= 0) return eager != 0;
  if (getenv("UCX_RNDV_THRESH") != NULL) return 0;
  int rdma = 0;
  DIR *dir = opendir("/sys/class/infiniband"); /* verbs devices, RoCE included */
  if (dir != NULL) {
    for (struct dirent *e; (e = readdir(dir)) != NULL && !rdma;) rdma = e->d_name[0] != '.';
    closedir(dir);
  }
  return !rdma;
}

weftResult_t ucx_worker_get(size_t slot_nbytes, struct ucx_worker **worker_out) {
  weftResult_t res = weftSuccess;
  ucx_lock();
  if (ucx.nrefs > 0 && ucx.pid != getpid()) {
    /* inherited from the parent across fork(): not ours to use or destroy */
    memset(&ucx, 0, sizeof ucx);
    proxy_forget(&ucx_proxy);
  }
  if (ucx.nrefs == 0) {
    ucp_config_t *config;
    ucs_status_t st = ucp_config_read(NULL, NULL, &config); /* UCX_* variables apply */
    if (st != UCS_OK) {
      res = ucx_error(st, "reading the UCX configuration");
      goto unlock;
    }
    /* slots go eagerly; messages past a slot (bulk transfers) by rendezvous */
    char thresh[32];
    snprintf(thresh, sizeof thresh, "%zu", slot_nbytes + 1);
    ucx.w.eager_nbytes = 0;
    if (ucx_slots_eager()) {
      if ((st = ucp_config_modify(config, "RNDV_THRESH", thresh)) == UCS_OK)
        ucx.w.eager_nbytes = slot_nbytes;
      else
        WEFT_INFO(LOG_NET, "ucx: cannot send slots eagerly: %s", ucs_status_string(st));
    }
    ucp_params_t params = {.field_mask = UCP_PARAM_FIELD_FEATURES,
                           .features = UCP_FEATURE_TAG};
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
    uint64_t timeout_ns = wait_default_timeout_ns();
    ucx.silence_ns = timeout_ns < UINT64_MAX / 4 ? timeout_ns : 0; /* 0: no timeout set */
    WEFT_INFO(LOG_NET, "ucx worker created");
  }
  ucx.nrefs++;
  *worker_out = &ucx.w;
unlock:
  ucx_unlock();
  return res;
}

/* Receives and drops the messages that arrived for no receive (a credit
 * its sender's peer had closed for, a poison word after close): UCX warns
 * about each one left at destroy. Eager messages are here whole; anything
 * that needs the peer gets DROP_WAIT_NS and is then cancelled.
 *
 * Bulk messages past the eager size are left to UCX's warning: receiving
 * one would read its sender's memory, and a sender whose process has gone
 * (they come from failed calls, whose peers may be exiting) ends this
 * process inside UCX (ucx_conn.c, bulk transfers). */
#define DROP_WAIT_NS 100000000ull
#define DROP_MAX 4096
static void worker_drop_unexpected(ucp_worker_h worker, size_t eager_nbytes) {
  const uint64_t bulk_bit = UCX_TOKEN_BULK << UCX_TAG_TOKEN_SHIFT;
  int bulk_eager = 1; /* bulk messages up to eager_nbytes may still be here */
  for (int i = 0; i < DROP_MAX; i++) {
    ucp_tag_recv_info_t info;
    ucp_tag_message_h msg = NULL;
    if (bulk_eager) {
      /* the first message in order of arrival: a bulk one past the eager
       * size stops the look at bulk messages (the rest of them stay) */
      msg = ucp_tag_probe_nb(worker, 0, 0, 0, &info);
      if (msg != NULL && (info.sender_tag & bulk_bit) && info.length > eager_nbytes) {
        bulk_eager = 0;
        msg = NULL;
      }
      if (msg != NULL) msg = ucp_tag_probe_nb(worker, 0, 0, 1, &info); /* the same one */
    }
    if (msg == NULL) msg = ucp_tag_probe_nb(worker, 0, bulk_bit, 1, &info); /* slot tags */
    if (msg == NULL) return;
    void *buf = malloc(info.length > 0 ? info.length : 1);
    if (buf == NULL) return;
    ucp_request_param_t param = {.op_attr_mask = 0};
    ucs_status_ptr_t req = ucp_tag_msg_recv_nbx(worker, buf, info.length, msg, &param);
    if (UCS_PTR_IS_PTR(req)) {
      uint64_t deadline = clock_ns() + DROP_WAIT_NS;
      int cancelled = 0;
      while (ucp_request_check_status(req) == UCS_INPROGRESS) {
        if (clock_ns() > deadline) {
          if (cancelled) return; /* not even cancelled: leave it (and buf) to the destroy */
          ucp_request_cancel(worker, req);
          cancelled = 1;
          deadline = clock_ns() + DROP_WAIT_NS;
        }
        ucp_worker_progress(worker);
      }
      ucp_request_free(req);
    }
    free(buf);
  }
}

/* Under the proxy's mutex, with the worker about to go: its destruction takes the
 * bulk endpoints along (UCX cannot close them sooner: without peer failure
 * handling an endpoint closes only by a flush, which a dead peer never
 * answers). */
static void bulk_peers_free(void) {
  while (ucx.bulk_peers != NULL) {
    struct bulk_peer *b = ucx.bulk_peers;
    ucx.bulk_peers = b->next;
    free(b);
  }
}

weftResult_t ucx_bulk_ep(const void *address, size_t address_nbytes, ucp_ep_h *ep_out) {
  for (struct bulk_peer *b = ucx.bulk_peers; b != NULL; b = b->next) {
    if (b->address_nbytes == address_nbytes && memcmp(b->address, address, address_nbytes) == 0) {
      *ep_out = b->ep;
      return weftSuccess;
    }
  }
  struct bulk_peer *b = malloc(sizeof *b + address_nbytes);
  if (b == NULL) return weft_error_set(weftSystemError, "out of memory");
  ucp_ep_params_t params = {
      .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE,
      .address = address,
      .err_mode = UCP_ERR_HANDLING_MODE_NONE};
  ucs_status_t st = ucp_ep_create(ucx.w.worker, &params, &b->ep);
  if (st != UCS_OK) {
    free(b);
    return ucx_error(st, "creating a UCX endpoint for bulk transfers");
  }
  b->address_nbytes = address_nbytes;
  memcpy(b->address, address, address_nbytes);
  b->next = ucx.bulk_peers;
  ucx.bulk_peers = b;
  *ep_out = b->ep;
  return weftSuccess;
}

void ucx_worker_put(void) {
  ucx_lock();
  if (ucx.nrefs == 0 || --ucx.nrefs > 0) {
    ucx_unlock();
    return;
  }
  ucx_unlock();
  proxy_stop(&ucx_proxy); /* not under its mutex: it waits for the thread */
  ucx_lock();
  if (ucx.nrefs == 0) { /* nobody came back meanwhile */
    retired_sweep(1); /* nothing progresses the worker any more */
    bulk_peers_free();
    worker_drop_unexpected(ucx.w.worker, ucx.w.eager_nbytes);
    ucp_worker_destroy(ucx.w.worker);
    ucp_cleanup(ucx.w.context);
    memset(&ucx.w, 0, sizeof ucx.w);
    WEFT_INFO(LOG_NET, "ucx worker destroyed");
  } else if (ucx_proxy.conns != NULL && !ucx_proxy.running) {
    proxy_start(&ucx_proxy, 0); /* a connection came while the proxy stopped */
  }
  ucx_unlock();
}
