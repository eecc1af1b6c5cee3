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
/* The same over the peer collectives' connections (comm.h), for a
 * collective built of sends and receives (WEFT_DETERMINISTIC's), so that
 * it never meets a user's send in a FIFO. */
weftResult_t sendrecv_run_peers(struct weftComm *comm, const struct weft_plan *const *ops,
                                size_t nops);

/* The same executor, taking more sends and receives while it runs (a host
 * stream's, collectives/api/stream.c): each call of sendrecv_exec_add is
 * like a group of its own, whose ops advance together with every op added
 * before and not finished; messages keep their order per peer and
 * direction across calls. */
struct sendrecv_exec;
/* lazy: connections are made while the ops wait, never waiting for a peer's
 * answer (ops added one by one may need connections in any order); without
 * it sendrecv_exec_add makes them, waiting for the peers. */
weftResult_t sendrecv_exec_create(struct weftComm *comm, int lazy, struct sendrecv_exec **out);
/* Connects what ops need (or starts to: lazy) and adds them; they must stay
 * valid until finished. */
weftResult_t sendrecv_exec_add(struct sendrecv_exec *x, const struct weft_plan *const *ops,
                               size_t nops);
/* Moves what can move, without blocking: weftSuccess once every op added is
 * finished, weftInProgress while some wait, or the failure (which breaks
 * the comm, as sendrecv_run's). Waits time out as sendrecv_run's do. */
weftResult_t sendrecv_exec_poll(struct sendrecv_exec *x);
/* How many ops were added, and whether op i (in order of adding) is done. */
size_t sendrecv_exec_count(const struct sendrecv_exec *x);
int sendrecv_exec_finished(const struct sendrecv_exec *x, size_t i);
void sendrecv_exec_free(struct sendrecv_exec *x);

#endif
