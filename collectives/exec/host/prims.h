/* Primitives: the steps algorithms are written in. One function,
 * prims_step, moves one slot (at most slot_nbytes) through the channel's
 * connections; its flags say where the step's data comes from and goes:
 *   PRIMS_RECV    the data is the slot the previous rank sent (else src)
 *   PRIMS_REDUCE  combined with src by the op (needs PRIMS_RECV)
 *   PRIMS_SEND    passed on into the next rank's FIFO
 *   PRIMS_COPY    written to dst; with PRIMS_REDUCE it is the final value
 *                 (avg divides here). Without PRIMS_RECV dst may be NULL or
 *                 src, and nothing is copied then.
 * The ring's seven primitives (collectives/algo/ring_steps.h) are
 *   send                    SEND                        src -> next
 *   copy_send               SEND | COPY                 src -> next and dst
 *   recv                    RECV | COPY                 prev -> dst
 *   recv_reduce_send        RECV | REDUCE | SEND        prev op src -> next
 *   recv_reduce_copy_send   RECV | REDUCE | SEND | COPY prev op src -> next, dst
 *   recv_copy_send          RECV | SEND | COPY          prev -> next and dst
 *   recv_reduce_copy        RECV | REDUCE | COPY        prev op src -> dst
 * The host executor runs them with vectorised loops; every wait is bounded by
 * the comm's timeout and abort flag and the peer's liveness.
 *
 * Two protocols move the slots, chosen per call by prims_init; prims_step
 * dispatches once on it, and each protocol has one generic step:
 *   PROTO_SIMPLE  plain data in the slot; the sender release-stores tail once
 *                 the slot is full and the receiver waits for tail
 *                 (prims_host.c)
 *   PROTO_LL      8-byte words of 4 data bytes and a 4-byte flag, stored at
 *                 once; the receiver polls the flags, so a slot carries half
 *                 as much (prims_ll.c)
 * Both use the connection's step counters and head credits the same way, so
 * calls of either protocol may follow each other on one connection. */
#ifndef WEFT_PRIMS_H
#define WEFT_PRIMS_H

#include <stddef.h>

#include "../../core/comm.h"
#include "../../core/plan.h"
#include "../../core/signature.h"
#include "../../reduce/reduce_host.h"

struct signature_packed;

struct prims {
  struct weftComm *comm;
  struct weft_conn *send; /* may be NULL when the algorithm never sends */
  struct weft_conn *recv;
  weft_reduce_fn reduce;
  size_t elem_nbytes;
  int divisor; /* applied by the final reduction (avg); 1 otherwise */
  enum coll_proto proto;
  const struct signature_packed *sig; /* the call's signature (prims_sign), or NULL */
  int sig_send;                /* the next slot sent carries sig (SIMPLE: the first) ... */
  int sig_send_data;           /* ... and the next one with data (SIMPLE) */
  int sig_recv;                /* the next slot received with data is checked for it */
  int sig_alone;               /* prims_sign_alone: a slot without data carries it */
  uint64_t sig_recv_from;      /* the call's first step on recv (naming a mismatch) */
  uint64_t sig_send_from;      /* the call's first step on send (credits, 2 ranks) */
};

/* In slot_used_nbytes: the slot's last 16 bytes are the sender's signature
 * of the call (struct signature_packed), after the data. Bits 0-26 count the bytes,
 * the signature included; LL and send/recv own bits 30 and 31. */
#define PRIMS_USED_SIGNED 0x20000000u

/* Whether the 16 bytes at `at` are keyed, the signature a sender stores
 * after a slot's data (mixed with the slot's step) and after every store of
 * the data: then the data may be read. Loads afresh on every call, so it
 * may poll. A receiver that knows which call it is in polls this rather
 * than the FIFO's tail, which the sender stores after the slot's size, on
 * lines of their own: a small slot then arrives in one cache-line transfer
 * instead of two. */
static inline int prims_slot_signed(const char *at, const struct signature_packed *keyed) {
  __asm__ volatile("" ::: "memory"); /* no load hoisted out of a polling loop */
  if (!signature_packed_same(at, keyed)) return 0;
  __atomic_thread_fence(__ATOMIC_ACQUIRE); /* the data's loads after the signature's */
  return 1;
}

/* Sets p up for one algorithm call on channel ch with the plan's protocol. */
void prims_init(struct prims *p, struct weftComm *comm, struct weft_channel *ch,
                weftDataType_t datatype, weftRedOp_t op, enum coll_proto proto);

/* The first slot this call sends carries sig after its data (SIMPLE: the
 * raw bytes, mixed with the slot's step, signature_packed_keyed; LL: as four
 * more payload words), and the first it receives is checked against sig
 * likewise; prims_slot_count leaves the room. SIMPLE checks the first slot
 * with data instead, which the sender signs too, so that an empty first
 * slot costs its receiver no cache line more; where the ranks' calls differ,
 * the receiver looks where the sender put no signature (or another step's),
 * refuses, and names the fields from the sender's first slot. A mismatch is
 * weftInvalidUsage naming both ranks and the fields that differ, and breaks
 * the comm (comm_fail_alone) so that no rank waits on steps that no longer
 * pair up. sig must live until the call ends. */
void prims_sign(struct prims *p, const struct signature_packed *sig);

/* For a connection that the call moves no data over (the ring's link into
 * the root of a broadcast, out of the root of a reduce): PRIMS_SEND sends a
 * slot holding only the signature, PRIMS_RECV receives one and checks it,
 * as prims_sign's first slots. Blocks (bounded). */
weftResult_t prims_sign_alone(struct prims *p, unsigned flags);

/* prims_step's flags (the table above). */
enum prims_flag {
  PRIMS_RECV = 1u << 0,
  PRIMS_REDUCE = 1u << 1,
  PRIMS_SEND = 1u << 2,
  PRIMS_COPY = 1u << 3,
};

/* One step of count elements as flags say. Flags that are no step (neither
 * RECV nor SEND; RECV without SEND or COPY, whose data would go nowhere;
 * REDUCE without RECV; unknown bits) are weftInternalError, and move nothing. */
weftResult_t prims_step(struct prims *p, unsigned flags, const void *src, void *dst, size_t count);

/* Payload bytes a slot of slot_nbytes leaves the data of a signed call: a
 * cache line for the signature (16 bytes where slots are small), so that
 * every first slot has room for it and data stays 64-byte aligned. */
static inline size_t prims_slot_room(size_t payload_nbytes) {
  if (!WEFT_SLOT_SIGNATURE) return payload_nbytes;
  return payload_nbytes - (payload_nbytes >= 256 ? 64 : 16);
}

/* Payload elements per slot for this datatype and protocol: LL spends half of
 * each 8-byte word on its flag; a signed call leaves room for its signature. */
static inline size_t prims_slot_count(const struct prims *p) {
  size_t slot_nbytes = p->send != NULL ? p->send->slot_nbytes : p->recv->slot_nbytes;
  if (p->proto == PROTO_LL) slot_nbytes = slot_nbytes / 8 * 4;
  if (p->sig != NULL) slot_nbytes = prims_slot_room(slot_nbytes);
  return slot_nbytes / p->elem_nbytes;
}

#endif
