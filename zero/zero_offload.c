/* offloadOptimizer (ZeRO-Offload): a device context's optimizer state in
 * pinned host memory. The owned gradients come to the host behind their
 * reductions, the update runs on the host's threads, and the parameters go
 * back in their type (zero_publish_params). The update is elementwise, so
 * cutting the range among threads changes no bit. */
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>

#include "zero_internal.h"

/* Where layer l's owned gradients go in the host's staging. */
static void *zero_offload_staged(const struct weftZero *z, const struct zero_layer *l,
                                 weftDataType_t type) {
  return (char *)z->off_stage + l->master_offset * weftTypeSize(type);
}

weftResult_t zero_offload_queue(struct weftZero *z, struct zero_layer *l, weftStream_t stream) {
  if (!z->cfg.offloadOptimizer || z->ops->copy_async == NULL) return weftSuccess;
  weftDataType_t type;
  const void *src = zero_owned_grads(z, l, &type);
  WEFT_TRY(z->ops->copy_async(zero_offload_staged(z, l, type), src,
                              l->own_count * weftTypeSize(type), stream));
  l->off_queued = 1;
  return weftSuccess;
}

weftResult_t zero_offload_load(struct weftZero *z, float *g, double stats[2],
                               weftStream_t stream) {
  const struct zero_ops *off = z->offload_ops;
  double scale = 1.0 / ((double)z->nranks * z->cfg.accumSteps * z->loss_scale);
  stats[0] = stats[1] = 0;
  for (int i = 0; i < z->nlayers; i++) {
    const struct zero_layer *l = &z->layers[i];
    weftDataType_t type;
    const void *src = zero_owned_grads(z, l, &type);
    const size_t tsize = weftTypeSize(type);
    void *staged = zero_offload_staged(z, l, type);
    /* the reduction, on whatever stream it was queued, and the copy queued
     * behind it; where none was (ops that copy at once), the copy below
     * reads the gradients once the reduction is over */
    WEFT_TRY(z->ops->event_sync(z->cfg.stage == 0 ? z->buckets[l->bucket].ev : l->red_ev));
    if (!l->off_queued) WEFT_TRY(z->ops->copy(staged, src, l->own_count * tsize, stream));
    WEFT_TRY(off->load_scaled(staged, type, g + l->master_offset, l->own_count, scale, stats,
                              NULL));
  }
  return weftSuccess;
}

int zero_offload_threads_default(void) {
  int cpus = 1;
#ifdef CPU_COUNT
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) cpus = CPU_COUNT(&set);
#endif
  /* the ranks of this host share its CPUs, where the launcher says how many
   * (weftrun, torchrun) */
  const char *names[] = {"WEFT_LOCAL_SIZE", "LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    const char *v = getenv(names[i]);
    int local = v != NULL ? atoi(v) : 0;
    if (local > 0) {
      cpus /= local;
      break;
    }
  }
  return cpus < 1 ? 1 : cpus > ZERO_OFFLOAD_THREADS_MAX ? ZERO_OFFLOAD_THREADS_MAX : cpus;
}

/* One thread's part of an update: [begin, end) of the owned range. */
enum offload_kind { OFFLOAD_ADAMW, OFFLOAD_SGD, OFFLOAD_SCALE };
struct offload_part {
  const struct weftZero *z;
  enum offload_kind kind;
  const float *g; /* adamw, sgd */
  float *scaled;  /* scale */
  const struct zero_adamw_coef *coef; /* adamw: all but wd, which is the run's */
  double lr;      /* adamw: wd = lr * the run's decay, as zero_update's */
  float mu, lr_sgd, factor;
  size_t begin, end;
  weftResult_t res;
};

