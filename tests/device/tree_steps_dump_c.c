/* tree_steps.h compiled as C, as the host executor compiles it. */
#include "tree_steps_dump.h"

size_t tree_steps_dump_c(const struct tree_geom *g, struct tree_step *out, size_t max) {
  return tree_steps_collect(g, out, max);
}
