/* Allocation by memory category, through the context's ops (host or device
 * memory): what weftZeroMemoryReport counts; the optimizer state's host
 * copies; where a layer's reduced gradients are. A leaf: calls nothing else
 * in zero/ but the ops. */
#include <stdlib.h>

#include "zero_internal.h"

int zero_optim_arrays(weftZeroOptimizer_t optimizer) {
  return optimizer == weftZeroAdamW ? 3 : 2;
}

weftResult_t zero_alloc(struct weftZero *z, enum zero_mem cat, size_t nbytes, void **ptr_out) {
  void *p = NULL;
  const struct zero_ops *ops = cat == ZERO_MEM_OPTIM ? zero_opt_ops(z) : z->ops;
  WEFT_TRY(ops->alloc(&p, nbytes));
  if (cat == ZERO_MEM_OPTIM && z->cfg.offloadOptimizer) z->offloaded += nbytes;
  z->mem[cat] += nbytes;
  if (z->mem[cat] > z->mem_peak[cat]) z->mem_peak[cat] = z->mem[cat];
  *ptr_out = p;
  return weftSuccess;
}

weftResult_t zero_state_copy(struct weftZero *z, float *host_out[3]) {
  float *arrays[3] = {z->master, z->moment1, z->moment2};
  size_t nbytes = z->own_total * sizeof(float);
  for (int a = 0; a < 3; a++) host_out[a] = NULL;
  for (int a = 0; a < 3 && arrays[a] != NULL; a++) {
    host_out[a] = malloc(nbytes > 0 ? nbytes : 1);
    if (host_out[a] == NULL) {
      zero_state_copy_free(host_out);
      return zero_fail(weftSystemError, "out of memory for a host copy of %zu bytes", nbytes);
    }
    weftResult_t res = zero_opt_ops(z)->copy(host_out[a], arrays[a], nbytes, NULL);
    if (res != weftSuccess) {
      zero_state_copy_free(host_out);
      return res;
    }
  }
  return weftSuccess;
}

weftResult_t zero_state_install(struct weftZero *z, float *host[3]) {
  float *arrays[3] = {z->master, z->moment1, z->moment2};
  for (int a = 0; a < 3 && arrays[a] != NULL; a++)
    WEFT_TRY(zero_opt_ops(z)->copy(arrays[a], host[a], z->own_total * sizeof(float), NULL));
  return weftSuccess;
}

void zero_state_copy_free(float *host[3]) {
  for (int a = 0; a < 3; a++) {
    free(host[a]);
    host[a] = NULL;
  }
}

weftResult_t zero_state_get(struct weftZero *z, float *host_out[3]) {
  if (zero_opt_ops(z)->device) return zero_state_copy(z, host_out);
  host_out[0] = z->master;
  host_out[1] = z->moment1;
  host_out[2] = z->moment2;
  return weftSuccess;
}

weftResult_t zero_state_put(struct weftZero *z, float *host[3]) {
  return zero_opt_ops(z)->device ? zero_state_install(z, host) : weftSuccess;
}

void zero_state_free(struct weftZero *z, float *host[3]) {
  if (zero_opt_ops(z)->device) zero_state_copy_free(host);
}

/* Where layer l's reduced gradients of its owned range are: the layout of
 * the step's and the offload's reading. */
const void *zero_owned_grads(const struct weftZero *z, const struct zero_layer *l,
                             weftDataType_t *type_out) {
  int stage = z->cfg.stage;
  int converted = z->cfg.reduceType != z->cfg.paramType;
  *type_out = converted ? z->cfg.reduceType : z->cfg.paramType;
  if (stage == 0) {
    const struct zero_bucket *b = &z->buckets[l->bucket];
    if (converted)
      return (const char *)b->red_copy + (l->flat_offset - b->flat_offset) * z->red_size;
    return (const char *)z->grads_full + l->flat_offset * z->param_size;
  }
  if (stage == 1) {
    if (converted) return (const char *)l->red_copy + l->own_offset * z->red_size;
    return (const char *)z->grads_full + (l->flat_offset + l->own_offset) * z->param_size;
  }
  *type_out = z->cfg.reduceType;
  return (const char *)z->grad_shard + l->shard_offset * z->red_size;
}