/* The update of [b, b + n), all of one weight decay wd. */
static weftResult_t offload_part_update(const struct offload_part *p, size_t b, size_t n,
                                        double wd) {
  const struct weftZero *z = p->z;
  const struct zero_ops *ops = z->offload_ops;
  if (p->kind == OFFLOAD_SGD)
    return ops->sgd(z->master + b, z->moment1 + b, p->g + b, n, p->mu, p->lr_sgd, (float)wd,
                    NULL);
  struct zero_adamw_coef k = *p->coef;
  k.wd = (float)(p->lr * wd);
  return ops->adamw(z->master + b, z->moment1 + b, z->moment2 + b, p->g + b, n, &k, NULL);
}

static void *offload_part_run(void *arg) {
  struct offload_part *p = arg;
  const struct weftZero *z = p->z;
  if (p->kind == OFFLOAD_SCALE) {
    p->res = z->offload_ops->scale(p->scaled + p->begin, p->end - p->begin, p->factor, NULL);
    return NULL;
  }
  /* the runs of one weight decay that meet [begin, end), cut to it */
  p->res = weftSuccess;
  for (size_t r = 0; r < z->ndecay_runs && p->res == weftSuccess; r++) {
    const struct zero_decay_run *run = &z->decay_runs[r];
    if (run->begin >= p->end) break; /* the runs are in order */
    const size_t lo = run->begin > p->begin ? run->begin : p->begin;
    const size_t hi = run->begin + run->count < p->end ? run->begin + run->count : p->end;
    if (lo < hi) p->res = offload_part_update(p, lo, hi - lo, run->weight_decay);
  }
  return NULL;
}

/* Runs job over the owned range on the context's threads: parts of whole
 * cache lines, this thread taking the first; a thread that cannot start
 * leaves its part to this one. */
static weftResult_t offload_run(const struct weftZero *z, struct offload_part job) {
  const size_t n = z->own_total, line = 16; /* floats of a 64-byte line */
  int t = z->cfg.offloadThreads;
  /* 64K elements a part at least: below that a thread's start costs more */
  if ((size_t)t > n / (64 * 1024) + 1) t = (int)(n / (64 * 1024) + 1);
  struct offload_part parts[ZERO_OFFLOAD_THREADS_MAX];
  pthread_t threads[ZERO_OFFLOAD_THREADS_MAX];
  int started[ZERO_OFFLOAD_THREADS_MAX] = {0};
  /* ceil(n / t) rounded up to whole lines: t parts cover the range */
  const size_t per = ((n + (size_t)t - 1) / (size_t)t + line - 1) / line * line;
  for (int i = 0; i < t; i++) {
    parts[i] = job;
    parts[i].begin = (size_t)i * per < n ? (size_t)i * per : n;
    parts[i].end = (size_t)(i + 1) * per < n ? (size_t)(i + 1) * per : n;
    parts[i].res = weftSuccess;
  }
  for (int i = 1; i < t; i++)
    started[i] = parts[i].begin < parts[i].end &&
                 pthread_create(&threads[i], NULL, offload_part_run, &parts[i]) == 0;
  offload_part_run(&parts[0]);
  weftResult_t res = parts[0].res;
  for (int i = 1; i < t; i++) {
    if (started[i]) pthread_join(threads[i], NULL);
    else if (parts[i].begin < parts[i].end) offload_part_run(&parts[i]);
    if (res == weftSuccess) res = parts[i].res;
  }
  return res;
}

weftResult_t zero_offload_adamw(struct weftZero *z, const float *g,
                                const struct zero_adamw_coef *coef, double lr) {
  return offload_run(z, (struct offload_part){.z = z, .kind = OFFLOAD_ADAMW, .g = g,
                                              .coef = coef, .lr = lr});
}

weftResult_t zero_offload_sgd(struct weftZero *z, const float *g, float mu, float lr) {
  return offload_run(
      z, (struct offload_part){.z = z, .kind = OFFLOAD_SGD, .g = g, .mu = mu, .lr_sgd = lr});
}

weftResult_t zero_offload_scale(struct weftZero *z, float *g, float factor) {
  return offload_run(z, (struct offload_part){.z = z, .kind = OFFLOAD_SCALE, .scaled = g,
                                              .factor = factor});
}
