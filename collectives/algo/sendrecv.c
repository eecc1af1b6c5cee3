/* Point-to-point: connections to any peer, made on first use, and an executor
 * that advances every send and receive of a group together, a slot at a time,
 * so that no order of sends and receives can deadlock. Messages keep their
 * order per peer and direction; the last slot of a message carries a flag, so
 * a receiver whose count differs from the sender's gets an error, not junk. */
#include <stdlib.h>
#include <string.h>

#include "../../transport/base/status.h"
#include "../../transport/base/wait.h"
#include "../reduce/reduce_host.h"
#include "copy_stream.h"
#include "p2p_slot.h"
#include "sendrecv.h"
#include "sendrecv_cma.h"

/* Two sets of connections to each peer (comm.h): the peer collectives' and
 * the sends' and receives'. Both FIFOs of a direction are made by one
 * handshake, so every connection is made once, whichever kind of call needs
 * it first, and a rank that breaks the comm poisons the FIFOs its peer's next
 * call of either kind uses. */
enum conn_set { SET_PEER = 0, SET_P2P = 1 };
enum { TAG_BLOB = 0x70320001u, TAG_ACK = 0x70320002u };

static struct weft_conn *set_send(struct weftComm *comm, enum conn_set set) {
  return set == SET_P2P ? comm->p2p_send_conns : comm->send_conns;
}
static struct weft_conn *set_recv(struct weftComm *comm, enum conn_set set) {
  return set == SET_P2P ? comm->p2p_recv_conns : comm->recv_conns;
}

weftResult_t sendrecv_conns_alloc(struct weftComm *comm) {
  const size_t n = (size_t)comm->nranks;
  comm->send_conns = calloc(n, sizeof *comm->send_conns);
  comm->recv_conns = calloc(n, sizeof *comm->recv_conns);
  comm->p2p_send_conns = calloc(n, sizeof *comm->p2p_send_conns);
  comm->p2p_recv_conns = calloc(n, sizeof *comm->p2p_recv_conns);
  if (comm->send_conns == NULL || comm->recv_conns == NULL || comm->p2p_send_conns == NULL ||
      comm->p2p_recv_conns == NULL)
    return weft_error_set(weftSystemError, "out of memory");
  return weftSuccess;
}

void sendrecv_conns_close(struct weftComm *comm) {
  struct weft_conn **arrays[] = {&comm->send_conns, &comm->recv_conns, &comm->p2p_send_conns,
                                 &comm->p2p_recv_conns};
  for (size_t a = 0; a < sizeof arrays / sizeof arrays[0]; a++) {
    for (int r = 0; *arrays[a] != NULL && r < comm->nranks; r++) {
      struct weft_conn *c = &(*arrays[a])[r];
      if (c->transport != NULL) c->transport->close(c);
    }
    free(*arrays[a]);
    *arrays[a] = NULL;
  }
}

static void conn_prepare(struct weftComm *comm, struct weft_conn *c, int peer) {
  memset(c, 0, sizeof *c);
  c->nslots = comm->nslots;
  c->slot_nbytes = comm->slot_nbytes;
  c->peer_rank = peer;
  c->bs = comm->bs;
  const struct peer_info *me = &comm->peers[comm->rank], *p = &comm->peers[peer];
  c->peer_pid = p->host_hash == me->host_hash ? p->pid : 0;
}

static int plan_is_send(const struct weft_plan *op) { return op->coll == COLL_SEND; }

/* The receiver's half of a connection from peer p: sets up the FIFO of
 * each set and sends their blobs in one message, which the sender attaches
 * with (send_conn_attach) and then acks. */
