/* Communication: gradient reductions queued as layers become ready, stage 3
 * gathers with prefetch under a byte bound, and parameter publication (the
 * stage 1-2 all-gather, left in flight for the next forward). */
#include <stdlib.h>
#include <string.h>

#include "zero_internal.h"

/* A reduceType copy of n gradients at src (paramType), for reductions in a
 * wider type. Counted as a bucket. */
static void *zero_red_copy(struct weftZero *z, const void *src, size_t n) {
  void *copy = zero_alloc(z, ZERO_MEM_BUCKETS, n * z->red_size);
  if (copy == NULL) return NULL;
  for (size_t i = 0; i < n; i++)
    zero_store(copy, z->cfg.reduceType, i, zero_load(src, z->cfg.paramType, i));
  return copy;
}

/* Stage 0: the bucket's in-place all-reduce (sum; step divides). */
static weftResult_t zero_bucket_reduce(struct weftZero *z, struct zero_bucket *b,
                                       weftStream_t stream) {
  void *grads = (char *)z->grads_full + b->flat_offset * z->param_size;
  void *buf = grads;
  if (z->cfg.reduceType != z->cfg.paramType) {
    b->red_copy = zero_red_copy(z, grads, b->count);
    if (b->red_copy == NULL) return zero_fail(weftSystemError, "out of memory");
    buf = b->red_copy;
  }
  WEFT_TRY(zero_weft(
      z, weftAllReduce(buf, buf, b->count, z->cfg.reduceType, weftSum, z->comm, stream),
      "all-reducing a gradient bucket"));
  WEFT_TRY(zero_weft(z, weftEventRecord(b->ev, stream), "recording a bucket event"));
  return weftSuccess;
}

/* Stages 1-3: the layer's reduce-scatter, into the full buffer's own slice
 * (stage 1, in place) or into the gradient shard (stages 2-3). */
static weftResult_t zero_layer_reduce(struct weftZero *z, struct zero_layer *l,
                                      weftStream_t stream) {
  void *grads = z->cfg.stage == 1 ? (char *)z->grads_full + l->flat_offset * z->param_size
                                  : l->grad_bucket;
  if (grads == NULL) { /* no gradient was asked for: a layer of zeros */
    l->grad_bucket = zero_alloc(z, ZERO_MEM_BUCKETS, l->padded * z->param_size);
    if (l->grad_bucket == NULL) return zero_fail(weftSystemError, "out of memory");
    grads = l->grad_bucket;
  }
  void *send = grads;
  if (z->cfg.reduceType != z->cfg.paramType) {
    l->red_copy = zero_red_copy(z, grads, l->padded);
    if (l->red_copy == NULL) return zero_fail(weftSystemError, "out of memory");
    send = l->red_copy;
  }
  void *recv = z->cfg.stage == 1 ? (char *)send + (size_t)z->rank * l->shard * z->red_size
                                 : (char *)z->grad_shard + l->shard_offset * z->red_size;
  WEFT_TRY(zero_weft(
      z, weftReduceScatter(send, recv, l->shard, z->cfg.reduceType, weftSum, z->comm, stream),
      "reduce-scattering a layer's gradients"));
  WEFT_TRY(zero_weft(z, weftEventRecord(l->red_ev, stream), "recording a reduction event"));
  return weftSuccess;
}

/* Stages 2-3: gives back the buckets of reductions that have finished. */
void zero_buckets_reclaim(struct weftZero *z) {
  if (z->cfg.stage < 2) return;
  for (int i = 0; i < z->nlayers; i++) {
    struct zero_layer *l = &z->layers[i];
    if (!l->reduced || l->grad_bucket == NULL || weftEventQuery(l->red_ev) != weftSuccess)
      continue;
    zero_free(z, ZERO_MEM_BUCKETS, l->grad_bucket, l->padded * z->param_size);
    zero_free(z, ZERO_MEM_BUCKETS, l->red_copy, l->padded * z->red_size);
    l->grad_bucket = NULL;
    l->red_copy = NULL;
  }
}

