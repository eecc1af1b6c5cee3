/* The host executor's primitives: plain loads and stores on the FIFOs, with
 * acquire/release ordering on the head and tail counters (the SIMPLE
 * protocol). prims_step hands calls set up for LL to prims_ll.c. */
#include <string.h>

#include "../../../transport/base/status.h"
#include "../../../transport/base/wait.h"
#include "../../core/signature.h"
#include "prims.h"
#include "prims_ll.h"
#include "prims_peer.h"

void prims_init(struct prims *p, struct weftComm *comm, struct weft_channel *ch,
                weftDataType_t datatype, weftRedOp_t op, enum coll_proto proto) {
  p->comm = comm;
  p->send = &ch->send;
  p->recv = &ch->recv;
  p->reduce = reduce_host_fn(datatype, op);
  p->elem_nbytes = weftTypeSize(datatype);
  p->divisor = op == weftAvg ? comm->nranks : 1;
  p->proto = proto == PROTO_LL ? PROTO_LL : PROTO_SIMPLE;
  p->sig = NULL;
  p->sig_send = p->sig_send_data = p->sig_recv = p->sig_alone = 0;
}

void prims_sign(struct prims *p, const struct signature_packed *sig) {
  p->sig = sig;
  p->sig_send = p->sig_send_data = p->send != NULL;
  p->sig_recv = p->recv != NULL;
  p->sig_recv_from = p->recv != NULL ? p->recv->step : 0;
  p->sig_send_from = p->send != NULL ? p->send->step : 0;
}

/* The sender's signature of its call, where a slot this call may have
 * received carries it: the slots from the call's first step to the last the
 * sender posted that the sender has not written over since (a sender signs
 * its first slot with data, which need not be the one this rank expected).
 * Each decodes with its own step's key, so bytes of other steps never read
 * as a signature. Whether found. */
static int sent_signature_find(const struct prims *p, struct signature *theirs) {
  const struct weft_conn *c = p->recv;
  const uint64_t tail = __atomic_load_n(&c->ctrl->tail, __ATOMIC_ACQUIRE);
  uint64_t from = tail > c->nslots ? tail - c->nslots : 0;
  if (from < p->sig_recv_from) from = p->sig_recv_from;
  for (uint64_t step = from; step < tail; step++) {
    const uint32_t used = c->ctrl->slot_used_nbytes[slot_index(step, c->nslots)];
    const size_t used_nbytes = used & PRIMS_USED_NBYTES_MASK;
    if (!(used & PRIMS_USED_SIGNED) || used_nbytes < sizeof(struct signature_packed) ||
        used_nbytes > c->slot_nbytes)
      continue;
    struct signature_packed packed;
    memcpy(&packed,
           conn_slot(c, step) + used_nbytes - sizeof packed,
           sizeof packed);
    signature_packed_keyed(&packed, &packed, step); /* unmixed */
    signature_unpack(theirs, &packed);
    if (theirs->magic == SIGNATURE_MAGIC && theirs->coll < COLL_NUM) return 1;
  }
  return 0;
}

/* A mismatch found by slot_signature_compare: names it where the sender's
 * signature is found, and breaks the comm. */
__attribute__((noinline, cold)) static weftResult_t signed_slot_mismatch(struct prims *p,
                                                                         size_t nbytes) {
  const struct weft_conn *c = p->recv;
  struct weftComm *comm = p->comm;
  const uint32_t used = c->ctrl->slot_used_nbytes[slot_index(c->step, c->nslots)];
  struct signature mine, theirs;
  signature_unpack(&mine, p->sig);
  if (sent_signature_find(p, &theirs)) {
    const int lower = c->peer_rank < comm->rank;
    const struct signature pair[2] = {lower ? theirs : mine, lower ? mine : theirs};
    const int ranks[2] = {lower ? c->peer_rank : comm->rank, lower ? comm->rank : c->peer_rank};
    if (signature_compare_ranks(pair, ranks, 2, "ranks disagree on a collective") != weftSuccess)
      return comm_fail_alone(comm, weftInvalidUsage);
  }
  const size_t used_nbytes = used & PRIMS_USED_NBYTES_MASK;
  weft_error_set(weftInvalidUsage,
                 "ranks disagree on a collective: %s: rank %d's slot holds %zu bytes "
                 "where rank %d expects %zu and a signature: it is in another call (count, "
                 "datatype, root or collective differ)",
                 coll_kind_name((enum coll_kind)mine.coll), c->peer_rank,
                 used_nbytes - ((used & PRIMS_USED_SIGNED) ? sizeof(struct signature_packed) : 0),
                 comm->rank, nbytes);
  return comm_fail_alone(comm, weftInvalidUsage);
}

