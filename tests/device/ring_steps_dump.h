// Step sequences of ring_steps.h as each compiler built them: the host C
// compiler (what the host executor runs), nvcc's host pass, and nvcc's device
// pass (run by a one-thread kernel). Each writes up to max steps, in the
// order of `interleave` loops at a time (struct ring_iter), and returns how
// many the channel's share takes.
#ifndef WEFT_TESTS_RING_STEPS_DUMP_H
#define WEFT_TESTS_RING_STEPS_DUMP_H

#include <stddef.h>

#include "collectives/algo/ring_steps.h"

// The steps of one channel in ring_iter's order, written up to max; returns
// how many there are. Compiled by whichever compiler includes it (the C
// and nvcc dumps below each run their own compile of it).
RING_HD size_t ring_steps_collect(const struct ring_geom *g, const int *ring,
                                  struct ring_step *out, size_t max, int interleave) {
  struct ring_iter it;
  ring_iter_init(&it, g, interleave);
  size_t n = 0, base;
  int s;
  for (; ring_iter_next(&it, &base, &s); n++)
    if (n < max) ring_step_at(g, ring, base, s, &out[n]);
  return n;
}

#ifdef __cplusplus
extern "C" {
#endif

size_t ring_steps_dump_c(const struct ring_geom *g, const int *ring, struct ring_step *out,
                         size_t max, int interleave);
size_t ring_steps_dump_nvcc_host(const struct ring_geom *g, const int *ring,
                                 struct ring_step *out, size_t max, int interleave);
// -1 without a usable GPU, else the count as above.
long ring_steps_dump_nvcc_device(const struct ring_geom *g, const int *ring,
                                 struct ring_step *out, size_t max, int interleave);

#ifdef __cplusplus
}
#endif
#endif
