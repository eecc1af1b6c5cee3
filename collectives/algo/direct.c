/* Direct all-reduce, broadcast and reduce: one step, for small messages on a
 * few ranks. Each slot-sized piece of the all-reduce goes:
 *   send:   every rank hands its input to every other rank, one slot each;
 *   reduce: every rank takes the n - 1 slots and reduces all n vectors in rank
 *           order, ((v0 op v1) op v2) ..., the last reduction dividing for avg.
 * Every rank runs the same reductions in the same order, so every rank holds
 * the same bits, floats included. The critical path is one hop: a rank waits
 * only for its peers' inputs, never for a partial result that another rank
 * has to compute first. Where ranks outnumber cores this matters most: a
 * rank that the scheduler runs finds every input that was posted and goes
 * on, where recursive doubling's fold and unfold hand the core back and forth
 * between a rank and its extra partner in every call.
 *
 * Each piece fills a slot; the first one also carries the signature of the
 * call (struct signature_packed) after the data, as in rd.c: each rank
 * checks every partner's call as its data arrives.
 *
 * Broadcast and reduce move data one way, to or from the root, and a ring
 * chain has no way back: a rank there learns that the ranks after it agreed
 * only from a token sent around the ring after the data (ring.c), about as
 * many hops again. Here every rank hears from every other in the first
 * piece instead, in the same single step: the data's slot carries the
 * sender's signature (the root's to every rank for broadcast, each rank's to
 * the root for reduce), and a slot holding the signature alone goes where no
 * data does. So no rank returns from a call that another rank made
 * differently, and the last rank waits one hop where the chain took k - 1. */
#include <stdlib.h>
#include <string.h>

#include "../../transport/base/status.h"
#include "../../transport/base/wait.h"
#include "../core/signature.h"
#include "../core/plan.h"
#include "../exec/host/prims_peer.h"
#include "../reduce/reduce_host.h"
#include "algo.h"

/* An in-place rank above 1 keeps its own vector of a piece this small on the
 * stack while the reductions before its turn overwrite the buffer. */
#define DIRECT_KEEP_STACK_NBYTES 4096

static weftResult_t direct_connect(struct weftComm *comm) {
  int peers[DIRECT_MAX_RANKS], npeers = 0;
  for (int r = 0; r < comm->nranks; r++)
    if (r != comm->rank) peers[npeers++] = r;
  return peer_connect(comm, peers, npeers);
}

/* Hands nbytes of src, followed by sig unless NULL, to rank peer. */
static weftResult_t direct_send_one(struct weftComm *comm, int peer, const char *src,
                                    size_t nbytes, const struct signature_packed *sig) {
  struct weft_conn *conn = &comm->send_conns[peer];
  char *slot;
  WEFT_TRY(peer_send_wait(comm, conn, &slot));
  if (nbytes > 0) memcpy(slot, src, nbytes); /* a signature alone has no src */
  if (sig != NULL) peer_send_post_signed(conn, nbytes, sig);
  else peer_send_post(conn, nbytes);
  return weftSuccess;
}

/* The same to every other rank. */
static weftResult_t direct_send_all(struct weftComm *comm, const char *src, size_t nbytes,
                                    const struct signature_packed *sig) {
  /* the next rank first: each rank's first send goes to a different peer */
  for (int i = 1; i < comm->nranks; i++)
    WEFT_TRY(direct_send_one(comm, (comm->rank + i) % comm->nranks, src, nbytes, sig));
  wait_prelude_run(); /* the trace record while the slots travel (rd.c) */
  return weftSuccess;
}

/* Rank peer's signed slot of the call has come: in a signed (first) piece
 * this rank sent peer one slot before it waits for any, so every slot
 * before that one is drained (peer_send_drained). */
static inline void signed_by(struct weftComm *comm, int peer) {
  struct weft_conn *to = &comm->send_conns[peer];
  peer_send_drained(to, to->step - 1);
}

/* Rank peer's slot has been read: back to peer (a credit), and the next
 * slot to peer taken for writing while this call goes on (prims_peer.h). */
static inline void taken_from(struct weftComm *comm, int peer) {
  peer_recv_done(&comm->recv_conns[peer]);
  peer_send_warm(&comm->send_conns[peer]);
}

/* Rank r's vector of the piece: own, or the slot from r (waited for). */
static weftResult_t direct_input(struct weftComm *comm, int r, const char *own, size_t nbytes,
                                 const struct signature_packed *sig, const char **in_out) {
  if (r == comm->rank) {
    *in_out = own;
    return weftSuccess;
  }
  struct weft_conn *from = &comm->recv_conns[r];
  if (sig == NULL) return peer_recv_wait(comm, from, nbytes, in_out);
  WEFT_TRY(peer_recv_signed_wait(comm, from, nbytes + sizeof *sig, sig, 1, in_out));
  signed_by(comm, r);
  return weftSuccess;
}

/* m elements of own (this rank's input) reduced with every peer's slot
 * into out, in rank order. keep: room for own where out is own and this
 * rank's turn comes after reductions that overwrite out. */