weftResult_t weftZeroGradReady(weftZero_t z, int layer, weftStream_t stream) {
  if (z == NULL) return zero_fail(weftInvalidArgument, "zero is NULL");
  if (!z->finalized) return zero_fail(weftInvalidUsage, "call weftZeroFinalize first");
  if (layer < 0 || layer >= z->nlayers)
    return zero_fail(weftInvalidArgument, "layer %d does not exist", layer);
  if (!z->sync) return weftSuccess; /* accumulating: the last micro-step reduces */
  struct zero_layer *l = &z->layers[layer];
  if (l->reduced)
    return zero_fail(weftInvalidUsage, "layer %d was marked ready twice in one step", layer);
  l->reduced = 1;
  if (z->cfg.stage == 0) {
    struct zero_bucket *b = &z->buckets[l->bucket];
    if (--b->pending == 0) WEFT_TRY(zero_bucket_reduce(z, b, stream));
    return weftSuccess;
  }
  WEFT_TRY(zero_layer_reduce(z, l, stream));
  zero_buckets_reclaim(z);
  return weftSuccess;
}

void zero_grads_reset(struct weftZero *z) {
  for (int i = 0; i < z->nlayers; i++) {
    struct zero_layer *l = &z->layers[i];
    weftEventSynchronize(l->red_ev);
    zero_free(z, ZERO_MEM_BUCKETS, l->grad_bucket, l->padded * z->param_size);
    zero_free(z, ZERO_MEM_BUCKETS, l->red_copy, l->padded * z->red_size);
    l->grad_bucket = NULL;
    l->red_copy = NULL;
    l->reduced = 0;
  }
  for (int b = 0; b < z->nbuckets; b++) {
    struct zero_bucket *bk = &z->buckets[b];
    weftEventSynchronize(bk->ev);
    zero_free(z, ZERO_MEM_BUCKETS, bk->red_copy, bk->count * z->red_size);
    bk->red_copy = NULL;
    bk->pending = bk->last_layer - bk->first_layer + 1;
  }
  if (z->grads_full != NULL) memset(z->grads_full, 0, z->psi_padded * z->param_size);
}

/* Stage 3: queues one layer's all-gather into a new buffer. */
static weftResult_t zero_gather_one(struct weftZero *z, int layer, weftStream_t stream) {
  struct zero_layer *l = &z->layers[layer];
  size_t nbytes = l->padded * z->param_size;
  l->gathered = zero_alloc(z, ZERO_MEM_GATHERED, nbytes);
  if (l->gathered == NULL) return zero_fail(weftSystemError, "out of memory");
  l->gather_state = ZERO_GATHERING;
  const void *shard = (char *)z->params_shard + l->shard_offset * z->param_size;
  WEFT_TRY(zero_weft(
      z, weftAllGather(shard, l->gathered, l->shard, z->cfg.paramType, z->comm, stream),
      "all-gathering a layer's parameters"));
  WEFT_TRY(zero_weft(z, weftEventRecord(l->gather_ev, stream), "recording a gather event"));
  return weftSuccess;
}

static int zero_gather_fits(const struct weftZero *z, int layer) {
  size_t nbytes = z->layers[layer].padded * z->param_size;
  return z->cfg.gatherBoundBytes == 0 ||
         z->mem[ZERO_MEM_GATHERED] + nbytes <= z->cfg.gatherBoundBytes;
}

