/* Pools of temporary buffers: stage 3's gathered layers, the gradient
 * buckets with their reduce-type copies, and the step's fp32 gradient. A
 * buffer given back is kept for the next taker instead of being freed, so
 * that a step allocates nothing once the first has run (on a GPU a
 * cudaMalloc costs time and a cudaFree waits for the whole device).
 *
 * A taker gets the smallest idle buffer that holds its bytes, else a new
 * buffer of its size, for which idle buffers are freed first (largest
 * first) so that the pool never holds more than the most it had in use at
 * once, or than its keep (the buckets' budget, bucketBytes: which buckets
 * are held at once depends on when reductions finish, and a pool held to
 * the peak alone would free and allocate again). A buffer given back
 * ordered carries an event recorded on the last user's stream: the next
 * taker orders its own stream after it (without blocking), and freeing it
 * waits for it. In use, the bytes count in the pool's memory category (the
 * report's gathered or buckets); idle, in pool->idle. */
#include <stdlib.h>

#include "zero_internal.h"

/* The smallest idle buffer of at least nbytes, or -1. */
static int pool_best_idle(const struct zero_pool *p, size_t nbytes) {
  int best = -1;
  for (int i = 0; i < p->n; i++) {
    const struct zero_pbuf *b = &p->bufs[i];
    if (b->in_use || b->ptr == NULL || b->nbytes < nbytes) continue;
    if (best < 0 || b->nbytes < p->bufs[best].nbytes) best = i;
  }
  return best;
}

static int pool_largest_idle(const struct zero_pool *p) {
  int big = -1;
  for (int i = 0; i < p->n; i++) {
    const struct zero_pbuf *b = &p->bufs[i];
    if (b->in_use || b->ptr == NULL) continue;
    if (big < 0 || b->nbytes > p->bufs[big].nbytes) big = i;
  }
  return big;
}

/* Frees idle buffer i once its last user's stream has passed its release
 * (a failed wait is returned; the buffer is freed all the same). */
static weftResult_t pool_drop(struct weftZero *z, struct zero_pool *p, int i) {
  struct zero_pbuf *b = &p->bufs[i];
  weftResult_t res = b->ordered ? z->ops->event_sync(b->release_ev) : weftSuccess;
  b->ordered = 0;
  z->ops->free(b->ptr);
  p->idle -= b->nbytes;
  b->ptr = NULL;
  b->nbytes = 0;
  return res;
}

int zero_same_stream(const struct weftZero *z, weftStream_t a, weftStream_t b) {
  return a == b && !z->ops->device;
}

int zero_pool_fits(const struct weftZero *z, const struct zero_pool *p, size_t bound,
                   size_t nbytes) {
  return pool_best_idle(p, nbytes) >= 0 || bound == 0 || z->mem[p->cat] + nbytes <= bound;
}

/* A slot for a new buffer: a freed one, or a new one with its event. */
static weftResult_t pool_slot(struct weftZero *z, struct zero_pool *p, int *slot_out) {
  for (int i = 0; i < p->n; i++)
    if (p->bufs[i].ptr == NULL) {
      *slot_out = i;
      return weftSuccess;
    }
  if (p->n == p->cap) {
    int cap = p->cap > 0 ? 2 * p->cap : 4;
    struct zero_pbuf *grown = realloc(p->bufs, (size_t)cap * sizeof *grown);
    if (grown == NULL) return zero_fail(weftSystemError, "out of memory for a buffer pool");
    p->bufs = grown;
    p->cap = cap;
  }
  struct zero_pbuf *b = &p->bufs[p->n];
  *b = (struct zero_pbuf){0};
  WEFT_TRY(z->ops->event_create(&b->release_ev));
  *slot_out = p->n++;
  return weftSuccess;
}

/* A new buffer of nbytes (zeroed), idle ones freed first so that the pool
 * stays within the most it had in use at once (this need included), or
 * within keep. */
static weftResult_t pool_grow(struct weftZero *z, struct zero_pool *p, size_t nbytes,
                              void **ptr_out) {
  size_t in_use = z->mem[p->cat], peak = z->mem_peak[p->cat];
  size_t limit = in_use + nbytes > peak ? in_use + nbytes : peak;
  if (limit < p->keep) limit = p->keep;
  int big;
  while (in_use + p->idle + nbytes > limit && (big = pool_largest_idle(p)) >= 0)
    WEFT_TRY(pool_drop(z, p, big));
  int i = -1;
  WEFT_TRY(pool_slot(z, p, &i));
  struct zero_pbuf *b = &p->bufs[i];
  WEFT_TRY(zero_alloc(z, p->cat, nbytes, &b->ptr));
  b->nbytes = nbytes;
  b->in_use = 1;
  p->allocs++;
  *ptr_out = b->ptr;
  return weftSuccess;
}

weftResult_t zero_pool_take(struct weftZero *z, struct zero_pool *p, size_t nbytes,
                            weftStream_t stream, void **ptr_out) {
  int i = pool_best_idle(p, nbytes);
  if (i < 0) return pool_grow(z, p, nbytes, ptr_out);
  struct zero_pbuf *b = &p->bufs[i];
  /* the last user's work on its stream comes before this taker's */
  if (b->ordered && !zero_same_stream(z, b->release_stream, stream))
    WEFT_TRY(z->ops->stream_wait(stream, b->release_ev));
  b->ordered = 0;
  b->in_use = 1;
  p->idle -= b->nbytes;
  z->mem[p->cat] += b->nbytes;
  if (z->mem[p->cat] > z->mem_peak[p->cat]) z->mem_peak[p->cat] = z->mem[p->cat];
  *ptr_out = b->ptr;
  return weftSuccess;
}

weftResult_t zero_pool_give(struct weftZero *z, struct zero_pool *p, void *ptr,
                            weftStream_t stream, int ordered) {
  if (ptr == NULL) return weftSuccess;
  int i = 0;
  while (i < p->n && p->bufs[i].ptr != ptr) i++;
  if (i == p->n || !p->bufs[i].in_use)
    return zero_fail(weftInternalError, "a buffer given back to a pool that did not lend it");
  struct zero_pbuf *b = &p->bufs[i];
  if (ordered) WEFT_TRY(z->ops->event_record(b->release_ev, stream));
  b->ordered = ordered;
  b->release_stream = stream;
  b->in_use = 0;
  z->mem[p->cat] -= b->nbytes;
  p->idle += b->nbytes;
  return weftSuccess;
}

weftResult_t zero_pool_destroy(struct weftZero *z, struct zero_pool *p) {
  weftResult_t res = weftSuccess;
  for (int i = 0; i < p->n; i++) {
    struct zero_pbuf *b = &p->bufs[i];
    if (b->ptr != NULL) {
      if (b->in_use) zero_pool_give(z, p, b->ptr, NULL, 0); /* a release that failed */
      weftResult_t r = pool_drop(z, p, i);
      if (res == weftSuccess) res = r;
    }
    z->ops->event_destroy(b->release_ev);
  }
  free(p->bufs);
  *p = (struct zero_pool){.cat = p->cat};
  return res;
}
