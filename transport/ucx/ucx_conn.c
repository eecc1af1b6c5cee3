/* The UCX transport: ranks on any hosts, over whatever UCX finds (InfiniBand
 * verbs, RoCE, TCP, shared memory; UCX_TLS and UCX_NET_DEVICES choose, and
 * pass through untouched). Each end keeps its FIFO in memory registered with
 * UCX; the proxy (ucx_proxy.c) sends the sender's filled slots as tagged
 * messages into receives posted in the receiver's free slots.
 *
 * Set-up: the receiver registers its FIFO and sends the sender its worker
 * address over the bootstrap (too large for a connection blob: an address
 * with several devices runs to hundreds of bytes); the blob carries a token
 * that ties the two together and names the connection's tags. The sender
 * connects an endpoint and sends its own address back, so that either end
 * can tell the other it failed, and learns when the other is gone. The
 * receiver connects its endpoint after the barrier; a rank's set-up then
 * ends only once its connections are wired up (set-up order, below). */
#include <assert.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "../base/param.h"
#include "../base/status.h"
#include "../transport.h"
#include "../base/wait.h"
#include "ucx_proxy.h"

#include <ucs/debug/debug.h>

/* UCX's library (libucs), loaded with weft's, catches SIGHUP from its
 * constructor on (UCX_DEBUG_SIGNO, whose default it is) and ends the process
 * on it, whatever the process had: a program started under nohup, or by a
 * shell that ignores SIGHUP for it, died at a hang-up once it loaded weft.
 * Unless UCX_DEBUG_SIGNO asks for UCX's handler, SIGHUP gets back what it was
 * before UCX took it, when weft is loaded (before main, or at dlopen). Here,
 * in a file every link of weft takes, static ones too. */
__attribute__((constructor)) static void ucx_sighup_restore(void) {
  if (getenv("UCX_DEBUG_SIGNO") != NULL) return;
  ucs_debug_disable_signal(SIGHUP);
}


#define UCX_MSG_MAGIC 0x7765667455435831ull /* "weftUCX1" */
#define UCX_MSG_DATA_NBYTES 8192            /* a worker address */
#define UCX_CLOSE_TIMEOUT_NS 2000000000ull  /* flushing an endpoint on close */
/* The bootstrap tags of a connection's set-up messages carry 23 bits of its
 * token: both ends know it (the receiver made it, the sender has it from
 * the blob), so each message is matched to its connection whatever order
 * several connections' set-ups between two ranks (the sets of one
 * handshake, several channels) deliver theirs in. */
static uint32_t tag_ucx_receiver(uint64_t token) {
  return 0x75000000u | (uint32_t)(token & 0x7fffffu);
}
static uint32_t tag_ucx_sender(uint64_t token) {
  return 0x75800000u | (uint32_t)(token & 0x7fffffu);
}

/* What the receiver publishes in its blob. */
struct ucx_blob {
  uint64_t token;
  uint64_t fifo_nbytes; /* nslots * slot_nbytes: both ends must agree */
};
static_assert(sizeof(struct ucx_blob) <= sizeof(((struct conn_blob *)0)->data),
              "ucx blob too large");

/* What each end tells the other over the bootstrap. */
struct ucx_msg {
  uint64_t magic;
  uint64_t token;
  uint64_t fifo_nbytes;
  uint32_t address_nbytes;
  uint32_t reserved;
  uint8_t data[UCX_MSG_DATA_NBYTES]; /* the worker address */
};

static void ucx_close(struct weft_conn *conn);

static int ucx_disabled(void) { return param_int(&ucx_params[UCX_P_DISABLE]) != 0; }

/* UCX reaches any host (and this one, when forced): host memory anywhere,
 * a device kernel's FIFO on another host (a device network connection; one
 * host's GPUs use the device transports). */
static int ucx_can_connect(const struct peer_info *sender, const struct peer_info *receiver,
                           const struct transport_need *need, char *why, size_t why_nbytes) {
  if (need->mem == TRANSPORT_MEM_DEVICE && sender->host_hash == receiver->host_hash)
    return transport_refuse(why, why_nbytes, "device memory between hosts only");
  return 1;
}

