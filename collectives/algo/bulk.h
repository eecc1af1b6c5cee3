/* Ring all-reduce, all-gather and reduce-scatter over transports that move
 * whole buffers (struct weft_bulk_ops: UCX between hosts), chunk by chunk
 * straight from and into the user's buffers (collectives/algo/bulk.c). */
#ifndef WEFT_BULK_H
#define WEFT_BULK_H

#include <stddef.h>

#include "../../transport/base/param.h"
#include "../core/comm.h"

struct weft_plan;

extern struct weft_param bulk_params[];

/* Whether comm's rings can run bulk: every channel's connections, both ways,
 * have a transport with bulk transfers, and the ring fits the tags. */
int bulk_possible(const struct weftComm *comm);
#ifdef WEFT_TEST_HOOKS
/* The suites' build only: how many bulk collectives comm has run. */
uint64_t bulk_comm_calls(const struct weftComm *comm);
#endif
/* WEFT_BULK_MIN_NBYTES: the smallest size (all ranks' bytes) worth it. */
size_t bulk_min_nbytes(void);

/* Runs plan (all-reduce, all-gather or reduce-scatter). Collective: every
 * rank must call it for the same plan. Blocks, bounded by the comm's
 * timeout; on an error no transfer refers to the caller's buffers after the
 * return (the connections that carried them are failed; sends a peer may
 * still read go from scratch, which is then kept: bulk.c's lifetime rule),
 * but for a receive cut off mid-message by a peer that stalls. */
weftResult_t bulk_run(struct weftComm *comm, const struct weft_plan *plan);

#endif
