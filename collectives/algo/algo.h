/* The channel algorithms that the host executor runs (ring, tree, rd, direct) and
 * that others fall back to. */
#ifndef WEFT_ALGO_H
#define WEFT_ALGO_H

#include <stddef.h>

#include "../core/plan.h"

/* Algorithms: one channel's share of the buffers, elements [offset, offset +
 * count) of the buffer (all-reduce, broadcast, reduce) or of each rank's block
 * (all-gather, reduce-scatter). */
typedef weftResult_t (*algo_fn)(struct weftComm *comm, struct weft_channel *ch,
                                const struct weft_plan *plan, size_t offset, size_t count);
/* Every ring collective (plan->coll): the steps of ring_steps.h, run with
 * the host primitives of plan->proto. */
weftResult_t ring_run(struct weftComm *comm, struct weft_channel *ch, const struct weft_plan *plan,
                      size_t offset, size_t count);
weftResult_t tree_allreduce(struct weftComm *comm, struct weft_channel *ch,
                            const struct weft_plan *plan, size_t offset, size_t count);
weftResult_t rd_allreduce(struct weftComm *comm, struct weft_channel *ch,
                          const struct weft_plan *plan, size_t offset, size_t count);
/* The direct all-reduce (direct.c) runs on at most this many ranks. */
#define DIRECT_MAX_RANKS 8
weftResult_t direct_allreduce(struct weftComm *comm, struct weft_channel *ch,
                              const struct weft_plan *plan, size_t offset, size_t count);

#endif