/* Each rank on this host runs a proxy thread besides its own: once a peer
 * shares the host, the waits must yield at once when the threads outnumber
 * the cores (as with the socket transport). */
static void ucx_note_local_peer(const struct weft_conn *conn, struct ucx_conn *uc) {
  if (conn->peer_pid > 0 && !uc->oversubscribed_hold)
    uc->oversubscribed_hold = wait_oversubscribed_hold(4, 0);
}

/* Rewrites the last error as "ucx transport, what rank N: cause". */
static weftResult_t ucx_error_peer(weftResult_t res, const char *what, int peer_rank) {
  char cause[512];
  snprintf(cause, sizeof cause, "%s", weft_error_text());
  return weft_error_set(res, "ucx transport, %s rank %d: %s", what, peer_rank, cause);
}

/* Frees what ucx_conn_alloc made; the worker reference is the caller's. */
static void ucx_conn_free(struct ucx_conn *uc) {
  for (uint32_t i = 0; i < CONN_MAX_SLOTS; i++)
    if (uc->reqs[i] != NULL) ucp_request_free(uc->reqs[i]);
  if (uc->poison_req != NULL) ucp_request_free(uc->poison_req);
  if (uc->credit_req != NULL) ucp_request_free(uc->credit_req);
  if (uc->memh != NULL) ucp_mem_unmap(uc->context, uc->memh);
  proxy_fifo_free(&uc->pc);
  free(uc);
}

/* Allocates and registers this end's FIFO and hangs it on conn (conn->priv
 * owns it, so close() undoes a half-done set-up). Takes a worker reference. */
static weftResult_t ucx_conn_alloc(struct weft_conn *conn, int is_send, struct ucx_conn **uc_out) {
  if (conn->bs == NULL)
    return weft_error_set(weftInternalError, "ucx transport: connection without a bootstrap");
  struct ucx_worker *w;
  WEFT_TRY(ucx_worker_get(conn->slot_nbytes, &w));
  struct ucx_conn *uc = calloc(1, sizeof *uc);
  if (uc == NULL) {
    ucx_worker_put();
    return weft_error_set(weftSystemError, "out of memory");
  }
  uc->context = w->context;
  uc->worker = w->worker;
  uc->eager_nbytes = w->eager_nbytes;
  uc->pc.ops = &ucx_net_ops;
  uc->pc.is_send = is_send;
  uc->pc.peer_rank = conn->peer_rank;
  uc->peer_pid = conn->peer_pid;
  conn->priv = uc; /* from here on, close() undoes it all */
  WEFT_TRY(proxy_fifo_alloc(&uc->pc, conn->nslots, conn->slot_nbytes, conn->fifo_mem));
  ucp_mem_map_params_t mp = {
      .field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH,
      .address = uc->pc.fifo,
      .length = uc->pc.fifo_nbytes};
  ucx_enter();
  ucs_status_t st = ucp_mem_map(w->context, &mp, &uc->memh);
  ucx_leave();
  if (st != UCS_OK) {
    uc->memh = NULL;
    return ucx_error(st, "registering a %zu-byte FIFO with UCX", uc->pc.fifo_nbytes);
  }
  uc->ep_status = UCS_OK;
  conn->ctrl = uc->pc.ctrl;
  conn->slots = uc->pc.slots;
  conn->step = 0;
  *uc_out = uc;
  return weftSuccess;
}

/* Describes this end's worker in msg. */
static weftResult_t ucx_msg_fill(struct ucx_conn *uc, struct ucx_msg *msg) {
  ucp_address_t *address = NULL;
  size_t address_nbytes = 0;
  weftResult_t res = weftSuccess;
  ucx_enter();
  ucs_status_t st = ucp_worker_get_address(uc->worker, &address, &address_nbytes);
  if (st != UCS_OK) {
    res = ucx_error(st, "getting the UCX worker address");
    goto leave;
  }
  if (address_nbytes > sizeof msg->data) {
    res = weft_error_set(weftSystemError,
                         "ucx worker address of %zu bytes exceeds %zu: restrict UCX_TLS or "
                         "UCX_NET_DEVICES",
                         address_nbytes, sizeof msg->data);
    goto release_address;
  }
  memset(msg, 0, sizeof *msg);
  msg->magic = UCX_MSG_MAGIC;
  msg->token = uc->token;
  msg->fifo_nbytes = (uint64_t)uc->pc.nslots * uc->pc.slot_nbytes;
  msg->address_nbytes = (uint32_t)address_nbytes;
  memcpy(msg->data, address, address_nbytes);
release_address:
  ucp_worker_release_address(uc->worker, address);
leave:
  ucx_leave();
  return res;
}

