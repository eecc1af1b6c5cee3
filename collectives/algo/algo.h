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
/* A collective of no elements on this rank: nothing moves, but its ranks
 * must agree that the call has none. Around the ring of ch, k-1 rounds of a
 * slot holding the signature alone, each sent to the next rank after the
 * previous round came in from the previous one: a rank returns success only
 * once every link of the ring compared, and a neighbour in a call with
 * elements finds a slot without them. */
weftResult_t ring_empty_run(struct weftComm *comm, struct weft_channel *ch,
                            const struct weft_plan *plan);
weftResult_t tree_allreduce(struct weftComm *comm, struct weft_channel *ch,
                            const struct weft_plan *plan, size_t offset, size_t count);
weftResult_t rd_allreduce(struct weftComm *comm, struct weft_channel *ch,
                          const struct weft_plan *plan, size_t offset, size_t count);
/* The direct all-reduce, broadcast and reduce (direct.c) run on at most this
 * many ranks. */
#define DIRECT_MAX_RANKS 8
weftResult_t direct_allreduce(struct weftComm *comm, struct weft_channel *ch,
                              const struct weft_plan *plan, size_t offset, size_t count);
weftResult_t direct_broadcast(struct weftComm *comm, struct weft_channel *ch,
                              const struct weft_plan *plan, size_t offset, size_t count);
weftResult_t direct_reduce(struct weftComm *comm, struct weft_channel *ch,
                           const struct weft_plan *plan, size_t offset, size_t count);

#endif
