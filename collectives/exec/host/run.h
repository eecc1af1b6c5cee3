/* The host executor's dispatch (collectives/exec/host/run.c). */
#ifndef WEFT_RUN_H
#define WEFT_RUN_H

#include "../../core/plan.h"

/* Runs plan on the calling thread (the host executor). */
weftResult_t plan_run_host(struct weftComm *comm, const struct weft_plan *plan);

#endif
