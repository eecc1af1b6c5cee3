/* Primitives on any one connection: the host executor's loads and stores on a
 * FIFO, with acquire/release ordering on the head and tail counters. */
#include <stdint.h>
#include <string.h>

#include "../../../transport/base/status.h"
#include "../../../transport/base/wait.h"
#include "../../core/signature.h"
#include "../../algo/sendrecv.h"
#include "../../core/plan.h"
#include "prims.h"
#include "prims_ll.h"
#include "prims_peer.h"

weftResult_t peer_connect_missing(struct weftComm *comm, const int *peers, int npeers) {
  return sendrecv_connect_peers(comm, peers, npeers, peers, npeers);
}

weftResult_t peer_send_wait(struct weftComm *comm, struct weft_conn *conn, char **slot_out) {
  if (!conn_send_ready(conn)) {
    struct weft_wait w;
    wait_begin(&w, comm_timeout_ns(comm), &comm->abort_flag, &conn->ctrl->poison, conn->peer_pid,
               conn->peer_rank, "send to");
    while (!conn_send_ready(conn)) {
      weftResult_t res = wait_poll(&w);
      if (res != weftInProgress) return res;
    }
  }
  *slot_out = peer_slot(conn);
  return weftSuccess;
}

void peer_send_post(struct weft_conn *conn, size_t nbytes) {
  conn_send_post(conn, (uint32_t)nbytes);
}

void peer_send_post_signed(struct weft_conn *conn, size_t nbytes,
                           const struct signature_packed *sig) {
  struct signature_packed keyed;
  signature_packed_keyed(&keyed, sig, conn->step);
  /* a receiver that sees the signature reads the data next: the data's
   * stores go first (x86 keeps stores in order; elsewhere this fences) */
  __atomic_thread_fence(__ATOMIC_RELEASE);
  memcpy(peer_slot(conn) + nbytes, &keyed, sizeof keyed);
  conn_send_post(conn, (uint32_t)(nbytes + sizeof keyed) | PRIMS_USED_SIGNED);
}

void peer_slot_signature(struct signature_packed *out, const char *at, uint64_t step) {
  memcpy(out, at, sizeof *out);
  signature_packed_keyed(out, out, step); /* unmixed */
}

/* Waits until the sender has posted the slot at conn->step. While it waits
 * it prefetches the slot's first line and its used size: the sender stores
 * both before tail, so once tail has moved they are mostly here already,
 * rather than one more cache-line transfer after it. */
static weftResult_t peer_recv_ready(struct weftComm *comm, struct weft_conn *conn) {
  if (__atomic_load_n(&conn->ctrl->tail, __ATOMIC_ACQUIRE) > conn->step) return weftSuccess;
  const char *slot = peer_slot(conn);
  const uint32_t *used = &conn->ctrl->slot_used_nbytes[slot_index(conn->step, conn->nslots)];
  struct weft_wait w;
  wait_begin(&w, comm_timeout_ns(comm), &comm->abort_flag, &conn->ctrl->poison, conn->peer_pid,
             conn->peer_rank, "receive from");
  while (__atomic_load_n(&conn->ctrl->tail, __ATOMIC_ACQUIRE) <= conn->step) {
    __builtin_prefetch(slot, 0, 3);
    __builtin_prefetch(used, 0, 3);
    weftResult_t res = wait_poll(&w);
    if (res != weftInProgress) return res;
  }
  return weftSuccess;
}

weftResult_t peer_recv_wait(struct weftComm *comm, struct weft_conn *conn, size_t nbytes,
                            const char **slot_out) {
  WEFT_TRY(peer_recv_ready(comm, conn));
  uint32_t used = conn->ctrl->slot_used_nbytes[slot_index(conn->step, conn->nslots)];
  if (used != nbytes)
    return weft_error_set(weftInvalidUsage,
                          "receive from rank %d: %u bytes arrived where %zu were expected "
                          "(do all ranks pass the same count and datatype?)",
                          conn->peer_rank, used & PRIMS_USED_NBYTES_MASK, nbytes);
  *slot_out = peer_slot(conn);
  return weftSuccess;
}

/* The slot at conn->step (used: its slot_used_nbytes) is not the nbytes
 * ending in mine that this rank expects: names the difference where the
 * slot's last bytes are the peer's signature, and breaks the comm. */