static weftResult_t recv_conn_offer(struct weftComm *comm, int p) {
  weftResult_t res = weftSuccess;
  struct conn_blob blobs[2];
  memset(blobs, 0, sizeof blobs);
  const struct transport_need need = {.mem = TRANSPORT_MEM_HOST};
  const int t = transport_select(&comm->peers[p], &comm->peers[comm->rank], &need, NULL, 0);
  for (int k = 0; k < 2; k++) {
    struct weft_conn *c = &set_recv(comm, (enum conn_set)k)[p];
    conn_prepare(comm, c, p);
    blobs[k].transport = t >= 0 && res != weftSuccess ? -2 : t;
    if (blobs[k].transport < 0) continue;
    res = weft_transports[t]->recv_setup(c, &blobs[k]);
    if (res == weftSuccess) c->transport = weft_transports[t];
    else blobs[k].transport = -2;
  }
  weftResult_t sent = bootstrap_send(comm->bs, p, TAG_BLOB, blobs, sizeof blobs);
  if (t == -1)
    res = weft_error_set(weftSystemError, "no transport connects rank %d to rank %d", p,
                         comm->rank);
  if (res == weftSuccess) res = sent;
  return res;
}

/* The sender's half: attaches to the receiver's FIFOs from their blobs, acks. */
static weftResult_t send_conn_attach(struct weftComm *comm, int p, const struct conn_blob *blobs) {
  for (int k = 0; k < 2; k++) {
    struct weft_conn *c = &set_send(comm, (enum conn_set)k)[p];
    const struct conn_blob *blob = &blobs[k];
    if (blob->transport < 0 || weft_transports[blob->transport] == NULL)
      return weft_error_set(weftRemoteError,
                            "rank %d could not set up its connection from rank %d", p, comm->rank);
    conn_prepare(comm, c, p);
    WEFT_TRY(weft_transports[blob->transport]->send_connect(c, blob));
    c->transport = weft_transports[blob->transport];
  }
  uint32_t ack = 1;
  return bootstrap_send(comm->bs, p, TAG_ACK, &ack, sizeof ack);
}

/* The receiver's end, once the sender acked. */
static weftResult_t recv_conn_finish(struct weftComm *comm, int p) {
  for (int k = 0; k < 2; k++) {
    struct weft_conn *c = &set_recv(comm, (enum conn_set)k)[p];
    WEFT_TRY(c->transport->recv_connect(c));
  }
  return weftSuccess;
}

/* Connects to the peers marked in want_send / want_recv ([nranks] flags)
 * that are not connected yet. Per pair: the receiver sets up its FIFOs and
 * sends the blobs; the sender attaches and acks; the receiver finishes.
 * Messages never wait for the peer, so any order works. */
static weftResult_t sendrecv_connect_wanted(struct weftComm *comm, char *want_send,
                                            char *want_recv) {
  const int n = comm->nranks;
  for (int p = 0; p < n; p++) {
    want_send[p] &= p != comm->rank && comm->p2p_send_conns[p].transport == NULL;
    want_recv[p] &= p != comm->rank && comm->p2p_recv_conns[p].transport == NULL;
  }
  for (int p = 0; p < n; p++)
    if (want_recv[p]) WEFT_TRY(recv_conn_offer(comm, p));
  for (int p = 0; p < n; p++) {
    if (!want_send[p]) continue;
    struct conn_blob blobs[2];
    WEFT_TRY(bootstrap_recv(comm->bs, p, TAG_BLOB, blobs, sizeof blobs));
    WEFT_TRY(send_conn_attach(comm, p, blobs));
  }
  for (int p = 0; p < n; p++) {
    if (!want_recv[p]) continue;
    uint32_t ack;
    WEFT_TRY(bootstrap_recv(comm->bs, p, TAG_ACK, &ack, sizeof ack));
    WEFT_TRY(recv_conn_finish(comm, p));
  }
  return weftSuccess;
}

weftResult_t sendrecv_connect_peers(struct weftComm *comm, const int *send_peers, int nsend,
                                    const int *recv_peers, int nrecv) {
  char *want_send = calloc((size_t)comm->nranks, 1), *want_recv = calloc((size_t)comm->nranks, 1);
  weftResult_t res;
  if (want_send == NULL || want_recv == NULL) {
    res = weft_error_set(weftSystemError, "out of memory");
  } else {
    for (int i = 0; i < nsend; i++) want_send[send_peers[i]] = 1;
    for (int i = 0; i < nrecv; i++) want_recv[recv_peers[i]] = 1;
    res = sendrecv_connect_wanted(comm, want_send, want_recv);
  }
  free(want_send);
  free(want_recv);
  return res;
}

