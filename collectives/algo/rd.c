/* Recursive doubling all-reduce: the fewest steps, for small messages. With
 * p the largest power of two not above nranks, each slot-sized piece goes:
 *   fold:     rank p+j (an extra rank) sends its input to rank j;
 *             rank j reduces it into its own;
 *   exchange: log2(p) times, rank r swaps its whole vector with r ^ mask
 *             (mask = 1, 2, 4 ...) and reduces the two;
 *   unfold:   rank j sends the result to rank p+j.
 * Both partners of an exchange compute (lower rank's vector) op (higher
 * rank's vector), so they produce the same bits, and after the last exchange
 * every rank holds the same result, floats included. The last exchange
 * divides for avg.
 *
 * The first piece is smaller by a signature of the call (16 bytes, struct
 * signature_packed), which each of its slots carries after the data, in the
 * data's cache line where the piece is small: every rank checks its
 * partners' call against its own as the data arrives, at no extra step
 * (peer_recv_signed_wait). */
#include <stdint.h>
#include <string.h>

#include "../../transport/base/status.h"
#include "../../transport/base/wait.h"
#include "../core/signature.h"
#include "../core/plan.h"
#include "../exec/host/prims.h"
#include "../exec/host/prims_peer.h"
#include "../reduce/reduce_host.h"
#include "algo.h"

/* Connects to every partner this rank has, both ways. */
static weftResult_t rd_connect(struct weftComm *comm, int pow2) {
  int peers[1 + 8 * sizeof(int)], npeers = 0;
  const int rank = comm->rank, extra = comm->nranks - pow2;
  if (rank >= pow2) {
    peers[npeers++] = rank - pow2;
  } else {
    if (rank < extra) peers[npeers++] = rank + pow2;
    for (int mask = 1; mask < pow2; mask <<= 1) peers[npeers++] = rank ^ mask;
  }
  return peer_connect(comm, peers, npeers);
}

/* memcpy of n bytes, inline up to 16: the calls this algorithm is for move
 * a few bytes, where the library's copy costs more than the bytes. */
static inline void rd_copy(void *dst, const void *src, size_t n) {
  if (n > 16) {
    memcpy(dst, src, n);
  } else if (n >= 8) { /* two words that overlap where n < 16 */
    uint64_t a, b;
    memcpy(&a, src, 8);
    memcpy(&b, (const char *)src + n - 8, 8);
    memcpy(dst, &a, 8);
    memcpy((char *)dst + n - 8, &b, 8);
  } else if (n >= 4) {
    uint32_t a, b;
    memcpy(&a, src, 4);
    memcpy(&b, (const char *)src + n - 4, 4);
    memcpy(dst, &a, 4);
    memcpy((char *)dst + n - 4, &b, 4);
  } else {
    for (size_t i = 0; i < n; i++) ((char *)dst)[i] = ((const char *)src)[i];
  }
}

/* One slot of nbytes from src to conn, followed by sig unless NULL. */
static weftResult_t rd_send(struct weftComm *comm, struct weft_conn *conn, const void *src,
                            size_t nbytes, const struct signature_packed *sig) {
  char *out;
  WEFT_TRY(peer_send_wait(comm, conn, &out));
  rd_copy(out, src, nbytes);
  if (sig != NULL) peer_send_post_signed(conn, nbytes, sig);
  else peer_send_post(conn, nbytes);
  return weftSuccess;
}

/* Waits for a slot of nbytes from conn, followed by the sender's signature
 * (checked against sig) unless sig is NULL. */
static weftResult_t rd_recv_wait(struct weftComm *comm, struct weft_conn *conn, size_t nbytes,
                                 const struct signature_packed *sig, const char **in_out) {
  if (sig == NULL) return peer_recv_wait(comm, conn, nbytes, in_out);
  return peer_recv_signed_wait(comm, conn, nbytes + sizeof *sig, sig, 1, in_out);
}

/* One exchange with partner: sends acc, then dst = low op high. Where
 * the slot is free and the partner's signed slot is already there (the
 * later rank of a pair finds it so), neither wait is entered. */
static weftResult_t rd_exchange(struct weftComm *comm, weft_reduce_fn reduce, size_t esize,
                                int partner, const char *acc, char *dst, size_t n, int divisor,
                                const struct signature_packed *sig) {
  const size_t nbytes = n * esize;
  struct weft_conn *to = &comm->send_conns[partner], *from = &comm->recv_conns[partner];
  const char *in;
  if (sig != NULL && conn_send_ready(to)) {
    rd_copy(peer_slot(to), acc, nbytes);
    peer_send_post_signed(to, nbytes, sig);
  } else {
    WEFT_TRY(rd_send(comm, to, acc, nbytes, sig));
  }
  /* the call's trace record now, while the slot travels and the partner's
   * line is fetched: there it costs nothing, where after the exchange it
   * would delay the next call's post */
  wait_prelude_run();
  struct signature_packed keyed;
  if (sig != NULL) signature_packed_keyed(&keyed, sig, from->step);
  if (sig != NULL && (from->transport->caps & TRANSPORT_CAP_HOST_MEMORY) &&
      nbytes + sizeof keyed <= from->slot_nbytes &&
      prims_slot_signed(peer_slot(from) + nbytes, &keyed)) {
    in = peer_slot(from);
  } else {
    WEFT_TRY(rd_recv_wait(comm, from, nbytes, sig, &in));
  }
  /* the partner's signed slot of this call: every slot sent it before this
   * call's one is drained */
  if (sig != NULL) peer_send_drained(to, to->step - 1);
  peer_send_warm(to);
  if (comm->rank < partner) reduce(dst, NULL, acc, in, n, divisor);
  else reduce(dst, NULL, in, acc, n, divisor);
  peer_recv_done(from);
  return weftSuccess;
}

