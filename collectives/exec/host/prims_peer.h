/* Primitives on any one connection, for algorithms that talk to several peers
 * (trees, recursive doubling) over the point-to-point connections
 * comm->send_conns[peer] / comm->recv_conns[peer]. A step is split in two halves
 * so that an algorithm can hold slots of several connections at once: wait
 * for a slot, fill or read it in place, then post it.
 *   peer_send_wait / peer_send_post   next free slot to the peer (a credit)
 *   peer_recv_wait / peer_recv_done   next filled slot from the peer
 * Memory ordering as in prims_host.c: acquire loads of tail and head, release
 * stores. Every wait is bounded by the comm's timeout and abort flag, the
 * connection's poison word and the peer's liveness. */
#ifndef WEFT_PRIMS_PEER_H
#define WEFT_PRIMS_PEER_H

#include <stddef.h>
#include <stdint.h>

#include "../../core/comm.h"

/* Connects this rank both ways with each of peers (to and from), where not
 * connected yet. Collective among the peers: each pair must both ask, in any
 * order. Blocks until connected or the timeout passes. */
weftResult_t peer_connect_missing(struct weftComm *comm, const int *peers, int npeers);
static inline weftResult_t peer_connect(struct weftComm *comm, const int *peers, int npeers) {
  int missing = 0;
  for (int i = 0; i < npeers; i++)
    missing |= comm->send_conns[peers[i]].transport == NULL ||
               comm->recv_conns[peers[i]].transport == NULL;
  return missing ? peer_connect_missing(comm, peers, npeers) : weftSuccess;
}

/* Waits until the next slot of conn's FIFO is free; *slot_out points to it.
 * Blocks (bounded). Calling it again before peer_send_post returns the same
 * slot. */
weftResult_t peer_send_wait(struct weftComm *comm, struct weft_conn *conn, char **slot_out);
/* The slot at conn->step. */
static inline char *peer_slot(const struct weft_conn *conn) {
  return conn_slot(conn, conn->step);
}

/* The receiver on conn has drained every slot before step `drained`, known
 * without loading the head it writes on every slot (a cache-line transfer
 * every nslots - 1 sends): a signed slot of this call from that rank was
 * posted after its calls before this one, which drained every slot sent it
 * before this call. Shared memory only: a proxy frees the sender's slots as
 * it sends them, and says so in head alone. */
static inline void peer_send_drained(struct weft_conn *conn, uint64_t drained) {
  if (conn->transport != NULL && (conn->transport->caps & TRANSPORT_CAP_HOST_MEMORY) &&
      drained > conn->head_seen)
    conn->head_seen = drained;
}

/* Asks for the first line of the next slot to conn for writing, ahead of the
 * store that fills it (a hint, no wait), where that slot is known free. The
 * receiver read that line nslots sends ago and keeps a copy; the store would
 * otherwise wait for the line to be taken back from it (on a mesh, through
 * its home slice) before the data can leave. Issued once this rank has what
 * it waits for, the take overlaps the CPU work up to the next store there. */
static inline void peer_send_warm(const struct weft_conn *conn) {
  if (conn->step - conn->head_seen >= conn->nslots) return; /* the receiver may be reading it */
  const char *line = peer_slot(conn);
#if defined(__x86_64__)
  /* PREFETCHW: x86-64 CPUs without it (Intel's before Broadwell) run it as a NOP */
  __asm__ volatile("prefetchw %0" ::"m"(*line));
#else
  __builtin_prefetch(line, 1, 3);
#endif
}

/* Hands the slot from peer_send_wait, filled with nbytes, to the receiver. */
void peer_send_post(struct weft_conn *conn, size_t nbytes);
struct signature_packed;
/* The same for a slot whose nbytes of data are followed by sig: stores sig
 * after the data, mixed with the slot's step (signature_packed_keyed) and
 * after every store of the data, then posts nbytes + 16 bytes marked signed.
 * A receiver that expects this call (peer_recv_signed_wait) takes the slot
 * as soon as the signature's line arrives, before tail moves. */
void peer_send_post_signed(struct weft_conn *conn, size_t nbytes,
                           const struct signature_packed *sig);

/* Waits until the next slot of conn's FIFO is filled; *slot_out points to it.
 * Fails with weftInvalidUsage when the sender put other than nbytes there
 * (the ranks disagree on count or datatype). Blocks (bounded). */
weftResult_t peer_recv_wait(struct weftComm *comm, struct weft_conn *conn, size_t nbytes,
                            const char **slot_out);
/* As peer_recv_wait for a slot posted by peer_send_post_signed (nbytes
 * counts the signature; mine is this rank's signature of the call): where the slot's size differs, or with compare set its
 * signature, the ranks are in different calls; then returns
 * weftInvalidUsage with a message naming both ranks and what differs, and
 * breaks the comm (comm_fail_alone), so that no rank waits on steps that no
 * longer pair up. */
weftResult_t peer_recv_signed_wait(struct weftComm *comm, struct weft_conn *conn, size_t nbytes,
                                   const struct signature_packed *mine, int compare,
                                   const char **slot_out);
/* Waits for the slot at conn->step where the caller knows the signature it
 * should carry: keyed (signature_packed_keyed with the slot's step), at `at`
 * in the slot. Polls that signature (prims_slot_signed), and tail every 16
 * polls; *signed_out 1: it arrived, the slot's data may be read. 0: tail
 * moved without it (the slot holds something else, which the caller checks
 * as any slot), or the FIFO is a proxy's, taken on tail alone. Bounded as
 * every wait. */
weftResult_t peer_wait_signed(struct weftComm *comm, struct weft_conn *conn, const char *at,
                              const struct signature_packed *keyed, int *signed_out);
/* The signature of a slot posted by peer_send_post_signed, as the sender
 * passed it: at is where it lies in the slot, step the slot's. */
void peer_slot_signature(struct signature_packed *out, const char *at, uint64_t step);

/* Returns the slot from peer_recv_wait to the sender (a credit). */
void peer_recv_done(struct weft_conn *conn);

/* One whole slot: src (nbytes <= slot_nbytes) to the peer; blocks (bounded). */
weftResult_t peer_send(struct weftComm *comm, struct weft_conn *conn, const void *src,
                       size_t nbytes);
/* One whole slot of nbytes from the peer into dst; blocks (bounded). */
weftResult_t peer_recv(struct weftComm *comm, struct weft_conn *conn, void *dst, size_t nbytes);

#endif
