/* The host side of NCCL's device API (nccl_device.h in NCCL) and its
 * one-sided signals, over weft.
 *
 * weft has no device communicators, no symmetric memory that peers map, and
 * no remote memory access: those calls return ncclInvalidUsage with a
 * message naming the function, also as the communicator's last error, and
 * leave the communicator as it was (PyTorch links them and falls back when
 * they fail). Teams are arithmetic over what weft does have, so they are
 * answered. */
#include "nccl_shim.h"

static ncclResult_t refused(ncclComm_t comm, const char *fn, const char *what) {
  weftResult_t res = weft_error_set(weftInvalidUsage, "%s: %s is not supported by weft", fn, what);
  compat_comm_error_keep((weftComm_t)comm);
  return (ncclResult_t)res;
}

#define DEVICE_API "NCCL's device API"
#define SYMMETRIC "symmetric memory (NCCL's device API)"
#define RMA "one-sided remote memory access"

NCCL_EXPORT ncclResult_t ncclDevCommCreate(ncclComm_t comm, const ncclDevCommRequirements_t *reqs,
                                           ncclDevComm_t *outDevComm) {
  (void)reqs, (void)outDevComm;
  return refused(comm, "ncclDevCommCreate", DEVICE_API);
}
NCCL_PROFILING_ALIAS(ncclDevCommCreate);

NCCL_EXPORT ncclResult_t ncclDevCommDestroy(ncclComm_t comm, const ncclDevComm_t *devComm) {
  (void)devComm;
  return refused(comm, "ncclDevCommDestroy", DEVICE_API);
}
NCCL_PROFILING_ALIAS(ncclDevCommDestroy);

NCCL_EXPORT ncclResult_t ncclCommQueryProperties(ncclComm_t comm, ncclCommProperties_t *props) {
  (void)props;
  return refused(comm, "ncclCommQueryProperties", DEVICE_API);
}
NCCL_PROFILING_ALIAS(ncclCommQueryProperties);

NCCL_EXPORT ncclResult_t ncclGetLsaMultimemDevicePointer(ncclWindow_t window, size_t offset,
                                                         void **outPtr) {
  (void)offset, (void)outPtr;
  return refused(nccl_window_comm(window), "ncclGetLsaMultimemDevicePointer", SYMMETRIC);
}
NCCL_PROFILING_ALIAS(ncclGetLsaMultimemDevicePointer);

NCCL_EXPORT ncclResult_t ncclGetMultimemDevicePointer(ncclWindow_t window, size_t offset,
                                                      ncclMultimemHandle_t multimem,
                                                      void **outPtr) {
  (void)offset, (void)multimem, (void)outPtr;
  return refused(nccl_window_comm(window), "ncclGetMultimemDevicePointer", SYMMETRIC);
}
NCCL_PROFILING_ALIAS(ncclGetMultimemDevicePointer);

NCCL_EXPORT ncclResult_t ncclGetLsaDevicePointer(ncclWindow_t window, size_t offset, int lsaRank,
                                                 void **outPtr) {
  (void)offset, (void)lsaRank, (void)outPtr;
  return refused(nccl_window_comm(window), "ncclGetLsaDevicePointer", SYMMETRIC);
}
NCCL_PROFILING_ALIAS(ncclGetLsaDevicePointer);

NCCL_EXPORT ncclResult_t ncclGetPeerDevicePointer(ncclWindow_t window, size_t offset, int peer,
                                                  void **outPtr) {
  (void)offset, (void)peer, (void)outPtr;
  return refused(nccl_window_comm(window), "ncclGetPeerDevicePointer", SYMMETRIC);
}
NCCL_PROFILING_ALIAS(ncclGetPeerDevicePointer);

NCCL_EXPORT ncclResult_t ncclLsaBarrierCreateRequirement(ncclTeam_t team, int nBarriers,
                                                         ncclLsaBarrierHandle_t *outHandle,
                                                         ncclDevResourceRequirements_t *outReq) {
  (void)team, (void)nBarriers, (void)outHandle, (void)outReq;
  return refused(NULL, "ncclLsaBarrierCreateRequirement", DEVICE_API);
}
NCCL_PROFILING_ALIAS(ncclLsaBarrierCreateRequirement);

NCCL_EXPORT ncclResult_t ncclGinBarrierCreateRequirement(ncclComm_t comm, ncclTeam_t team,
                                                         int nBarriers,
                                                         ncclGinBarrierHandle_t *outHandle,
                                                         ncclDevResourceRequirements_t *outReq) {
  (void)team, (void)nBarriers, (void)outHandle, (void)outReq;
  return refused(comm, "ncclGinBarrierCreateRequirement", DEVICE_API);
}
NCCL_PROFILING_ALIAS(ncclGinBarrierCreateRequirement);

