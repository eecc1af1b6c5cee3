/* NCCL 2.30's communicator life cycle over weft: revoke, suspend and resume,
 * memory statistics, and grow (ncclCommGetUniqueId + ncclCommGrow).
 *
 * What weft's communicator does not keep itself (an unconsumed grow id)
 * lives in nccl_comm_state.c. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../../transport/base/log.h"
#include "../../transport/base/status.h"
#include "../core/comm.h"
#include "../exec/device/device.h"
#include "nccl_shim.h"

#define COMM(c) ((weftComm_t)(c))


/* --- Revoke ------------------------------------------------------------------ */

/* weftCommRevoke, with NCCL's flags. */
NCCL_EXPORT ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags) {
  weft_error_clear();
  weftResult_t res = comm_check(COMM(comm));
  if (res != weftSuccess) return RES(res);
  if (revokeFlags != NCCL_REVOKE_DEFAULT)
    return RES(weft_error_set(weftInvalidArgument,
                              "ncclCommRevoke: flags 0x%x (only NCCL_REVOKE_DEFAULT, 0, is valid)",
                              revokeFlags));
  return RES(weftCommRevoke(COMM(comm), 0));
}
NCCL_PROFILING_ALIAS(ncclCommRevoke);

/* --- Suspend and resume ------------------------------------------------------ */

/* NCCL_SUSPEND_MEM releases the scratch the communicator holds for itself
 * (the collectives allocate it again on first use). weft keeps the mark
 * (comm_suspend): an operation that passed nccl_comm_usable before it still
 * refuses itself once it starts. */
NCCL_EXPORT ncclResult_t ncclCommSuspend(ncclComm_t comm, int flags) {
  weft_error_clear();
  struct weftComm *c = COMM(comm);
  weftResult_t res = comm_check(c);
  if (res != weftSuccess) return RES(res);
  if (flags & ~NCCL_SUSPEND_MEM)
    return RES(weft_error_set(weftInvalidArgument,
                              "ncclCommSuspend: unknown flags 0x%x (NCCL_SUSPEND_MEM is 0x%x)",
                              flags, NCCL_SUSPEND_MEM));
  return RES(comm_suspend(c, (flags & NCCL_SUSPEND_MEM) != 0, "ncclCommSuspend"));
}
NCCL_PROFILING_ALIAS(ncclCommSuspend);

NCCL_EXPORT ncclResult_t ncclCommResume(ncclComm_t comm) {
  weft_error_clear();
  weftResult_t res = comm_check(COMM(comm));
  if (res != weftSuccess) return RES(res);
  if (!comm_resume(COMM(comm)))
    return RES(weft_error_set(weftInvalidUsage, "ncclCommResume: communicator is not suspended"));
  return ncclSuccess;
}
NCCL_PROFILING_ALIAS(ncclCommResume);

/* weft counts the scratch buffers that suspending releases; its connection
 * FIFOs are set up once and not counted, so Persist is 0. */
NCCL_EXPORT ncclResult_t ncclCommMemStats(ncclComm_t comm, ncclCommMemStat_t stat,
                                          uint64_t *value) {
  weft_error_clear();
  struct weftComm *c = COMM(comm);
  weftResult_t res = comm_check(c);
  if (res != weftSuccess) return RES(res);
  if (value == NULL) return RES(weft_error_set(weftInvalidArgument, "ncclCommMemStats: value is NULL"));
  switch (stat) {
  case ncclStatGpuMemSuspend:
  case ncclStatGpuMemTotal:
    *value = comm_states_scratch_nbytes(c);
    return ncclSuccess;
  case ncclStatGpuMemPersist:
    *value = 0;
    return ncclSuccess;
  case ncclStatGpuMemSuspended:
    *value = (uint64_t)comm_suspended(c);
    return ncclSuccess;
  }
  return RES(weft_error_set(weftInvalidArgument, "ncclCommMemStats: unknown statistic %d",
                            (int)stat));
}
NCCL_PROFILING_ALIAS(ncclCommMemStats);

/* --- Grow -------------------------------------------------------------------- */

NCCL_EXPORT ncclResult_t ncclCommGetUniqueId(ncclComm_t comm, ncclUniqueId *uniqueId) {
  weft_error_clear();
  weftResult_t res = comm_check(COMM(comm));
  if (res != weftSuccess) return RES(res);
  if (uniqueId == NULL)
    return RES(weft_error_set(weftInvalidArgument, "ncclCommGetUniqueId: uniqueId is NULL"));
  return RES(nccl_comm_grow_id_make(comm, uniqueId));
}
NCCL_PROFILING_ALIAS(ncclCommGetUniqueId);

/* Existing ranks learn which of them is the root (the one with the id) and
 * its id through the parent, then all ranks join the id's rendezvous. */