static void ucx_ep_error_cb(void *arg, ucp_ep_h ep, ucs_status_t status) {
  (void)ep;
  struct ucx_conn *uc = arg;
  __atomic_store_n(&uc->ep_status, status, __ATOMIC_RELEASE);
}

/* Connects an endpoint to the peer that msg describes; peer_pid (0: on
 * another host) is checked first. A peer that sent its half of the set-up
 * and then died is refused here rather than connected to: UCX 1.13 aborts
 * the process on an assertion when an endpoint's wire-up meets a peer that
 * is gone (its pending wire-up request is purged: ucp_request.c "got REQ
 * message", tcp_ep.c "CTX_TYPE_TX"). The check narrows that window to the
 * endpoint's creation; on another host it stays UCX's. */
static weftResult_t ucx_conn_attach(struct ucx_conn *uc, const struct ucx_msg *msg,
                                    pid_t peer_pid) {
  if (peer_pid > 0 && pid_gone(peer_pid, 1))
    return weft_error_set(weftRemoteError, "rank %d (pid %d) died during the connection's set-up",
                          uc->pc.peer_rank, (int)peer_pid);
  if (msg->magic != UCX_MSG_MAGIC || msg->token != uc->token)
    return weft_error_set(weftInternalError,
                          "a ucx set-up message that is not for this connection (magic %#llx, "
                          "token %#llx; this connection's token %#llx)",
                          (unsigned long long)msg->magic, (unsigned long long)msg->token,
                          (unsigned long long)uc->token);
  WEFT_TRY(transport_check_fifo(uc->pc.peer_rank, uc->pc.nslots, uc->pc.slot_nbytes, msg->fifo_nbytes));
  if (msg->address_nbytes > sizeof msg->data)
    return weft_error_set(weftInternalError, "a ucx set-up message with a bad length");
  /* peer error handling: a dead or unreachable peer fails the endpoint */
  ucp_ep_params_t ep_params = {
      .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER,
      .address = (const ucp_address_t *)msg->data,
      .err_mode = UCP_ERR_HANDLING_MODE_PEER,
      .err_handler = {.cb = ucx_ep_error_cb, .arg = uc}};
  ucx_enter();
  /* UCX pairs the k-th endpoint one worker makes to another with the k-th
   * made the other way, and refuses pairs whose failure handling differs:
   * the bulk endpoint (without it) is each worker's first to the other */
  ucp_ep_h bulk_ep;
  weftResult_t res = ucx_bulk_ep(msg->data, msg->address_nbytes, &bulk_ep);
  if (res != weftSuccess) {
    ucx_leave();
    return res;
  }
  uc->bulk_ep = bulk_ep; /* sends: sender only; the receiver flushes it at set-up */
  ucs_status_t st = ucp_ep_create(uc->worker, &ep_params, &uc->ep);
  if (st == UCS_ERR_UNREACHABLE) {
    /* UCX's shared-memory transports cannot report a dead peer: without it,
     * liveness comes from the waits (pid checks on one host, WEFT_TIMEOUT) */
    ep_params.err_mode = UCP_ERR_HANDLING_MODE_NONE;
    st = ucp_ep_create(uc->worker, &ep_params, &uc->ep);
    if (st == UCS_OK)
      WEFT_INFO(LOG_NET, "ucx connection %s rank %d: endpoint without peer failure detection",
                uc->pc.is_send ? "to" : "from", uc->pc.peer_rank);
  }
  ucx_leave();
  if (st != UCS_OK) {
    uc->ep = NULL;
    return ucx_error(st, "creating a UCX endpoint");
  }
  return weftSuccess;
}

