/* ring_steps.h compiled as C, as the host executor compiles it. */
#include "ring_steps_dump.h"

size_t ring_steps_dump_c(const struct ring_geom *g, const int *ring, struct ring_step *out,
                         size_t max, int interleave) {
  return ring_steps_collect(g, ring, out, max, interleave);
}
