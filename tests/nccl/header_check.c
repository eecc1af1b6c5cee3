/* Compiled (not run) by test_header.sh as C, C++ and CUDA: nccl.h alone
 * must compile without warnings and carry NCCL 2.32's ABI. */
#include "nccl.h"

#if defined(__cplusplus)
#define ABI(cond) static_assert(cond, #cond)
#elif __STDC_VERSION__ >= 201112L
#define ABI(cond) _Static_assert(cond, #cond)
#else /* C99: a negative array size fails */
#define ABI_JOIN_(a, b) a##b
#define ABI_JOIN(a, b) ABI_JOIN_(a, b)
#define ABI(cond) typedef char ABI_JOIN(abi_check_, __LINE__)[(cond) ? 1 : -1]
#endif

#if defined(EXPECT_CUDA_RUNTIME) && !defined(CUDART_VERSION)
#error "cuda_runtime.h is on the include path but nccl.h did not use it"
#endif

/* versions */
ABI(NCCL_VERSION_CODE == 23203);
ABI(NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH) == NCCL_VERSION_CODE);
ABI(NCCL_VERSION(2, 8, 4) == 2804); /* the old encoding below 2.9 */
ABI(NCCL_VERSION(2, 19, 3) == 21903);

/* results, types, ops */
ABI(ncclSuccess == 0 && ncclUnhandledCudaError == 1 && ncclSystemError == 2);
ABI(ncclInternalError == 3 && ncclInvalidArgument == 4 && ncclInvalidUsage == 5);
ABI(ncclRemoteError == 6 && ncclInProgress == 7 && ncclTimeout == 8 && ncclNumResults == 9);
ABI(ncclInt8 == 0 && ncclChar == 0 && ncclUint8 == 1 && ncclInt32 == 2 && ncclInt == 2);
ABI(ncclUint32 == 3 && ncclInt64 == 4 && ncclUint64 == 5 && ncclFloat16 == 6 && ncclHalf == 6);
ABI(ncclFloat32 == 7 && ncclFloat == 7 && ncclFloat64 == 8 && ncclDouble == 8);
ABI(ncclBfloat16 == 9 && ncclFloat8e4m3 == 10 && ncclFloat8e5m2 == 11 && ncclNumTypes == 12);
ABI(ncclSum == 0 && ncclProd == 1 && ncclMax == 2 && ncclMin == 3 && ncclAvg == 4);
ABI(ncclNumOps == 5 && ncclMaxRedOp == 0x7fffffff);
ABI(ncclScalarDevice == 0 && ncclScalarHostImmediate == 1);
ABI(sizeof(ncclRedOp_t) == 4 && sizeof(ncclDataType_t) == 4 && sizeof(ncclResult_t) == 4);

/* structs */
ABI(NCCL_UNIQUE_ID_BYTES == 128 && sizeof(ncclUniqueId) == 128);
ABI(offsetof(ncclConfig_t, magic) == sizeof(size_t));
ABI(offsetof(ncclConfig_t, blocking) == sizeof(size_t) + 8);
ABI(offsetof(ncclConfig_t, netName) == sizeof(size_t) + 24);
ABI(offsetof(ncclConfig_t, commName) == offsetof(ncclConfig_t, trafficClass) + sizeof(int));
ABI(offsetof(ncclConfig_t, nvlsCTAs) == offsetof(ncclConfig_t, collnetEnable) + 3 * sizeof(int));
ABI(offsetof(ncclConfig_t, graphStreamOrdering) ==
    offsetof(ncclConfig_t, nvlsCTAs) + 6 * sizeof(int));
ABI(offsetof(ncclConfig_t, nvlsHostMode) ==
    offsetof(ncclConfig_t, graphStreamOrdering) + 5 * sizeof(int));
ABI(sizeof(void *) != 8 || sizeof(ncclConfig_t) == 120);
ABI(sizeof(void *) != 8 || sizeof(ncclCollConfig_t) == 72);
ABI(sizeof(void *) != 8 || offsetof(ncclCollConfig_t, algSelection) == 40);
ABI(sizeof(void *) != 8 || offsetof(ncclCollConfig_t, userProfilerTag) == 56);
ABI(sizeof(void *) != 8 || sizeof(ncclEncryptionConfig_t) == 32);
ABI(sizeof(void *) != 8 || sizeof(ncclConfigExt_t) == 24);
ABI(sizeof(ncclCftLeId) == 4 && NCCL_CFT_TEAM_FLAT == 0 && NCCL_CFT_TEAM_HIER_MULTIMEM == 1 &&
    NCCL_CFT_TEAM_HIER_LSA == 2);