/* --- set-up order -----------------------------------------------------------
 * UCX 1.13 over TCP ends the process on assertions (tcp_ep.c "!(ep->flags &
 * UCT_TCP_EP_FLAG_CTX_TYPE_TX)", tcp_cm.c "conn_state == ...ACCEPTING") when
 * a peer dies while the two workers' TCP connections are still being wired
 * up: e.g. this worker makes an endpoint to a peer that had already
 * connected to it and has died since (the new endpoint takes over the socket
 * the peer opened, its connection request fails, the reconnection is refused
 * at once on one host, and UCX marks the endpoint for destruction before it
 * hands it out). A receiver makes its endpoint after the barrier, its sender
 * before it, so without an order a sender could finish its set-up and die
 * while its receiver was still making its endpoint. Hence:
 *  1. each receive end, once attached, flushes its endpoints (their wire-up
 *     is then complete: the sender has taken in its connection requests)
 *     and tells its sender so (UCX_CTRL_READY);
 *  2. a rank's last receive end of a bootstrap to attach then waits, for
 *     each send end of that bootstrap, for its receiver's ready and flushes
 *     the send end's endpoint (the receiver has taken in its requests; not
 *     the bulk endpoint, whose flush UCX logs as an error when the receiver,
 *     done with its set-up, has left).
 * Step 1 waits for no rank's step 2, so no rank waits for itself. When
 * set-up returns, no peer will make an endpoint to this rank and each peer
 * has taken in every connection request this rank sent it. A peer that dies
 * during the waits is a set-up error (its pid on this host, a failed
 * endpoint, WEFT_TIMEOUT). A rank without a UCX receive end (its receive
 * ends use shared memory, or point-to-point sends only) skips step 2. */

static struct ucx_conn *setup_ends; /* ends whose set-up is not done yet */

static void setup_track(struct ucx_conn *uc, const void *key) {
  ucx_enter();
  uc->setup_key = key;
  uc->setup_next = setup_ends;
  setup_ends = uc;
  ucx_leave();
}

static void setup_untrack(struct ucx_conn *uc) {
  ucx_enter();
  for (struct ucx_conn **link = &setup_ends; *link != NULL; link = &(*link)->setup_next) {
    if (*link == uc) {
      *link = uc->setup_next;
      break;
    }
  }
  uc->setup_key = NULL;
  uc->setup_next = NULL;
  ucx_leave();
}

/* A send end of key still tracked, once no receive end of key is left to
 * attach (NULL while one is, or when none is tracked). */
static struct ucx_conn *setup_send_end(const void *key) {
  struct ucx_conn *send = NULL;
  ucx_enter();
  for (struct ucx_conn *uc = setup_ends; uc != NULL; uc = uc->setup_next) {
    if (uc->setup_key != key) continue;
    if (!uc->pc.is_send) {
      send = NULL;
      break;
    }
    send = uc;
  }
  ucx_leave();
  return send;
}

/* Waits until the peer of uc says it is ready (req NULL), or until the
 * endpoint request req completes. A peer that fails first (its endpoint, its
 * pid, WEFT_TIMEOUT) ends the wait with an error. */
static weftResult_t setup_wait_for(struct ucx_conn *uc, ucs_status_ptr_t req, const char *what,
                                   uint64_t timeout_ns) {
  struct weft_wait w;
  wait_begin(&w, timeout_ns, NULL, NULL, uc->peer_pid, uc->pc.peer_rank, what);
  for (;;) {
    if (req != NULL) {
      ucx_worker_progress_once();
      if (ucp_request_check_status(req) != UCS_INPROGRESS) return weftSuccess;
    } else if (__atomic_load_n(&uc->peer_ready, __ATOMIC_ACQUIRE)) {
      return weftSuccess;
    }
    if (__atomic_load_n(&uc->ep_status, __ATOMIC_ACQUIRE) != UCS_OK ||
        __atomic_load_n(&uc->pc.failed, __ATOMIC_ACQUIRE))
      return weft_error_set(weftRemoteError, "rank %d failed or went away", uc->pc.peer_rank);
    weftResult_t res = wait_poll(&w);
    if (res != weftInProgress) return res;
  }
}

