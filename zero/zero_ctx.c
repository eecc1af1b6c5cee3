/* The context: configuration, registration by layer, flat padded buffers and
 * the memory report. */
#include <math.h>
#include <stdint.h>
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

/* A device context: CUDA usable here, and the current device comm's. */
static weftResult_t zero_ctx_device_check(weftComm_t comm) {
  WEFT_TRY(zero_dev_usable());
  int comm_dev = -1, cur = -1;
  if (weftCommCuDevice(comm, &comm_dev) != weftSuccess)
    return zero_fail(weftInvalidArgument, "comm is not a usable communicator");
  WEFT_TRY(zero_dev_current(&cur));
  if (comm_dev >= 0 && comm_dev != cur)
    return zero_fail(weftInvalidUsage,
                     "device memory: the current CUDA device is %d, the communicator's is %d",
                     cur, comm_dev);
  return weftSuccess;
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
  if (!(c->lr >= 0) || !isfinite(c->lr) || !(c->lossScale > 0))
    return zero_fail(weftInvalidArgument, "lr must be finite and >= 0, and lossScale > 0");
  /* what PyTorch's optimizers refuse: a beta of 1 makes the bias correction
   * 0, and the first step NaN everywhere while it reports success */
  if (c->optimizer == weftZeroAdamW &&
      (!(c->beta1 >= 0 && c->beta1 < 1) || !(c->beta2 >= 0 && c->beta2 < 1)))
    return zero_fail(weftInvalidArgument, "AdamW's betas (%g, %g) must be in [0, 1)", c->beta1,
                     c->beta2);
  if (c->optimizer == weftZeroAdamW && !(c->eps >= 0 && isfinite(c->eps)))
    return zero_fail(weftInvalidArgument, "AdamW's eps %g must be finite and >= 0", c->eps);
  if (c->optimizer == weftZeroSgdMomentum && !(c->momentum >= 0 && isfinite(c->momentum)))
    return zero_fail(weftInvalidArgument, "momentum %g must be finite and >= 0", c->momentum);
  if (!(c->weightDecay >= 0 && isfinite(c->weightDecay)))
    return zero_fail(weftInvalidArgument, "weightDecay %g must be finite and >= 0",
                     c->weightDecay);
  if (isnan(c->maxGradNorm))
    return zero_fail(weftInvalidArgument, "maxGradNorm is NaN (<= 0 turns clipping off)");
  if (c->paramType == weftFloat16 && c->lossScaleWindow < 1)
    return zero_fail(weftInvalidArgument,
                     "lossScaleWindow %d: fp16's dynamic scale doubles after that many clean "
                     "steps, at least 1",
                     c->lossScaleWindow);
  if (c->paramType == weftFloat16 &&
      !(c->lossScale >= ZERO_LOSS_SCALE_MIN && c->lossScale <= ZERO_LOSS_SCALE_MAX))
    return zero_fail(weftInvalidArgument, "lossScale %g: fp16's scale is within [1, 2^24]",
                     c->lossScale);
  if (c->reduceEveryMicroStep != 0 && c->reduceEveryMicroStep != 1)
    return zero_fail(weftInvalidArgument, "reduceEveryMicroStep %d is not 0 or 1",
                     c->reduceEveryMicroStep);
  if (c->memory != weftZeroHostMemory && c->memory != weftZeroDeviceMemory)
    return zero_fail(weftInvalidArgument, "memory %d is not host (0) or device (1)", c->memory);
  if (c->offloadOptimizer != 0 && c->offloadOptimizer != 1)
    return zero_fail(weftInvalidArgument, "offloadOptimizer %d is not 0 or 1",
                     c->offloadOptimizer);
  if (c->offloadThreads < 0 || c->offloadThreads > ZERO_OFFLOAD_THREADS_MAX)
    return zero_fail(weftInvalidArgument, "offloadThreads %d: 0 (as many as the CPUs) to %d",
                     c->offloadThreads, ZERO_OFFLOAD_THREADS_MAX);
  if (c->offloadOptimizer && c->memory != weftZeroDeviceMemory)
    return zero_fail(weftInvalidUsage,
                     "offloadOptimizer moves a device context's optimizer to the host: this "
                     "context's memory is the host's already");
  if (c->memory == weftZeroDeviceMemory) WEFT_TRY(zero_ctx_device_check(comm));
  struct weftZero *z = calloc(1, sizeof *z);
  if (z == NULL) return zero_fail(weftSystemError, "out of memory");
  z->comm = comm;
  z->cfg = *c;
  z->ops = c->memory == weftZeroDeviceMemory ? &zero_ops_device : &zero_ops_host;
  z->offload_ops = &zero_ops_pinned;
  if (z->cfg.offloadThreads == 0) z->cfg.offloadThreads = zero_offload_threads_default();
  z->gather_pool.cat = ZERO_MEM_GATHERED;
  z->bucket_pool.cat = z->step_pool.cat = ZERO_MEM_BUCKETS;
  z->bucket_pool.keep = c->bucketBytes;
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
  if (z->finalize_tried)
    return zero_fail(weftInvalidUsage,
                     "an earlier weftZeroFinalize failed: destroy the context and create a new one");
  if (count == 0 || init == NULL)
    return zero_fail(weftInvalidArgument, "a parameter needs count > 0 and initial values");
  if (layer < 0 || layer < z->nlayers - 1 || layer > z->nlayers)
    return zero_fail(weftInvalidArgument,
                     "layer %d: layers are numbered from 0 and added in order (next is %d or %d)",
                     layer, z->nlayers > 0 ? z->nlayers - 1 : 0, z->nlayers);
  /* every buffer of the model, padded, must have a size in bytes that
   * fits size_t: the elements so far and count, with up to nranks - 1 of
   * padding for each layer, at 4 bytes (the widest type) */
  const size_t max_elems = SIZE_MAX / sizeof(float);
  const size_t pad = (size_t)(z->nranks - 1) * (size_t)(z->nlayers + 1);
  if (count > max_elems || pad > max_elems - count || z->psi > max_elems - count - pad)
    return zero_fail(weftInvalidArgument,
                     "a parameter of %zu elements: with the %zu added so far and padding for "
                     "%d ranks, the model's buffers would exceed %zu elements (their size in "
                     "bytes would not fit size_t)",
                     count, z->psi, z->nranks, max_elems);
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
    /* doubled, up to the limit checked above */
    size_t cap = z->init_cap ? z->init_cap : 1024;
    while (cap < z->psi + count) cap = cap > max_elems / 2 ? z->psi + count : 2 * cap;
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
  p->weight_decay = z->cfg.weightDecay + 0.0; /* -0 as 0: one run with it */
  memcpy(z->init + z->psi, init, count * sizeof *init);
  l->count += count;
  l->nparams++;
  z->psi += count;
  *param_out = (int)z->nparams++;
  return weftSuccess;
}

