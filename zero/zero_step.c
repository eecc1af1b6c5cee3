/* The optimizer step on the owned shard: finish reductions, agree on
 * overflow and the global gradient norm, clip, update fp32 master weights
 * (AdamW or SGD with momentum), publish parameters, reset gradients. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "zero_internal.h"
#include "zero_math.h"

/* Where the reduced gradients of layer l's owned range are, and their type. */
static const void *zero_owned_grads(const struct weftZero *z, const struct zero_layer *l,
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

static void zero_update(struct weftZero *z, const float *g, size_t n, size_t at) {
  const weftZeroConfig_t *c = &z->cfg;
  float *p = z->master + at, *m = z->moment1 + at;
  if (c->optimizer == weftZeroAdamW) {
    float *v = z->moment2 + at;
    double bc1 = 1.0 - pow(c->beta1, (double)z->updates);
    double bc2 = 1.0 - pow(c->beta2, (double)z->updates);
    struct zero_adamw_coef k = {(float)c->beta1, (float)c->beta2, (float)(c->lr / bc1),
                                (float)(c->lr * c->weightDecay), (float)(1.0 / sqrt(bc2)),
                                (float)c->eps};
    for (size_t i = 0; i < n; i++) zero_adamw_elem(&p[i], &m[i], &v[i], g[i], &k);
  } else {
    float mu = (float)c->momentum, lr = (float)c->lr, wd = (float)c->weightDecay;
    for (size_t i = 0; i < n; i++) zero_sgd_elem(&p[i], &m[i], g[i], mu, lr, wd);
  }
}

weftResult_t weftZeroStep(weftZero_t z, weftStream_t stream, weftZeroStepInfo_t *info) {
  if (z == NULL) return zero_fail(weftInvalidArgument, "zero is NULL");
  if (!z->finalized) return zero_fail(weftInvalidUsage, "call weftZeroFinalize first");
  for (int i = 0; i < z->nlayers; i++)
    if (!z->layers[i].reduced)
      return zero_fail(weftInvalidUsage,
                       "layer %d's gradients were not marked ready (with sync on) before the step",
                       i);
  if (stream != NULL)
    WEFT_TRY(zero_weft(z, weftStreamSynchronize(stream), "finishing the reductions"));
  /* gathered stage 3 layers would go stale: drop them */
  WEFT_TRY(zero_release_all(z));

  /* the averaged gradient of the owned range, in fp32 */
  float *g = malloc((z->own_total > 0 ? z->own_total : 1) * sizeof *g);
  if (g == NULL) return zero_fail(weftSystemError, "out of memory");
  double scale = 1.0 / ((double)z->nranks * z->cfg.accumSteps * z->loss_scale);
  double sumsq = 0, nonfinite = 0;
  for (int i = 0; i < z->nlayers; i++) {
    const struct zero_layer *l = &z->layers[i];
    weftDataType_t type;
    const void *src = zero_owned_grads(z, l, &type);
    float *dst = g + l->master_offset;
    for (size_t k = 0; k < l->own_count; k++) {
      float v = (float)(zero_load(src, type, k) * scale);
      if (!isfinite(v)) nonfinite += 1;
      dst[k] = v;
      sumsq += (double)v * v;
    }
  }
  /* stage 0: every rank holds the whole gradient, rank 0 speaks for all */
  double stats[2] = {nonfinite, z->cfg.stage == 0 && z->rank != 0 ? 0.0 : sumsq};
  if (z->cfg.stage == 0 && z->rank != 0) stats[0] = 0;
  weftResult_t res;
  WEFT_TRY_GOTO(zero_allreduce_sum(z, stats, 2, stream), res, free_grads);
  weftZeroStepInfo_t out = {sqrt(stats[1]), z->loss_scale, stats[0] > 0};
  if (out.skipped) {
    if (z->cfg.paramType == weftFloat16) {
      z->loss_scale /= 2;
      z->good_steps = 0;
    }
  } else {
    if (z->cfg.maxGradNorm > 0 && out.gradNorm > z->cfg.maxGradNorm) {
      float clip = (float)(z->cfg.maxGradNorm / (out.gradNorm + 1e-6));
      for (size_t k = 0; k < z->own_total; k++) g[k] *= clip;
    }
    z->updates++;
    zero_update(z, g, z->own_total, 0);
    if (z->cfg.paramType == weftFloat16 && ++z->good_steps >= z->cfg.lossScaleWindow) {
      z->loss_scale *= 2;
      z->good_steps = 0;
    }
  }
  free(g);
  z->step++;
  zero_grads_reset(z);
  if (!out.skipped) WEFT_TRY(zero_publish_params(z, stream));
  if (info != NULL) *info = out;
  return weftSuccess;
free_grads:
  free(g);
  return res;
}

weftResult_t weftZeroGetParams(weftZero_t z, float *out, weftStream_t stream) {
  if (z == NULL || out == NULL) return zero_fail(weftInvalidArgument, "NULL argument");
  if (!z->finalized) return zero_fail(weftInvalidUsage, "call weftZeroFinalize first");
  size_t at = 0;
  for (int i = 0; i < z->nlayers; i++) {
    const struct zero_layer *l = &z->layers[i];
    if (z->cfg.stage == 0) {
      memcpy(out + at, z->master + l->master_offset, l->count * sizeof *out);
    } else {
      float *full = malloc(l->padded * sizeof *full);
      if (full == NULL) return zero_fail(weftSystemError, "out of memory");
      weftResult_t res = weftAllGather(z->master + l->master_offset, full, l->shard, weftFloat32,
                                       z->comm, stream);
      if (res == weftSuccess && stream != NULL) res = weftStreamSynchronize(stream);
      if (res != weftSuccess) {
        free(full);
        return zero_fail_weft(res, z->comm, "all-gathering master weights");
      }
      memcpy(out + at, full, l->count * sizeof *out);
      free(full);
    }
    at += l->count;
  }
  return weftSuccess;
}