ABI(ncclHostCftDefault == INT_MIN && ncclHostCftEnable == 1 && ncclHostCftDisable == 2 &&
    ncclHostCftFallback == 3);
ABI(ncclNvlsHostModeDefault == INT_MIN && ncclNvlsHostModeEnable == 0 &&
    ncclNvlsHostModeDisableTransport == 1 && ncclNvlsHostModeDisableSymmetricMultimem == 2 &&
    ncclNvlsHostModeDisable == INT_MAX);
ABI(NCCL_WIN_GIN_ONLY == 4 && NCCL_WIN_CFT_COUNTED == 8);
ABI(sizeof(void *) != 8 || sizeof(ncclSimInfo_t) == 24);
ABI(NCCL_SPLIT_NOCOLOR == -1 && NCCL_SHRINK_DEFAULT == 0 && NCCL_SHRINK_ABORT == 1);
ABI(NCCL_WIN_DEFAULT == 0 && NCCL_WIN_COLL_SYMMETRIC == 1 && NCCL_WIN_STRICT_ORDERING == 2);
ABI(NCCL_WIN_REQUIRED_ALIGNMENT == 4096 && NCCL_REVOKE_DEFAULT == 0 && NCCL_SUSPEND_MEM == 1);
ABI(NCCL_API_MAGIC == 0xcafebeef && NCCL_CONFIG_MAGIC == NCCL_API_MAGIC);
ABI(ncclStatGpuMemSuspend == 0 && ncclStatGpuMemSuspended == 1 && ncclStatGpuMemPersist == 2 &&
    ncclStatGpuMemTotal == 3);
ABI(sizeof(ncclWaitSignalDesc_t) == 4 * sizeof(int) && sizeof(ncclTeam_t) == 3 * sizeof(int));
ABI(NCCL_CTA_POLICY_DEFAULT == 0 && NCCL_CTA_POLICY_EFFICIENCY == 1 && NCCL_CTA_POLICY_ZERO == 2);

/* the initializers fill size, magic, version and mark every field unset */
static ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
static ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
static ncclCollConfig_t coll_config = NCCL_COLLCONFIG_INITIALIZER;
static ncclEncryptionConfig_t encryption = NCCL_ENCRYPTION_CONFIG_INITIALIZER;

int config_is_default(void);
int config_is_default(void) {
  return config.size == sizeof(ncclConfig_t) && config.magic == 0xcafebeef &&
         config.version == NCCL_VERSION_CODE && config.blocking == NCCL_CONFIG_UNDEF_INT &&
         config.nvlsCTAs == NCCL_CONFIG_UNDEF_INT && config.graphStreamOrdering == NCCL_CONFIG_UNDEF_INT &&
         config.commName == NULL && config.nvlsHostMode == NCCL_CONFIG_UNDEF_INT &&
         coll_config.size == sizeof(ncclCollConfig_t) && coll_config.magic == NCCL_API_MAGIC &&
         coll_config.forceAlgSelection == 1 && coll_config.userProfilerTag == 0 &&
         coll_config.launchCompletionEvent == NULL && coll_config.algSelection == NULL &&
         encryption.size == sizeof(ncclEncryptionConfig_t) &&
         encryption.mode == NCCL_ENCRYPTION_MODE_NONE && encryption.psk == NULL &&
         sim.magic == 0x74685283 && sim.estimatedTime == NCCL_UNDEF_FLOAT;
}

/* every function has NCCL's type; assigning to a typed pointer checks it */
typedef ncclResult_t (*coll_reduce_t)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t,
                                      ncclComm_t, cudaStream_t);
typedef ncclResult_t (*coll_root_reduce_t)(const void *, void *, size_t, ncclDataType_t,
                                           ncclRedOp_t, int, ncclComm_t, cudaStream_t);
typedef ncclResult_t (*coll_root_t)(const void *, void *, size_t, ncclDataType_t, int, ncclComm_t,
                                    cudaStream_t);
typedef ncclResult_t (*coll_gather_t)(const void *, void *, size_t, ncclDataType_t, ncclComm_t,
                                      cudaStream_t);
typedef ncclResult_t (*p2p_send_t)(const void *, size_t, ncclDataType_t, int, ncclComm_t,
                                   cudaStream_t);
typedef ncclResult_t (*p2p_recv_t)(void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);