static weftResult_t setup_wait(struct ucx_conn *uc, ucs_status_ptr_t req, const char *what) {
  return setup_wait_for(uc, req, what, wait_default_timeout_ns());
}

/* Completes the wire-up of ep (an endpoint of uc): flushes it and waits.
 * Never fails the set-up: a peer that finished its own set-up may leave at
 * once (a flush then ends in an error), and one that failed has poisoned
 * the connection, which its first use reports. */
static void setup_flush(struct ucx_conn *uc, ucp_ep_h ep) {
  ucp_request_param_t param = {.op_attr_mask = 0};
  ucx_enter();
  ucs_status_ptr_t req = ucp_ep_flush_nbx(ep, &param);
  ucx_leave();
  if (!UCS_PTR_IS_PTR(req)) return;
  if (setup_wait(uc, req, "connect to") != weftSuccess)
    WEFT_INFO(LOG_NET, "ucx connection %s rank %d: endpoint not flushed: %s",
              uc->pc.is_send ? "to" : "from", uc->pc.peer_rank, weft_error_text());
  ucx_enter();
  ucp_request_free(req); /* released by UCX once done, if it is not */
  ucx_leave();
}

/* Step 2 for key, once its last receive end has attached. */
static weftResult_t setup_finish(const void *key) {
  for (struct ucx_conn *uc; (uc = setup_send_end(key)) != NULL;) {
    weftResult_t res = setup_wait(uc, NULL, "hear set-up done from");
    if (res == weftSuccess) setup_flush(uc, uc->ep); /* not the bulk one (above) */
    setup_untrack(uc);
    if (res != weftSuccess)
      return ucx_error_peer(res, "finishing the set-up of the connection to", uc->pc.peer_rank);
  }
  return weftSuccess;
}

static weftResult_t ucx_recv_setup(struct weft_conn *conn, struct conn_blob *blob_out) {
  struct ucx_conn *uc;
  weftResult_t res;
  WEFT_TRY_GOTO(ucx_conn_alloc(conn, 0, &uc), res, close_conn);
  struct ucx_blob b = {.fifo_nbytes = (uint64_t)conn->nslots * conn->slot_nbytes};
  if (getrandom(&b.token, sizeof b.token, 0) != (ssize_t)sizeof b.token) {
    res = weft_error_errno(weftSystemError, "getrandom");
    goto close_conn;
  }
  b.token &= UCX_TOKEN_BULK - 1;
  uc->token = b.token;
  struct ucx_msg *msg = malloc(sizeof *msg);
  if (msg == NULL) {
    res = weft_error_set(weftSystemError, "out of memory");
    goto close_conn;
  }
  res = ucx_msg_fill(uc, msg);
  if (res == weftSuccess)
    res = bootstrap_send(conn->bs, conn->peer_rank, tag_ucx_receiver(uc->token), msg, sizeof *msg);
  free(msg);
  if (res != weftSuccess) goto close_conn;
  memcpy(blob_out->data, &b, sizeof b);
  setup_track(uc, conn->bs);
  ucx_note_local_peer(conn, uc);
  WEFT_INFO(LOG_NET, "ucx connection from rank %d: FIFO of %zu bytes registered",
            conn->peer_rank, uc->pc.fifo_nbytes);
  return weftSuccess;
close_conn:
  res = ucx_error_peer(res, "setting up the connection from", conn->peer_rank);
  ucx_close(conn); /* the caller forgets a connection whose set-up failed */
  return res;
}

