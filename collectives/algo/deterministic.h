/* WEFT_DETERMINISTIC=1: reductions in a fixed order (collectives/algo/deterministic.c). */
#ifndef WEFT_DETERMINISTIC_H
#define WEFT_DETERMINISTIC_H

#include "../core/plan.h"

/* Whether plan's call runs in the fixed order: a reduction (all-reduce,
 * reduce-scatter, reduce) with WEFT_DETERMINISTIC=1. */
int det_applies(const struct weft_plan *plan);

/* Runs plan's reduction in the fixed order, on the host executor, with two or
 * more ranks. Blocks (bounded by the comm's timeout). A mismatch between the
 * ranks' calls is weftInvalidUsage on every rank, found before data moves. */
weftResult_t det_run(struct weftComm *comm, const struct weft_plan *plan);

#endif
