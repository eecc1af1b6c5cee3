/* Communication: gradient reductions queued as layers become ready, stage 3
 * gathers with prefetch under a byte bound, and parameter publication (the
 * stage 1-2 all-gather, left in flight for the next forward). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zero_internal.h"

/* A reduceType (fp32: the only wider one) copy of n gradients at src
 * (paramType), for reductions in a wider type. Counted as a bucket. */
static weftResult_t zero_red_copy(struct weftZero *z, const void *src, size_t n,
                                  weftStream_t stream, void **copy_out) {
  WEFT_TRY(zero_pool_take(z, &z->bucket_pool, n * z->red_size, stream, copy_out));
  return z->ops->to_float(src, z->cfg.paramType, *copy_out, n, z->stats, stream);
}

weftResult_t zero_gathers_order(struct weftZero *z, weftStream_t stream) {
  for (int i = 0; i < z->nlayers; i++) {
    struct zero_layer *l = &z->layers[i];
    /* the last publication's write-back (stages 1-2: and all-gather), or a
     * stage 3 gather held or prefetched; the same host stream keeps order */
    if (!l->gather_pending && l->gather_state == ZERO_RELEASED) continue;
    if (zero_same_stream(z, l->gather_stream, stream)) continue;
    if (z->ops->device) {
      WEFT_TRY(z->ops->stream_wait(stream, l->gather_ev));
      continue;
    }
    WEFT_TRY(zero_gather_wait(z, l));
    /* a gathered layer stays held: only its gather is waited for */
    if (l->gather_state != ZERO_RELEASED) WEFT_TRY(z->ops->event_sync(l->gather_ev));
  }
  return weftSuccess;
}

/* A collective about to be queued on stream after reductions queued on
 * another one: every rank must start its collectives in one order (the
 * communicator pairs them so), which two streams do not keep, so it waits
 * for them (on the host now, on a device queued). A reduction waits for
 * them and for the gathers queued on another stream (zero_gathers_order);
 * a stage 3 gather for them. */
static weftResult_t zero_reductions_order(struct weftZero *z, weftStream_t stream) {
  /* the same handle: in order already (a CUDA stream's too, within a step) */
  if (!z->reduced_any || z->reduced_on == stream) return weftSuccess;
  for (int i = 0; i < z->nlayers; i++) {
    const weftEvent_t ev = z->layers[i].red_ev;
    WEFT_TRY(z->ops->device ? z->ops->stream_wait(stream, ev) : z->ops->event_sync(ev));
  }
  for (int b = 0; b < z->nbuckets; b++) {
    const weftEvent_t ev = z->buckets[b].ev;
    WEFT_TRY(z->ops->device ? z->ops->stream_wait(stream, ev) : z->ops->event_sync(ev));
  }
  return weftSuccess;
}

static weftResult_t zero_reduce_order(struct weftZero *z, weftStream_t stream) {
  WEFT_TRY(zero_gathers_order(z, stream));
  WEFT_TRY(zero_reductions_order(z, stream));
  z->reduced_on = stream;
  z->reduced_any = 1;
  return weftSuccess;
}

/* Stage 0: the bucket's in-place all-reduce (sum; step divides). */
static weftResult_t zero_bucket_reduce(struct weftZero *z, struct zero_bucket *b,
                                       weftStream_t stream) {
  WEFT_TRY(zero_reduce_order(z, stream));
  void *grads = (char *)z->grads_full + b->flat_offset * z->param_size;
  void *buf = grads;
  if (z->cfg.reduceType != z->cfg.paramType) {
    WEFT_TRY(zero_red_copy(z, grads, b->count, stream, &b->red_copy));
    buf = b->red_copy;
  }
  WEFT_TRY(zero_weft(
      z, weftAllReduce(buf, buf, b->count, z->cfg.reduceType, weftSum, z->comm, stream),
      "all-reducing a gradient bucket"));
  zero_agree_step_note(z, (int)(b - z->buckets));
  /* the event follows whatever copies were queued, even if one failed */
  weftResult_t queued = weftSuccess;
  for (int i = b->first_layer; i <= b->last_layer && queued == weftSuccess; i++)
    queued = zero_offload_queue(z, &z->layers[i], stream);
  WEFT_TRY(z->ops->event_record(b->ev, stream));
  return queued;
}

