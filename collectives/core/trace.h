/* Each communicator's trace: its last WEFT_TRACE_ENTRIES collectives, sends
 * and receives, with their numbers, arguments, states and times, kept in a
 * ring that the calling thread writes and any thread may read (the query
 * thread that tells peers where this rank is, a dump on a signal). Dumped
 * as JSON (docs/diagnosis.md) by weftCommTraceDump, and into WEFT_TRACE_DIR
 * on a timeout, a failure, an abort and a signal the user enables. */
#ifndef WEFT_TRACE_H
#define WEFT_TRACE_H

#include <assert.h>
#include <stdint.h>
#include <stdio.h>

#include "../../include/weft.h"
#include "../../transport/base/param_load.h"
#include "plan.h"

/* The trace's settings: WEFT_TRACE_ENTRIES, WEFT_TRACE_DIR, WEFT_TRACE_SIGNAL,
 * WEFT_HANG_ASK_MS. */
extern struct weft_param trace_params[];
enum trace_param { P_TRACE_ENTRIES, P_TRACE_DIR, P_TRACE_SIGNAL, P_HANG_ASK_MS };

/* A call's state; the names are the JSON's (PyTorch's flight recorder has
 * scheduled, started and completed; waiting is started, stuck on one peer). */
enum trace_state {
  TRACE_SCHEDULED = 0, /* called, not running yet (a group, a host stream) */
  TRACE_STARTED,       /* running */
  TRACE_WAITING,       /* running, a wait on waiting_on has lasted 100 ms or more */
  TRACE_COMPLETED,
  TRACE_FAILED,
  TRACE_NUM_STATES
};
const char *trace_state_name(enum trace_state s);

/* One call: fixed size and no padding, as it travels in answers to peers. */
struct trace_call {
  uint64_t id;             /* the trace's count of calls when it was made, from 1 */
  uint64_t seq;            /* collectives and point-to-point calls are numbered apart, from 1 */
  uint64_t count;          /* the call's count argument */
  int64_t t_created_ns;    /* CLOCK_REALTIME; 0: not yet */
  int64_t t_started_ns;
  int64_t t_done_ns;       /* completed or failed */
  int32_t coll;            /* enum coll_kind */
  int32_t datatype;
  int32_t op;
  int32_t root;            /* the root of broadcast and reduce, the peer of send and recv, else -1 */
  int32_t state;           /* enum trace_state */
  int32_t waiting_on;      /* the rank a stalled wait waits on, else -1 */
  int32_t algo;            /* enum coll_algo, enum coll_proto as planned */
  int32_t proto;
  int32_t nranks;          /* the communicator's */
  int32_t result;          /* weftResult_t once done */
  int32_t on_device;       /* 1: a kernel's on the caller's CUDA stream (its state as
                              its launches' ends say: struct trace_launch) */
  int32_t unused;
};
static_assert(sizeof(struct trace_call) == 96, "trace_call has no hidden padding");

struct trace;

/* A trace for rank of nranks of the job job_hash (bootstrap_job_hash), named
 * name; NULL when WEFT_TRACE_ENTRIES is 0 (every call below takes NULL and
 * does nothing) or out of memory. */
struct trace *trace_create(int rank, int nranks, uint64_t job_hash, const char *name);
void trace_destroy(struct trace *t);
/* From now on a stream's thread writes t too (its calls' states): called
 * by the calling thread before it hands a stream its first call of t. */
void trace_share(struct trace *t);

/* Records plan's call as scheduled, or as started when it starts_now (on
 * the calling thread, at once): returns its id (0 without a trace). */
uint64_t trace_record(struct trace *t, const struct weft_plan *plan, int starts_now);
/* Records plan's call as started and done with result at once: a call
 * that ran on the calling thread and never waited (its times are one clock
 * read). Returns its id (0 without a trace). */
uint64_t trace_record_done(struct trace *t, const struct weft_plan *plan, weftResult_t result);
/* A call on device memory: the comm's kernel launches it went out as,
 * numbered as the comm counts them (launch_done.h), first to last, and the
 * last one's blocks. Its state is what those launches' ends say, which the
 * device executor reads (trace_launch_fn) whenever the trace is read. */
