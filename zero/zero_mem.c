/* Allocation by memory category: what weftZeroMemoryReport counts. A leaf:
 * calls nothing else in zero/. */
#include <stdlib.h>

#include "zero_internal.h"

int zero_optim_arrays(weftZeroOptimizer_t optimizer) {
  return optimizer == weftZeroAdamW ? 3 : 2;
}

void *zero_alloc(struct weftZero *z, enum zero_mem cat, size_t nbytes) {
  void *p = calloc(1, nbytes > 0 ? nbytes : 1);
  if (p == NULL) return NULL;
  z->mem[cat] += nbytes;
  if (z->mem[cat] > z->mem_peak[cat]) z->mem_peak[cat] = z->mem[cat];
  return p;
}

void zero_free(struct weftZero *z, enum zero_mem cat, void *ptr, size_t nbytes) {
  if (ptr == NULL) return;
  z->mem[cat] -= nbytes;
  free(ptr);
}