/* Stages 1-3: the layer's reduce-scatter, into the full buffer's own slice
 * (stage 1, in place) or into the gradient shard (stages 2-3). A later
 * micro-step's (reduceEveryMicroStep) adds the shard's sum so far into this
 * rank's own part of what it sends: the reduce-scatter's sum then holds it
 * once, and overwrites the shard with the total (no buffer besides). */
static weftResult_t zero_layer_reduce(struct weftZero *z, struct zero_layer *l,
                                      weftStream_t stream) {
  WEFT_TRY(zero_reduce_order(z, stream));
  void *grads = z->cfg.stage == 1 ? (char *)z->grads_full + l->flat_offset * z->param_size
                                  : l->grad_bucket;
  if (grads == NULL) { /* no gradient was asked for: a layer of zeros */
    WEFT_TRY(zero_bucket_take(z, l->padded * z->param_size, &l->grad_bucket));
    grads = l->grad_bucket;
  }
  void *send = grads;
  if (z->cfg.reduceType != z->cfg.paramType) {
    WEFT_TRY(zero_red_copy(z, grads, l->padded, stream, &l->red_copy));
    send = l->red_copy;
  }
  void *own = (char *)send + (size_t)z->rank * l->shard * z->red_size;
  void *shard = (char *)z->grad_shard + l->shard_offset * z->red_size;
  if (z->cfg.stage >= 2 && l->shard_sums > 0) {
    /* the last reduction wrote the shard, on whatever stream it was queued:
     * a host add runs now, a device one is queued behind it */
    WEFT_TRY(z->ops->device ? z->ops->stream_wait(stream, l->red_ev)
                            : z->ops->event_sync(l->red_ev));
    WEFT_TRY(z->ops->add(own, shard, z->cfg.reduceType, l->shard, stream));
  }
  void *recv = z->cfg.stage == 1 ? own : shard;
  WEFT_TRY(zero_weft(
      z, weftReduceScatter(send, recv, l->shard, z->cfg.reduceType, weftSum, z->comm, stream),
      "reduce-scattering a layer's gradients"));
  zero_agree_step_note(z, (int)(l - z->layers));
  l->shard_sums++;
  l->sent = z->cfg.stage >= 2;
  /* the owned gradients go to the host once complete: behind the step's last reduction */
  weftResult_t queued = z->sync ? zero_offload_queue(z, l, stream) : weftSuccess;
  WEFT_TRY(z->ops->event_record(l->red_ev, stream));
  return queued;
}

weftResult_t zero_bucket_take(struct weftZero *z, size_t nbytes, void **ptr_out) {
  size_t allocs = z->bucket_pool.allocs;
  void *p;
  WEFT_TRY(zero_pool_take(z, &z->bucket_pool, nbytes, NULL, &p));
  /* a reused buffer: its reduction is over (given back unordered); on a
   * device the zeroing waits for its own stream only */
  if (z->bucket_pool.allocs == allocs) WEFT_TRY(z->ops->zero(p, nbytes, z->zero_stream));
  *ptr_out = p;
  return weftSuccess;
}

/* Gives the layer's gradient buffers back (their reduction is over). */
static weftResult_t zero_layer_buckets_give(struct weftZero *z, struct zero_layer *l) {
  WEFT_TRY(zero_pool_give(z, &z->bucket_pool, l->grad_bucket, NULL, 0));
  l->grad_bucket = NULL;
  WEFT_TRY(zero_pool_give(z, &z->bucket_pool, l->red_copy, NULL, 0));
  l->red_copy = NULL;
  l->sent = 0;
  return weftSuccess;
}

/* Stages 2-3: gives back the buckets of reductions that have finished. */
weftResult_t zero_buckets_reclaim(struct weftZero *z) {
  if (z->cfg.stage < 2) return weftSuccess;
  for (int i = 0; i < z->nlayers; i++) {
    struct zero_layer *l = &z->layers[i];
    if (!l->sent || !z->ops->event_done(l->red_ev)) continue;
    WEFT_TRY(zero_layer_buckets_give(z, l));
  }
  return weftSuccess;
}