struct trace_launch {
  uint64_t first;
  uint64_t last;
  uint64_t nblocks;
};
/* What a device call's launches say now: *state (TRACE_SCHEDULED: none of
 * them began, as far as the host can tell; TRACE_STARTED; TRACE_COMPLETED;
 * TRACE_FAILED with *result) and, when a block of the comm stopped for
 * want of progress, *waiting_on (else left). Called on any thread that reads
 * the trace; must not block. */
typedef void (*trace_launch_fn)(void *arg, const struct trace_launch *l, int32_t *state,
                                int32_t *result, int32_t *waiting_on);
/* Makes fn(arg) what device calls' states are read from (NULL: none; they
 * read as recorded); returns once no reader uses the previous one. */
void trace_launch_probe_set(struct trace *t, trace_launch_fn fn, void *arg);
/* Records plan's call on device memory, enqueued as launches l: its state
 * from then on is what they say. Returns its id (0 without a trace). */
uint64_t trace_record_launched(struct trace *t, const struct weft_plan *plan,
                               const struct trace_launch *l);
/* The calls a rank tells a peer that asks where it is, oldest first, at
 * most max: from the last completed call before the oldest unfinished one
 * (trace_oldest_unfinished) on, so that the call a stalled peer asks about
 * is there however many calls were queued after it (device calls return
 * once enqueued): where more than max are, max/2 from there and the rest
 * the newest; the latest max where every call completed. How many. */
int trace_window(const struct trace *t, struct trace_call *out, int max);
/* The oldest call of the unbroken run of calls, newest back, that are not
 * completed (running, waiting, failed: where a comm stuck or broke): 1 and
 * *out, or 0 when the newest call completed or there is none. */
int trace_oldest_unfinished(const struct trace *t, struct trace_call *out);

/* The call id enters state; `peer` is the rank it waits on for TRACE_WAITING,
 * result its result for TRACE_COMPLETED and TRACE_FAILED. */
void trace_set_state(struct trace *t, uint64_t id, enum trace_state state, int peer,
                     weftResult_t result);
/* Call id is done with result: completed, or failed. Its end is stamped
 * with the clock when read_clock, else with its start: a call of a few
 * microseconds (the clock's resolution is milliseconds) saves the read. */
void trace_done(struct trace *t, uint64_t id, weftResult_t result, int read_clock);
/* A copy of call id: 1, or 0 when it has left the ring. */
int trace_get(const struct trace *t, uint64_t id, struct trace_call *out);
/* The latest calls, newest last, at most max of them: how many. */
int trace_latest(const struct trace *t, struct trace_call *out, int max);

/* Whether c was refused as it was made (a bad argument, a communicator an
 * earlier failure broke): it never ran, so it says nothing of where its rank
 * stopped. A device call's start is not timed: never counted so. */
static inline int trace_call_refused_at_start(const struct trace_call *c) {
  return c->state == TRACE_FAILED && c->t_started_ns == 0 && !c->on_device;
}
/* WEFT_HANG_ASK_MS in nanoseconds as the trace was made (0: ask only at the timeout). */
uint64_t trace_ask_after_ns(const struct trace *t);

/* Why a dump was written: the JSON's "reason". */
enum trace_reason { TRACE_ON_REQUEST, TRACE_ON_TIMEOUT, TRACE_ON_FAILURE, TRACE_ON_ABORT,
                    TRACE_ON_SIGNAL };
/* Writes the trace as JSON; error, when not NULL, is the failure's text. */
weftResult_t trace_dump(const struct trace *t, FILE *out, enum trace_reason reason,
                        const char *error);
/* The same into WEFT_TRACE_DIR/weft_trace_<job>_rank<R>.json (replaced
 * whole), when WEFT_TRACE_DIR is set; logs where, or why not. */
void trace_dump_to_dir(const struct trace *t, enum trace_reason reason, const char *error);

/* Names for messages and the JSON: "float32", "sum". */
const char *trace_type_name(int32_t datatype);
const char *trace_op_name(int32_t op);
/* CLOCK_REALTIME in nanoseconds. */
int64_t trace_now_ns(void);

#endif
