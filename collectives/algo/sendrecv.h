/* Point-to-point: a connection to any peer, made on first use, and the
 * executor of a group's sends and receives (collectives/algo/sendrecv.c). */
#ifndef WEFT_SENDRECV_H
#define WEFT_SENDRECV_H

#include <stddef.h>

#include "../core/plan.h"

/* The comm's arrays of point-to-point connections (one per peer and
 * direction, unconnected), and their release. */
weftResult_t sendrecv_conns_alloc(struct weftComm *comm);
void sendrecv_conns_close(struct weftComm *comm);

/* Connects this rank's point-to-point connections to send_peers and from
 * recv_peers, where not connected yet. Collective among the peers named:
 * each pair must both ask for their connection (collectives/algo/sendrecv.c). */
weftResult_t sendrecv_connect_peers(struct weftComm *comm, const int *send_peers, int nsend,
                                    const int *recv_peers, int nrecv);

/* Runs the sends and receives of one group together (collectives/algo/sendrecv.c). */
weftResult_t sendrecv_run(struct weftComm *comm, const struct weft_plan *const *ops, size_t nops);

#endif