weftResult_t zero_layer_retire(struct weftZero *z, struct zero_layer *l) {
  if (!l->sent) return weftSuccess;
  WEFT_TRY(z->ops->event_sync(l->red_ev));
  return zero_layer_buckets_give(z, l);
}

weftResult_t weftZeroGradReady(weftZero_t z, int layer, weftStream_t stream) {
  if (z == NULL) return zero_fail(weftInvalidArgument, "zero is NULL");
  if (!z->finalized) return zero_fail(weftInvalidUsage, "call weftZeroFinalize first");
  if (layer < 0 || layer >= z->nlayers)
    return zero_fail(weftInvalidArgument, "layer %d does not exist", layer);
  /* accumulating: the last micro-step reduces, unless every one does */
  if (!z->sync && !zero_reduces_micro_steps(z)) return weftSuccess;
  WEFT_TRY(zero_sound(z));
  struct zero_layer *l = &z->layers[layer];
  if (l->reduced)
    return zero_fail(weftInvalidUsage, "layer %d was marked ready twice in one step", layer);
  l->reduced = z->sync;
  /* marked again with no gradient asked for since: what was sent is summed
   * already, this reduction's part is zeros */
  weftResult_t res = zero_layer_retire(z, l);
  if (res == weftSuccess && z->cfg.stage == 0) {
    struct zero_bucket *b = &z->buckets[l->bucket];
    if (--b->pending == 0) res = zero_bucket_reduce(z, b, stream);
  } else if (res == weftSuccess) {
    res = zero_layer_reduce(z, l, stream);
    if (res == weftSuccess) res = zero_buckets_reclaim(z);
  }
  /* the layer counts as reduced, or part of its reduction ran: a step would
   * apply stale gradients (the last step's shard) or a part of the sum */
  if (res != weftSuccess) return zero_break(z, res, "marking layer %d's gradients ready", layer);
  return weftSuccess;
}

weftResult_t zero_grads_reset(struct weftZero *z, weftStream_t stream) {
  /* a step has waited for the reductions already; a load or a destroy has
   * not, and returns a failed wait (the reset goes on all the same) */
  weftResult_t res = weftSuccess;
  for (int i = 0; i < z->nlayers; i++) {
    struct zero_layer *l = &z->layers[i];
    weftResult_t waited = z->ops->event_sync(l->red_ev);
    if (res == weftSuccess) res = waited;
    WEFT_TRY(zero_layer_buckets_give(z, l));
    l->reduced = 0;
    l->shard_sums = 0;
    l->off_queued = 0;
  }
  z->step_order = 0;
  z->step_reductions = 0;
  for (int b = 0; b < z->nbuckets; b++) {
    struct zero_bucket *bk = &z->buckets[b];
    weftResult_t waited = z->ops->event_sync(bk->ev);
    if (res == weftSuccess) res = waited;
    WEFT_TRY(zero_pool_give(z, &z->bucket_pool, bk->red_copy, NULL, 0));
    bk->red_copy = NULL;
    bk->pending = bk->last_layer - bk->first_layer + 1;
  }
  if (z->grads_full != NULL) {
    weftResult_t zeroed = z->ops->zero(z->grads_full, z->psi_padded * z->param_size, stream);
    if (res == weftSuccess) res = zeroed;
  }
  return res;
}

/* Stage 3: a gather buffer that nothing will write (the wait before its
 * all-gather failed, or the all-gather was refused) back to the pool.
 * Ordered on stream: the take may have queued there a wait for the
 * buffer's last user (a release on a compute stream), which the next taker
 * on another stream must wait for too. Unordered where stream takes no
 * event (one weft refused, where no wait was queued either). Returns res,
 * its text kept. */
static weftResult_t zero_gather_undo(struct weftZero *z, void *buf, weftStream_t stream,
                                     weftResult_t res) {
  char why[1024];
  snprintf(why, sizeof why, "%s", weftZeroLastError());
  if (zero_pool_give(z, &z->gather_pool, buf, stream, 1) != weftSuccess)
    (void)zero_pool_give(z, &z->gather_pool, buf, NULL, 0);
  return zero_fail(res, "%s", why);
}

