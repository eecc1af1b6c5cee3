/* The context: configuration, registration by layer, flat padded buffers and
 * the memory report. */
#include <stdlib.h>
#include <string.h>

#include "zero_internal.h"

void weftZeroConfigDefaults(weftZeroConfig_t *config) {
  if (config == NULL) return;
  memset(config, 0, sizeof *config);
  config->stage = 0;
  config->paramType = weftFloat32;
  config->reduceType = weftFloat32;
  config->optimizer = weftZeroAdamW;
  config->lr = 1e-3;
  config->beta1 = 0.9;
  config->beta2 = 0.999;
  config->eps = 1e-8;
  config->momentum = 0.9;
  config->weightDecay = 0.0;
  config->maxGradNorm = 0.0;
  config->accumSteps = 1;
  config->bucketBytes = 4u << 20;
  config->gatherBoundBytes = 0;
  config->prefetchLayers = 1;
  config->lossScale = 65536.0;
  config->lossScaleWindow = 100;
}

weftResult_t weftZeroCreate(weftZero_t *zero, weftComm_t comm, const weftZeroConfig_t *config) {
  if (zero == NULL || comm == NULL || config == NULL)
    return zero_fail(weftInvalidArgument, "zero, comm and config must not be NULL");
  const weftZeroConfig_t *c = config;
  if (c->stage < 0 || c->stage > 3)
    return zero_fail(weftInvalidArgument, "stage %d is not 0, 1, 2 or 3", c->stage);
  if (!zero_type_ok(c->paramType))
    return zero_fail(weftInvalidArgument, "paramType %d is not fp32, bf16 or fp16", c->paramType);
  if (c->reduceType != c->paramType && c->reduceType != weftFloat32)
    return zero_fail(weftInvalidArgument, "reduceType must be paramType or fp32");
  if (c->optimizer != weftZeroAdamW && c->optimizer != weftZeroSgdMomentum)
    return zero_fail(weftInvalidArgument, "optimizer %d is unknown", c->optimizer);
  if (c->accumSteps < 1)
    return zero_fail(weftInvalidArgument, "accumSteps %d: at least 1", c->accumSteps);
  if (c->prefetchLayers < 0)
    return zero_fail(weftInvalidArgument, "prefetchLayers %d is negative", c->prefetchLayers);
  if (!(c->lr >= 0) || !(c->lossScale > 0))
    return zero_fail(weftInvalidArgument, "lr must be >= 0 and lossScale > 0");
  struct weftZero *z = calloc(1, sizeof *z);
  if (z == NULL) return zero_fail(weftSystemError, "out of memory");
  z->comm = comm;
  z->cfg = *c;
  if (weftCommUserRank(comm, &z->rank) != weftSuccess ||
      weftCommCount(comm, &z->nranks) != weftSuccess) {
    free(z);
    return zero_fail(weftInvalidArgument, "comm is not a usable communicator");
  }
  z->param_size = weftTypeSize(c->paramType);
  z->red_size = weftTypeSize(c->reduceType);
  z->sync = 1;
  z->loss_scale = c->paramType == weftFloat16 ? c->lossScale : 1.0;
  z->last_gather = -1;
  z->gather_dir = 1;
  *zero = z;
  return weftSuccess;
}

