/* Single-copy all-reduce, all-gather, reduce-scatter, broadcast and reduce
 * for ranks that share a host, through mappings of each other's buffers or
 * cross-memory attach (collectives/algo/cma.c). */
#ifndef WEFT_CMA_H
#define WEFT_CMA_H

#include <stddef.h>

#include "../../transport/base/param.h"
#include "../core/comm.h"
#include "../core/plan.h"

extern struct weft_param cma_params[];

/* Whether comm may run single-copy: every rank on this host, rings over
 * shared memory, and no earlier probe found cross-memory attach refused. */
int cma_possible(const struct weftComm *comm);
/* Whether cross-memory attach works between comm's ranks: 0 untried, 1 it
 * does, -1 a probe found it refused (then comm never tries it again). */
int cma_comm_usable(const struct weftComm *comm);
/* WEFT_CMA_MIN_NBYTES: the smallest size (all ranks' bytes) worth it for
 * coll (a reduce's: WEFT_CMA_REDUCE_MIN_NBYTES where larger). */
size_t cma_min_nbytes(enum coll_kind coll);

#ifdef WEFT_TEST_HOOKS
/* The suites' build only: how many calls on comm copied single-copy (not
 * the ring that a reduce on unmapped buffers, or a refused probe, runs
 * after the address exchange). */
uint64_t cma_ran_count(const struct weftComm *comm);
#endif

/* Runs plan (any collective but point-to-point) single-copy; falls
 * back to the ring when the first call's probe finds that ranks may not read
 * each other. Collective: every rank must call it for the same plan. Blocks
 * (bounded by the comm's timeout). */
weftResult_t cma_run(struct weftComm *comm, const struct weft_plan *plan);

#endif
