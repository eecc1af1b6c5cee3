/* Primitives on any one connection: the host executor's loads and stores on a
 * FIFO, with acquire/release ordering on the head and tail counters. */
#include <stdint.h>
#include <string.h>

#include "../transport/status.h"
#include "../transport/wait.h"
#include "plan.h"
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

weftResult_t peer_recv_wait(struct weftComm *comm, struct weft_conn *conn, size_t nbytes,
                            const char **slot_out) {
  if (__atomic_load_n(&conn->ctrl->tail, __ATOMIC_ACQUIRE) <= conn->step) {
    struct weft_wait w;
    wait_begin(&w, comm->timeout_ns, &comm->abort_flag, &conn->ctrl->poison, conn->peer_pid,
               conn->peer_rank, "receive from");
    while (__atomic_load_n(&conn->ctrl->tail, __ATOMIC_ACQUIRE) <= conn->step) {
      weftResult_t res = wait_poll(&w);
      if (res != weftInProgress) return res;
    }
  }
  uint32_t used = conn->ctrl->slot_used_nbytes[conn->step % conn->nslots];
  if (used != nbytes)
    return weft_error_set(weftInvalidUsage,
                          "receive from rank %d: %u bytes arrived where %zu were expected "
                          "(do all ranks pass the same count and datatype?)",
                          conn->peer_rank, used, nbytes);
  *slot_out = conn_slot(conn);
  return weftSuccess;
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