/* Connects what the sends and receives of ops need. */
static weftResult_t sendrecv_connect(struct weftComm *comm, const struct weft_plan *const *ops,
                                     size_t nops) {
  /* the common case, every connection made by an earlier call: nothing to
   * allocate */
  size_t ready = 0;
  for (; ready < nops; ready++) {
    if (plan_is_mark(ops[ready])) continue;
    const int p = ops[ready]->root;
    const struct weft_conn *c =
        plan_is_send(ops[ready]) ? &comm->p2p_send_conns[p] : &comm->p2p_recv_conns[p];
    if (p != comm->rank && c->transport == NULL) break;
  }
  if (ready == nops) return weftSuccess;
  char *want_send = calloc((size_t)comm->nranks, 1), *want_recv = calloc((size_t)comm->nranks, 1);
  weftResult_t res;
  if (want_send == NULL || want_recv == NULL) {
    res = weft_error_set(weftSystemError, "out of memory");
  } else {
    for (size_t i = 0; i < nops; i++)
      if (!plan_is_mark(ops[i])) (plan_is_send(ops[i]) ? want_send : want_recv)[ops[i]->root] = 1;
    res = sendrecv_connect_wanted(comm, want_send, want_recv);
  }
  free(want_send);
  free(want_recv);
  return res;
}

struct sendrecv_state {
  const struct weft_plan *op; /* valid until finished (an executor's callers free it then) */
  int peer, send;             /* op's, kept for the ops added after it finishes */
  size_t nbytes;
  size_t done_nbytes;
  int finished;
  int after; /* the op before it on the same peer and direction, or -1 */
  struct weft_conn *conn; /* to or from peer, in the executor's set */
  int offer; /* a send the receiver copies (sendrecv_cma.c): 1 to offer, 2 offered */
  int withdrawable;        /* the offer is taken back at withdraw_at_ns if not taken */
  uint64_t withdraw_ns;    /* ... withdraw_ns after it was made */
  uint64_t withdraw_at_ns; /* clock_ns */
  int stream; /* a receive whose single copies bypass the caches */
  unsigned polls; /* a receive's looks at its slot */
  uint64_t offer_step;
  weftResult_t err; /* why progress returned -1 */
};

/* Offers st's message, then waits for the answer: how many slots moved, or
 * -1. A refused offer, and one taken back before the receiver came (its
 * start copied into the offer's slot), leave the message to the FIFO
 * (st->offer 0). */
static int send_offer_progress(struct weftComm *comm, struct weft_conn *c,
                               struct sendrecv_state *st) {
  if (st->offer == 1) {
    const int offered = sendrecv_cma_offer(c, st->op->sendbuf, st->nbytes, &st->offer_step);
    /* The last offer's slot is not drained yet. A send that may complete
     * alone goes through the FIFO; one larger than the FIFO waits, as it
     * waits for its receiver anyway, who drains that slot first. */
    if (offered < 0 && st->withdrawable) st->offer = 0;
    if (offered <= 0) return 0;
    st->offer = 2;
    if (st->withdrawable) st->withdraw_at_ns = clock_ns() + st->withdraw_ns;
    return 1;
  }
  int copied = 0;
  weftResult_t res = sendrecv_cma_answer(comm, c, st->offer_step, st->nbytes, &copied);
  if (res == weftInProgress) {
    if (!st->withdrawable || clock_ns() < st->withdraw_at_ns) return 0;
    st->withdrawable = 0; /* once: taken back, or the receiver has it */
    int withdrawn = 0;
    const size_t n = sendrecv_cma_withdraw(c, st->offer_step, st->op->sendbuf, st->nbytes,
                                           &withdrawn);
    if (!withdrawn) return 0;
    st->offer = 0;
    st->done_nbytes = n;
    st->finished = n == st->nbytes;
    return 1;
  }
  if (res != weftSuccess) {
    st->err = res;
    return -1;
  }
  st->offer = 0;
  st->finished = copied;
  if (copied) st->done_nbytes = st->nbytes;
  return 1;
}