weftResult_t weftZeroSetParamWeightDecay(weftZero_t z, int param, double weightDecay) {
  if (z == NULL) return zero_fail(weftInvalidArgument, "zero is NULL");
  if (z->finalized || z->finalize_tried)
    return zero_fail(weftInvalidUsage,
                     "a parameter's weight decay is set before weftZeroFinalize");
  if (param < 0 || (size_t)param >= z->nparams)
    return zero_fail(weftInvalidArgument, "parameter %d does not exist", param);
  if (!(weightDecay >= 0 && isfinite(weightDecay)))
    return zero_fail(weftInvalidArgument, "parameter %d: weight decay %g must be finite and >= 0",
                     param, weightDecay);
  z->params[param].weight_decay = weightDecay + 0.0;
  return weftSuccess;
}

/* Appends [begin, begin + count) of the owned range with decay wd to the
 * runs, merged into the last run when its decay is the same. */
static void zero_decay_run_add(struct weftZero *z, size_t begin, size_t count, double wd) {
  if (count == 0) return;
  struct zero_decay_run *last = z->ndecay_runs > 0 ? &z->decay_runs[z->ndecay_runs - 1] : NULL;
  if (last != NULL && last->weight_decay == wd && last->begin + last->count == begin) {
    last->count += count;
    return;
  }
  z->decay_runs[z->ndecay_runs++] = (struct zero_decay_run){begin, count, wd};
}