weftResult_t weftZeroGather(weftZero_t z, int layer, weftStream_t stream, weftEvent_t *ready_out) {
  if (z == NULL) return zero_fail(weftInvalidArgument, "zero is NULL");
  if (!z->finalized) return zero_fail(weftInvalidUsage, "call weftZeroFinalize first");
  if (layer < 0 || layer >= z->nlayers)
    return zero_fail(weftInvalidArgument, "layer %d does not exist", layer);
  struct zero_layer *l = &z->layers[layer];
  if (z->cfg.stage < 3) {
    /* stages 1-2: the last step's gather of the layer (complete when none
     * was recorded: stage 0, before the first step, or a NULL stream) */
    if (ready_out != NULL) *ready_out = l->gather_ev;
    return weftSuccess;
  }
  if (l->gather_state == ZERO_RELEASED) {
    if (!zero_gather_fits(z, layer))
      return zero_fail(weftInvalidUsage,
                       "gathering layer %d (%zu bytes) would hold %zu bytes, over the bound of "
                       "%zu: release layers first",
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

weftResult_t weftZeroRelease(weftZero_t z, int layer) {
  if (z == NULL) return zero_fail(weftInvalidArgument, "zero is NULL");
  if (layer < 0 || layer >= z->nlayers)
    return zero_fail(weftInvalidArgument, "layer %d does not exist", layer);
  struct zero_layer *l = &z->layers[layer];
  if (z->cfg.stage < 3 || l->gather_state == ZERO_RELEASED) return weftSuccess;
  /* the all-gather may still be writing the buffer */
  WEFT_TRY(zero_weft(z, weftEventSynchronize(l->gather_ev), "waiting for a gather"));
  zero_free(z, ZERO_MEM_GATHERED, l->gathered, l->padded * z->param_size);
  l->gathered = NULL;
  l->gather_state = ZERO_RELEASED;
  return weftSuccess;
}

weftResult_t zero_gather_wait(struct weftZero *z, struct zero_layer *l) {
  if (!l->gather_pending) return weftSuccess;
  WEFT_TRY(zero_weft(z, weftEventSynchronize(l->gather_ev), "waiting for a parameter gather"));
  l->gather_pending = 0;
  return weftSuccess;
}

weftResult_t zero_release_all(struct weftZero *z) {
  for (int i = 0; i < z->nlayers; i++) {
    WEFT_TRY(zero_gather_wait(z, &z->layers[i]));
    WEFT_TRY(weftZeroRelease(z, i));
  }
  return weftSuccess;
}

weftResult_t zero_allreduce_sum(struct weftZero *z, double *vals, size_t n, weftStream_t stream) {
  WEFT_TRY(zero_weft(z, weftAllReduce(vals, vals, n, weftFloat64, weftSum, z->comm, stream),
                     "all-reducing step statistics"));
  if (stream != NULL)
    WEFT_TRY(zero_weft(z, weftStreamSynchronize(stream), "synchronizing the stream"));
  return weftSuccess;
}

weftResult_t zero_publish_params(struct weftZero *z, weftStream_t stream) {
  int stage = z->cfg.stage;
  for (int i = 0; i < z->nlayers; i++) {
    struct zero_layer *l = &z->layers[i];
    /* the last step's gather of the layer may still read or write it */
    WEFT_TRY(zero_gather_wait(z, l));
    const float *master = z->master + l->master_offset;
    void *dst = stage == 3
                    ? (char *)z->params_shard + l->shard_offset * z->param_size
                    : (char *)z->params_full + (l->flat_offset + l->own_offset) * z->param_size;
    for (size_t k = 0; k < l->own_count; k++) zero_store(dst, z->cfg.paramType, k, master[k]);
    if (stage != 1 && stage != 2) continue;
    /* queued in layer order, so the first layers arrive first; the next
     * forward waits for each layer's event as it reaches it */
    void *full = (char *)z->params_full + l->flat_offset * z->param_size;
    WEFT_TRY(zero_weft(z, weftAllGather(dst, full, l->shard, z->cfg.paramType, z->comm, stream),
                       "all-gathering updated parameters"));
    if (stream == NULL) continue; /* complete already */
    WEFT_TRY(zero_weft(z, weftEventRecord(l->gather_ev, stream), "recording a gather event"));
    l->gather_pending = 1;
  }
  return weftSuccess;
}