/* Moves as many slots as the FIFO allows; returns how many moved, or -1. A
 * message of P2P_HDR_MAX_NBYTES at most takes one slot with a header; a larger
 * one, or the rest of one whose offer was taken back, whole slots of raw data. */
static int send_progress(struct weftComm *comm, struct weft_conn *c, struct sendrecv_state *st) {
  if (st->offer) {
    const int moved = send_offer_progress(comm, c, st);
    if (moved != 0 || st->offer) return moved;
  }
  const char *src = st->op->sendbuf;
  if (st->done_nbytes == 0 && p2p_slot_hdr_fits(c, st->nbytes)) {
    if (st->finished || !conn_send_ready(c)) return 0;
    memcpy(conn_slot(c, c->step) + P2P_SLOT_HDR_NBYTES, src, st->nbytes);
    st->done_nbytes = st->nbytes;
    st->finished = 1;
    p2p_slot_publish(c, (uint32_t)(P2P_SLOT_HDR_NBYTES + st->nbytes) | SLOT_LAST);
    return 1;
  }
  int moved = 0;
  while (!st->finished && conn_send_ready(c)) {
    size_t n = st->nbytes - st->done_nbytes;
    if (n > c->slot_nbytes) n = c->slot_nbytes;
    memcpy(conn_slot(c, c->step), src + st->done_nbytes, n);
    st->done_nbytes += n;
    st->finished = st->done_nbytes == st->nbytes;
    conn_send_post(c, (uint32_t)n | (st->finished ? SLOT_LAST : 0));
    moved++;
  }
  return moved;
}

/* A receive's progress: a message of P2P_HDR_MAX_NBYTES at most is taken
 * once its slot's header says it has arrived (one slow look in 256 also
 * asks tail: p2p_slot_arrived), a larger one slot by slot after tail. */
static int recv_progress(struct weftComm *comm, struct weft_conn *c, struct sendrecv_state *st) {
  int moved = 0;
  uint32_t used;
  while (!st->finished) {
    const int hdr = st->done_nbytes == 0 && p2p_slot_hdr_fits(c, st->nbytes);
    const int got = p2p_slot_arrived(c, hdr, (++st->polls & 255) == 0, &used);
    if (got == 0) break;
    if (got < 0) {
      st->err = weft_error_set(weftInvalidUsage,
                               "recv from rank %d: its message %llu on this connection is not the "
                               "send of %zu bytes expected (another count or datatype, or not a "
                               "send: do the ranks call the same operations in the same order?)",
                               c->peer_rank, (unsigned long long)c->step, st->nbytes);
      return -1;
    }
    if (used & SENDRECV_CMA_SLOT_OFFER) { /* the sender offers its buffer */
      size_t taken = 0;
      uint32_t withdrawn_used = 0;
      st->err = sendrecv_cma_take(comm, c, st->op->recvbuf, st->nbytes, st->done_nbytes, st->stream,
                                  &taken, &withdrawn_used);
      if (st->err == weftInProgress) break;
      if (st->err != weftSuccess) return -1;
      if (withdrawn_used == 0) {
        st->done_nbytes += taken;
        st->finished = st->done_nbytes == st->nbytes;
        moved++;
        continue;
      }
      used = withdrawn_used; /* taken back: the slot is the FIFO's */
    }
    const size_t at = used & P2P_USED_HDR ? P2P_SLOT_HDR_NBYTES : 0;
    const size_t count = used & PROXY_USED_NBYTES_MASK;
    const size_t n = count - at;
    const int last = (used & SLOT_LAST) != 0;
    if (count < at || count > c->slot_nbytes || st->done_nbytes + n > st->nbytes ||
        (last && st->done_nbytes + n != st->nbytes)) {
      st->err = weft_error_set(weftInvalidUsage,
                               "recv from rank %d: the message does not match the %zu bytes "
                               "expected (sender and receiver must use the same count and "
                               "datatype)",
                               c->peer_rank, st->nbytes);
      return -1;
    }
    if (!last && st->done_nbytes + n == st->nbytes) {
      st->err = weft_error_set(weftInvalidUsage,
                               "recv from rank %d: the message is longer than the %zu bytes "
                               "expected", c->peer_rank, st->nbytes);
      return -1;
    }
    memcpy((char *)st->op->recvbuf + st->done_nbytes, conn_slot(c, c->step) + at, n);
    st->done_nbytes += n;
    st->finished = last;
    p2p_slot_taken(c, used);
    moved++;
  }
  return moved;
}