static weftResult_t direct_reduce_all(struct weftComm *comm, weft_reduce_fn reduce, int divisor,
                                      size_t esize, const char *own, char *out, size_t m,
                                      const struct signature_packed *sig, char *keep) {
  const int n = comm->nranks, rank = comm->rank;
  const size_t nbytes = m * esize;
  if (own == out && rank > 1) {
    memcpy(keep, own, nbytes);
    own = keep;
  }
  const char *a, *b;
  WEFT_TRY(direct_input(comm, 0, own, nbytes, sig, &a));
  for (int r = 1; r < n; r++) {
    WEFT_TRY(direct_input(comm, r, own, nbytes, sig, &b));
    reduce(out, NULL, a, b, m, r == n - 1 ? divisor : 1);
    /* the slots reduced are the senders' again */
    if (r == 1 && rank != 0) taken_from(comm, 0);
    if (r != rank) taken_from(comm, r);
    a = out;
  }
  return weftSuccess;
}

/* One piece of the all-reduce: own to every rank, then every rank's reduced. */
static weftResult_t direct_piece(struct weftComm *comm, weft_reduce_fn reduce, int divisor,
                                 size_t esize, const char *own, char *out, size_t m,
                                 const struct signature_packed *sig, char *keep) {
  WEFT_TRY(direct_send_all(comm, own, m * esize, sig));
  return direct_reduce_all(comm, reduce, divisor, esize, own, out, m, sig, keep);
}

/* The elements of every piece: a slot less the signature. */
static weftResult_t direct_per_piece(const struct weftComm *comm, size_t esize, const char *what,
                                     size_t *per_piece) {
  const size_t sig_nbytes = WEFT_SLOT_SIGNATURE ? sizeof(struct signature_packed) : 0;
  *per_piece = (comm->slot_nbytes - sig_nbytes) / esize;
  if (*per_piece == 0)
    return weft_error_set(weftInternalError, "direct %s: %zu-byte slots hold no element", what,
                          comm->slot_nbytes);
  return weftSuccess;
}

/* Where an in-place rank above 1 keeps its own vector of a piece while the
 * reductions before its turn overwrite the buffer: keep_small, or the heap
 * (*heap, to free) for pieces larger. */
static weftResult_t direct_keep(const struct weftComm *comm, int in_place, size_t nbytes,
                                char *keep_small, const char *what, char **keep, char **heap) {
  *keep = keep_small, *heap = NULL;
  if (!in_place || comm->rank <= 1 || nbytes <= DIRECT_KEEP_STACK_NBYTES) return weftSuccess;
  *keep = *heap = malloc(nbytes);
  if (*keep == NULL)
    return weft_error_set(weftSystemError, "direct %s: no memory for %zu bytes", what, nbytes);
  return weftSuccess;
}

/* Sends the signature alone to every rank but skip (or every rank, with
 * skip -1): the first piece's word to those this rank sends no data. */
static weftResult_t direct_sign_all(struct weftComm *comm, int skip,
                                    const struct signature_packed *sig) {
  const int n = comm->nranks;
  for (int i = 1; i < n; i++)
    if ((comm->rank + i) % n != skip)
      WEFT_TRY(direct_send_one(comm, (comm->rank + i) % n, NULL, 0, sig));
  return weftSuccess;
}

/* Takes the signature-alone slot of every rank but skip (or -1), checked. */
static weftResult_t direct_signed_by_all(struct weftComm *comm, int skip,
                                         const struct signature_packed *sig) {
  const int n = comm->nranks;
  for (int i = 1; i < n; i++) {
    const int peer = (comm->rank + n - i) % n;
    if (peer == skip) continue;
    const char *in;
    WEFT_TRY(peer_recv_signed_wait(comm, &comm->recv_conns[peer], sizeof *sig, sig, 1, &in));
    signed_by(comm, peer);
    taken_from(comm, peer);
  }
  return weftSuccess;
}

/* One piece of the broadcast: the root's data (with its signature in the
 * first piece) to every rank; in the first piece, every other rank's
 * signature alone to every rank. */
static weftResult_t direct_bcast_piece(struct weftComm *comm, int root, const char *src,
                                       char *dst, size_t nbytes,
                                       const struct signature_packed *sig) {
  if (comm->rank == root) {
    WEFT_TRY(direct_send_all(comm, src, nbytes, sig));
    if (dst != src) memcpy(dst, src, nbytes);
  } else if (sig != NULL) {
    WEFT_TRY(direct_sign_all(comm, -1, sig));
  }
  if (comm->rank != root) {
    const char *in;
    WEFT_TRY(direct_input(comm, root, NULL, nbytes, sig, &in));
    memcpy(dst, in, nbytes);
    taken_from(comm, root);
  }
  return sig != NULL ? direct_signed_by_all(comm, root, sig) : weftSuccess;
}