/* The owned range cut into runs of one weight decay: each layer's owned
 * range [own_offset, own_offset + own_count) intersected with its
 * parameters' [offset, offset + count), then its padding (cfg.weightDecay),
 * at master indices. */
static weftResult_t zero_decay_runs_plan(struct weftZero *z) {
  /* at most a run per parameter and one of padding per layer */
  z->decay_runs = calloc(z->nparams + (size_t)z->nlayers, sizeof *z->decay_runs);
  if (z->decay_runs == NULL) return zero_fail(weftSystemError, "out of memory");
  for (int i = 0; i < z->nlayers; i++) {
    const struct zero_layer *l = &z->layers[i];
    const size_t own_end = l->own_offset + l->own_count;
    for (size_t k = l->first_param; k < l->first_param + l->nparams; k++) {
      const struct zero_param *p = &z->params[k];
      const size_t lo = p->offset > l->own_offset ? p->offset : l->own_offset;
      const size_t hi = p->offset + p->count < own_end ? p->offset + p->count : own_end;
      if (lo < hi)
        zero_decay_run_add(z, l->master_offset + (lo - l->own_offset), hi - lo, p->weight_decay);
    }
    const size_t pad = l->count > l->own_offset ? l->count : l->own_offset;
    if (pad < own_end)
      zero_decay_run_add(z, l->master_offset + (pad - l->own_offset), own_end - pad,
                         z->cfg.weightDecay + 0.0);
  }
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
    WEFT_TRY(z->ops->event_create(&z->buckets[b].ev));
  }
  return weftSuccess;
}

/* The buffers the formulas count, and the step's statistics. */
static weftResult_t zero_ctx_alloc(struct weftZero *z) {
  int stage = z->cfg.stage;
  size_t ps = z->param_size, own = z->own_total * sizeof(float);
  if (stage < 3) WEFT_TRY(zero_alloc(z, ZERO_MEM_PARAMS, z->psi_padded * ps, &z->params_full));
  else WEFT_TRY(zero_alloc(z, ZERO_MEM_PARAMS, z->shard_total * ps, &z->params_shard));
  if (stage < 2) WEFT_TRY(zero_alloc(z, ZERO_MEM_GRADS, z->psi_padded * ps, &z->grads_full));
  else WEFT_TRY(zero_alloc(z, ZERO_MEM_GRADS, z->shard_total * z->red_size, &z->grad_shard));
  WEFT_TRY(zero_alloc(z, ZERO_MEM_OPTIM, own, (void **)&z->master));
  WEFT_TRY(zero_alloc(z, ZERO_MEM_OPTIM, own, (void **)&z->moment1));
  if (z->cfg.optimizer == weftZeroAdamW)
    WEFT_TRY(zero_alloc(z, ZERO_MEM_OPTIM, own, (void **)&z->moment2));
  if (z->cfg.offloadOptimizer) {
    /* the step's gradient and staging, beside the state */
    WEFT_TRY(z->offload_ops->alloc((void **)&z->off_grad, own));
    z->offloaded += own;
    WEFT_TRY(z->offload_ops->alloc(&z->off_stage, own));
    z->offloaded += own;
    WEFT_TRY(z->offload_ops->alloc(&z->off_params, z->own_total * ps));
    z->offloaded += z->own_total * ps;
    WEFT_TRY(z->ops->event_create(&z->off_params_ev));
  }
  /* the statistics, then the step's comparison (zero_agree.c) */
  return z->ops->alloc((void **)&z->stats, (2 + ZERO_AGREE_STEP_N) * sizeof(double));
}

/* Master weights: the owned range of the initial values (padding stays 0),
 * put together in host memory and copied in. */
static weftResult_t zero_master_init(struct weftZero *z) {
  float *host[3];
  WEFT_TRY(zero_state_get(z, host));
  size_t src = 0;
  for (int i = 0; i < z->nlayers; i++) {
    struct zero_layer *l = &z->layers[i];
    for (size_t k = 0; k < l->own_count; k++) {
      size_t e = l->own_offset + k;
      if (e < l->count) host[0][l->master_offset + k] = z->init[src + e];
    }
    src += l->count;
  }
  weftResult_t res = zero_state_put(z, host);
  zero_state_free(z, host);
  if (res != weftSuccess) return res;
  free(z->init);
  z->init = NULL;
  return weftSuccess;
}

