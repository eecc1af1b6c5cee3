/* Single-copy sends and receives between ranks of one host
 * (collectives/algo/sendrecv_cma.c): the sender offers its buffer in one FIFO
 * slot and the receiver copies the message straight out of it. Used by the
 * point-to-point executor (collectives/algo/sendrecv.c), so all-to-all (even,
 * uneven, vector) and grouped sends and receives all take it. */
#ifndef WEFT_SENDRECV_CMA_H
#define WEFT_SENDRECV_CMA_H

#include <stddef.h>
#include <stdint.h>

#include "../../transport/base/param.h"
#include "../core/comm.h"

extern struct weft_param sendrecv_cma_params[];

/* In a slot's slot_used_nbytes: the slot holds an offer, not data (a bit
 * of its own: an LL receiver takes 0x40000000 for its protocol's mark). */
#define SENDRECV_CMA_SLOT_OFFER 0x08000000u

/* Whether a send of nbytes over c is offered for the receiver to copy: c
 * reaches a peer on this host through memory both load and store, the size
 * is from WEFT_P2P_CMA_MIN_NBYTES and no earlier offer of comm was refused.
 * SENDRECV_CMA_OFFER where the send waits for its receiver anyway: it does
 * not fit the FIFO; SENDRECV_CMA_OFFER_WITHDRAWABLE otherwise: the offer is
 * taken back when the receiver has not come within sendrecv_cma_withdraw_ns,
 * and the message then goes through the FIFO, its start in the offer's
 * slot, so that the send still completes without its receiver and takes the
 * slots it would have taken. A lone send (paired 0) is not offered when
 * WEFT_P2P_CMA_WITHDRAW_NS is 0; a paired one (its group also receives from
 * that peer, as an all-to-all does) is then offered for good, as with
 * WEFT_P2P_CMA_PAIRED_WITHDRAW_NS 0:
 * its group waits for its peer anyway, except where the peer's send to this
 * rank completed alone and it receives only after another call (then such a
 * send waits where through the FIFO it would not). 0: no offer. */
enum { SENDRECV_CMA_OFFER = 1, SENDRECV_CMA_OFFER_WITHDRAWABLE = 3 };
int sendrecv_cma_wanted(const struct weftComm *comm, const struct weft_conn *c, size_t nbytes,
                        int paired);

/* How long a withdrawable offer of nbytes waits for its receiver
 * (WEFT_P2P_CMA_WITHDRAW_NS; WEFT_P2P_CMA_PAIRED_WITHDRAW_NS where paired). */
uint64_t sendrecv_cma_withdraw_ns(size_t nbytes, int paired);

/* Puts an offer of buf (nbytes) in c's next slot if one is free: 1 when it
 * did (*step_out: the slot's step), 0 when the FIFO is full, -1 when the
 * receiver has not yet drained the slot of c's last offer, whose answer still
 * holds the control block's offer area (the caller then sends a withdrawable
 * offer's message through the FIFO, and tries again later with any other:
 * that receiver drains the slot before it takes this message). */
int sendrecv_cma_offer(struct weft_conn *c, const void *buf, size_t nbytes, uint64_t *step_out);

/* Takes back the offer of buf (nbytes) at step before its receiver has it:
 * *withdrawn_out 1 when it did, and then fills the offer's slot with the
 * start of the message, as the FIFO would, returning how many bytes (the rest
 * goes through the FIFO's next slots: the message takes as many as it takes
 * there alone); 0 when the receiver has it (its answer follows). */
size_t sendrecv_cma_withdraw(struct weft_conn *c, uint64_t step, const void *buf, size_t nbytes,
                             int *withdrawn_out);

/* How the receiver answered the offer at step (sendrecv_cma_offer's), nbytes
 * long: weftInProgress while it has not; weftSuccess with *copied_out 1 when
 * it copied the message, 0 when it may not read this process (the message
 * then goes through the FIFO, and comm offers no more); an error (on both
 * ends) when the receiver expected another size or could not read it. */
weftResult_t sendrecv_cma_answer(struct weftComm *comm, struct weft_conn *c, uint64_t step,
                                 size_t nbytes, int *copied_out);

/* Takes the offer in c's current slot into dst (nbytes expected, of which
 * done_nbytes already arrived; stream: copy past the caches where the
 * sender's buffer is mapped here) and frees the slot: weftSuccess with
 * *taken_out the bytes now in dst: nbytes when it copied the message, 0 when
 * this rank may not read the sender. Where the sender took the offer back,
 * weftSuccess with the slot kept and *withdrawn_used_out non-zero: the
 * slot's used bytes and flags now, the message's start as through the FIFO
 * (the caller takes it so, and the rest from the next slots); weftInProgress
 * while the sender fills it. weftInvalidUsage when the sizes differ, or the
 * error of a failed copy; the sender learns either. */
weftResult_t sendrecv_cma_take(struct weftComm *comm, struct weft_conn *c, void *dst, size_t nbytes,
                               size_t done_nbytes, int stream, size_t *taken_out,
                               uint32_t *withdrawn_used_out);

#ifdef WEFT_TEST_HOOKS
/* The suites' build only: how many messages comm's sends had copied by their
 * receivers, and its receives copied from their senders. Only the comm's
 * own thread may ask while it runs calls. */
void sendrecv_cma_counts(const struct weftComm *comm, uint64_t *sent_out, uint64_t *received_out);
#endif

#endif