static weftResult_t ucx_send_connect(struct weft_conn *conn, const struct conn_blob *blob) {
  struct ucx_blob b;
  memcpy(&b, blob->data, sizeof b);
  WEFT_TRY(
      transport_check_fifo(conn->peer_rank, conn->nslots, conn->slot_nbytes, b.fifo_nbytes));
  struct ucx_conn *uc;
  weftResult_t res;
  struct ucx_msg *msg = malloc(sizeof *msg);
  if (msg == NULL) return weft_error_set(weftSystemError, "out of memory");
  WEFT_TRY_GOTO(ucx_conn_alloc(conn, 1, &uc), res, close_conn);
  uc->token = b.token;
  WEFT_TRY_GOTO(bootstrap_recv(conn->bs, conn->peer_rank, tag_ucx_receiver(uc->token), msg,
                               sizeof *msg),
                res, close_conn);
  WEFT_TRY_GOTO(ucx_conn_attach(uc, msg, conn->peer_pid), res, close_conn);
  WEFT_TRY_GOTO(ucx_msg_fill(uc, msg), res, close_conn);
  WEFT_TRY_GOTO(bootstrap_send(conn->bs, conn->peer_rank, tag_ucx_sender(uc->token), msg,
                               sizeof *msg), res,
                close_conn);
  WEFT_TRY_GOTO(ucx_proxy_add(uc), res, close_conn);
  free(msg);
  setup_track(uc, conn->bs); /* until set-up order's step 2 */
  ucx_note_local_peer(conn, uc);
  WEFT_INFO(LOG_NET, "ucx connection to rank %d: endpoint created", conn->peer_rank);
  return weftSuccess;
close_conn:
  free(msg);
  res = ucx_error_peer(res, "connecting to", conn->peer_rank);
  ucx_close(conn);
  return res;
}

static weftResult_t ucx_recv_connect(struct weft_conn *conn) {
  struct ucx_conn *uc = conn->priv;
  weftResult_t res;
  struct ucx_msg *msg = malloc(sizeof *msg);
  if (msg == NULL) return weft_error_set(weftSystemError, "out of memory");
  /* the sender sent its half before the barrier (or the ack): it is queued */
  WEFT_TRY_GOTO(bootstrap_recv(conn->bs, conn->peer_rank, tag_ucx_sender(uc->token), msg,
                               sizeof *msg), res,
                close_conn);
  WEFT_TRY_GOTO(ucx_conn_attach(uc, msg, conn->peer_pid), res, close_conn);
  WEFT_TRY_GOTO(ucx_proxy_add(uc), res, close_conn);
  setup_flush(uc, uc->bulk_ep); /* step 1 */
  setup_flush(uc, uc->ep);
  ucx_conn_ready(uc);
  setup_untrack(uc);
  free(msg);
  return setup_finish(conn->bs);
close_conn:
  free(msg);
  res = ucx_error_peer(res, "connecting from", conn->peer_rank);
  ucx_close(conn);
  return res;
}

/* Waits, progressing the worker, until req completes, the deadline passes
 * or the peer's process (peer_pid, on this host; 0: elsewhere) is found gone
 * (asked every 10 ms: a transport that raises no error for a dead peer, as
 * UCX's shared-memory ones, would wait out the deadline); then frees it. */
static void ucx_request_wait(ucs_status_ptr_t req, uint64_t deadline, pid_t peer_pid) {
  if (!UCS_PTR_IS_PTR(req)) return;
  uint64_t next_look = clock_ns() + 10000000ull;
  while (ucp_request_check_status(req) == UCS_INPROGRESS) {
    const uint64_t now = clock_ns();
    if (now >= deadline) break;
    if (peer_pid > 0 && now >= next_look) {
      if (pid_gone(peer_pid, 1)) break;
      next_look = now + 10000000ull;
    }
    ucx_worker_progress_once();
  }
  ucx_enter();
  ucp_request_free(req);
  ucx_leave();
}

/* Closes the endpoint. While the peer is there, a flush first lets what this
 * end sent (poison included) reach it; the close itself is forced, which
 * ends whatever is still in flight (a peer behind a dead link), so that
 * nothing is left for the worker's destruction. A peer on this host whose
 * process is gone is not flushed to. */
static void ucx_ep_close(struct ucx_conn *uc) {
  ucp_request_param_t param = {.op_attr_mask = 0};
  if (!uc->peer_gone && uc->peer_pid > 0 && pid_gone(uc->peer_pid, 1)) uc->peer_gone = 1;
  if (!uc->peer_gone && uc->ep_status == UCS_OK) {
    ucx_enter();
    ucs_status_ptr_t req = ucp_ep_flush_nbx(uc->ep, &param);
    ucx_leave();
    ucx_request_wait(req, clock_ns() + UCX_CLOSE_TIMEOUT_NS, uc->peer_pid);
  }
  param = (ucp_request_param_t){.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                                .flags = UCP_EP_CLOSE_FLAG_FORCE};
  ucx_enter();
  ucs_status_ptr_t req = ucp_ep_close_nbx(uc->ep, &param);
  ucx_leave();
  ucx_request_wait(req, clock_ns() + UCX_CLOSE_TIMEOUT_NS, uc->peer_pid);
  uc->ep = NULL;
}

