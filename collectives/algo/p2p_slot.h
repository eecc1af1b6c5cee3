/* A point-to-point slot (collectives/algo/sendrecv.c, sendrecv_cma.c): its
 * first word is a header, stored after the payload that follows it, so that
 * a receiver on the same host sees a message by loading the slot's first
 * cache line alone (the size, the flags and a small payload come with it)
 * instead of tail, then slot_used_nbytes, then the slot: three lines that
 * the sender wrote, each a transfer between the cores.
 *
 * The header's high half is (step + 1) truncated to 32 bits (never 0 within
 * 2^32 steps, so zeroed memory reads as empty), its low half the slot's
 * used bytes with their flags, the header's 8 bytes counted, the same value
 * the sender then records in slot_used_nbytes before it moves tail, so that
 * a proxy forwards the slot as any other.
 *
 * Collectives share these connections and leave raw data in their slots,
 * whose first word may read as the step's header by chance. The receiver
 * therefore believes a header at first sight only in a slot whose last
 * content it knows was a header (p2p_clean), or that was never written; in
 * any other slot, and in a FIFO that a proxy fills (recv() may land the
 * header before the payload), it waits for tail first, as before. */
#ifndef WEFT_P2P_SLOT_H
#define WEFT_P2P_SLOT_H

#include <stdint.h>

#include "../../transport/proxy.h"
#include "../../transport/transport.h"

#define P2P_SLOT_HDR_NBYTES 8

/* The slot the step lands in. */
static inline char *p2p_slot(const struct weft_conn *c, uint64_t step) {
  return c->slots + slot_index(step, c->nslots) * c->slot_nbytes;
}

/* Payload bytes a slot holds. */
static inline size_t p2p_slot_capacity(const struct weft_conn *c) {
  return c->slot_nbytes - P2P_SLOT_HDR_NBYTES;
}

/* Sender: the slot at c->step holds its payload; used counts it with the
 * header and carries the algorithm's flags. Publishes it and moves on. */
static inline void p2p_slot_publish(struct weft_conn *c, uint32_t used) {
  const uint64_t i = slot_index(c->step, c->nslots);
  uint64_t *hdr = (uint64_t *)(c->slots + i * c->slot_nbytes);
  __atomic_store_n(hdr, (uint64_t)(uint32_t)(c->step + 1) << 32 | used, __ATOMIC_RELEASE);
  c->ctrl->slot_used_nbytes[i] = used;
  c->step++;
  __atomic_store_n(&c->ctrl->tail, c->step, __ATOMIC_RELEASE);
}

/* Receiver: forgets the slots that other algorithms took since the last
 * point-to-point step (their content is not a header). */
static inline void p2p_slot_catch_up(struct weft_conn *c) {
  if (c->step - c->p2p_end >= c->nslots) c->p2p_clean = 0;
  else
    for (uint64_t s = c->p2p_end; s < c->step; s++)
      c->p2p_clean &= ~(1ull << slot_index(s, c->nslots));
  c->p2p_end = c->step;
}

/* Receiver: whether the step at c->step has arrived: 1 with its used bytes
 * in *used_out, 0 not yet, -1 when it has and is not a point-to-point
 * message (the ranks' calls differ). check_tail asks tail as well where a
 * header is believed at sight (a slow wait's occasional look, which tells a
 * step of another kind from one not yet sent). */
static inline int p2p_slot_arrived(struct weft_conn *c, int check_tail, uint32_t *used_out) {
  if (__builtin_expect(c->p2p_end != c->step, 0)) p2p_slot_catch_up(c);
  const uint64_t i = slot_index(c->step, c->nslots);
  const int at_sight = (c->transport->caps & TRANSPORT_CAP_HOST_MEMORY) &&
                       (c->step < c->nslots || (c->p2p_clean >> i & 1));
  int landed = 0;
  if (!at_sight || check_tail) {
    landed = __atomic_load_n(&c->ctrl->tail, __ATOMIC_ACQUIRE) > c->step;
    if (!landed && !at_sight) return 0;
  }
  const uint64_t h = __atomic_load_n((const uint64_t *)(c->slots + i * c->slot_nbytes),
                                     __ATOMIC_ACQUIRE);
  if ((uint32_t)(h >> 32) != (uint32_t)(c->step + 1)) return landed ? -1 : 0;
  *used_out = (uint32_t)h;
  return 1;
}

/* Receiver: the slot at c->step is taken (its head moves on): it now holds a
 * header. */
static inline void p2p_slot_taken(struct weft_conn *c) {
  c->p2p_clean |= 1ull << slot_index(c->step, c->nslots);
  c->step++;
  c->p2p_end = c->step;
  __atomic_store_n(&c->ctrl->head, c->step, __ATOMIC_RELEASE);
}

#endif