/* Stage 3: queues one layer's all-gather into a buffer of the gather pool.
 * The layer is held, and the last write-back of its shard counts as waited
 * for, once the all-gather is queued: after a failure before that the layer
 * stays released with its write-back pending, its buffer back in the pool
 * (held, the layer would hand out what the buffer had before, another
 * layer's parameters, and a second gather would not run). */
static weftResult_t zero_gather_one(struct weftZero *z, int layer, weftStream_t stream) {
  struct zero_layer *l = &z->layers[layer];
  WEFT_TRY(zero_reductions_order(z, stream));
  void *buf;
  WEFT_TRY(zero_pool_take(z, &z->gather_pool, l->padded * z->param_size, stream, &buf));
  weftResult_t res = weftSuccess;
  /* the step's write-back of the shard, queued on another stream maybe */
  if (l->gather_pending && !zero_same_stream(z, l->gather_stream, stream))
    res = z->ops->stream_wait(stream, l->gather_ev);
  const void *shard = (char *)z->params_shard + l->shard_offset * z->param_size;
  if (res == weftSuccess)
    res = zero_weft(z, weftAllGather(shard, buf, l->shard, z->cfg.paramType, z->comm, stream),
                    "all-gathering a layer's parameters");
  if (res != weftSuccess) return zero_gather_undo(z, buf, stream, res);
  l->gathered = buf;
  l->gather_state = ZERO_GATHERING;
  l->gather_stream = stream;
  l->gather_pending = 0;
  return z->ops->event_record(l->gather_ev, stream);
}

static int zero_gather_fits(const struct weftZero *z, int layer) {
  return zero_pool_fits(z, &z->gather_pool, z->cfg.gatherBoundBytes,
                        z->layers[layer].padded * z->param_size);
}

weftResult_t weftZeroGather(weftZero_t z, int layer, weftStream_t stream, weftEvent_t *ready_out) {
  if (z == NULL) return zero_fail(weftInvalidArgument, "zero is NULL");
  if (!z->finalized) return zero_fail(weftInvalidUsage, "call weftZeroFinalize first");
  if (layer < 0 || layer >= z->nlayers)
    return zero_fail(weftInvalidArgument, "layer %d does not exist", layer);
  struct zero_layer *l = &z->layers[layer];
  if (z->cfg.stage < 3) {
    /* stages 0-2: the last step's write-back of the layer (stages 1-2: and
     * its all-gather); complete before the first step and after one on the
     * NULL stream */
    if (ready_out != NULL) *ready_out = l->gather_ev;
    return weftSuccess;
  }
  if (l->gather_state == ZERO_RELEASED) {
    if (!zero_gather_fits(z, layer))
      return zero_fail(weftInvalidUsage,
                       "gathering layer %d (%zu bytes) would hold %zu bytes of gathered layers, "
                       "over the bound of %zu: release layers first",
                       layer, l->padded * z->param_size,
                       z->mem[ZERO_MEM_GATHERED] + l->padded * z->param_size,
                       z->cfg.gatherBoundBytes);
    WEFT_TRY(zero_gather_one(z, layer, stream));
  }
  /* the direction of travel: forward, or backward from the last layer */
  if (layer > z->last_gather && z->last_gather >= 0) z->gather_dir = 1;
  else if (layer < z->last_gather) z->gather_dir = -1;
  else if (layer == 0) z->gather_dir = 1;
  else if (layer == z->nlayers - 1) z->gather_dir = -1;
  z->last_gather = layer;
  for (int k = 1; k <= z->cfg.prefetchLayers; k++) {
    int next = layer + k * z->gather_dir;
    if (next < 0 || next >= z->nlayers) break;
    if (z->layers[next].gather_state != ZERO_RELEASED) continue;
    if (!zero_gather_fits(z, next)) break; /* every rank decides alike */
    WEFT_TRY(zero_gather_one(z, next, stream));
  }
  if (ready_out != NULL) *ready_out = l->gather_ev;
  return weftSuccess;
}

weftResult_t weftZeroGatherEvent(weftZero_t z, int layer, weftEvent_t *event_out) {
  if (z == NULL || event_out == NULL) return zero_fail(weftInvalidArgument, "NULL argument");
  if (!z->finalized) return zero_fail(weftInvalidUsage, "call weftZeroFinalize first");
  if (layer < 0 || layer >= z->nlayers)
    return zero_fail(weftInvalidArgument, "layer %d does not exist", layer);
  *event_out = z->layers[layer].gather_ev;
  return weftSuccess;
}

