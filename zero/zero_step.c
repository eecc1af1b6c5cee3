/* The optimizer step on the owned shard: finish reductions, agree on
 * overflow and the global gradient norm, clip, update fp32 master weights
 * (AdamW or SGD with momentum), publish parameters, reset gradients. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zero_internal.h"
#include "zero_math.h"

/* The optimizer on the owned range: coefficients from the configuration and
 * the update count, in double, then the kernel or loop of z->ops once for
 * each run of one weight decay (a model without per-parameter decays has
 * one); offloaded, the host's threads walk the runs within their parts. */
static weftResult_t zero_update(struct weftZero *z, const float *g, weftStream_t stream) {
  const weftZeroConfig_t *c = &z->cfg;
  if (c->optimizer == weftZeroAdamW) {
    double bc1 = 1.0 - pow(c->beta1, (double)z->updates);
    double bc2 = 1.0 - pow(c->beta2, (double)z->updates);
    struct zero_adamw_coef k = {(float)c->beta1, (float)c->beta2, (float)(c->lr / bc1),
                                0, (float)(1.0 / sqrt(bc2)), (float)c->eps};
    if (c->offloadOptimizer) return zero_offload_adamw(z, g, &k, c->lr);
    for (size_t r = 0; r < z->ndecay_runs; r++) {
      const struct zero_decay_run *run = &z->decay_runs[r];
      const size_t b = run->begin;
      k.wd = (float)(c->lr * run->weight_decay);
      WEFT_TRY(z->ops->adamw(z->master + b, z->moment1 + b, z->moment2 + b, g + b, run->count,
                             &k, stream));
    }
    return weftSuccess;
  }
  if (c->offloadOptimizer) return zero_offload_sgd(z, g, (float)c->momentum, (float)c->lr);
  for (size_t r = 0; r < z->ndecay_runs; r++) {
    const struct zero_decay_run *run = &z->decay_runs[r];
    const size_t b = run->begin;
    WEFT_TRY(z->ops->sgd(z->master + b, z->moment1 + b, g + b, run->count, (float)c->momentum,
                         (float)c->lr, (float)run->weight_decay, stream));
  }
  return weftSuccess;
}

/* The averaged gradient of the owned range in fp32 into g, and the step's
 * statistics agreed across ranks into stats: the non-finite count and the
 * sum of squares (the global norm's square). */
static weftResult_t zero_grads_load(struct weftZero *z, float *g, double stats[2],
                                    weftStream_t stream) {
  if (z->cfg.offloadOptimizer) {
    /* summed on the host, agreed below through context memory */
    WEFT_TRY(zero_offload_load(z, g, stats, stream));
    WEFT_TRY(z->ops->copy(z->stats, stats, 2 * sizeof(double), stream));
  } else {
    double scale = 1.0 / ((double)z->nranks * z->cfg.accumSteps * z->loss_scale);
    /* every reduction may be queued on another stream than the step's (the
     * load would read a half-reduced gradient, and the statistics' all-reduce
     * could pass the reductions on the communicator): a step whose work is
     * queued (a device's: stream_waits) is queued behind them all, before it
     * zeroes the statistics, which the reductions' conversions to reduceType
     * use as their scratch; the host tables' work runs now (the staged one's
     * too, on device branches), so it waits for them here */
    for (int i = 0; i < z->nlayers; i++) {
      const struct zero_layer *l = &z->layers[i];
      const weftEvent_t reduced = z->cfg.stage == 0 ? z->buckets[l->bucket].ev : l->red_ev;
      WEFT_TRY(z->ops->stream_waits ? z->ops->stream_wait(stream, reduced)
                                    : z->ops->event_sync(reduced));
    }
    WEFT_TRY(z->ops->zero(z->stats, 2 * sizeof(double), stream));
    for (int i = 0; i < z->nlayers; i++) {
      const struct zero_layer *l = &z->layers[i];
      weftDataType_t type;
      const void *src = zero_owned_grads(z, l, &type);
      WEFT_TRY(z->ops->load_scaled(src, type, g + l->master_offset, l->own_count, scale,
                                   z->stats, stream));
    }
  }
  /* stage 0: every rank holds the whole gradient, rank 0 speaks for all */
  if (z->cfg.stage == 0 && z->rank != 0)
    WEFT_TRY(z->ops->zero(z->stats, 2 * sizeof(double), stream));
  /* the ranks' comparison goes with the statistics (zero_agree.c) */
  double agree[ZERO_AGREE_STEP_N];
  zero_agree_step_values(z, agree);
  WEFT_TRY(z->ops->copy(z->stats + 2, agree, sizeof agree, stream));
  WEFT_TRY(zero_allreduce_sum_ctx(z, z->stats, 2 + ZERO_AGREE_STEP_N, stream));
  WEFT_TRY(z->ops->copy(stats, z->stats, 2 * sizeof(double), stream));
  WEFT_TRY(z->ops->copy(agree, z->stats + 2, sizeof agree, stream));
  return zero_agree_step_check(z, agree);
}

