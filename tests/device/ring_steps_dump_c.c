/* ring_steps.h compiled as C, as the host executor compiles it. */
#include "ring_steps_dump.h"

size_t ring_steps_dump_c(const struct ring_geom *g, const int *ring, struct ring_step *out,
                         size_t max, int interleave) {
  size_t n = 0;
  const size_t total = ring_nsteps_total(g);
  for (; n < total && n < max; n++) {
    size_t base;
    int s;
    ring_step_order(g, interleave, n, &base, &s);
    ring_step_at(g, ring, base, s, &out[n]);
  }
  return total;
}
