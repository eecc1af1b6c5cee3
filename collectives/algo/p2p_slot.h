/* Point-to-point slots (collectives/algo/sendrecv.c, sendrecv_cma.c) in two
 * formats, told apart by the message's size, which both ends know.
 *
 * A small message (P2P_HDR_MAX_NBYTES at most) and an offer take one slot
 * whose first word is a header, stored after the payload that follows it,
 * so that a receiver on the same host sees the message by loading the
 * slot's first cache line alone (the size, the flags and a small payload
 * come with it) instead of tail, then slot_used_nbytes, then the slot: three
 * lines that the sender wrote, each a transfer between the cores. The
 * header's high half is (step + 1) truncated to 32 bits (never 0 within 2^32
 * steps, so zeroed memory reads as empty), its low half the slot's used
 * bytes with their flags (P2P_USED_HDR among them), the header's 8 bytes
 * counted: the same value the sender then records in slot_used_nbytes before
 * it moves tail, so that a proxy forwards the slot as any other.
 *
 * A larger message fills whole slots with raw data, as the collectives do,
 * and its receiver waits for tail: a FIFO's slots then hold exactly what
 * they held before, so a send that fits the free slots completes without its
 * receiver whatever its size.
 *
 * Larger messages leave raw data in the slots (the collectives have FIFOs
 * of their own, and a test may write a raw step), whose first
 * word may read as a header by chance. The receiver therefore believes a
 * header at first sight only in a slot whose last content it knows was a
 * header (p2p_clean), or that was never written; in any other slot, and in
 * a FIFO that a proxy fills (recv() may land the header before the payload),
 * it waits for tail first. */
#ifndef WEFT_P2P_SLOT_H
#define WEFT_P2P_SLOT_H

#include <stdint.h>

#include "../../transport/proxy.h"
#include "../../transport/transport.h"

#define P2P_SLOT_HDR_NBYTES 8
#define P2P_HDR_MAX_NBYTES 4096
/* In slot_used_nbytes: the slot starts with a header (its count includes it). */
#define P2P_USED_HDR 0x10000000u
/* In slot_used_nbytes: the message ends in this slot. */
#define SLOT_LAST 0x80000000u

/* Whether a message of nbytes takes one slot with a header. */
static inline int p2p_slot_hdr_fits(const struct weft_conn *c, size_t nbytes) {
  return nbytes <= P2P_HDR_MAX_NBYTES && nbytes + P2P_SLOT_HDR_NBYTES <= c->slot_nbytes;
}

/* Sender: the slot at c->step holds its payload after the header's place;
 * used counts it with the header and carries the algorithm's flags.
 * Publishes it and moves on. */
static inline void p2p_slot_publish(struct weft_conn *c, uint32_t used) {
  used |= P2P_USED_HDR;
  uint64_t *hdr = (uint64_t *)conn_slot(c, c->step);
  __atomic_store_n(hdr, (uint64_t)(uint32_t)(c->step + 1) << 32 | used, __ATOMIC_RELEASE);
  conn_send_post(c, used);
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
 * in *used_out, 0 not yet, -1 when a header was expected (hdr) and the step
 * has none (another size, or not a point-to-point message). check_tail asks
 * tail as well where a header is believed at sight (a slow wait's occasional
 * look, which tells a step of another kind from one not yet sent). */
static inline int p2p_slot_arrived(struct weft_conn *c, int hdr, int check_tail,
                                   uint32_t *used_out) {
  if (__builtin_expect(c->p2p_end != c->step, 0)) p2p_slot_catch_up(c);
  const uint64_t i = slot_index(c->step, c->nslots);
  const int at_sight = hdr && (c->transport->caps & TRANSPORT_CAP_HOST_MEMORY) &&
                       (c->step < c->nslots || (c->p2p_clean >> i & 1));
  int landed = 0;
  if (!at_sight || check_tail) {
    landed = __atomic_load_n(&c->ctrl->tail, __ATOMIC_ACQUIRE) > c->step;
    if (!landed && !at_sight) return 0;
  }
  if (!hdr) {
    *used_out = c->ctrl->slot_used_nbytes[i];
    return 1;
  }
  const uint64_t h = __atomic_load_n((const uint64_t *)conn_slot(c, c->step), __ATOMIC_ACQUIRE);
  if ((uint32_t)(h >> 32) != (uint32_t)(c->step + 1) || !((uint32_t)h & P2P_USED_HDR))
    return landed ? -1 : 0;
  *used_out = (uint32_t)h;
  return 1;
}

/* Receiver: the slot at c->step, used as its slot_used_nbytes says, is
 * taken (its head moves on). */
static inline void p2p_slot_taken(struct weft_conn *c, uint32_t used) {
  const uint64_t bit = 1ull << slot_index(c->step, c->nslots);
  c->p2p_clean = used & P2P_USED_HDR ? c->p2p_clean | bit : c->p2p_clean & ~bit;
  c->step++;
  c->p2p_end = c->step;
  __atomic_store_n(&c->ctrl->head, c->step, __ATOMIC_RELEASE);
}

#endif
