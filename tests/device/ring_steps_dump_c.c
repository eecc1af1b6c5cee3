/* ring_steps.h compiled as C, as the host executor compiles it. */
#include "ring_steps_dump.h"

size_t ring_steps_dump_c(const struct ring_geom *g, const int *ring, struct ring_step *out,
                         size_t max) {
  size_t n = 0;
  for (size_t base = 0; base < g->count; base += ring_loop_nelems(g))
    for (int s = 0; s < ring_loop_nsteps(g); s++, n++)
      if (n < max) ring_step_at(g, ring, base, s, &out[n]);
  return n;
}