/* Sends and receives to this rank itself pair up in order, as copies. */
static weftResult_t sendrecv_self(struct weftComm *comm, struct sendrecv_state *st, size_t nops) {
  size_t r = 0;
  /* a mark (plan_is_mark) is neither: it is finished from the start */
  for (size_t s = 0; s < nops; s++) {
    if (st[s].op->root != comm->rank || !plan_is_send(st[s].op)) continue;
    while (r < nops && (st[r].op->root != comm->rank || plan_is_send(st[r].op) ||
                        plan_is_mark(st[r].op)))
      r++;
    if (r == nops)
      return weft_error_set(weftInvalidUsage, "a send to self has no matching recv in the group");
    if (st[r].nbytes != st[s].nbytes)
      return weft_error_set(weftInvalidUsage, "send to self of %zu bytes, recv of %zu bytes",
                            st[s].nbytes, st[r].nbytes);
    const char *from = st[s].op->sendbuf;
    char *to = st[r].op->recvbuf;
    size_t nbytes = st[s].nbytes;
    if (nbytes > 0 && st[r].stream && (from + nbytes <= to || to + nbytes <= from))
      copy_host_stream(to, from, nbytes);
    else if (nbytes > 0)
      memmove(to, from, nbytes);
    st[s].finished = st[r].finished = 1;
    r++;
  }
  for (; r < nops; r++)
    if (st[r].op->root == comm->rank && !plan_is_send(st[r].op) && !plan_is_mark(st[r].op) &&
        !st[r].finished)
      return weft_error_set(weftInvalidUsage, "a recv from self has no matching send in the group");
  return weftSuccess;
}

/* A wait that ended with res: a receiver that refused an offer (another
 * size) also poisons its connections, so the answer is what to report. */
static weftResult_t offers_settle(struct weftComm *comm, struct sendrecv_state *st, size_t nops,
                                  weftResult_t res) {
  for (size_t i = 0; i < nops; i++) {
    if (st[i].offer != 2) continue;
    if (send_offer_progress(comm, st[i].conn, &st[i]) < 0) return st[i].err;
  }
  return res;
}

static void offer_set(struct weftComm *comm, struct sendrecv_state *st, int paired) {
  const int wanted = sendrecv_cma_wanted(comm, st->conn, st->nbytes, paired);
  st->offer = wanted != 0;
  st->withdrawable = wanted == SENDRECV_CMA_OFFER_WITHDRAWABLE;
  if (st->withdrawable) st->withdraw_ns = sendrecv_cma_withdraw_ns(st->nbytes, paired);
}

/* Marks the sends that the receiver copies from the sender's buffer
 * (sendrecv_cma_wanted): a send is paired when the group also receives from its
 * peer. */
static weftResult_t sendrecv_offers_mark(struct weftComm *comm, struct sendrecv_state *st,
                                         size_t nops) {
  if (nops <= 16) { /* a few: the pairing found by looking, with no table */
    for (size_t i = 0; i < nops; i++) {
      const int peer = st[i].op->root;
      if (!plan_is_send(st[i].op) || st[i].finished) continue;
      int receives = 0;
      for (size_t j = 0; j < nops && !receives; j++)
        receives = st[j].op->coll == COLL_RECV && st[j].op->root == peer;
      offer_set(comm, &st[i], receives);
    }
    return weftSuccess;
  }
  char *recv_from = calloc((size_t)comm->nranks, 1);
  if (recv_from == NULL) return weft_error_set(weftSystemError, "out of memory");
  for (size_t i = 0; i < nops; i++)
    if (st[i].op->coll == COLL_RECV) recv_from[st[i].op->root] = 1;
  for (size_t i = 0; i < nops; i++) {
    if (plan_is_send(st[i].op) && !st[i].finished) offer_set(comm, &st[i], recv_from[st[i].op->root]);
  }
  free(recv_from);
  return weftSuccess;
}

