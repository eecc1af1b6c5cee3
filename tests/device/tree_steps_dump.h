// Step sequences of tree_steps.h as each compiler built them: the host C
// compiler (what the host executor runs) and nvcc's host and device passes
// (the latter run by a one-thread kernel). Each writes up to max steps of
// one channel in tree_iter's order and returns how many there are.
#ifndef WEFT_TESTS_TREE_STEPS_DUMP_H
#define WEFT_TESTS_TREE_STEPS_DUMP_H

#include <stddef.h>

#include "collectives/algo/tree_steps.h"

RING_HD size_t tree_steps_collect(const struct tree_geom *g, struct tree_step *out, size_t max) {
  struct tree_iter it;
  struct tree_step st;
  size_t n = 0;
  tree_iter_init(&it, g);
  for (; tree_iter_next(g, &it, &st); n++)
    if (n < max) out[n] = st;
  return n;
}

#ifdef __cplusplus
extern "C" {
#endif

size_t tree_steps_dump_c(const struct tree_geom *g, struct tree_step *out, size_t max);
size_t tree_steps_dump_nvcc_host(const struct tree_geom *g, struct tree_step *out, size_t max);
// -1 without a usable GPU, else the count as above.
long tree_steps_dump_nvcc_device(const struct tree_geom *g, struct tree_step *out, size_t max);

#ifdef __cplusplus
}
#endif
#endif