weftResult_t weftZeroAddParam(weftZero_t z, int layer, size_t count, const float *init,
                              int *param_out) {
  if (z == NULL || param_out == NULL) return zero_fail(weftInvalidArgument, "NULL argument");
  if (z->finalized) return zero_fail(weftInvalidUsage, "parameters are added before weftZeroFinalize");
  if (count == 0 || init == NULL)
    return zero_fail(weftInvalidArgument, "a parameter needs count > 0 and initial values");
  if (layer < 0 || layer < z->nlayers - 1 || layer > z->nlayers)
    return zero_fail(weftInvalidArgument,
                     "layer %d: layers are numbered from 0 and added in order (next is %d or %d)",
                     layer, z->nlayers > 0 ? z->nlayers - 1 : 0, z->nlayers);
  if (layer == z->nlayers) {
    struct zero_layer *grown = realloc(z->layers, (size_t)(layer + 1) * sizeof *grown);
    if (grown == NULL) return zero_fail(weftSystemError, "out of memory");
    z->layers = grown;
    memset(&z->layers[layer], 0, sizeof z->layers[layer]);
    z->layers[layer].first_param = z->nparams;
    z->nlayers++;
  }
  if (z->nparams == z->params_cap) {
    size_t cap = z->params_cap ? 2 * z->params_cap : 16;
    struct zero_param *grown = realloc(z->params, cap * sizeof *grown);
    if (grown == NULL) return zero_fail(weftSystemError, "out of memory");
    z->params = grown;
    z->params_cap = cap;
  }
  if (z->psi + count > z->init_cap) {
    size_t cap = z->init_cap ? 2 * z->init_cap : 1024;
    while (cap < z->psi + count) cap *= 2;
    float *grown = realloc(z->init, cap * sizeof *grown);
    if (grown == NULL) return zero_fail(weftSystemError, "out of memory");
    z->init = grown;
    z->init_cap = cap;
  }
  struct zero_layer *l = &z->layers[layer];
  struct zero_param *p = &z->params[z->nparams];
  p->layer = layer;
  p->offset = l->count;
  p->count = count;
  memcpy(z->init + z->psi, init, count * sizeof *init);
  l->count += count;
  l->nparams++;
  z->psi += count;
  *param_out = (int)z->nparams++;
  return weftSuccess;
}

/* Stage 0 buckets: from the last layer back (the order backward marks
 * them), consecutive layers until a bucket reaches bucketBytes. */
static weftResult_t zero_buckets_plan(struct weftZero *z) {
  z->buckets = calloc((size_t)z->nlayers, sizeof *z->buckets);
  if (z->buckets == NULL) return zero_fail(weftSystemError, "out of memory");
  int nb = 0;
  for (int l = z->nlayers - 1; l >= 0;) {
    struct zero_bucket *b = &z->buckets[nb];
    b->last_layer = l;
    size_t count = 0;
    int first = l;
    while (first >= 0) {
      count += z->layers[first].padded;
      z->layers[first].bucket = nb;
      first--;
      if (count * z->param_size >= z->cfg.bucketBytes) break;
    }
    b->first_layer = first + 1;
    b->flat_offset = z->layers[b->first_layer].flat_offset;
    b->count = count;
    l = first;
    nb++;
  }
  z->nbuckets = nb;
  for (int b = 0; b < nb; b++) {
    z->buckets[b].pending = z->buckets[b].last_layer - z->buckets[b].first_layer + 1;
    if (weftEventCreate(&z->buckets[b].ev) != weftSuccess)
      return zero_fail(weftSystemError, "creating an event");
  }
  return weftSuccess;
}

