/* NCCL's group calls over weft's, plus communicator creation inside a group.
 *
 * NCCL lets one thread create the communicators of several ranks (one per
 * GPU) between ncclGroupStart and ncclGroupEnd. weft's init and split block
 * until every rank has joined, so inside a group they are recorded here, and
 * the outermost ncclGroupEnd runs all recorded ones at once, a thread each,
 * before it launches the group's operations. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../transport/base/status.h"
#include "../core/comm.h"
#include "../exec/device/device.h"
#include "nccl_shim.h"

struct deferred {
  int is_split;
  ncclComm_t *out;
  /* init */
  int nranks, rank;
  ncclUniqueId id;
  int dev; /* the CUDA device current at the call (nccl_bind_device) */
  /* split */
  ncclComm_t parent;
  int color, key;
  /* the config, with its name copied: the caller's string may be gone */
  int has_cfg;
  weftConfig_t cfg;
  char name[64];
  /* result */
  weftComm_t comm;
  weftResult_t res;
  char error[1024];
  pthread_t tid;
};

static _Thread_local int group_depth;
static _Thread_local struct deferred *pending;
static _Thread_local size_t npending, pending_cap;

int nccl_group_active(void) { return group_depth > 0; }

static ncclResult_t defer(const struct deferred *d, const weftConfig_t *cfg) {
  if (d->out == NULL)
    return RES(weft_error_set(weftInvalidArgument, "the communicator pointer is NULL"));
  if (npending == pending_cap) {
    size_t cap = pending_cap ? 2 * pending_cap : 8;
    struct deferred *p = realloc(pending, cap * sizeof *p);
    if (p == NULL) return RES(weft_error_set(weftSystemError, "out of memory"));
    pending = p;
    pending_cap = cap;
  }
  struct deferred *slot = &pending[npending++];
  *slot = *d;
  if (cfg != NULL) {
    slot->has_cfg = 1;
    slot->cfg = *cfg;
    if (cfg->commName != NULL) {
      snprintf(slot->name, sizeof slot->name, "%s", cfg->commName);
      slot->cfg.commName = slot->name;
    }
  }
  return ncclSuccess;
}

ncclResult_t nccl_defer_init(ncclComm_t *out, int nranks, ncclUniqueId id, int rank,
                             const weftConfig_t *cfg) {
  struct deferred d = {.out = out, .nranks = nranks, .rank = rank, .id = id,
                       .dev = device_current()};
  return defer(&d, cfg);
}

ncclResult_t nccl_defer_split(ncclComm_t parent, int color, int key, ncclComm_t *out,
                              const weftConfig_t *cfg) {
  struct deferred d = {.is_split = 1, .out = out, .parent = parent, .color = color, .key = key};
  return defer(&d, cfg);
}

void nccl_bind_device(weftComm_t comm, int dev) {
  if (comm != NULL && dev >= 0 && comm->cuda_dev < 0) comm->cuda_dev = dev;
}

static void *deferred_main(void *arg) {
  struct deferred *d = arg;
  weftConfig_t *cfg = d->has_cfg ? &d->cfg : NULL;
  if (d->is_split) {
    d->res = weftCommSplit((weftComm_t)d->parent, d->color, d->key, &d->comm, cfg);
  } else {
    weftUniqueId id;
    memcpy(&id, &d->id, sizeof id);
    d->res = weftCommInitRankConfig(&d->comm, d->nranks, id, d->rank, cfg);
    if (d->res == weftSuccess) nccl_bind_device(d->comm, d->dev);
  }
  if (d->res != weftSuccess) snprintf(d->error, sizeof d->error, "%s", weft_error_text());
  return NULL;
}

/* Runs every recorded creation, each on a thread of its own (the first on
 * the caller's), and writes the communicators. Returns the first failure. */
static weftResult_t deferred_run(void) {
  struct deferred *ds = pending;
  size_t n = npending;
  pending = NULL;
  npending = pending_cap = 0;
  /* the copies moved with realloc: point the names at their own buffers */
  for (size_t i = 0; i < n; i++)
    if (ds[i].has_cfg && ds[i].cfg.commName != NULL) ds[i].cfg.commName = ds[i].name;
  weftResult_t res = weftSuccess;
  size_t started = 1;
  for (; started < n; started++)
    if (pthread_create(&ds[started].tid, NULL, deferred_main, &ds[started]) != 0) {
      res = weft_error_errno(weftSystemError, "starting a thread for a grouped init");
      break;
    }
  if (n > 0 && res == weftSuccess) deferred_main(&ds[0]);
  for (size_t i = 1; i < started; i++) pthread_join(ds[i].tid, NULL);
  for (size_t i = 0; i < n; i++) {
    if (res == weftSuccess && i < started && ds[i].res != weftSuccess)
      res = weft_error_set(ds[i].res, "%s in a group: %s", ds[i].is_split ? "split" : "init",
                           ds[i].error);
    *ds[i].out = (ncclComm_t)(ds[i].res == weftSuccess ? ds[i].comm : NULL);
  }
  free(ds);
  return res;
}

NCCL_EXPORT ncclResult_t ncclGroupStart(void) {
  weftResult_t res = weftGroupStart();
  if (res == weftSuccess) group_depth++;
  return RES(res);
}
NCCL_PROFILING_ALIAS(ncclGroupStart);

/* The outermost end first creates the recorded communicators, then runs
 * (or, simulating, estimates) the group's operations. */
static ncclResult_t group_end(int simulate, float *estimated_us) {
  weft_error_clear();
  if (group_depth == 0)
    return RES(simulate ? weftGroupSimulateEnd(estimated_us) : weftGroupEnd());
  weftResult_t created = weftSuccess;
  if (--group_depth == 0) created = deferred_run();
  char why[1024] = "";
  if (created != weftSuccess) snprintf(why, sizeof why, "%s", weft_error_text());
  weftResult_t res = simulate ? weftGroupSimulateEnd(estimated_us) : weftGroupEnd();
  if (created != weftSuccess) return RES(weft_error_set(created, "%s", why));
  return RES(res);
}

NCCL_EXPORT ncclResult_t ncclGroupEnd(void) { return group_end(0, NULL); }
NCCL_PROFILING_ALIAS(ncclGroupEnd);

NCCL_EXPORT ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t *simInfo) {
  weft_error_clear();
  /* an inner end leaves simInfo alone, as NCCL's: the outermost estimates */
  if (group_depth > 1) return group_end(1, NULL);
  if (simInfo != NULL && (simInfo->magic != NCCL_SIM_INFO_MAGIC ||
                          simInfo->size < offsetof(ncclSimInfo_t, estimatedTime) + sizeof(float))) {
    /* the group still ends, as NCCL's does, so that the caller is not left in one */
    group_end(1, NULL);
    return RES(weft_error_set(weftInvalidArgument,
                              "ncclSimInfo_t was not initialised with NCCL_SIM_INFO_INITIALIZER"));
  }
  float us = 0;
  ncclResult_t res = group_end(1, &us);
  if (res == ncclSuccess && simInfo != NULL) simInfo->estimatedTime = us;
  return res;
}
NCCL_PROFILING_ALIAS(ncclGroupSimulateEnd);