__attribute__((noinline, cold)) static weftResult_t
peer_recv_signed_mismatch(struct weftComm *comm, struct weft_conn *conn, const char *slot,
                          uint32_t used, size_t nbytes,
                          const struct signature_packed *mine_packed) {
  const size_t used_nbytes = used & PRIMS_USED_NBYTES_MASK;
  struct signature_packed theirs_packed;
  memset(&theirs_packed, 0, sizeof theirs_packed);
  if (used_nbytes >= sizeof theirs_packed && used_nbytes <= conn->slot_nbytes)
    peer_slot_signature(&theirs_packed, slot + used_nbytes - sizeof theirs_packed, conn->step);
  struct signature mine, theirs;
  signature_unpack(&mine, mine_packed);
  signature_unpack(&theirs, &theirs_packed);
  weftResult_t res = weftInvalidUsage;
  if (theirs.magic == SIGNATURE_MAGIC) {
    const int lower = conn->peer_rank < comm->rank;
    const struct signature pair[2] = {lower ? theirs : mine, lower ? mine : theirs};
    const int ranks[2] = {lower ? conn->peer_rank : comm->rank,
                          lower ? comm->rank : conn->peer_rank};
    res = signature_compare_ranks(pair, ranks, 2, "ranks disagree on a collective");
  }
  if (res == weftSuccess || theirs.magic != SIGNATURE_MAGIC)
    weft_error_set(weftInvalidUsage,
                   "%s: rank %d sent %zu bytes where %zu were expected: it is in another call "
                   "on this communicator (do all ranks make the same collectives in the same "
                   "order, with the same count and datatype?)",
                   coll_kind_name((enum coll_kind)mine.coll), conn->peer_rank, used_nbytes,
                   nbytes);
  /* the ranks' steps no longer pair up: break the comm so that none waits */
  return comm_fail_alone(comm, weftInvalidUsage);
}

weftResult_t peer_wait_signed(struct weftComm *comm, struct weft_conn *conn, const char *at,
                              const struct signature_packed *keyed, int *signed_out) {
  *signed_out = 0;
  /* a proxy's FIFO (sockets) gets its bytes from recv(), whose copy need
   * not store them in order: there only tail says the slot has landed */
  if (!(conn->transport->caps & TRANSPORT_CAP_HOST_MEMORY)) return peer_recv_ready(comm, conn);
  *signed_out = 1;
  if (prims_slot_signed(at, keyed)) return weftSuccess;
  struct weft_wait w;
  wait_begin(&w, comm_timeout_ns(comm), &comm->abort_flag, &conn->ctrl->poison, conn->peer_pid,
             conn->peer_rank, "receive from");
  for (;;) {
    if (prims_slot_signed(at, keyed)) return weftSuccess;
    if ((w.iter & 15) == 15 && __atomic_load_n(&conn->ctrl->tail, __ATOMIC_ACQUIRE) > conn->step) break;
    weftResult_t res = wait_poll(&w);
    if (res != weftInProgress) return res;
  }
  *signed_out = prims_slot_signed(at, keyed); /* stored before tail: seen now if at all */
  return weftSuccess;
}

weftResult_t peer_recv_signed_wait(struct weftComm *comm, struct weft_conn *conn, size_t nbytes,
                                   const struct signature_packed *mine, int compare,
                                   const char **slot_out) {
  const char *slot = peer_slot(conn);
  struct signature_packed keyed;
  signature_packed_keyed(&keyed, mine, conn->step);
  const int fits = nbytes >= sizeof keyed && nbytes <= conn->slot_nbytes;
  if (compare && fits) {
    int is_signed;
    WEFT_TRY(peer_wait_signed(comm, conn, slot + nbytes - sizeof keyed, &keyed, &is_signed));
    if (is_signed) {
      *slot_out = slot;
      return weftSuccess;
    }
  } else {
    WEFT_TRY(peer_recv_ready(comm, conn));
  }
  /* tail has moved: the slot holds what the sender posted */
  const uint32_t used = conn->ctrl->slot_used_nbytes[slot_index(conn->step, conn->nslots)];
  if ((used & PRIMS_USED_NBYTES_MASK) == nbytes &&
      (!compare || signature_packed_same(slot + nbytes - sizeof keyed, &keyed))) {
    *slot_out = slot;
    return weftSuccess;
  }
  return peer_recv_signed_mismatch(comm, conn, slot, used, nbytes, mine);
}

void peer_recv_done(struct weft_conn *conn) {
  conn->step++;
  __atomic_store_n(&conn->ctrl->head, conn->step, __ATOMIC_RELEASE);
}

weftResult_t peer_send(struct weftComm *comm, struct weft_conn *conn, const void *src,
                       size_t nbytes) {
  char *out;
  WEFT_TRY(peer_send_wait(comm, conn, &out));
  memcpy(out, src, nbytes);
  peer_send_post(conn, nbytes);
  return weftSuccess;
}

weftResult_t peer_recv(struct weftComm *comm, struct weft_conn *conn, void *dst, size_t nbytes) {
  const char *in;
  WEFT_TRY(peer_recv_wait(comm, conn, nbytes, &in));
  memcpy(dst, in, nbytes);
  peer_recv_done(conn);
  return weftSuccess;
}