static void ucx_close(struct weft_conn *conn) {
  struct ucx_conn *uc = conn->priv;
  if (uc == NULL) return;
  /* a send end whose receiver has not said it is set up (a rank with send
   * ends only runs no step 2): the receiver may still be making its
   * endpoint to this worker, which fails once this process is gone, though
   * the messages are in its FIFO. The close waits for its word first (the
   * proxy takes it in); a failed peer, or 2 s (the receiver's endpoint
   * follows the sender's ack at once), ends the wait. */
  if (uc->pc.is_send && uc->setup_key != NULL && uc->pc.proxy != NULL && uc->ep != NULL &&
      setup_wait_for(uc, NULL, "hear set-up done from", 2000000000ull) != weftSuccess)
    WEFT_INFO(LOG_NET, "ucx connection to rank %d: closed before its receiver was set up: %s",
              uc->pc.peer_rank, weft_error_text());
  setup_untrack(uc);
  if (uc->pc.proxy != NULL) {
    /* a sender waits until UCX has taken every filled slot (the endpoint's
     * flush then delivers them); credits play no part: the rank filled only
     * slots the receiver has room for, and a receiver that never drains
     * them must not hold up the close */
    if (uc->pc.is_send) proxy_conn_drain(&uc->pc);
    ucx_proxy_remove(uc);
  }
  /* receives still posted into the FIFO (and the poison one) end now */
  ucx_enter();
  for (uint32_t i = 0; i < CONN_MAX_SLOTS; i++)
    if (!uc->pc.is_send && uc->reqs[i] != NULL) ucp_request_cancel(uc->worker, uc->reqs[i]);
  if (uc->poison_req != NULL) ucp_request_cancel(uc->worker, uc->poison_req);
  if (uc->pc.is_send && uc->credit_req != NULL) ucp_request_cancel(uc->worker, uc->credit_req);
  ucx_leave();
  if (uc->ep != NULL) ucx_ep_close(uc);
  if (uc->oversubscribed_hold) wait_oversubscribed_release();
  uc->oversubscribed_hold = 0;
  conn->priv = NULL;
  conn->ctrl = NULL;
  conn->slots = NULL;
  ucx_retire(uc, ucx_conn_free); /* freed once UCX lets go of its FIFO */
  ucx_worker_put();
}

/* --- bulk transfers ---------------------------------------------------------
 * Whole buffers straight between the ranks' memory, posted and tested by the
 * rank's own thread (the proxy keeps progressing the worker too). The tag is
 * the connection's token with UCX_TOKEN_BULK set and the caller's id.
 *
 * A message above the eager size goes by rendezvous: the send only announces
 * it, and the receiver's process reads the sender's buffer when it matches a
 * receive (process_vm_readv on one host), whenever that is. UCX 1.13 cannot
 * cancel a send, and a read that fails (a buffer unmapped, a process gone)
 * ends the reader's process: the bulk endpoint has no error handling, and
 * with it the transfers would crawl (ucx_bulk_ep). So such a send stays
 * readable until the worker goes, whatever became of the call that posted
 * it: the caller sends it from memory of its own (peer_reads_above), and no
 * receive is posted for a rendezvous nobody asked for (the worker's drain
 * before destroy leaves them). */

static size_t ucx_bulk_peer_reads_above(const struct weft_conn *conn) {
  const struct ucx_conn *uc = conn->priv;
  return uc->eager_nbytes;
}

