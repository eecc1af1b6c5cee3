/* Host streams: an ordered queue of group launches that a worker thread runs,
 * so that the caller returns at once and overlaps its own work with them. */
#ifndef WEFT_STREAM_H
#define WEFT_STREAM_H

#include "../core/plan.h"
#include "../exec/host/launch.h"

struct host_stream;

/* The host stream behind a weftStream_t, or an error when it is not one. */
weftResult_t stream_lookup(weftStream_t stream, struct host_stream **out);
/* Whether stream is NULL or a live host stream (no error text set). */
int stream_is_host(weftStream_t stream);

/* Copies ops into the stream's queue; the worker runs them with group_launch
 * after everything queued before. Does not block. */
weftResult_t stream_enqueue(struct host_stream *s, const struct group_op *ops, size_t nops);

/* Queues a call of hook(arg) on the stream's worker, after everything queued
 * before (events: collectives/api/stream_event.c). The hook may block the stream
 * (a wait on an event), unless mark says it never blocks (a record), which
 * lets the sends and receives queued behind it start before it runs (the
 * hook still runs once everything before it is done). It owns arg. tag (may
 * be NULL) names the item for stream_run_head. Does not block. */
weftResult_t stream_enqueue_hook(struct host_stream *s, void (*hook)(void *arg), void *arg,
                                 int mark, const void *tag);

/* Runs the item at the head of s on the calling thread when it is sends and
 * receives (with what it takes in), the worker is not running an item, and
 * the item queued last is the hook item named tag: a caller waiting for that
 * mark runs nothing queued behind it. It takes in the items queued before
 * the mark, and the mark; what was queued behind the mark is left to the
 * worker. Returns whether it ran one. Blocks while its sends and receives
 * wait for their peers. */
int stream_run_head(struct host_stream *s, const void *tag);
/* An abort or a revoke of comm: the ops of comm queued on any host stream
 * and not started are taken out (done with res in the trace, off
 * comm->pending), so that the abort waits only for what runs now, not for
 * other communicators' operations queued before them; each item that lost
 * ops fails with res when the stream reaches it (its other ops still run). */
void stream_drop_comm(struct weftComm *comm, weftResult_t res);
#endif
