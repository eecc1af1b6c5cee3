/* ring_steps.h compiled as C, as the host executor compiles it. */
#include "ring_steps_dump.h"

size_t ring_steps_dump_c(const struct ring_geom *g, const int *ring, struct ring_step *out,
                         size_t max, int interleave) {
  struct ring_iter o;
  ring_iter_init(&o, g, interleave);
  size_t n = 0, base;
  int s;
  for (; ring_iter_next(&o, &base, &s); n++)
    if (n < max) ring_step_at(g, ring, base, s, &out[n]);
  return n;
}