weftResult_t weftZeroFinalize(weftZero_t z) {
  if (z == NULL) return zero_fail(weftInvalidArgument, "zero is NULL");
  if (z->finalized) return zero_fail(weftInvalidUsage, "weftZeroFinalize called twice");
  if (z->finalize_tried)
    return zero_fail(weftInvalidUsage,
                     "an earlier weftZeroFinalize failed: destroy the context and create a new one");
  /* first, before anything is allocated: a rank that differs (one with no
   * parameters among them) fails every rank */
  weftResult_t agreed = zero_agree_model(z);
  if (agreed != weftSuccess) {
    z->finalize_tried = 1;
    return agreed;
  }
  /* every rank alike: the empty context takes parameters still */
  if (z->nparams == 0) return zero_fail(weftInvalidUsage, "no parameters were added");
  z->finalize_tried = 1;
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
    WEFT_TRY(z->ops->event_create(&l->gather_ev));
    WEFT_TRY(z->ops->event_create(&l->red_ev));
  }
  z->psi_padded = flat;
  z->shard_total = shard;
  z->own_total = own;
  WEFT_TRY(zero_decay_runs_plan(z));
  WEFT_TRY(z->ops->stream_create(&z->zero_stream));
  WEFT_TRY(zero_ctx_alloc(z));
  if (stage == 0) WEFT_TRY(zero_buckets_plan(z));
  WEFT_TRY(zero_master_init(z));
  /* finalized before the write-back, so that destroy waits for what it
   * queued; stages 1-2 all-gather in it (collective) */
  z->finalized = 1;
  weftResult_t res = zero_publish_params(z, NULL); /* complete on return */
  /* the parameters are partly written: training would start from them */
  if (res != weftSuccess) return zero_break(z, res, "writing back the initial parameters");
  return weftSuccess;
}