/* The executor's state: every send and receive added and not yet freed. */
/* A connection an executor is making without blocking: the sender waits
 * for the receiver's blob, the receiver (its FIFO set up, its blob sent)
 * for the sender's ack. */
enum { CONN_READY = 0, CONN_WANT_BLOB = 1, CONN_WANT_ACK = 2 };

#define EXEC_INLINE_OPS 8
struct sendrecv_exec {
  struct weftComm *comm;
  enum conn_set set; /* whose connections its ops use */
  /* with lazy connects, each peer's connection state per direction */
  int lazy;
  char *send_state, *recv_state;
  int connecting; /* connections not ready */
  struct sendrecv_state *st; /* inline_st, or the heap's past EXEC_INLINE_OPS */
  size_t nops, cap;
  size_t left;      /* ops not finished */
  size_t low;       /* every op before it is finished: polls start there */
  struct weft_wait w;
  int waiting;      /* w is counting: nothing moved since it began */
  struct sendrecv_state inline_st[EXEC_INLINE_OPS];
};

/* An executor in place (sendrecv_run's, on its stack: a call's few ops
 * allocate nothing). */
static void exec_init(struct sendrecv_exec *x, struct weftComm *comm, int lazy,
                      enum conn_set set) {
  x->comm = comm;
  x->set = set;
  x->lazy = lazy;
  x->send_state = x->recv_state = NULL;
  x->connecting = 0;
  x->st = x->inline_st;
  x->nops = x->left = x->low = 0;
  x->cap = EXEC_INLINE_OPS;
  x->waiting = 0;
}

static void exec_fini(struct sendrecv_exec *x) {
  free(x->send_state);
  free(x->recv_state);
  if (x->st != x->inline_st) free(x->st);
}

weftResult_t sendrecv_exec_create(struct weftComm *comm, int lazy, struct sendrecv_exec **out) {
  struct sendrecv_exec *x = malloc(sizeof *x);
  if (x == NULL) return weft_error_set(weftSystemError, "out of memory");
  exec_init(x, comm, lazy, SET_P2P);
  if (lazy) {
    x->send_state = calloc((size_t)comm->nranks, 1);
    x->recv_state = calloc((size_t)comm->nranks, 1);
    if (x->send_state == NULL || x->recv_state == NULL) {
      sendrecv_exec_free(x);
      return weft_error_set(weftSystemError, "out of memory");
    }
  }
  *out = x;
  return weftSuccess;
}

void sendrecv_exec_free(struct sendrecv_exec *x) {
  if (x == NULL) return;
  exec_fini(x);
  free(x);
}

/* Starts the connections ops need, without waiting for the peers. */
static weftResult_t exec_connect_start(struct sendrecv_exec *x, const struct weft_plan *const *ops,
                                       size_t nops) {
  struct weftComm *comm = x->comm;
  for (size_t i = 0; i < nops; i++) {
    const int p = ops[i]->root;
    if (p == comm->rank || plan_is_mark(ops[i])) continue;
    if (plan_is_send(ops[i])) {
      if (comm->p2p_send_conns[p].transport != NULL || x->send_state[p] != CONN_READY) continue;
      x->send_state[p] = CONN_WANT_BLOB;
      x->connecting++;
    } else {
      if (comm->p2p_recv_conns[p].transport != NULL || x->recv_state[p] != CONN_READY) continue;
      WEFT_TRY(recv_conn_offer(comm, p));
      x->recv_state[p] = CONN_WANT_ACK;
      x->connecting++;
    }
  }
  return weftSuccess;
}