weftResult_t direct_broadcast(struct weftComm *comm, struct weft_channel *ch,
                              const struct weft_plan *plan, size_t offset, size_t count) {
  (void)ch;
  if (count == 0) return weftSuccess;
  const int n = comm->nranks, root = plan->root;
  const size_t esize = weftTypeSize(plan->datatype);
  const char *src = comm->rank == root ? (const char *)plan->sendbuf + offset * esize : NULL;
  char *dst = (char *)plan->recvbuf + offset * esize;
  if (n > DIRECT_MAX_RANKS)
    return weft_error_set(weftInternalError, "direct broadcast on %d ranks (at most %d)", n,
                          DIRECT_MAX_RANKS);
  size_t per_piece;
  WEFT_TRY(direct_per_piece(comm, esize, "broadcast", &per_piece));
  WEFT_TRY(direct_connect(comm));
  struct signature_packed signature;
  signature_pack(&signature, plan);
  for (size_t base = 0; base < count;) {
    const struct signature_packed *sig = WEFT_SLOT_SIGNATURE && base == 0 ? &signature : NULL;
    const size_t m = count - base < per_piece ? count - base : per_piece;
    WEFT_TRY(direct_bcast_piece(comm, root, src != NULL ? src + base * esize : NULL,
                                dst + base * esize, m * esize, sig));
    base += m;
  }
  return weftSuccess;
}

/* One piece of the reduce: every rank's data (with its signature in the
 * first piece) to the root, which reduces all n vectors in rank order as
 * the all-reduce does; in the first piece the root's signature alone to
 * every rank, and each other rank's to every rank but the root. */
static weftResult_t direct_reduce_piece(struct weftComm *comm, weft_reduce_fn reduce,
                                        int divisor, size_t esize, int root, const char *own,
                                        char *out, size_t m, const struct signature_packed *sig,
                                        char *keep) {
  if (comm->rank != root) {
    WEFT_TRY(direct_send_one(comm, root, own, m * esize, sig));
    if (sig == NULL) return weftSuccess;
    WEFT_TRY(direct_sign_all(comm, root, sig));
    return direct_signed_by_all(comm, -1, sig);
  }
  if (sig != NULL) WEFT_TRY(direct_sign_all(comm, -1, sig));
  return direct_reduce_all(comm, reduce, divisor, esize, own, out, m, sig, keep);
}

/* The all-reduce (root -1) and the reduce: the call in pieces of a slot,
 * the first carrying the signature. */
static weftResult_t direct_reduction(struct weftComm *comm, const struct weft_plan *plan,
                                     size_t offset, size_t count, int root) {
  const char *what = root < 0 ? "all-reduce" : "reduce";
  if (count == 0) return weftSuccess;
  const int n = comm->nranks;
  const size_t esize = weftTypeSize(plan->datatype);
  const char *src = (const char *)plan->sendbuf + offset * esize;
  char *dst = root < 0 || comm->rank == root ? (char *)plan->recvbuf + offset * esize : NULL;
  if (n == 1) {
    if (dst != src) memcpy(dst, src, count * esize);
    return weftSuccess;
  }
  if (n > DIRECT_MAX_RANKS)
    return weft_error_set(weftInternalError, "direct %s on %d ranks (at most %d)", what, n,
                          DIRECT_MAX_RANKS);
  size_t per_piece;
  WEFT_TRY(direct_per_piece(comm, esize, what, &per_piece));
  const weft_reduce_fn reduce = reduce_host_fn(plan->datatype, plan->op);
  const int divisor = plan->op == weftAvg ? n : 1;
  WEFT_TRY(direct_connect(comm));
  struct signature_packed signature;
  signature_pack(&signature, plan);
  /* in place, the reductions before this rank's turn overwrite its input:
   * a copy of it, on the stack for small pieces */
  _Alignas(64) char keep_small[DIRECT_KEEP_STACK_NBYTES];
  char *keep, *keep_heap;
  WEFT_TRY(direct_keep(comm, src == dst, (count < per_piece ? count : per_piece) * esize,
                       keep_small, what, &keep, &keep_heap));
  weftResult_t res = weftSuccess;
  for (size_t base = 0; base < count && res == weftSuccess;) {
    const struct signature_packed *sig = WEFT_SLOT_SIGNATURE && base == 0 ? &signature : NULL;
    const size_t m = count - base < per_piece ? count - base : per_piece;
    const char *own = src + base * esize;
    char *out = dst != NULL ? dst + base * esize : NULL;
    res = root < 0 ? direct_piece(comm, reduce, divisor, esize, own, out, m, sig, keep)
                   : direct_reduce_piece(comm, reduce, divisor, esize, root, own, out, m, sig,
                                         keep);
    base += m;
  }
  free(keep_heap);
  return res;
}

weftResult_t direct_allreduce(struct weftComm *comm, struct weft_channel *ch,
                              const struct weft_plan *plan, size_t offset, size_t count) {
  (void)ch; /* point-to-point connections, not the ring's */
  return direct_reduction(comm, plan, offset, count, -1);
}

weftResult_t direct_reduce(struct weftComm *comm, struct weft_channel *ch,
                           const struct weft_plan *plan, size_t offset, size_t count) {
  (void)ch;
  return direct_reduction(comm, plan, offset, count, plan->root);
}