double zero_loss_scale_clamp(double scale) {
  return scale < ZERO_LOSS_SCALE_MIN ? ZERO_LOSS_SCALE_MIN
         : scale > ZERO_LOSS_SCALE_MAX ? ZERO_LOSS_SCALE_MAX
                                       : scale;
}

/* Skips an overflowed step or clips and updates; the loss scale follows. */
static weftResult_t zero_apply(struct weftZero *z, float *g, weftZeroStepInfo_t *out,
                               weftStream_t stream) {
  if (out->skipped) {
    if (z->cfg.paramType == weftFloat16) {
      z->loss_scale = zero_loss_scale_clamp(z->loss_scale / 2);
      z->good_steps = 0;
    }
    return weftSuccess;
  }
  if (z->cfg.maxGradNorm > 0 && out->gradNorm > z->cfg.maxGradNorm) {
    float clip = (float)(z->cfg.maxGradNorm / (out->gradNorm + 1e-6));
    weftResult_t res = z->cfg.offloadOptimizer ? zero_offload_scale(z, g, clip)
                                               : z->ops->scale(g, z->own_total, clip, stream);
    /* the peers go on to their update and publication */
    if (res != weftSuccess) return zero_break(z, res, "clipping the gradients");
  }
  z->updates++;
  weftResult_t res = zero_update(z, g, stream);
  /* the step is complete on return, and g goes back to the pool next */
  if (res == weftSuccess) res = z->ops->sync(stream, z->comm, "updating the shard");
  /* some of the shard may have moved: a second try would move it again,
   * and a save would keep it */
  if (res != weftSuccess) {
    z->state_damaged = 1;
    return zero_break(z, res, "the optimizer's update");
  }
  if (z->cfg.paramType == weftFloat16 && ++z->good_steps >= z->cfg.lossScaleWindow) {
    z->loss_scale = zero_loss_scale_clamp(z->loss_scale * 2);
    z->good_steps = 0;
  }
  return weftSuccess;
}

/* A failed step's fp32 gradient back to the pool once nothing reads it
 * (else held until destroy); returns res, the failure's text kept. */
static weftResult_t zero_step_fail(struct weftZero *z, float *g, weftStream_t stream,
                                   weftResult_t res) {
  char why[1024];
  snprintf(why, sizeof why, "%s", weftZeroLastError());
  if (z->ops->sync(stream, z->comm, "a failed step") == weftSuccess && g != NULL &&
      !z->cfg.offloadOptimizer)
    (void)zero_pool_give(z, &z->step_pool, g, NULL, 0);
  return zero_fail(res, "%s", why);
}