NCCL_EXPORT ncclResult_t ncclGinOutboxCreateRequirement(int nBlocks, int size_log2,
                                                        struct ncclGinOutboxHandle *outHandle,
                                                        ncclDevResourceRequirements_t *outReq) {
  (void)nBlocks, (void)size_log2, (void)outHandle, (void)outReq;
  return refused(NULL, "ncclGinOutboxCreateRequirement", DEVICE_API);
}
NCCL_PROFILING_ALIAS(ncclGinOutboxCreateRequirement);

NCCL_EXPORT ncclResult_t ncclGinInboxA2ACreateRequirement(ncclTeam_t peers, int nBlocks,
                                                          int size_log2,
                                                          struct ncclGinInboxA2AHandle *outHandle,
                                                          ncclDevResourceRequirements_t *outReq) {
  (void)peers, (void)nBlocks, (void)size_log2, (void)outHandle, (void)outReq;
  return refused(NULL, "ncclGinInboxA2ACreateRequirement", DEVICE_API);
}
NCCL_PROFILING_ALIAS(ncclGinInboxA2ACreateRequirement);

/* returns a count, not a result: -1, with the reason as the last error */
NCCL_EXPORT int ncclLLA2ACalcSlots(int maxElts, int maxEltSize) {
  (void)maxElts, (void)maxEltSize;
  refused(NULL, "ncclLLA2ACalcSlots", DEVICE_API);
  return -1;
}
NCCL_PROFILING_ALIAS(ncclLLA2ACalcSlots);

NCCL_EXPORT ncclResult_t ncclLLA2ACreateRequirement(int nBlocks, int nSlots,
                                                    ncclLLA2AHandle_t *outHandle,
                                                    ncclDevResourceRequirements_t *outReq) {
  (void)nBlocks, (void)nSlots, (void)outHandle, (void)outReq;
  return refused(NULL, "ncclLLA2ACreateRequirement", DEVICE_API);
}
NCCL_PROFILING_ALIAS(ncclLLA2ACreateRequirement);

/* --- One-sided signals --------------------------------------------------------- */

NCCL_EXPORT ncclResult_t ncclPutSignal(const void *localbuff, size_t count,
                                       ncclDataType_t datatype, int peer, ncclWindow_t peerWin,
                                       size_t peerWinOffset, int sigIdx, int ctx,
                                       unsigned int flags, ncclComm_t comm, cudaStream_t stream) {
  (void)localbuff, (void)count, (void)datatype, (void)peer, (void)peerWin, (void)peerWinOffset;
  (void)sigIdx, (void)ctx, (void)flags, (void)stream;
  return refused(comm, "ncclPutSignal", RMA);
}
NCCL_PROFILING_ALIAS(ncclPutSignal);

NCCL_EXPORT ncclResult_t ncclSignal(int peer, int sigIdx, int ctx, unsigned int flags,
                                    ncclComm_t comm, cudaStream_t stream) {
  (void)peer, (void)sigIdx, (void)ctx, (void)flags, (void)stream;
  return refused(comm, "ncclSignal", RMA);
}
NCCL_PROFILING_ALIAS(ncclSignal);

NCCL_EXPORT ncclResult_t ncclWaitSignal(int nDesc, ncclWaitSignalDesc_t *signalDescs,
                                        ncclComm_t comm, cudaStream_t stream) {
  (void)nDesc, (void)signalDescs, (void)stream;
  return refused(comm, "ncclWaitSignal", RMA);
}
NCCL_PROFILING_ALIAS(ncclWaitSignal);

/* --- Teams ----------------------------------------------------------------------- */

/* The world is every rank; no peer's memory is mapped here, so the
 * load/store-accessible team is this rank alone and the rail team (one rank
 * per LSA team) the world again. */
/* comm's size and this rank's place in it, or 0 (the thread's error text
 * saying why) when comm is not a live communicator. */
struct team_comm {
  int nranks, rank;
};
static int team_comm(ncclComm_t comm, const char *fn, struct team_comm *c_out) {
  weft_error_clear();
  if (weftCommCount((weftComm_t)comm, &c_out->nranks) != weftSuccess ||
      weftCommUserRank((weftComm_t)comm, &c_out->rank) != weftSuccess) {
    weft_error_set(weftInvalidArgument, "%s: not a live communicator", fn);
    return 0;
  }
  return 1;
}

NCCL_EXPORT ncclTeam_t ncclTeamWorld(ncclComm_t comm) {
  struct team_comm c;
  ncclTeam_t t = {0, 0, 0};
  if (team_comm(comm, "ncclTeamWorld", &c)) t = (ncclTeam_t){c.nranks, c.rank, 1};
  return t;
}
NCCL_PROFILING_ALIAS(ncclTeamWorld);

