/* Launching a group's operations now (collectives/exec/host/launch.c). */
#ifndef WEFT_LAUNCH_H
#define WEFT_LAUNCH_H

#include <stddef.h>

#include "../../core/plan.h"

/* One operation of a group: which comm, what, and on which stream. */
struct group_op {
  struct weftComm *comm;
  struct weft_plan plan;
  weftStream_t stream;
};

/* Runs ops now: each comm's ops on a thread of its own (the caller's for the
 * first), collectives in call order, then that comm's sends and receives
 * together. Returns the first failure. Each comm is held while its own ops
 * run (an abort of it waits for them, not for another comm's); with
 * caller_holds, the caller holds each op's comm once per op (comm_hold) and
 * group_launch ends those holds once it holds the comms itself. */
weftResult_t group_launch(const struct group_op *ops, size_t nops, int caller_holds);
/* group_launch of one collective (not a send or receive) on the calling
 * thread, from the caller's plan: no group_op to copy it into. record: the
 * call is not in the trace yet, and is recorded as started as it runs
 * (hang_watch_record); else plan->trace_id is its entry, scheduled. */
weftResult_t launch_collective(struct weftComm *comm, const struct weft_plan *plan,
                               int record);

/* What every host operation of comm does around its run: holds comm
 * (comm_op_begin) and fails if it is unusable or broken; then releases it,
 * a failure breaking comm unless comm was revoked (what the revocation cut
 * short or refused is its purpose, not comm's state). Returns res. */
weftResult_t launch_op_begin(struct weftComm *comm);
weftResult_t launch_op_end(struct weftComm *comm, weftResult_t res);

#endif
