/* NCCL 2.30's communicator life cycle over weft: revoke, suspend and resume,
 * memory statistics, and grow (ncclCommGetUniqueId + ncclCommGrow).
 *
 * What weft's communicator does not keep itself (an unconsumed grow id)
 * lives in nccl_comm_state.c. */
#include <stdint.h>
#include <string.h>

#include "nccl_shim.h"

#define COMM(c) ((weftComm_t)(c))

/* --- Revoke ------------------------------------------------------------------ */

/* weftCommRevoke, with NCCL's flags. */
NCCL_EXPORT ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags) {
  weft_error_clear();
  weftResult_t res = compat_comm_check(COMM(comm));
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
 * (the collectives allocate it again on first use). The suspension is a
 * state of the communicator (compat_comm_suspend): an operation that was
 * checked before it (recorded in a group) still refuses itself once it
 * starts. */
NCCL_EXPORT ncclResult_t ncclCommSuspend(ncclComm_t comm, int flags) {
  weft_error_clear();
  weftComm_t c = COMM(comm);
  weftResult_t res = compat_comm_check(c);
  if (res != weftSuccess) return RES(res);
  if (flags & ~NCCL_SUSPEND_MEM)
    return RES(weft_error_set(weftInvalidArgument,
                              "ncclCommSuspend: unknown flags 0x%x (NCCL_SUSPEND_MEM is 0x%x)",
                              flags, NCCL_SUSPEND_MEM));
  return RES(compat_comm_suspend(c, (flags & NCCL_SUSPEND_MEM) != 0, "ncclCommSuspend"));
}
NCCL_PROFILING_ALIAS(ncclCommSuspend);

NCCL_EXPORT ncclResult_t ncclCommResume(ncclComm_t comm) {
  weft_error_clear();
  weftResult_t res = compat_comm_check(COMM(comm));
  if (res != weftSuccess) return RES(res);
  if (!compat_comm_resume(COMM(comm)))
    return RES(weft_error_set(weftInvalidUsage, "ncclCommResume: communicator is not suspended"));
  return ncclSuccess;
}
NCCL_PROFILING_ALIAS(ncclCommResume);

/* weft counts the scratch buffers that suspending releases; its connection
 * FIFOs are set up once and not counted, so Persist is 0. */
NCCL_EXPORT ncclResult_t ncclCommMemStats(ncclComm_t comm, ncclCommMemStat_t stat,
                                          uint64_t *value) {
  weft_error_clear();
  weftComm_t c = COMM(comm);
  weftResult_t res = compat_comm_check(c);
  if (res != weftSuccess) return RES(res);
  if (value == NULL) return RES(weft_error_set(weftInvalidArgument, "ncclCommMemStats: value is NULL"));
  switch (stat) {
  case ncclStatGpuMemSuspend:
  case ncclStatGpuMemTotal:
    *value = compat_comm_scratch_nbytes(c);
    return ncclSuccess;
  case ncclStatGpuMemPersist:
    *value = 0;
    return ncclSuccess;
  case ncclStatGpuMemSuspended:
    *value = (uint64_t)compat_comm_suspended(c);
    return ncclSuccess;
  }
  return RES(weft_error_set(weftInvalidArgument, "ncclCommMemStats: unknown statistic %d",
                            (int)stat));
}
NCCL_PROFILING_ALIAS(ncclCommMemStats);

/* --- Grow -------------------------------------------------------------------- */

NCCL_EXPORT ncclResult_t ncclCommGetUniqueId(ncclComm_t comm, ncclUniqueId *uniqueId) {
  weft_error_clear();
  weftResult_t res = compat_comm_check(COMM(comm));
  if (res != weftSuccess) return RES(res);
  if (uniqueId == NULL)
    return RES(weft_error_set(weftInvalidArgument, "ncclCommGetUniqueId: uniqueId is NULL"));
  return RES(nccl_comm_grow_id_make(comm, uniqueId));
}
NCCL_PROFILING_ALIAS(ncclCommGetUniqueId);

NCCL_EXPORT ncclResult_t ncclCommGrow(ncclComm_t comm, int nRanks, const ncclUniqueId *uniqueId,
                                      int rank, ncclComm_t *newcomm, ncclConfig_t *config) {
  weft_error_clear();
  if (newcomm == NULL)
    return RES(weft_error_set(weftInvalidArgument, "ncclCommGrow: newcomm is NULL"));
  if (compat_group_depth() > 0)
    return RES(weft_error_set(weftInvalidUsage,
                              "ncclCommGrow: not supported between ncclGroupStart and ncclGroupEnd"));
  if (comm == NULL) { /* a new rank */
    if (uniqueId == NULL || rank < 0)
      return RES(weft_error_set(weftInvalidArgument,
                                "ncclCommGrow: a new rank (comm NULL) needs the id and its rank "
                                "(got id %p, rank %d)",
                                (const void *)uniqueId, rank));
    /* its pnccl name: a profiler that interposes nccl* sees the one call made */
    return pncclCommInitRankConfig(newcomm, nRanks, *uniqueId, rank, config);
  }
  weftComm_t c = COMM(comm);
  weftResult_t res = compat_comm_check(c);
  if (res != weftSuccess) return RES(res);
  res = compat_comm_usable(c, "ncclCommGrow");
  if (res != weftSuccess) return (ncclResult_t)res;
  int nranks_now = 0, rank_now = 0;
  weftCommCount(c, &nranks_now);
  weftCommUserRank(c, &rank_now);
  if (rank != -1)
    return RES(weft_error_set(weftInvalidArgument,
                              "ncclCommGrow: an existing rank passes rank -1 (got %d); it keeps "
                              "its rank %d",
                              rank, rank_now));
  if (nRanks <= nranks_now)
    return RES(weft_error_set(weftInvalidArgument,
                              "ncclCommGrow: nRanks %d does not exceed the communicator's %d",
                              nRanks, nranks_now));
  /* a bad configuration is refused before the id is taken: it serves a
   * corrected call */
  weftConfig_t cfg, *cfgp;
  ncclResult_t cres = nccl_config_read(config, &cfg, &cfgp);
  if (cres != ncclSuccess) return cres;
  if (uniqueId != NULL) {
    int ours = nccl_comm_grow_id_consume(comm, uniqueId); /* whatever happens next */
    if (!ours)
      return RES(weft_error_set(weftInvalidArgument,
                                "ncclCommGrow: the id was not made by ncclCommGetUniqueId on this "
                                "communicator, or was used already"));
  }
  weftUniqueId id;
  if (uniqueId != NULL) memcpy(&id, uniqueId, sizeof id);
  return RES(compat_comm_grow(c, nRanks, uniqueId != NULL ? &id : NULL, cfgp,
                              (weftComm_t *)newcomm));
}
NCCL_PROFILING_ALIAS(ncclCommGrow);