weftResult_t weftZeroStep(weftZero_t z, weftStream_t stream, weftZeroStepInfo_t *info) {
  if (z == NULL) return zero_fail(weftInvalidArgument, "zero is NULL");
  if (!z->finalized) return zero_fail(weftInvalidUsage, "call weftZeroFinalize first");
  WEFT_TRY(zero_sound(z));
  for (int i = 0; i < z->nlayers; i++)
    if (!z->layers[i].reduced)
      return zero_fail(weftInvalidUsage,
                       "layer %d's gradients were not marked ready (with sync on) before the step",
                       i);
  /* From here a failure breaks the engine until a load. The reductions may
   * be incomplete (a failed one is reported once, by the sync below: a second
   * step would apply what they left), or this rank out of step with its
   * peers, which may wait in the statistics' all-reduce below or have gone
   * on to their update and publication (a second step would pair its
   * collectives with those). */
  weftResult_t res = z->ops->sync(stream, z->comm, "finishing the reductions");
  /* gathered stage 3 layers would go stale: drop them */
  if (res == weftSuccess) res = zero_release_all(z);
  /* the fp32 gradient of the owned range, counted as a bucket: the same
   * buffer every step (a new one would cost a cudaMalloc and a cudaFree,
   * which waits for the whole device, every step) */
  float *g = z->off_grad; /* offloaded: the host's, the same every step */
  if (res == weftSuccess && !z->cfg.offloadOptimizer) {
    res = zero_pool_take(z, &z->step_pool, z->own_total * sizeof *g, stream, (void **)&g);
    if (res != weftSuccess) g = NULL;
  }
  double stats[2];
  if (res == weftSuccess) res = zero_grads_load(z, g, stats, stream);
  if (res != weftSuccess) {
    res = zero_break(z, res, "step %ld", z->step + 1);
    return zero_step_fail(z, g, stream, res);
  }
  weftZeroStepInfo_t out = {sqrt(stats[1]), z->loss_scale, stats[0] > 0};
  /* a failure breaks the engine there, naming what failed */
  res = zero_apply(z, g, &out, stream);
  if (res != weftSuccess) return zero_step_fail(z, g, stream, res);
  z->step++;
  /* updated: what fails now leaves this step's gradients, or parameters
   * that are not the master weights */
  if (!z->cfg.offloadOptimizer) res = zero_pool_give(z, &z->step_pool, g, NULL, 0);
  if (res == weftSuccess) res = zero_grads_reset(z, stream);
  if (res != weftSuccess) return zero_break(z, res, "resetting the gradients after step %ld", z->step);
  if (!out.skipped && (res = zero_publish_params(z, stream)) != weftSuccess)
    return zero_break(z, res, "writing back the parameters of step %ld", z->step);
  if (info != NULL) *info = out;
  return weftSuccess;
}

/* Layer l's full fp32 master weights into out (host), through context memory
 * (an offloaded shard copied there first). */
static weftResult_t zero_layer_params(struct weftZero *z, const struct zero_layer *l, float *out,
                                      weftStream_t stream) {
  const float *mine = z->master + l->master_offset;
  if (z->cfg.stage == 0) return zero_opt_ops(z)->copy(out, mine, l->count * sizeof *out, stream);
  const int off = z->cfg.offloadOptimizer;
  float *full;
  WEFT_TRY(z->ops->alloc((void **)&full, (l->padded + (off ? l->shard : 0)) * sizeof *full));
  if (off) {
    /* the shard goes in behind the gathered layer */
    weftResult_t copied = z->ops->copy(full + l->padded, mine, l->shard * sizeof *full, stream);
    if (copied != weftSuccess) {
      z->ops->free(full);
      return copied;
    }
    mine = full + l->padded;
  }
  weftResult_t res = weftAllGather(mine, full, l->shard, weftFloat32, z->comm, stream);
  if (res != weftSuccess) res = zero_fail_weft(res, z->comm, "all-gathering master weights");
  if (res == weftSuccess) res = z->ops->sync(stream, z->comm, "all-gathering master weights");
  if (res == weftSuccess) res = z->ops->copy(out, full, l->count * sizeof *out, stream);
  z->ops->free(full);
  return res;
}

weftResult_t weftZeroGetParams(weftZero_t z, float *out, weftStream_t stream) {
  if (z == NULL || out == NULL) return zero_fail(weftInvalidArgument, "NULL argument");
  if (!z->finalized) return zero_fail(weftInvalidUsage, "call weftZeroFinalize first");
  /* the last step's all-gathers (or stage 3's gathers) on another stream
   * come first on every rank */
  WEFT_TRY(zero_gathers_order(z, stream));
  size_t at = 0;
  for (int i = 0; i < z->nlayers; i++) {
    WEFT_TRY(zero_layer_params(z, &z->layers[i], out + at, stream));
    at += z->layers[i].count;
  }
  return weftSuccess;
}