/* Compares the signature after the data of the previous rank's first slot of
 * the call, which holds nbytes of data when both ranks make the same call:
 * one 128-bit comparison. Looking there spares a read of slot_used_nbytes
 * (a cache line the sender wrote); only a mismatch reads it, to find where
 * the sender put its signature, if anywhere. */
static inline weftResult_t slot_signature_compare(struct prims *p, const char *slot,
                                                  size_t nbytes) {
  struct signature_packed keyed;
  signature_packed_keyed(&keyed, p->sig, p->recv->step);
  if (__builtin_expect(signature_packed_same(slot + nbytes, &keyed), 1)) return weftSuccess;
  return signed_slot_mismatch(p, nbytes);
}

/* The first slot of the call from the previous rank carried the call's
 * signature: on two ranks that rank is also the one this rank sends to, and
 * every slot sent it before this call is drained (peer_send_drained). */
static inline void credits_from_signed(struct prims *p) {
  if (p->comm->nranks == 2 && p->send != NULL) peer_send_drained(p->send, p->sig_send_from);
}

/* A step that sends nothing has what it waited for: the next slot this rank
 * sends is taken for writing now (peer_send_warm; a ring's last receive of a
 * call warms the next call's first send). */
static inline void send_warm(struct prims *p) {
  if (p->send != NULL) peer_send_warm(p->send);
}

/* Waits until the slot the receiver reads next has been filled; nbytes: the
 * data it should hold. While it waits it prefetches the slot's first line,
 * which the sender stores before tail: once tail has moved, the line is
 * mostly here already rather than one more cache-line transfer after it. */
static weftResult_t wait_filled(struct prims *p, size_t nbytes, char **slot_out) {
  struct weft_conn *c = p->recv;
  if (p->sig_recv && (nbytes > 0 || p->sig_alone) &&
      nbytes + sizeof(struct signature_packed) <= c->slot_nbytes) {
    /* the first slot with data: its signature says it is here */
    char *slot = conn_slot(c, c->step);
    struct signature_packed keyed;
    signature_packed_keyed(&keyed, p->sig, c->step);
    *slot_out = slot;
    int is_signed;
    WEFT_TRY(peer_wait_signed(p->comm, c, slot + nbytes, &keyed, &is_signed));
    p->sig_recv = 0;
    if (!is_signed) WEFT_TRY(slot_signature_compare(p, slot, nbytes));
    credits_from_signed(p);
    return weftSuccess;
  }
  if (__atomic_load_n(&c->ctrl->tail, __ATOMIC_ACQUIRE) <= c->step) {
    const char *slot = conn_slot(c, c->step);
    struct weft_wait w;
    wait_begin(&w, comm_timeout_ns(p->comm), &p->comm->abort_flag, &c->ctrl->poison, c->peer_pid,
               c->peer_rank, "receive from");
    while (__atomic_load_n(&c->ctrl->tail, __ATOMIC_ACQUIRE) <= c->step) {
      __builtin_prefetch(slot, 0, 3);
      weftResult_t res = wait_poll(&w);
      if (res != weftInProgress) return res;
    }
  }
  *slot_out = conn_slot(c, c->step);
  if (p->sig_recv && (nbytes > 0 || p->sig_alone)) {
    p->sig_recv = 0;
    WEFT_TRY(slot_signature_compare(p, *slot_out, nbytes));
    credits_from_signed(p);
  }
  return weftSuccess;
}

/* Waits until the next slot of the sender's peer FIFO is free (a credit). */
static weftResult_t wait_credit(struct prims *p, char **slot_out) {
  struct weft_conn *c = p->send;
  if (!conn_send_ready(c)) {
    struct weft_wait w;
    wait_begin(&w, comm_timeout_ns(p->comm), &p->comm->abort_flag, &c->ctrl->poison, c->peer_pid,
               c->peer_rank, "send to");
    while (!conn_send_ready(c)) {
      weftResult_t res = wait_poll(&w);
      if (res != weftInProgress) return res;
    }
  }
  *slot_out = conn_slot(c, c->step);
  return weftSuccess;
}