weftResult_t weftZeroParam(weftZero_t z, int param, void **ptr_out) {
  if (z == NULL || ptr_out == NULL) return zero_fail(weftInvalidArgument, "NULL argument");
  if (!z->finalized) return zero_fail(weftInvalidUsage, "call weftZeroFinalize first");
  if (param < 0 || (size_t)param >= z->nparams)
    return zero_fail(weftInvalidArgument, "parameter %d does not exist", param);
  const struct zero_param *p = &z->params[param];
  struct zero_layer *l = &z->layers[p->layer];
  if (z->cfg.stage < 3) {
    WEFT_TRY(zero_gather_wait(z, l)); /* the last step's write-back and gather */
    *ptr_out = (char *)z->params_full + (l->flat_offset + p->offset) * z->param_size;
    return weftSuccess;
  }
  if (l->gather_state != ZERO_GATHERING)
    return zero_fail(weftInvalidUsage, "layer %d is not gathered", p->layer);
  if (!z->ops->stream_waits && !z->ops->event_done(l->gather_ev))
    return zero_fail(weftInvalidUsage, "layer %d's gather event was not waited for", p->layer);
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
  /* an earlier micro-step's buffer, sent (reduceEveryMicroStep): this
   * micro-step's gradients go into a new one */
  WEFT_TRY(zero_layer_retire(z, l));
  if (l->grad_bucket == NULL) {
    /* over bucketBytes: wait for the oldest reductions in flight (backward
     * marks layers from the last), so that a bucket is freed first */
    size_t nbytes = l->padded * z->param_size;
    for (int i = z->nlayers - 1; i >= 0 && z->cfg.bucketBytes > 0 &&
                                 z->mem[ZERO_MEM_BUCKETS] + nbytes > z->cfg.bucketBytes;
         i--) {
      if (!z->layers[i].sent) continue;
      WEFT_TRY(z->ops->event_sync(z->layers[i].red_ev));
      WEFT_TRY(zero_buckets_reclaim(z));
    }
    WEFT_TRY(zero_bucket_take(z, l->padded * z->param_size, &l->grad_bucket));
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

weftResult_t weftZeroSetLr(weftZero_t z, double lr) {
  if (z == NULL) return zero_fail(weftInvalidArgument, "zero is NULL");
  if (!(lr >= 0) || !isfinite(lr)) return zero_fail(weftInvalidArgument, "lr must be finite and >= 0");
  z->cfg.lr = lr;
  return weftSuccess;
}

/* params + grads + optimizer: ds bytes a parameter, gs a gradient where
 * sharded (stages 2-3), k of optimizer state. */
static size_t memory_formula(int stage, size_t psi, size_t n, size_t ds, size_t gs, size_t k) {
  switch (stage) {
  case 0: return (2 * ds + k) * psi;
  case 1: return 2 * ds * psi + k * psi / n;
  case 2: return ds * psi + (gs + k) * psi / n;
  case 3: return (ds + gs + k) * psi / n;
  default: return 0;
  }
}

size_t weftZeroMemoryFormula(int stage, size_t psi, int nranks, weftDataType_t paramType,
                             weftZeroOptimizer_t optimizer) {
  if (nranks <= 0) return 0;
  const size_t ds = weftTypeSize(paramType);
  return memory_formula(stage, psi, (size_t)nranks, ds, ds,
                        4 * (size_t)zero_optim_arrays(optimizer));
}

size_t weftZeroMemoryFormulaFor(const weftZeroConfig_t *config, size_t psi, int nranks) {
  if (config == NULL || nranks <= 0) return 0;
  return memory_formula(config->stage, psi, (size_t)nranks, weftTypeSize(config->paramType),
                        weftTypeSize(config->reduceType),
                        4 * (size_t)zero_optim_arrays(config->optimizer));
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
  r->gatheredIdle = z->gather_pool.idle;
  r->gatheredAllocs = z->gather_pool.allocs;
  r->bucketsIdle = z->bucket_pool.idle + z->step_pool.idle;
  r->bucketsAllocs = z->bucket_pool.allocs + z->step_pool.allocs;
  r->offloaded = z->offloaded;
  return weftSuccess;
}

weftResult_t weftZeroDestroy(weftZero_t z) {
  if (z == NULL) return zero_fail(weftInvalidArgument, "zero is NULL");
  weftResult_t res = weftSuccess;
  if (z->finalized) {
    res = zero_release_all(z);
    weftResult_t reset = zero_grads_reset(z, NULL);
    if (res == weftSuccess) res = reset;
  }
  const struct zero_ops *ops = z->ops;
  for (int i = 0; i < z->nlayers; i++) {
    ops->event_destroy(z->layers[i].gather_ev);
    ops->event_destroy(z->layers[i].red_ev);
  }
  weftResult_t pools[] = {zero_pool_destroy(z, &z->gather_pool),
                          zero_pool_destroy(z, &z->bucket_pool),
                          zero_pool_destroy(z, &z->step_pool)};
  for (int i = 0; i < 3; i++)
    if (res == weftSuccess) res = pools[i];
  ops->stream_destroy(z->zero_stream);
  for (int b = 0; b < z->nbuckets; b++) ops->event_destroy(z->buckets[b].ev);
  /* the parameters' last copies, out of pinned memory into the context's,
   * before either is freed */
  if (z->off_params_pending) {
    weftResult_t copied = ops->event_sync(z->off_params_ev);
    if (res == weftSuccess) res = copied;
  }
  void *bufs[] = {z->params_full, z->params_shard, z->grads_full, z->grad_shard, z->stats};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) ops->free(bufs[i]);
  const struct zero_ops *opt = zero_opt_ops(z);
  ops->event_destroy(z->off_params_ev);
  void *state[] = {z->master, z->moment1, z->moment2, z->off_grad, z->off_stage, z->off_params};
  for (size_t i = 0; i < sizeof state / sizeof state[0]; i++) opt->free(state[i]);
  free(z->buckets);
  free(z->decay_runs);
  free(z->layers);
  free(z->params);
  free(z->init);
  free(z->loaded_state);
  free(z);
  return res;
}
