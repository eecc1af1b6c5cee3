/* Stage 3's gathered buffers: a pool per context, so that a layer gathered
 * again, or another of a size that fits, reuses a buffer a released layer
 * gave back instead of allocating (on a GPU a cudaFree waits for the whole
 * device).
 *
 * A gather takes the smallest idle buffer that holds its layer, else
 * allocates one of the layer's size, first freeing idle buffers (largest
 * first) so that the pool never holds more than the most it had in use at
 * once, nor more than gatherBoundBytes. A buffer given back by
 * weftZeroReleaseOn carries an event recorded on the caller's stream: the
 * gather that takes it next orders its stream after that event (without
 * blocking), and freeing it waits for it. In use, the bytes count as
 * ZERO_MEM_GATHERED (the report's gathered); idle, as gathered_idle. */
#include <stdlib.h>

#include "zero_internal.h"

/* The smallest idle buffer of at least nbytes, or -1. */
static int pool_best_idle(const struct weftZero *z, size_t nbytes) {
  int best = -1;
  for (int i = 0; i < z->ngbufs; i++) {
    const struct zero_gbuf *b = &z->gbufs[i];
    if (b->in_use || b->ptr == NULL || b->nbytes < nbytes) continue;
    if (best < 0 || b->nbytes < z->gbufs[best].nbytes) best = i;
  }
  return best;
}

static int pool_largest_idle(const struct weftZero *z) {
  int big = -1;
  for (int i = 0; i < z->ngbufs; i++) {
    const struct zero_gbuf *b = &z->gbufs[i];
    if (b->in_use || b->ptr == NULL) continue;
    if (big < 0 || b->nbytes > z->gbufs[big].nbytes) big = i;
  }
  return big;
}

/* Frees idle buffer i once its last user's stream has passed its release
 * (a failed wait is returned; the buffer is freed all the same). */
static weftResult_t pool_drop(struct weftZero *z, int i) {
  struct zero_gbuf *b = &z->gbufs[i];
  weftResult_t res = b->ordered ? z->ops->event_sync(b->release_ev) : weftSuccess;
  b->ordered = 0;
  z->ops->free(b->ptr);
  z->gathered_idle -= b->nbytes;
  b->ptr = NULL;
  b->nbytes = 0;
  return res;
}

int zero_same_stream(const struct weftZero *z, weftStream_t a, weftStream_t b) {
  return a == b && !z->ops->device;
}

int zero_pool_fits(const struct weftZero *z, size_t nbytes) {
  return pool_best_idle(z, nbytes) >= 0 || z->cfg.gatherBoundBytes == 0 ||
         z->mem[ZERO_MEM_GATHERED] + nbytes <= z->cfg.gatherBoundBytes;
}

/* A slot for a new buffer: a freed one, or a new one with its event. */
static weftResult_t pool_slot(struct weftZero *z, int *slot_out) {
  for (int i = 0; i < z->ngbufs; i++)
    if (z->gbufs[i].ptr == NULL) {
      *slot_out = i;
      return weftSuccess;
    }
  if (z->ngbufs == z->gbufs_cap) {
    int cap = z->gbufs_cap > 0 ? 2 * z->gbufs_cap : 4;
    struct zero_gbuf *grown = realloc(z->gbufs, (size_t)cap * sizeof *grown);
    if (grown == NULL) return zero_fail(weftSystemError, "out of memory for the gather pool");
    z->gbufs = grown;
    z->gbufs_cap = cap;
  }
  struct zero_gbuf *b = &z->gbufs[z->ngbufs];
  *b = (struct zero_gbuf){0};
  WEFT_TRY(z->ops->event_create(&b->release_ev));
  *slot_out = z->ngbufs++;
  return weftSuccess;
}

/* A new buffer of nbytes, idle ones freed first so that the pool stays
 * within the most it had in use at once (this gather's need included). */
static weftResult_t pool_grow(struct weftZero *z, size_t nbytes, int *buf_out) {
  size_t in_use = z->mem[ZERO_MEM_GATHERED], peak = z->mem_peak[ZERO_MEM_GATHERED];
  size_t limit = in_use + nbytes > peak ? in_use + nbytes : peak;
  int big;
  while (in_use + z->gathered_idle + nbytes > limit && (big = pool_largest_idle(z)) >= 0)
    WEFT_TRY(pool_drop(z, big));
  int i = -1;
  WEFT_TRY(pool_slot(z, &i));
  struct zero_gbuf *b = &z->gbufs[i];
  WEFT_TRY(zero_alloc(z, ZERO_MEM_GATHERED, nbytes, &b->ptr));
  b->nbytes = nbytes;
  b->in_use = 1;
  z->gathered_allocs++;
  *buf_out = i;
  return weftSuccess;
}

weftResult_t zero_pool_take(struct weftZero *z, size_t nbytes, weftStream_t stream,
                            int *buf_out) {
  int i = pool_best_idle(z, nbytes);
  if (i < 0) return pool_grow(z, nbytes, buf_out);
  struct zero_gbuf *b = &z->gbufs[i];
  /* the last user's work on its stream comes before this gather's writes */
  if (b->ordered && !zero_same_stream(z, b->release_stream, stream))
    WEFT_TRY(z->ops->stream_wait(stream, b->release_ev));
  b->ordered = 0;
  b->in_use = 1;
  z->gathered_idle -= b->nbytes;
  z->mem[ZERO_MEM_GATHERED] += b->nbytes;
  if (z->mem[ZERO_MEM_GATHERED] > z->mem_peak[ZERO_MEM_GATHERED])
    z->mem_peak[ZERO_MEM_GATHERED] = z->mem[ZERO_MEM_GATHERED];
  *buf_out = i;
  return weftSuccess;
}

weftResult_t zero_pool_put(struct weftZero *z, int buf, weftStream_t stream, int ordered) {
  struct zero_gbuf *b = &z->gbufs[buf];
  if (ordered) WEFT_TRY(z->ops->event_record(b->release_ev, stream));
  b->ordered = ordered;
  b->release_stream = stream;
  b->in_use = 0;
  z->mem[ZERO_MEM_GATHERED] -= b->nbytes;
  z->gathered_idle += b->nbytes;
  return weftSuccess;
}

weftResult_t zero_pool_destroy(struct weftZero *z) {
  weftResult_t res = weftSuccess;
  for (int i = 0; i < z->ngbufs; i++) {
    struct zero_gbuf *b = &z->gbufs[i];
    if (b->ptr != NULL) {
      if (b->in_use) zero_pool_put(z, i, NULL, 0); /* a release that failed */
      weftResult_t r = pool_drop(z, i);
      if (res == weftSuccess) res = r;
    }
    z->ops->event_destroy(b->release_ev);
  }
  free(z->gbufs);
  z->gbufs = NULL;
  z->ngbufs = z->gbufs_cap = 0;
  return res;
}
