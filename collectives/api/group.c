/* Groups: weftGroupStart/End record operations and launch them together,
 * now on the calling thread (and a kept worker thread per further
 * communicator) or later on a host stream's worker. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../transport/base/status.h"
#include "../exec/device/device.h"
#include "../algo/sendrecv.h"
#include "../exec/host/launch.h"
#include "stream.h"
#include "../tune/tuner.h"

static _Thread_local int group_depth;
static _Thread_local struct group_op *group_ops;
static _Thread_local size_t group_nops, group_cap;
static _Thread_local weftResult_t group_error; /* first failure while recording */

int group_active(void) { return group_depth > 0; }

void group_fail(weftResult_t res) {
  if (group_depth > 0 && group_error == weftSuccess) group_error = res;
}

weftResult_t group_record(struct weftComm *comm, const struct weft_plan *plan,
                          weftStream_t stream) {
  if (group_nops == group_cap) {
    size_t cap = group_cap ? group_cap * 2 : 16;
    struct group_op *ops = realloc(group_ops, cap * sizeof *ops);
    if (ops == NULL) return weft_error_set(weftSystemError, "out of memory");
    group_ops = ops;
    group_cap = cap;
  }
  group_ops[group_nops++] = (struct group_op){.comm = comm, .plan = *plan, .stream = stream};
  return weftSuccess;
}

/* --- the public calls ---------------------------------------------------- */

weftResult_t weftGroupStart(void) {
  if (group_depth == 0) group_error = weftSuccess;
  group_depth++;
  return weftSuccess;
}

/* Enqueues the group's operations on device memory on their CUDA streams, in
 * call order, once the whole group is known. */
static weftResult_t group_dispatch_device(const struct group_op *ops, size_t nops) {
  size_t n = 0;
  for (size_t i = 0; i < nops; i++) n += ops[i].plan.on_device != 0;
  if (n == 0) return weftSuccess;
  struct weftComm **comms = malloc(sizeof *comms * n);
  const struct weft_plan **plans = malloc(sizeof *plans * n);
  void **streams = malloc(sizeof *streams * n);
  weftResult_t res = comms && plans && streams
                         ? weftSuccess
                         : weft_error_set(weftSystemError, "out of memory");
  n = 0;
  for (size_t i = 0; i < nops && res == weftSuccess; i++)
    if (ops[i].plan.on_device) {
      comms[n] = ops[i].comm;
      plans[n] = &ops[i].plan;
      streams[n++] = ops[i].stream;
    }
  if (res == weftSuccess) res = device_enqueue_group(comms, plans, streams, n);
  free(comms);
  free(plans);
  free(streams);
  return res;
}

/* Launches ops: each stream's as one item of that stream, the rest now. */
static weftResult_t group_dispatch(const struct group_op *ops, size_t nops) {
  /* a comm's ops run as one batch, so they must agree on their stream */
  for (size_t i = 0; i < nops; i++)
    for (size_t j = 0; j < i; j++)
      if (ops[j].comm == ops[i].comm && ops[j].stream != ops[i].stream)
        return weft_error_set(weftInvalidUsage,
                              "a group uses two streams for one communicator (rank %d)",
                              ops[i].comm->rank);
  struct group_op *part = malloc(sizeof *part * (nops ? nops : 1));
  if (part == NULL) return weft_error_set(weftSystemError, "out of memory");
  weftResult_t res = group_dispatch_device(ops, nops);
  for (size_t i = 0; i < nops && res == weftSuccess; i++) {
    int first = ops[i].stream != NULL && !ops[i].plan.on_device;
    for (size_t j = 0; j < i && first; j++) first = ops[j].stream != ops[i].stream;
    if (!first) continue;
    struct host_stream *s;
    res = stream_lookup(ops[i].stream, &s);
    size_t n = 0;
    for (size_t j = i; j < nops; j++)
      if (ops[j].stream == ops[i].stream) part[n++] = ops[j];
    if (res == weftSuccess) res = stream_enqueue(s, part, n);
  }
  size_t n = 0;
  for (size_t i = 0; i < nops; i++)
    if (ops[i].stream == NULL && !ops[i].plan.on_device) part[n++] = ops[i];
  if (res == weftSuccess && n > 0) res = group_launch(part, n);
  free(part);
  return res;
}

weftResult_t weftGroupEnd(void) {
  if (group_depth == 0)
    return weft_error_set(weftInvalidUsage, "weftGroupEnd without weftGroupStart");
  if (--group_depth > 0) return weftSuccess;
  struct group_op *ops = group_ops;
  size_t nops = group_nops;
  group_ops = NULL;
  group_nops = group_cap = 0;
  weftResult_t res = group_error;
  if (res == weftSuccess) res = group_dispatch(ops, nops);
  free(ops);
  return res;
}

weftResult_t weftGroupSimulateEnd(float *estimatedUs) {
  if (group_depth == 0)
    return weft_error_set(weftInvalidUsage, "weftGroupSimulateEnd without weftGroupStart");
  if (--group_depth > 0) return weftSuccess;
  /* one comm's operations run one after another, comms side by side */
  double longest = 0;
  for (size_t i = 0; i < group_nops; i++) {
    int first = 1;
    for (size_t j = 0; j < i && first; j++) first = group_ops[j].comm != group_ops[i].comm;
    if (!first) continue;
    double us = 0;
    for (size_t j = i; j < group_nops; j++)
      if (group_ops[j].comm == group_ops[i].comm)
        us += plan_estimate_us(group_ops[j].comm, &group_ops[j].plan);
    if (us > longest) longest = us;
  }
  free(group_ops);
  group_ops = NULL;
  group_nops = group_cap = 0;
  weftResult_t res = group_error;
  if (res == weftSuccess && estimatedUs != NULL) *estimatedUs = (float)longest;
  return res;
}