/* Advances the connections being made; *moved counts those now ready. */
static weftResult_t exec_connect_poll(struct sendrecv_exec *x, int *moved) {
  struct weftComm *comm = x->comm;
  for (int p = 0; p < comm->nranks && x->connecting > 0; p++) {
    if (x->send_state[p] == CONN_WANT_BLOB) {
      struct conn_blob blobs[2];
      weftResult_t res = bootstrap_try_recv(comm->bs, p, TAG_BLOB, blobs, sizeof blobs);
      if (res == weftSuccess) res = send_conn_attach(comm, p, blobs);
      if (res == weftInProgress) continue;
      if (res != weftSuccess) return res;
      x->send_state[p] = CONN_READY;
      x->connecting--;
      (*moved)++;
    }
    if (x->recv_state[p] == CONN_WANT_ACK) {
      uint32_t ack;
      weftResult_t res = bootstrap_try_recv(comm->bs, p, TAG_ACK, &ack, sizeof ack);
      if (res == weftSuccess) res = recv_conn_finish(comm, p);
      if (res == weftInProgress) continue;
      if (res != weftSuccess) return res;
      x->recv_state[p] = CONN_READY;
      x->connecting--;
      (*moved)++;
    }
  }
  return weftSuccess;
}

/* Whether op's connection is ready to move data. */
static int exec_conn_ready(const struct sendrecv_exec *x, const struct weft_plan *op) {
  if (!x->lazy || op->root == x->comm->rank) return 1;
  return (plan_is_send(op) ? x->send_state : x->recv_state)[op->root] == CONN_READY;
}

size_t sendrecv_exec_count(const struct sendrecv_exec *x) { return x->nops; }

int sendrecv_exec_finished(const struct sendrecv_exec *x, size_t i) { return x->st[i].finished; }

weftResult_t sendrecv_exec_add(struct sendrecv_exec *x, const struct weft_plan *const *ops,
                               size_t nops) {
  struct weftComm *comm = x->comm;
  WEFT_TRY(x->lazy ? exec_connect_start(x, ops, nops) : sendrecv_connect(comm, ops, nops));
  if (x->nops + nops > x->cap) {
    size_t cap = x->cap;
    while (cap < x->nops + nops) cap *= 2;
    struct sendrecv_state *st =
        realloc(x->st == x->inline_st ? NULL : x->st, cap * sizeof *st);
    if (st == NULL) return weft_error_set(weftSystemError, "out of memory");
    if (x->st == x->inline_st) memcpy(st, x->inline_st, x->nops * sizeof *st);
    x->st = st;
    x->cap = cap;
  }
  struct sendrecv_state *st = x->st + x->nops;
  const size_t first = x->nops;
  for (size_t i = 0; i < nops; i++) {
    const int mark = plan_is_mark(ops[i]); /* runs nothing: finished from the start */
    st[i] = (struct sendrecv_state){.op = ops[i],
                               .peer = mark ? -1 : ops[i]->root,
                               .send = plan_is_send(ops[i]),
                               .nbytes = mark ? 0 : ops[i]->count * weftTypeSize(ops[i]->datatype),
                               .finished = mark,
                               .conn = mark ? NULL
                                       : plan_is_send(ops[i]) ? &set_send(comm, x->set)[ops[i]->root]
                                                              : &set_recv(comm, x->set)[ops[i]->root],
                               .after = -1,
                               .err = weftInvalidUsage};
    if (mark) continue;
    /* after the op before it on the same peer and direction, in this call
     * or an earlier one */
    for (size_t j = first + i; j-- > 0;)
      if (x->st[j].peer == st[i].peer && x->st[j].send == st[i].send) {
        st[i].after = (int)j;
        break;
      }
  }
  /* a group that receives more than the caches hold (all ranks together,
   * as the single-copy collectives judge it) writes past them: the data is
   * not read back from cache anyway, and the stores skip reading each line */
  size_t recv_nbytes = 0;
  for (size_t i = 0; i < nops; i++)
    if (ops[i]->coll == COLL_RECV) recv_nbytes += st[i].nbytes;
  const int stream = recv_nbytes >= copy_stream_min_nbytes(comm->nranks);
  for (size_t i = 0; i < nops; i++) st[i].stream = stream && !plan_is_send(ops[i]);
  x->nops += nops;
  weftResult_t res = sendrecv_self(comm, st, nops);
  /* an offer asks the connection, which a lazy executor may still be making */
  if (res == weftSuccess && !x->lazy) res = sendrecv_offers_mark(comm, st, nops);
  for (size_t i = 0; i < nops; i++) x->left += !st[i].finished;
  return res;
}