/* Two ranks, the call in one piece: its one exchange. */
static weftResult_t rd_pair(struct weftComm *comm, const struct weft_plan *plan, size_t offset,
                            size_t count, size_t esize) {
  const int partner = comm->rank ^ 1;
  if (comm->send_conns[partner].transport == NULL || comm->recv_conns[partner].transport == NULL)
    WEFT_TRY(peer_connect_missing(comm, &partner, 1));
  struct signature_packed signature;
  signature_pack(&signature, plan);
  const char *src = (const char *)plan->sendbuf + offset * esize;
  char *dst = (char *)plan->recvbuf + offset * esize;
  return rd_exchange(comm, reduce_host_fn(plan->datatype, plan->op), esize, partner, src, dst,
                     count, plan->op == weftAvg ? 2 : 1, &signature);
}

weftResult_t rd_allreduce(struct weftComm *comm, struct weft_channel *ch,
                          const struct weft_plan *plan, size_t offset, size_t count) {
  (void)ch; /* the exchanges use point-to-point connections, not the ring's */
  if (count == 0) return weftSuccess;
  if (comm->nranks == 2 && WEFT_SLOT_SIGNATURE &&
      count * plan_type_size(plan->datatype) + sizeof(struct signature_packed) <=
          comm->slot_nbytes)
    return rd_pair(comm, plan, offset, count, plan_type_size(plan->datatype));
  const weft_reduce_fn reduce = reduce_host_fn(plan->datatype, plan->op);
  const size_t esize = plan_type_size(plan->datatype);
  const int divisor = plan->op == weftAvg ? comm->nranks : 1; /* the last exchange's */
  const char *src = (const char *)plan->sendbuf + offset * esize;
  char *dst = (char *)plan->recvbuf + offset * esize;
  if (comm->nranks == 1) {
    if (dst != src) memcpy(dst, src, count * esize);
    return weftSuccess;
  }
  const int rank = comm->rank;
  int pow2 = 1;
  while (pow2 * 2 <= comm->nranks) pow2 *= 2;
  const int extra = comm->nranks - pow2;
  WEFT_TRY(rd_connect(comm, pow2));

  struct signature_packed signature;
  signature_pack(&signature, plan);
  /* the first piece leaves room for the signature, and the next ones start
   * 64-byte aligned where the slot allows; a call that fits in one piece (the
   * small ones this algorithm is for) needs no division */
  const size_t first_room = comm->slot_nbytes - (WEFT_SLOT_SIGNATURE ? sizeof signature : 0);
  if (extra == 0 && count * esize <= first_room) {
    /* the whole call in one piece on a power of two of ranks (the small
     * calls this algorithm is for): the exchanges alone */
    const struct signature_packed *sig = WEFT_SLOT_SIGNATURE ? &signature : NULL;
    const char *acc = src;
    for (int mask = 1; mask < pow2; mask <<= 1) {
      WEFT_TRY(rd_exchange(comm, reduce, esize, rank ^ mask, acc, dst, count,
                           mask * 2 == pow2 ? divisor : 1, sig));
      acc = dst;
    }
    return weftSuccess;
  }
  for (size_t base = 0; base < count;) {
    const struct signature_packed *sig = WEFT_SLOT_SIGNATURE && base == 0 ? &signature : NULL;
    size_t n = count - base;
    if (n * esize > (sig != NULL ? first_room : comm->slot_nbytes)) {
      n = comm->slot_nbytes / esize;
      if (sig != NULL) {
        n = first_room / 64 * 64 / esize;
        if (n == 0) n = first_room / esize;
      }
    }
    const size_t nbytes = n * esize;
    const char *acc = src + base * esize; /* this rank's vector so far */
    char *out = dst + base * esize;
    if (rank >= pow2) {
      /* an extra rank: hand in the input, get the result back */
      const char *in;
      struct weft_conn *from = &comm->recv_conns[rank - pow2];
      WEFT_TRY(rd_send(comm, &comm->send_conns[rank - pow2], acc, nbytes, sig));
      WEFT_TRY(rd_recv_wait(comm, from, nbytes, sig, &in));
      memcpy(out, in, nbytes);
      peer_recv_done(from);
      base += n;
      continue;
    }
    /* fold: the extra rank's input (the higher rank's) into ours */
    if (rank < extra) {
      const char *in;
      struct weft_conn *from = &comm->recv_conns[rank + pow2];
      WEFT_TRY(rd_recv_wait(comm, from, nbytes, sig, &in));
      reduce(out, NULL, acc, in, n, 1);
      peer_recv_done(from);
      acc = out;
    }
    /* exchange: log2(pow2) swaps, the last one dividing for avg */
    for (int mask = 1; mask < pow2; mask <<= 1) {
      const int last = mask * 2 == pow2;
      WEFT_TRY(rd_exchange(comm, reduce, esize, rank ^ mask, acc, out, n, last ? divisor : 1,
                           sig));
      acc = out;
    }
    /* unfold: the result to the extra rank */
    if (rank < extra) WEFT_TRY(rd_send(comm, &comm->send_conns[rank + pow2], out, nbytes, sig));
    base += n;
  }
  return weftSuccess;
}
