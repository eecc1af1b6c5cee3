/* Primitives on any one connection: the host executor's loads and stores on a
 * FIFO, with acquire/release ordering on the head and tail counters. */
#include <stdint.h>
#include <string.h>

#include "../../../transport/status.h"
#include "../../../transport/wait.h"
#include "../../core/check.h"
#include "../../algo/p2p.h"
#include "../../core/plan.h"
#include "prims_ll.h"
#include "prims_peer.h"

weftResult_t peer_connect(struct weftComm *comm, const int *peers, int npeers) {
  int missing = 0;
  for (int i = 0; i < npeers; i++)
    missing |= comm->p2p_send[peers[i]].transport == NULL ||
               comm->p2p_recv[peers[i]].transport == NULL;
  return missing ? p2p_connect_peers(comm, peers, npeers, peers, npeers) : weftSuccess;
}

static char *conn_slot(const struct weft_conn *c) {
  return c->slots + (c->step % c->nslots) * c->slot_nbytes;
}

weftResult_t peer_send_wait(struct weftComm *comm, struct weft_conn *conn, char **slot_out) {
  if (conn->step - __atomic_load_n(&conn->ctrl->head, __ATOMIC_ACQUIRE) >= conn->nslots) {
    struct weft_wait w;
    wait_begin(&w, comm->timeout_ns, &comm->abort_flag, &conn->ctrl->poison, conn->peer_pid,
               conn->peer_rank, "send to");
    while (conn->step - __atomic_load_n(&conn->ctrl->head, __ATOMIC_ACQUIRE) >= conn->nslots) {
      weftResult_t res = wait_poll(&w);
      if (res != weftInProgress) return res;
    }
  }
  *slot_out = conn_slot(conn);
  return weftSuccess;
}

void peer_send_post(struct weft_conn *conn, size_t nbytes) {
  conn->ctrl->slot_used_nbytes[conn->step % conn->nslots] = (uint32_t)nbytes;
  conn->step++;
  __atomic_store_n(&conn->ctrl->tail, conn->step, __ATOMIC_RELEASE);
}

/* Waits until the sender has posted the slot at conn->step. */
static weftResult_t peer_recv_ready(struct weftComm *comm, struct weft_conn *conn) {
  if (__atomic_load_n(&conn->ctrl->tail, __ATOMIC_ACQUIRE) > conn->step) return weftSuccess;
  struct weft_wait w;
  wait_begin(&w, comm->timeout_ns, &comm->abort_flag, &conn->ctrl->poison, conn->peer_pid,
             conn->peer_rank, "receive from");
  while (__atomic_load_n(&conn->ctrl->tail, __ATOMIC_ACQUIRE) <= conn->step) {
    weftResult_t res = wait_poll(&w);
    if (res != weftInProgress) return res;
  }
  return weftSuccess;
}

weftResult_t peer_recv_wait(struct weftComm *comm, struct weft_conn *conn, size_t nbytes,
                            const char **slot_out) {
  WEFT_TRY(peer_recv_ready(comm, conn));
  uint32_t used = conn->ctrl->slot_used_nbytes[conn->step % conn->nslots];
  if (used != nbytes)
    return weft_error_set(weftInvalidUsage,
                          "receive from rank %d: %u bytes arrived where %zu were expected "
                          "(do all ranks pass the same count and datatype?)",
                          conn->peer_rank, used, nbytes);
  *slot_out = conn_slot(conn);
  return weftSuccess;
}

weftResult_t peer_recv_signed_wait(struct weftComm *comm, struct weft_conn *conn, size_t nbytes,
                                   const struct check_sig *mine, int compare,
                                   const char **slot_out) {
  WEFT_TRY(peer_recv_ready(comm, conn));
  const char *slot = conn_slot(conn);
  const size_t used = conn->ctrl->slot_used_nbytes[conn->step % conn->nslots] &
                      PRIMS_USED_NBYTES_MASK;
  struct check_sig theirs;
  memset(&theirs, 0, sizeof theirs);
  if (used >= sizeof theirs && used <= conn->slot_nbytes)
    memcpy(&theirs, slot + used - sizeof theirs, sizeof theirs);
  const int same = !compare || (theirs.magic == mine->magic && theirs.coll == mine->coll &&
                                theirs.count == mine->count && theirs.datatype == mine->datatype &&
                                theirs.op == mine->op && theirs.root == mine->root);
  if (same && used == nbytes) {
    *slot_out = slot;
    return weftSuccess;
  }
  /* the peer is in another call: name the difference where its slot says it */
  weftResult_t res = weftInvalidUsage;
  if (theirs.magic == CHECK_SIG_MAGIC) {
    const int lower = conn->peer_rank < comm->rank;
    struct check_sig pair[2] = {lower ? theirs : *mine, lower ? *mine : theirs};
    const int ranks[2] = {lower ? conn->peer_rank : comm->rank,
                          lower ? comm->rank : conn->peer_rank};
    pair[0].seq = pair[1].seq = 0;
    res = check_compare_ranks(pair, ranks, 2, "ranks disagree on a collective");
  }
  if (res == weftSuccess || theirs.magic != CHECK_SIG_MAGIC)
    weft_error_set(weftInvalidUsage,
                   "%s: rank %d sent %zu bytes where %zu were expected: it is in another call "
                   "on this communicator (do all ranks make the same collectives in the same "
                   "order, with the same count and datatype?)",
                   coll_kind_name((enum coll_kind)mine->coll),
                   conn->peer_rank, used, nbytes);
  /* the ranks' steps no longer pair up: break the comm so that none waits */
  return comm_fail_alone(comm, weftInvalidUsage);
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