static weftResult_t ucx_bulk_post(struct weft_conn *conn, void *buf, size_t nbytes, uint32_t id,
                                  struct weft_bulk_req *req) {
  struct ucx_conn *uc = conn->priv;
  const uint64_t tag = ucx_tag(uc->token | UCX_TOKEN_BULK, UCX_TAG_DATA, id);
  ucp_request_param_t param = {.op_attr_mask = UCP_OP_ATTR_FLAG_NO_IMM_CMPL};
  ucs_status_ptr_t r;
  ucx_enter();
  /* a receive goes in even on a failed connection: what the peer sent before
   * it closed or failed may be here already (as slots that arrived stay
   * readable after a poison) */
  if (uc->pc.is_send && (uc->pc.failed || uc->ep == NULL || uc->bulk_ep == NULL)) {
    ucx_leave();
    return weft_error_set(weftRemoteError, "ucx transport, to rank %d: the connection is down",
                          uc->pc.peer_rank);
  }
  if (uc->pc.is_send) r = ucp_tag_send_nbx(uc->bulk_ep, buf, nbytes, tag, &param);
  else r = ucp_tag_recv_nbx(uc->worker, buf, nbytes, tag, UINT64_MAX, &param);
  ucx_leave();
  if (UCS_PTR_IS_ERR(r))
    return ucx_error_peer(ucx_error(UCS_PTR_STATUS(r), "posting a bulk %s",
                                    uc->pc.is_send ? "send" : "receive"),
                          uc->pc.is_send ? "sending to" : "receiving from", uc->pc.peer_rank);
  req->handle = r;
  req->nbytes = nbytes;
  return weftSuccess;
}

static weftResult_t ucx_bulk_test(struct weft_conn *conn, struct weft_bulk_req *req) {
  struct ucx_conn *uc = conn->priv;
  ucs_status_t st = ucp_request_check_status(req->handle);
  if (st == UCS_INPROGRESS) return weftInProgress;
  size_t length = req->nbytes;
  if (!uc->pc.is_send) {
    ucp_tag_recv_info_t info;
    st = ucp_tag_recv_request_test(req->handle, &info);
    if (st == UCS_OK) length = info.length;
  }
  ucx_enter();
  ucp_request_free(req->handle);
  ucx_leave();
  req->handle = NULL;
  const char *what = uc->pc.is_send ? "sending to" : "receiving from";
  if (st != UCS_OK)
    return ucx_error_peer(ucx_error(st, "bulk %s", uc->pc.is_send ? "send" : "receive"), what,
                          uc->pc.peer_rank);
  if (length != req->nbytes)
    return weft_error_set(weftRemoteError,
                          "ucx transport, %s rank %d: a bulk message of %zu bytes where %zu "
                          "were due",
                          what, uc->pc.peer_rank, length, req->nbytes);
  return weftSuccess;
}

/* Between begin and end the rank's thread makes the proxy's passes: the
 * worker and every connection of this process (other communicators' slots
 * included, so that they never wait for a bulk call to end). */
static void ucx_bulk_begin(struct weft_conn *conn) {
  (void)conn;
  ucx_drive_begin();
}

static void ucx_bulk_progress(struct weft_conn *conn) {
  (void)conn;
  ucx_drive_pass();
}

static void ucx_bulk_end(struct weft_conn *conn) {
  (void)conn;
  ucx_drive_end();
}

static void ucx_bulk_cancel(struct weft_conn *conn, struct weft_bulk_req *req) {
  struct ucx_conn *uc = conn->priv;
  if (!uc->pc.is_send) {
    ucx_enter();
    ucp_request_cancel(uc->worker, req->handle);
    ucx_leave();
  }
  ucx_conn_kill(uc, "a bulk transfer was given up");
}

const struct weft_transport ucx_transport = {
    .name = "ucx",
    .caps = TRANSPORT_CAP_PROGRESS_ALL,
    .disable_env = "WEFT_UCX_DISABLE",
    .disabled = ucx_disabled,
    .can_connect = ucx_can_connect,
    .recv_setup = ucx_recv_setup,
    .send_connect = ucx_send_connect,
    .recv_connect = ucx_recv_connect,
    .close = ucx_close,
    .kick = proxy_conn_kick,
    .bulk = {.peer_reads_above = ucx_bulk_peer_reads_above,
             .post = ucx_bulk_post,
             .test = ucx_bulk_test,
             .progress = ucx_bulk_progress,
             .cancel = ucx_bulk_cancel,
             .begin = ucx_bulk_begin,
             .end = ucx_bulk_end},
};
