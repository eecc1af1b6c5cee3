/* How a comm knows that its kernels ended without an event recorded after
 * each launch (a third of a microsecond of the host's time a call, and more
 * where it flushes the launch: docs/cuda.md, "Where the enqueue goes").
 *
 * Each block of a launch writes the launch's number into its own word of
 * the comm's mapped host memory as it ends (dev_done_report,
 * prims_device.cuh). The comm's launches end in launch order: on one stream
 * by the stream's order, and a launch on another stream than the comm's
 * last one goes behind a gate (kernels_gate.cu), one warp that holds the
 * stream until every block of that last launch has ended. So once each
 * block of the last launch has written its number, every earlier launch
 * has ended too, and destroy and abort wait for exactly the comm's own
 * work, whatever streams it went to and whether they still exist.
 *
 * Plain C over the words, so the host tests run it (test_launch_done). */
#ifndef WEFT_LAUNCH_DONE_H
#define WEFT_LAUNCH_DONE_H

#include <stdint.h>

#include "dev_types.h"

/* A comm's launches so far, as the host made them. */
struct launch_done {
  uint64_t seq;     /* launches counted (the last one's number) */
  int nblocks;      /* of the last one */
  uintptr_t stream; /* the last one's stream, */
  uintptr_t thread; /* and where that is the per-thread stream (one handle
                       for every thread's own), the calling thread; else 0 */
};

/* Whether every counted launch has ended, read from the ended words. */
static inline int launch_done_ended(const struct launch_done *t, const uint64_t *ended) {
  for (int b = 0; b < t->nblocks; b++)
    if (__atomic_load_n(&ended[b], __ATOMIC_ACQUIRE) < t->seq) return 0;
  return 1;
}

/* Whether a call's launches on stream (thread: as struct launch_done's)
 * go behind a gate: the comm's last launch went to another stream and has
 * not ended. A stream a graph captures gets none: a graph's order is its
 * owner's. */
static inline int launch_done_gated(const struct launch_done *t, const uint64_t *ended,
                                    uintptr_t stream, uintptr_t thread, int captured) {
  if (captured || t->seq == 0 || (t->stream == stream && t->thread == thread)) return 0;
  return !launch_done_ended(t, ended);
}

/* What the next launch carries (*out): its number and the device view of
 * the ended words, the failed word and the error word, or nothing to
 * report when captured (a graph's replays are its owner's to wait for). */
static inline void launch_done_fill(const struct launch_done *t, uint64_t *ended_d,
                                    uint64_t *failed_d, const uint32_t *error_d, int captured,
                                    struct dev_done *out) {
  out->ended = captured ? (uint64_t *)0 : ended_d;
  out->failed = captured ? (uint64_t *)0 : failed_d;
  out->error = error_d;
  out->seq = captured ? 0 : t->seq + 1;
}

/* Counts a launch of nblocks on stream (thread: as struct launch_done's)
 * made with what launch_done_fill gave (nothing when it was captured). */
static inline void launch_done_commit(struct launch_done *t, const struct dev_done *d,
                                      uintptr_t stream, uintptr_t thread, int nblocks) {
  if (d->ended == (uint64_t *)0) return;
  t->seq = d->seq;
  t->nblocks = nblocks;
  t->stream = stream;
  t->thread = thread;
}

/* Where a call's launches first..last stand (the last one has nblocks
 * blocks), as the host can tell from the ended words (nwords of them) and
 * the failed word (dev_done's), read after them: */
enum launch_state {
  LAUNCH_QUEUED,  /* the comm's launch before first has not begun to end */
  LAUNCH_RUNNING, /* it has (a block of it ended): first is the comm's current work */
  LAUNCH_OK,      /* every block of last ended, before any launch of the comm failed */
  LAUNCH_FAILED,  /* every block of last ended, and it or an earlier one failed */
};
/* The newest launch any of the ended words (nwords) names. */
static inline uint64_t launch_done_newest(const uint64_t *ended, int nwords) {
  uint64_t newest = 0;
  for (int b = 0; b < nwords; b++) {
    const uint64_t e = __atomic_load_n(&ended[b], __ATOMIC_ACQUIRE);
    if (e > newest) newest = e;
  }
  return newest;
}
static inline enum launch_state launch_done_state(const uint64_t *ended, int nwords,
                                                  const uint64_t *failed, uint64_t first,
                                                  uint64_t last, int nblocks) {
  int all = nblocks > 0;
  for (int b = 0; b < nblocks && all; b++)
    if (__atomic_load_n(&ended[b], __ATOMIC_ACQUIRE) < last) all = 0;
  if (!all) {
    const uint64_t newest = launch_done_newest(ended, nwords);
    return first <= 1 || newest + 1 >= first ? LAUNCH_RUNNING : LAUNCH_QUEUED;
  }
  /* a block names a failed launch before it reports its end */
  const uint64_t f = __atomic_load_n(failed, __ATOMIC_ACQUIRE);
  return f != 0 && f <= last ? LAUNCH_FAILED : LAUNCH_OK;
}

#endif