static weftResult_t grow_existing(struct weftComm *c, int nranks, const ncclUniqueId *id,
                                  weftUniqueId *id_out) {
  const int n = c->nranks;
  int32_t mine = id != NULL, *has = calloc((size_t)n, sizeof *has);
  if (has == NULL) return weft_error_set(weftSystemError, "ncclCommGrow: out of memory");
  weftResult_t res = weftAllGather(&mine, has, 1, weftInt32, c, NULL);
  int root = -1, nroots = 0;
  for (int r = 0; res == weftSuccess && r < n; r++)
    if (has[r]) root = r, nroots++;
  free(has);
  if (res != weftSuccess) return res;
  if (nroots != 1)
    return weft_error_set(weftInvalidUsage,
                          "ncclCommGrow: %d existing ranks passed an id; exactly one (the root, "
                          "which made it with ncclCommGetUniqueId) must",
                          nroots);
  if (id != NULL) memcpy(id_out, id, sizeof *id_out);
  res = weftBroadcast(id_out, id_out, sizeof *id_out, weftUint8, root, c, NULL);
  if (res == weftSuccess)
    WEFT_INFO(LOG_INIT, "grow: rank %d of %d joins a communicator of %d (root %d)", c->rank, n,
              nranks, root);
  return res;
}

NCCL_EXPORT ncclResult_t ncclCommGrow(ncclComm_t comm, int nRanks, const ncclUniqueId *uniqueId,
                                      int rank, ncclComm_t *newcomm, ncclConfig_t *config) {
  weft_error_clear();
  if (newcomm == NULL)
    return RES(weft_error_set(weftInvalidArgument, "ncclCommGrow: newcomm is NULL"));
  if (nccl_group_active())
    return RES(weft_error_set(weftInvalidUsage,
                              "ncclCommGrow: not supported between ncclGroupStart and ncclGroupEnd"));
  if (comm == NULL) { /* a new rank */
    if (uniqueId == NULL || rank < 0)
      return RES(weft_error_set(weftInvalidArgument,
                                "ncclCommGrow: a new rank (comm NULL) needs the id and its rank "
                                "(got id %p, rank %d)",
                                (const void *)uniqueId, rank));
    return ncclCommInitRankConfig(newcomm, nRanks, *uniqueId, rank, config);
  }
  struct weftComm *c = COMM(comm);
  weftResult_t res = comm_check(c);
  if (res != weftSuccess) return RES(res);
  ncclResult_t usable = nccl_comm_usable(comm, "ncclCommGrow");
  if (usable != ncclSuccess) return usable;
  if (rank != -1)
    return RES(weft_error_set(weftInvalidArgument,
                              "ncclCommGrow: an existing rank passes rank -1 (got %d); it keeps "
                              "its rank %d",
                              rank, c->rank));
  if (nRanks <= c->nranks)
    return RES(weft_error_set(weftInvalidArgument,
                              "ncclCommGrow: nRanks %d does not exceed the communicator's %d",
                              nRanks, c->nranks));
  if (uniqueId != NULL) {
    int ours = nccl_comm_grow_id_consume(comm, uniqueId); /* whatever happens next */
    if (!ours)
      return RES(weft_error_set(weftInvalidArgument,
                                "ncclCommGrow: the id was not made by ncclCommGetUniqueId on this "
                                "communicator, or was used already"));
  }
  weftConfig_t cfg, *cfgp;
  ncclResult_t cres = nccl_config_read(config, &cfg, &cfgp);
  if (cres != ncclSuccess) return cres;
  if (cfgp == NULL) {
    /* the parent's timeout and name; channels come from the environment, as
     * on the new ranks, which have no parent: every rank must agree on them */
    const weftConfig_t defaults = WEFT_CONFIG_INITIALIZER;
    cfg = defaults;
    uint64_t timeout_ms = c->timeout_ns / 1000000ull;
    if (timeout_ms > 0 && timeout_ms <= INT32_MAX) cfg.timeoutMs = (int)timeout_ms;
    cfg.commName = c->name[0] != '\0' ? c->name : NULL;
    cfgp = &cfg;
  }
  weftUniqueId id;
  memset(&id, 0, sizeof id);
  /* the parent is in use until the grown comm exists (its name and timeout
   * are read there): an abort from another thread waits, as for a split */
  __atomic_add_fetch(&c->active, 1, __ATOMIC_SEQ_CST);
  if (__atomic_load_n(&c->abort_flag, __ATOMIC_SEQ_CST))
    res = weft_error_set(weftRemoteError, "ncclCommGrow: communicator was aborted");
  else
    res = grow_existing(c, nRanks, uniqueId, &id);
  if (res == weftSuccess) res = weftCommInitRankConfig((weftComm_t *)newcomm, nRanks, id, c->rank, cfgp);
  if (res != weftSuccess) snprintf(c->last_error, sizeof c->last_error, "%s", weft_error_text());
  __atomic_sub_fetch(&c->active, 1, __ATOMIC_SEQ_CST);
  return RES(res);
}
NCCL_PROFILING_ALIAS(ncclCommGrow);