struct api_table {
  coll_reduce_t all_reduce, reduce_scatter, pall_reduce;
  coll_root_reduce_t reduce;
  coll_root_t broadcast;
  ncclResult_t (*bcast)(void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
  coll_gather_t all_gather;
  p2p_send_t send;
  p2p_recv_t recv;
  ncclResult_t (*group_start)(void), (*group_end)(void);
  ncclResult_t (*group_simulate_end)(ncclSimInfo_t *);
  ncclResult_t (*mem_alloc)(void **, size_t), (*mem_free)(void *);
  ncclResult_t (*get_version)(int *), (*get_unique_id)(ncclUniqueId *);
  ncclResult_t (*init_rank_config)(ncclComm_t *, int, ncclUniqueId, int, ncclConfig_t *);
  ncclResult_t (*init_rank)(ncclComm_t *, int, ncclUniqueId, int);
  ncclResult_t (*init_all)(ncclComm_t *, int, const int *);
  ncclResult_t (*init_scalable)(ncclComm_t *, int, int, int, ncclUniqueId *, ncclConfig_t *);
  ncclResult_t (*finalize)(ncclComm_t), (*destroy)(ncclComm_t), (*abort_)(ncclComm_t);
  ncclResult_t (*split)(ncclComm_t, int, int, ncclComm_t *, ncclConfig_t *);
  ncclResult_t (*shrink)(ncclComm_t, int *, int, ncclComm_t *, ncclConfig_t *, int);
  const char *(*error_string)(ncclResult_t);
  const char *(*last_error)(ncclComm_t);
  void (*reset_debug)(void);
  ncclResult_t (*async_error)(ncclComm_t, ncclResult_t *);
  ncclResult_t (*count)(const ncclComm_t, int *), (*cu_device)(const ncclComm_t, int *);
  ncclResult_t (*user_rank)(const ncclComm_t, int *);
  ncclResult_t (*reg)(const ncclComm_t, void *, size_t, void **);
  ncclResult_t (*dereg)(const ncclComm_t, void *);
  ncclResult_t (*win_reg)(ncclComm_t, void *, size_t, ncclWindow_t *, int);
  ncclResult_t (*win_dereg)(ncclComm_t, ncclWindow_t);
  ncclResult_t (*premul)(ncclRedOp_t *, void *, ncclDataType_t, ncclScalarResidence_t, ncclComm_t);
  ncclResult_t (*op_destroy)(ncclRedOp_t, ncclComm_t);
};

const struct api_table *api_table_get(void);
const struct api_table *api_table_get(void) {
  static const struct api_table t = {
      ncclAllReduce, ncclReduceScatter, pncclAllReduce, ncclReduce, ncclBroadcast, ncclBcast,
      ncclAllGather, ncclSend, ncclRecv, ncclGroupStart, ncclGroupEnd, ncclGroupSimulateEnd,
      ncclMemAlloc, ncclMemFree, ncclGetVersion, ncclGetUniqueId, ncclCommInitRankConfig,
      ncclCommInitRank, ncclCommInitAll, ncclCommInitRankScalable, ncclCommFinalize,
      ncclCommDestroy, ncclCommAbort, ncclCommSplit, ncclCommShrink, ncclGetErrorString,
      ncclGetLastError, ncclResetDebugInit, ncclCommGetAsyncError, ncclCommCount,
      ncclCommCuDevice, ncclCommUserRank, ncclCommRegister, ncclCommDeregister,
      ncclCommWindowRegister, ncclCommWindowDeregister, ncclRedOpCreatePreMulSum,
      ncclRedOpDestroy};
  return &t;
}

/* what 2.28 to 2.30 added, with their types */
struct api_table_230 {
  ncclResult_t (*revoke)(ncclComm_t, int);
  ncclResult_t (*comm_get_unique_id)(ncclComm_t, ncclUniqueId *);
  ncclResult_t (*grow)(ncclComm_t, int, const ncclUniqueId *, int, ncclComm_t *, ncclConfig_t *);
  ncclResult_t (*suspend)(ncclComm_t, int), (*resume)(ncclComm_t);
  ncclResult_t (*mem_stats)(ncclComm_t, ncclCommMemStat_t, uint64_t *);
  ncclResult_t (*win_user_ptr)(ncclComm_t, ncclWindow_t, void **);
  coll_gather_t alltoall;
  coll_root_t gather, scatter;
  ncclResult_t (*put_signal)(const void *, size_t, ncclDataType_t, int, ncclWindow_t, size_t, int,
                             int, unsigned int, ncclComm_t, cudaStream_t);
  ncclResult_t (*signal)(int, int, int, unsigned int, ncclComm_t, cudaStream_t);
  ncclResult_t (*wait_signal)(int, ncclWaitSignalDesc_t *, ncclComm_t, cudaStream_t);
  ncclResult_t (*param_bind)(ncclParamHandle_t *, const char *);
  ncclResult_t (*param_i8)(ncclParamHandle_t, int8_t *), (*param_u64)(ncclParamHandle_t, uint64_t *);
  ncclResult_t (*param_str)(ncclParamHandle_t, const char **);
  ncclResult_t (*param_get)(ncclParamHandle_t, void *, int, int *);
  ncclResult_t (*param_by_key)(const char *, const char **, int *);
  ncclResult_t (*param_keys)(const char ***, int *);
  void (*param_dump)(void);
  ncclResult_t (*dev_comm_create)(ncclComm_t, const ncclDevCommRequirements_t *, ncclDevComm_t *);
  ncclResult_t (*dev_comm_destroy)(ncclComm_t, const ncclDevComm_t *);
  ncclResult_t (*query_properties)(ncclComm_t, ncclCommProperties_t *);
  ncclResult_t (*peer_pointer)(ncclWindow_t, size_t, int, void **);
  ncclResult_t (*lsa_multimem_pointer)(ncclWindow_t, size_t, void **);
  ncclResult_t (*multimem_pointer)(ncclWindow_t, size_t, ncclMultimemHandle_t, void **);
  ncclTeam_t (*team_world)(ncclComm_t);
  int (*team_rank_to_world)(ncclComm_t, ncclTeam_t, int);
  int (*lla2a_slots)(int, int);
};

const struct api_table_230 *api_table_230_get(void);
const struct api_table_230 *api_table_230_get(void) {
  /* positional: C++11 has no designated initializers */
  static const struct api_table_230 t = {
      ncclCommRevoke, ncclCommGetUniqueId, ncclCommGrow, ncclCommSuspend, ncclCommResume,
      ncclCommMemStats, ncclWinGetUserPtr, ncclAlltoAll, ncclGather, ncclScatter, ncclPutSignal,
      ncclSignal, ncclWaitSignal, ncclParamBind, ncclParamGetI8, ncclParamGetU64, ncclParamGetStr,
      ncclParamGet, ncclParamGetParameter, ncclParamGetAllParameterKeys, ncclParamDumpAll,
      ncclDevCommCreate, ncclDevCommDestroy, ncclCommQueryProperties, ncclGetPeerDevicePointer,
      ncclGetLsaMultimemDevicePointer, ncclGetMultimemDevicePointer, ncclTeamWorld,
      ncclTeamRankToWorld, ncclLLA2ACalcSlots
  };
  return &t;
}

/* what 2.31 and 2.32 added, with their types */
typedef ncclResult_t (*coll_config_red_t)(const void *, void *, size_t, ncclDataType_t,
                                          ncclRedOp_t, ncclComm_t, cudaStream_t,
                                          const ncclCollConfig_t *);
typedef ncclResult_t (*coll_config_root_t)(const void *, void *, size_t, ncclDataType_t, int,
                                           ncclComm_t, cudaStream_t, const ncclCollConfig_t *);
typedef ncclResult_t (*coll_config_t)(const void *, void *, size_t, ncclDataType_t, ncclComm_t,
                                      cudaStream_t, const ncclCollConfig_t *);
struct api_table_232 {
  coll_config_red_t all_reduce, reduce_scatter;
  ncclResult_t (*reduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, int,
                         ncclComm_t, cudaStream_t, const ncclCollConfig_t *);
  coll_config_root_t broadcast, gather, scatter;
  coll_config_t all_gather, alltoall;
  ncclResult_t (*set_encryption)(const ncclEncryptionConfig_t *);
  ncclTeam_t (*team_cft)(ncclComm_t, ncclCftTeamMode_t);
  ncclTeam_t (*team_cft_multimem)(ncclComm_t);
  ncclResult_t (*multimem_le)(ncclWindow_t, size_t, ncclCftLeId *, size_t *);
  ncclResult_t (*cft_le)(ncclWindow_t, size_t, int, ncclTeam_t, ncclCftLeId *, size_t *);
  ncclResult_t (*peer_le)(ncclWindow_t, size_t, int, ncclCftLeId *, size_t *);
  void (*reset_debug_internal)(void);
};

const struct api_table_232 *api_table_232_get(void);
const struct api_table_232 *api_table_232_get(void) {
  static const struct api_table_232 t = {
      ncclAllReduceConfig, ncclReduceScatterConfig, ncclReduceConfig, ncclBroadcastConfig,
      ncclGatherConfig, ncclScatterConfig, ncclAllGatherConfig, ncclAlltoAllConfig,
      ncclSetEncryption, ncclTeamCft, ncclTeamCftMultimem, ncclGetMultimemDeviceLeInfo,
      ncclGetCftDeviceLeInfo, ncclGetPeerDeviceLeInfo, ncclResetDebugInitInternal};
  return &t;
}