/* Gives the layer's buffer back to the pool, with a release on stream when
 * ordered. */
static weftResult_t zero_layer_drop(struct weftZero *z, struct zero_layer *l, weftStream_t stream,
                                    int ordered) {
  WEFT_TRY(zero_pool_give(z, &z->gather_pool, l->gathered, stream, ordered));
  l->gathered = NULL;
  l->gather_state = ZERO_RELEASED;
  return weftSuccess;
}

static weftResult_t zero_release_check(weftZero_t z, int layer) {
  if (z == NULL) return zero_fail(weftInvalidArgument, "zero is NULL");
  if (layer < 0 || layer >= z->nlayers)
    return zero_fail(weftInvalidArgument, "layer %d does not exist", layer);
  return weftSuccess;
}

weftResult_t weftZeroRelease(weftZero_t z, int layer) {
  WEFT_TRY(zero_release_check(z, layer));
  struct zero_layer *l = &z->layers[layer];
  if (z->cfg.stage < 3 || l->gather_state == ZERO_RELEASED) return weftSuccess;
  /* the all-gather may still be writing the buffer, and on a device a
   * caller's kernels on any stream may still read it: the next gather
   * into it may start once both are done */
  WEFT_TRY(z->ops->event_sync(l->gather_ev));
  WEFT_TRY(z->ops->quiesce());
  return zero_layer_drop(z, l, NULL, 0);
}

weftResult_t weftZeroReleaseOn(weftZero_t z, int layer, weftStream_t stream) {
  WEFT_TRY(zero_release_check(z, layer));
  struct zero_layer *l = &z->layers[layer];
  if (z->cfg.stage < 3 || l->gather_state == ZERO_RELEASED) return weftSuccess;
  /* the release follows the gather too, for a layer stream never waited for */
  if (!zero_same_stream(z, l->gather_stream, stream))
    WEFT_TRY(z->ops->stream_wait(stream, l->gather_ev));
  return zero_layer_drop(z, l, stream, 1);
}

weftResult_t zero_gather_wait(struct weftZero *z, struct zero_layer *l) {
  if (!l->gather_pending) return weftSuccess;
  WEFT_TRY(z->ops->event_sync(l->gather_ev));
  l->gather_pending = 0;
  return weftSuccess;
}

weftResult_t zero_release_all(struct weftZero *z) {
  int held = 0;
  for (int i = 0; i < z->nlayers; i++) {
    struct zero_layer *l = &z->layers[i];
    WEFT_TRY(zero_gather_wait(z, l));
    if (l->gather_state == ZERO_RELEASED) continue;
    WEFT_TRY(z->ops->event_sync(l->gather_ev));
    held = 1;
  }
  if (!held) return weftSuccess;
  /* as weftZeroRelease, once for all the layers still held */
  WEFT_TRY(z->ops->quiesce());
  for (int i = 0; i < z->nlayers; i++)
    if (z->layers[i].gather_state != ZERO_RELEASED)
      WEFT_TRY(zero_layer_drop(z, &z->layers[i], NULL, 0));
  return weftSuccess;
}

static weftResult_t allreduce_ctx(struct weftZero *z, double *vals, size_t n, weftRedOp_t op,
                                  weftStream_t stream, const char *what) {
  WEFT_TRY(zero_weft(z, weftAllReduce(vals, vals, n, weftFloat64, op, z->comm, stream), what));
  return z->ops->sync(stream, z->comm, "synchronizing the stream");
}

/* vals (host memory) through context memory */
static weftResult_t allreduce_host(struct weftZero *z, double *vals, size_t n, weftRedOp_t op,
                                   weftStream_t stream, const char *what) {
  if (!z->ops->device) return allreduce_ctx(z, vals, n, op, stream, what);
  double *buf;
  WEFT_TRY(z->ops->alloc((void **)&buf, n * sizeof *buf));
  weftResult_t res;
  WEFT_TRY_GOTO(z->ops->copy(buf, vals, n * sizeof *buf, stream), res, free_buf);
  WEFT_TRY_GOTO(allreduce_ctx(z, buf, n, op, stream, what), res, free_buf);
  res = z->ops->copy(vals, buf, n * sizeof *buf, stream);
free_buf:
  z->ops->free(buf);
  return res;
}