static void post_filled(struct prims *p, size_t nbytes) {
  struct weft_conn *c = p->send;
  uint32_t used = (uint32_t)nbytes;
  /* the signature after the data: in the first slot, and in the first with
   * data (the one the receiver checks) where that is not the first */
  if (p->sig_send || (p->sig_send_data && nbytes > 0)) {
    struct signature_packed keyed;
    signature_packed_keyed(&keyed, p->sig, c->step);
    p->sig_send = 0;
    if (nbytes > 0) p->sig_send_data = 0;
    __atomic_thread_fence(__ATOMIC_RELEASE); /* the data's stores first (prims_slot_signed) */
    memcpy(conn_slot(c, c->step) + nbytes, &keyed,
           sizeof keyed);
    used = (uint32_t)(nbytes + sizeof keyed) | PRIMS_USED_SIGNED;
  }
  conn_send_post(c, used);
}

static void post_drained(struct weft_conn *c) {
  c->step++;
  __atomic_store_n(&c->ctrl->head, c->step, __ATOMIC_RELEASE);
}

/* The SIMPLE step: waits for the slot to read (RECV) and the slot to fill
 * (SEND), then one pass over the data, a reduction or copies, and posts. The
 * flags are tested once per slot: the loops over the data (memcpy, the
 * reduction) have none. */
static weftResult_t simple_step(struct prims *p, unsigned flags, const void *src, void *dst,
                                size_t count) {
  const size_t nbytes = count * p->elem_nbytes;
  const void *in = src;
  char *slot_in = NULL, *out = NULL;
  if (flags & PRIMS_RECV) {
    WEFT_TRY(wait_filled(p, nbytes, &slot_in));
    in = slot_in;
    if (!(flags & PRIMS_SEND)) send_warm(p);
  }
  if (flags & PRIMS_SEND) WEFT_TRY(wait_credit(p, &out));
  if (flags & PRIMS_REDUCE) { /* the final value (COPY) goes to dst, and on from there */
    const int copy = (flags & PRIMS_COPY) != 0;
    p->reduce(copy ? dst : out, copy ? out : NULL, in, src, count, copy ? p->divisor : 1);
  } else {
    if (out != NULL) memcpy(out, in, nbytes);
    if ((flags & PRIMS_COPY) && dst != NULL && dst != in) memcpy(dst, in, nbytes);
  }
  if (flags & PRIMS_SEND) post_filled(p, nbytes);
  if (flags & PRIMS_RECV) post_drained(p->recv);
  return weftSuccess;
}

weftResult_t prims_sign_alone(struct prims *p, unsigned flags) {
  if (p->sig == NULL) return weftSuccess;
  if (p->proto == PROTO_LL) return prims_ll_sign_alone(p, flags);
  char *slot;
  const int send_left = p->sig_send, recv_left = p->sig_recv;
  weftResult_t res = weftSuccess;
  p->sig_alone = 1;
  if (flags & PRIMS_SEND) {
    p->sig_send = 1;
    res = wait_credit(p, &slot);
    if (res == weftSuccess) post_filled(p, 0);
    p->sig_send = send_left && res != weftSuccess;
    p->sig_send_data = 0;
  } else {
    p->sig_recv = 1;
    res = wait_filled(p, 0, &slot);
    if (res == weftSuccess) {
      post_drained(p->recv);
      send_warm(p);
    }
    p->sig_recv = recv_left && res != weftSuccess;
  }
  p->sig_alone = 0;
  return res;
}

/* Whether flags are a step (prims.h). */
static int prims_flags_valid(unsigned flags) {
  if (flags & ~(unsigned)(PRIMS_RECV | PRIMS_REDUCE | PRIMS_SEND | PRIMS_COPY)) return 0;
  if (!(flags & PRIMS_RECV)) return (flags & PRIMS_SEND) && !(flags & PRIMS_REDUCE);
  return (flags & (PRIMS_SEND | PRIMS_COPY)) != 0;
}

weftResult_t prims_step(struct prims *p, unsigned flags, const void *src, void *dst,
                        size_t count) {
  if (__builtin_expect(!prims_flags_valid(flags), 0))
    return weft_error_set(weftInternalError, "primitive step with flags 0x%x: no such step",
                          flags);
  if (p->proto == PROTO_LL) return prims_ll_step(p, flags, src, dst, count);
  return simple_step(p, flags, src, dst, count);
}