weftResult_t weftZeroFinalize(weftZero_t z) {
  if (z == NULL) return zero_fail(weftInvalidArgument, "zero is NULL");
  if (z->finalized) return zero_fail(weftInvalidUsage, "weftZeroFinalize called twice");
  if (z->nparams == 0) return zero_fail(weftInvalidUsage, "no parameters were added");
  int stage = z->cfg.stage;
  size_t flat = 0, shard = 0, own = 0;
  for (int i = 0; i < z->nlayers; i++) {
    struct zero_layer *l = &z->layers[i];
    l->padded = weftZeroPadded(l->count, z->nranks);
    l->shard = l->padded / (size_t)z->nranks;
    l->flat_offset = flat;
    l->shard_offset = shard;
    l->own_offset = stage == 0 ? 0 : (size_t)z->rank * l->shard;
    l->own_count = stage == 0 ? l->padded : l->shard;
    l->master_offset = own;
    flat += l->padded;
    shard += l->shard;
    own += l->own_count;
    if (weftEventCreate(&l->gather_ev) != weftSuccess || weftEventCreate(&l->red_ev) != weftSuccess)
      return zero_fail(weftSystemError, "creating an event");
  }
  z->psi_padded = flat;
  z->shard_total = shard;
  z->own_total = own;
  size_t ps = z->param_size;
  if (stage < 3) z->params_full = zero_alloc(z, ZERO_MEM_PARAMS, flat * ps);
  else z->params_shard = zero_alloc(z, ZERO_MEM_PARAMS, shard * ps);
  if (stage < 2) z->grads_full = zero_alloc(z, ZERO_MEM_GRADS, flat * ps);
  else z->grad_shard = zero_alloc(z, ZERO_MEM_GRADS, shard * z->red_size);
  z->master = zero_alloc(z, ZERO_MEM_OPTIM, own * sizeof(float));
  z->moment1 = zero_alloc(z, ZERO_MEM_OPTIM, own * sizeof(float));
  if (z->cfg.optimizer == weftZeroAdamW)
    z->moment2 = zero_alloc(z, ZERO_MEM_OPTIM, own * sizeof(float));
  if ((stage < 3 ? z->params_full : z->params_shard) == NULL ||
      (stage < 2 ? z->grads_full : z->grad_shard) == NULL || z->master == NULL ||
      z->moment1 == NULL || (z->cfg.optimizer == weftZeroAdamW && z->moment2 == NULL))
    return zero_fail(weftSystemError, "out of memory for %zu parameters", z->psi);
  if (stage == 0) WEFT_TRY(zero_buckets_plan(z));
  /* master weights: the owned range of the initial values (padding stays 0) */
  size_t src = 0;
  for (int i = 0; i < z->nlayers; i++) {
    struct zero_layer *l = &z->layers[i];
    for (size_t k = 0; k < l->own_count; k++) {
      size_t e = l->own_offset + k;
      if (e < l->count) z->master[l->master_offset + k] = z->init[src + e];
    }
    src += l->count;
  }
  free(z->init);
  z->init = NULL;
  z->finalized = 1;
  return zero_publish_params(z, NULL);
}

weftResult_t weftZeroParam(weftZero_t z, int param, void **ptr_out) {
  if (z == NULL || ptr_out == NULL) return zero_fail(weftInvalidArgument, "NULL argument");
  if (!z->finalized) return zero_fail(weftInvalidUsage, "call weftZeroFinalize first");
  if (param < 0 || (size_t)param >= z->nparams)
    return zero_fail(weftInvalidArgument, "parameter %d does not exist", param);
  const struct zero_param *p = &z->params[param];
  struct zero_layer *l = &z->layers[p->layer];
  if (z->cfg.stage < 3) {
    WEFT_TRY(zero_gather_wait(z, l)); /* stages 1-2: the last step's gather */
    *ptr_out = (char *)z->params_full + (l->flat_offset + p->offset) * z->param_size;
    return weftSuccess;
  }
  if (l->gather_state != ZERO_GATHERING || weftEventQuery(l->gather_ev) != weftSuccess)
    return zero_fail(weftInvalidUsage,
                     "layer %d is not gathered, or its gather's event was not waited for",
                     p->layer);
  *ptr_out = (char *)l->gathered + p->offset * z->param_size;
  return weftSuccess;
}