weftResult_t sendrecv_exec_poll(struct sendrecv_exec *x) {
  struct weftComm *comm = x->comm;
  struct sendrecv_state *st = x->st;
  const size_t nops = x->nops;
  weftResult_t res = weftSuccess;
  int moved = 0;
  struct sendrecv_state *blocked = NULL;
  if (x->connecting > 0) {
    res = exec_connect_poll(x, &moved);
    if (res != weftSuccess) {
      comm_async_error_set(comm, res);
      comm_poison_conns(comm);
      return res;
    }
  }
  /* a long-lived executor (a host stream's run of thousands of sends) would
   * otherwise walk its finished ops on every poll */
  while (x->low < nops && st[x->low].finished) x->low++;
  for (size_t i = x->low; i < nops && x->left > 0; i++) {
    struct sendrecv_state *s = &st[i];
    if (s->finished || (s->after >= 0 && !st[s->after].finished)) continue;
    if (!exec_conn_ready(x, s->op)) {
      if (blocked == NULL) blocked = s;
      continue;
    }
    int send = plan_is_send(s->op);
    struct weft_conn *c = s->conn;
    int m = send ? send_progress(comm, c, s) : recv_progress(comm, c, s);
    if (m < 0) {
      res = s->err;
      /* a peer that failed may have done so on one of these offers (another
       * size): that answer, already in its slot, is the cause */
      if (res == weftRemoteError) res = offers_settle(comm, st, nops, res);
      /* the streams of these ops' peers are out of step: they learn it now */
      comm_async_error_set(comm, res);
      comm_poison_conns(comm);
      return res;
    }
    moved += m;
    x->left -= s->finished;
    if (!s->finished && blocked == NULL) blocked = s;
  }
  if (x->left == 0) {
    x->waiting = 0;
    return weftSuccess;
  }
  if (moved > 0) {
    x->waiting = 0;
    return weftInProgress;
  }
  if (!x->waiting) {
    int peer = blocked->op->root, send = plan_is_send(blocked->op);
    struct weft_conn *c = blocked->conn;
    if (exec_conn_ready(x, blocked->op)) {
      wait_begin(&x->w, comm_timeout_ns(comm), &comm->abort_flag, &c->ctrl->poison, c->peer_pid, peer,
                 send ? "send to" : "receive from");
    } else {
      const struct peer_info *me = &comm->peers[comm->rank], *p = &comm->peers[peer];
      wait_begin(&x->w, comm_timeout_ns(comm), &comm->abort_flag, NULL,
                 p->host_hash == me->host_hash ? p->pid : 0, peer,
                 send ? "connect to" : "accept a connection from");
    }
    x->waiting = 1;
  }
  weftResult_t wr = wait_poll(&x->w);
  if (wr == weftInProgress) return weftInProgress;
  const weftResult_t settled = offers_settle(comm, st, nops, wr);
  int out = 0; /* offers that no receiver answered yet */
  for (size_t i = 0; i < nops && !out; i++) out = st[i].offer == 2 && !st[i].finished;
  if (settled != wr || out) {
    /* a receiver refused an offer (another size): the peers of the group's
     * other offers learn it now, as after any failed op, before this call
     * returns and its buffers may be reused; and an offer still out (the
     * wait ended for a revoke, which poisons after it) is void before then */
    comm_async_error_set(comm, settled);
    comm_poison_conns(comm);
  }
  return settled;
}

static weftResult_t run_on(struct weftComm *comm, const struct weft_plan *const *ops,
                           size_t nops, enum conn_set set) {
  struct sendrecv_exec x;
  exec_init(&x, comm, 0, set);
  weftResult_t res = sendrecv_exec_add(&x, ops, nops);
  while (res == weftSuccess) {
    res = sendrecv_exec_poll(&x);
    if (res == weftInProgress) res = weftSuccess;
    else break;
  }
  exec_fini(&x);
  return res;
}

weftResult_t sendrecv_run(struct weftComm *comm, const struct weft_plan *const *ops, size_t nops) {
  return run_on(comm, ops, nops, SET_P2P);
}

weftResult_t sendrecv_run_peers(struct weftComm *comm, const struct weft_plan *const *ops,
                                size_t nops) {
  return run_on(comm, ops, nops, SET_PEER);
}