NCCL_EXPORT ncclTeam_t ncclTeamLsa(ncclComm_t comm) {
  struct team_comm c;
  ncclTeam_t t = {0, 0, 0};
  if (team_comm(comm, "ncclTeamLsa", &c)) t = (ncclTeam_t){1, 0, 1};
  return t;
}
NCCL_PROFILING_ALIAS(ncclTeamLsa);

NCCL_EXPORT ncclTeam_t ncclTeamRail(ncclComm_t comm) {
  struct team_comm c;
  ncclTeam_t t = {0, 0, 0};
  if (team_comm(comm, "ncclTeamRail", &c)) t = (ncclTeam_t){c.nranks, c.rank, 1};
  return t;
}
NCCL_PROFILING_ALIAS(ncclTeamRail);

/* rank `rank` of team, as a world rank (-1 when outside the world) */
NCCL_EXPORT int ncclTeamRankToWorld(ncclComm_t comm, ncclTeam_t team, int rank) {
  struct team_comm c;
  if (!team_comm(comm, "ncclTeamRankToWorld", &c)) return -1;
  long w = c.rank + (long)(rank - team.rank) * team.stride;
  return w >= 0 && w < c.nranks ? (int)w : -1;
}
NCCL_PROFILING_ALIAS(ncclTeamRankToWorld);

/* rank `rank` of team, as a rank of this rank's LSA team (itself alone) */
NCCL_EXPORT int ncclTeamRankToLsa(ncclComm_t comm, ncclTeam_t team, int rank) {
  struct team_comm c;
  if (!team_comm(comm, "ncclTeamRankToLsa", &c)) return -1;
  long l = (long)(rank - team.rank) * team.stride;
  return l == 0 ? 0 : -1;
}
NCCL_PROFILING_ALIAS(ncclTeamRankToLsa);

/* --- CFT (compute fabric transport) --------------------------------------- */
/* weft has no fabric logical endpoints: the teams are empty and the
 * endpoint queries fail as NCCL's do where a communicator has no CFT
 * (ncclInvalidArgument), each with a message that names it. */
#define CFT "compute fabric transport (CFT)"

static ncclResult_t cft_refused(ncclComm_t comm, const char *fn) {
  weftResult_t res = weft_error_set(weftInvalidArgument, "%s: %s is not supported by weft", fn, CFT);
  compat_comm_error_keep((weftComm_t)comm);
  return (ncclResult_t)res;
}

NCCL_EXPORT ncclTeam_t ncclTeamCft(ncclComm_t comm, ncclCftTeamMode_t mode) {
  (void)mode;
  ncclTeam_t none = {0, 0, 0};
  cft_refused(comm, "ncclTeamCft");
  return none;
}
NCCL_PROFILING_ALIAS(ncclTeamCft);

NCCL_EXPORT ncclTeam_t ncclTeamCftMultimem(ncclComm_t comm) {
  ncclTeam_t none = {0, 0, 0};
  cft_refused(comm, "ncclTeamCftMultimem");
  return none;
}
NCCL_PROFILING_ALIAS(ncclTeamCftMultimem);

NCCL_EXPORT ncclResult_t ncclGetMultimemDeviceLeInfo(ncclWindow_t window, size_t offset,
                                                     ncclCftLeId *leId, size_t *leOffset) {
  (void)offset, (void)leId, (void)leOffset;
  return cft_refused(nccl_window_comm(window), "ncclGetMultimemDeviceLeInfo");
}
NCCL_PROFILING_ALIAS(ncclGetMultimemDeviceLeInfo);

NCCL_EXPORT ncclResult_t ncclGetCftDeviceLeInfo(ncclWindow_t window, size_t offset, int peerCft,
                                                ncclTeam_t cftTeam, ncclCftLeId *leId,
                                                size_t *leOffset) {
  (void)offset, (void)peerCft, (void)cftTeam, (void)leId, (void)leOffset;
  return cft_refused(nccl_window_comm(window), "ncclGetCftDeviceLeInfo");
}
NCCL_PROFILING_ALIAS(ncclGetCftDeviceLeInfo);

NCCL_EXPORT ncclResult_t ncclGetPeerDeviceLeInfo(ncclWindow_t window, size_t offset, int peerWorld,
                                                 ncclCftLeId *leId, size_t *leOffset) {
  (void)offset, (void)peerWorld, (void)leId, (void)leOffset;
  return cft_refused(nccl_window_comm(window), "ncclGetPeerDeviceLeInfo");
}
NCCL_PROFILING_ALIAS(ncclGetPeerDeviceLeInfo);