weftResult_t zero_allreduce_sum_ctx(struct weftZero *z, double *vals, size_t n,
                                    weftStream_t stream) {
  return allreduce_ctx(z, vals, n, weftSum, stream, "all-reducing step statistics");
}

weftResult_t zero_allreduce_sum(struct weftZero *z, double *vals, size_t n, weftStream_t stream) {
  return allreduce_host(z, vals, n, weftSum, stream, "all-reducing step statistics");
}

weftResult_t zero_allreduce_max(struct weftZero *z, double *vals, size_t n, weftStream_t stream) {
  return allreduce_host(z, vals, n, weftMax, stream, "agreeing with the other ranks");
}

/* One layer of zero_publish_params: its owned part written back from the
 * master weights, stages 1-2's all-gather queued behind it, and its event. */
static weftResult_t publish_layer(struct weftZero *z, struct zero_layer *l, weftStream_t stream) {
  const int stage = z->cfg.stage;
  /* the last step's gather of the layer may still read or write it */
  WEFT_TRY(zero_gather_wait(z, l));
  const float *master = z->master + l->master_offset;
  void *dst = stage == 3
                  ? (char *)z->params_shard + l->shard_offset * z->param_size
                  : (char *)z->params_full + (l->flat_offset + l->own_offset) * z->param_size;
  if (z->cfg.offloadOptimizer) {
    /* converted on the host, then one copy of paramType over the link,
     * queued (where the ops queue copies) ahead of the layer's all-gather */
    void *staged = (char *)z->off_params + l->master_offset * z->param_size;
    const size_t nbytes = l->own_count * z->param_size;
    WEFT_TRY(z->offload_ops->store(master, z->cfg.paramType, staged, l->own_count, NULL));
    if (z->ops->copy_async != NULL) {
      WEFT_TRY(z->ops->copy_async(dst, staged, nbytes, stream));
      z->off_params_pending = 1;
    } else {
      WEFT_TRY(z->ops->copy(dst, staged, nbytes, stream));
    }
  } else {
    WEFT_TRY(z->ops->store(master, z->cfg.paramType, dst, l->own_count, stream));
  }
  if (stage == 1 || stage == 2) {
    /* queued in layer order, so the first layers arrive first; the next
     * forward waits for each layer's event as it reaches it */
    void *full = (char *)z->params_full + l->flat_offset * z->param_size;
    WEFT_TRY(zero_weft(z, weftAllGather(dst, full, l->shard, z->cfg.paramType, z->comm, stream),
                       "all-gathering updated parameters"));
  }
  /* the NULL stream is waited for by the caller; on the host a write-back
   * is done already, and only stages 1-2's all-gather is in flight */
  if (stream == NULL || (!z->ops->device && stage != 1 && stage != 2)) return weftSuccess;
  /* the layer's event follows what is queued for it (on a device, at every
   * stage: the write-back is a kernel), so that work on another stream may
   * wait for it */
  WEFT_TRY(z->ops->event_record(l->gather_ev, stream));
  l->gather_stream = stream;
  l->gather_pending = 1;
  return weftSuccess;
}

weftResult_t zero_publish_params(struct weftZero *z, weftStream_t stream) {
  /* offloaded: the last publication's copies have read the staging */
  if (z->off_params_pending) {
    WEFT_TRY(z->ops->event_sync(z->off_params_ev));
    z->off_params_pending = 0;
  }
  weftResult_t res = weftSuccess;
  for (int i = 0; i < z->nlayers && res == weftSuccess; i++)
    res = publish_layer(z, &z->layers[i], stream);
  /* after a failure too: the copies queued so far read the staging until
   * this event, which the next publication and destroy wait for */
  if (z->off_params_pending) {
    const weftResult_t recorded = z->ops->event_record(z->off_params_ev, stream);
    if (res == weftSuccess) res = recorded;
  }
  if (res != weftSuccess || stream != NULL) return res;
  /* the NULL stream: everything is complete on return */
  return z->ops->sync(NULL, z->comm, "writing the parameters back");
}