weftResult_t weftZeroGrad(weftZero_t z, int param, void **ptr_out) {
  if (z == NULL || ptr_out == NULL) return zero_fail(weftInvalidArgument, "NULL argument");
  if (!z->finalized) return zero_fail(weftInvalidUsage, "call weftZeroFinalize first");
  if (param < 0 || (size_t)param >= z->nparams)
    return zero_fail(weftInvalidArgument, "parameter %d does not exist", param);
  const struct zero_param *p = &z->params[param];
  struct zero_layer *l = &z->layers[p->layer];
  if (l->reduced)
    return zero_fail(weftInvalidUsage,
                     "layer %d's gradients are being reduced: they change again after the step",
                     p->layer);
  if (z->cfg.stage < 2) {
    *ptr_out = (char *)z->grads_full + (l->flat_offset + p->offset) * z->param_size;
    return weftSuccess;
  }
  if (l->grad_bucket == NULL) {
    /* over bucketBytes: wait for the oldest reductions in flight (backward
     * marks layers from the last), so that a bucket is freed first */
    size_t nbytes = l->padded * z->param_size;
    for (int i = z->nlayers - 1; i >= 0 && z->cfg.bucketBytes > 0 &&
                                 z->mem[ZERO_MEM_BUCKETS] + nbytes > z->cfg.bucketBytes;
         i--) {
      if (!z->layers[i].reduced || z->layers[i].grad_bucket == NULL) continue;
      if (weftEventSynchronize(z->layers[i].red_ev) != weftSuccess)
        return zero_fail(weftInternalError, "waiting for a reduction");
      zero_buckets_reclaim(z);
    }
    l->grad_bucket = zero_alloc(z, ZERO_MEM_BUCKETS, l->padded * z->param_size);
    if (l->grad_bucket == NULL) return zero_fail(weftSystemError, "out of memory");
  }
  *ptr_out = (char *)l->grad_bucket + p->offset * z->param_size;
  return weftSuccess;
}

weftResult_t weftZeroSetSync(weftZero_t z, int sync) {
  if (z == NULL) return zero_fail(weftInvalidArgument, "zero is NULL");
  z->sync = sync != 0;
  return weftSuccess;
}

double weftZeroLossScale(weftZero_t z) { return z != NULL ? z->loss_scale : 1.0; }
long weftZeroStepCount(weftZero_t z) { return z != NULL ? z->step : 0; }

size_t weftZeroMemoryFormula(int stage, size_t psi, int nranks, weftDataType_t paramType,
                             weftZeroOptimizer_t optimizer) {
  if (nranks <= 0) return 0;
  size_t ds = weftTypeSize(paramType);
  size_t k = 4 * (size_t)zero_optim_arrays(optimizer);
  size_t n = (size_t)nranks;
  switch (stage) {
  case 0: return (2 * ds + k) * psi;
  case 1: return 2 * ds * psi + k * psi / n;
  case 2: return ds * psi + (ds + k) * psi / n;
  case 3: return (2 * ds + k) * psi / n;
  default: return 0;
  }
}

weftResult_t weftZeroMemoryReport(weftZero_t z, weftZeroMemory_t *r) {
  if (z == NULL || r == NULL) return zero_fail(weftInvalidArgument, "NULL argument");
  memset(r, 0, sizeof *r);
  r->psi = z->psi;
  r->psiPadded = z->psi_padded;
  r->params = z->mem[ZERO_MEM_PARAMS];
  r->grads = z->mem[ZERO_MEM_GRADS];
  r->optimizer = z->mem[ZERO_MEM_OPTIM];
  r->buckets = z->mem[ZERO_MEM_BUCKETS];
  r->bucketsPeak = z->mem_peak[ZERO_MEM_BUCKETS];
  r->gathered = z->mem[ZERO_MEM_GATHERED];
  r->gatheredPeak = z->mem_peak[ZERO_MEM_GATHERED];
  return weftSuccess;
}

weftResult_t weftZeroDestroy(weftZero_t z) {
  if (z == NULL) return zero_fail(weftInvalidArgument, "zero is NULL");
  weftResult_t res = weftSuccess;
  if (z->finalized) {
    res = zero_release_all(z);
    zero_grads_reset(z);
  }
  for (int i = 0; i < z->nlayers; i++) {
    if (z->layers[i].gather_ev != NULL) weftEventDestroy(z->layers[i].gather_ev);
    if (z->layers[i].red_ev != NULL) weftEventDestroy(z->layers[i].red_ev);
  }
  for (int b = 0; b < z->nbuckets; b++)
    if (z->buckets[b].ev != NULL) weftEventDestroy(z->buckets[b].ev);
  free(z->params_full);
  free(z->params_shard);
  free(z->grads_full);
  free(z->grad_shard);
  free(z->master);
  free(z->moment1);
  free(z->moment2);
  free(z->buckets);
  free(z->layers);
  free(z->params);
  free(z->init);
  free(z);
  return res;
}
