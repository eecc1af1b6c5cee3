/*
 * nccl.h for weft's libnccl.so.2: the NCCL 2.32 API, implemented over weft.
 *
 * Programs written for NCCL compile against this header and run on weft, or
 * keep their NCCL build and load weft's libnccl.so.2 in its place: the types,
 * enum values, struct layouts and symbol names are NCCL 2.32's, so the ABI is
 * the same. ncclGetVersion reports 23203 (NCCL 2.32.3).
 *
 * Buffers may be host memory (no GPU needed): pass a NULL stream and the call
 * completes before it returns. docs/nccl.md says what differs from NCCL.
 *
 * Every function has a pnccl* twin with the same behaviour, for profilers
 * that interpose the nccl* names.
 */
#ifndef NCCL_H_
#define NCCL_H_

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

/* cudaStream_t: CUDA's own when its headers are there, else the same
 * pointer type under the same name, so both kinds of caller link alike. */
#if defined(__has_include)
#if __has_include(<cuda_runtime.h>)
#include <cuda_runtime.h>
#define NCCL_WEFT_HAVE_CUDA_RUNTIME 1
#endif
#endif
#ifndef NCCL_WEFT_HAVE_CUDA_RUNTIME
typedef struct CUstream_st *cudaStream_t;
typedef struct CUevent_st *cudaEvent_t;
#endif

#define NCCL_MAJOR 2
#define NCCL_MINOR 32
#define NCCL_PATCH 3
#define NCCL_SUFFIX ""

/* Up to 2.8 the code was X*1000 + Y*100 + Z; from 2.9 on, X*10000 + Y*100 + Z. */
#define NCCL_VERSION(X, Y, Z)                                                  \
  (((X) <= 2 && (Y) <= 8) ? (X) * 1000 + (Y) * 100 + (Z)                       \
                          : (X) * 10000 + (Y) * 100 + (Z))
#define NCCL_VERSION_CODE 23203

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ncclComm *ncclComm_t;
typedef struct ncclWindow_vidmem *ncclWindow_t;
#define NCCL_COMM_NULL NULL

/* 128 opaque bytes; weft keeps its rendezvous address and secret in them. */
#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
  ncclTimeout = 8, /* weft reports a timed-out peer as ncclRemoteError */
  ncclNumResults = 9
} ncclResult_t;

#define NCCL_CONFIG_UNDEF_INT INT_MIN
#define NCCL_CONFIG_UNDEF_PTR NULL
#define NCCL_SPLIT_NOCOLOR -1
#define NCCL_UNDEF_FLOAT -1.0f

/* ncclConfig_t.magic (NCCL_CONFIG_MAGIC is its older name) */
#define NCCL_API_MAGIC 0xcafebeef

/* ncclCommWindowRegister flags; NCCL's windows want this alignment */
#define NCCL_WIN_DEFAULT 0x00
#define NCCL_WIN_COLL_SYMMETRIC 0x01
#define NCCL_WIN_STRICT_ORDERING 0x02
#define NCCL_WIN_GIN_ONLY 0x04    /* from 2.31: register for GIN only */
#define NCCL_WIN_CFT_COUNTED 0x08 /* from 2.31: CFT counted endpoints */
#define NCCL_WIN_REQUIRED_ALIGNMENT 4096

/* ncclConfig_t.CTAPolicy values */
#define NCCL_CTA_POLICY_DEFAULT 0x00
#define NCCL_CTA_POLICY_EFFICIENCY 0x01
#define NCCL_CTA_POLICY_ZERO 0x02

/* ncclCommShrink flags */
#define NCCL_SHRINK_DEFAULT 0x00 /* the parent is healthy */
#define NCCL_SHRINK_ABORT 0x01   /* the parent may hold failed operations */

/* ncclCommRevoke flags: none yet, pass 0 */
#define NCCL_REVOKE_DEFAULT 0x00

/* ncclCommSuspend flags */
#define NCCL_SUSPEND_MEM 0x01 /* release the communicator's scratch memory */

/* ncclConfig_t.hostCftMode (from 2.31): host-side CFT endpoints. */
typedef enum {
  ncclHostCftDefault = NCCL_CONFIG_UNDEF_INT,
  ncclHostCftEnable = 1,
  ncclHostCftDisable = 2,
  ncclHostCftFallback = 3
} ncclHostCftMode_t;

/* ncclConfig_t.nvlsHostMode (from 2.32): NVLS parts a communicator leaves
 * out; the component flags combine. */
typedef enum {
  ncclNvlsHostModeDefault = NCCL_CONFIG_UNDEF_INT,
  ncclNvlsHostModeEnable = 0,
  ncclNvlsHostModeDisableTransport = 1 << 0,
  ncclNvlsHostModeDisableSymmetricMultimem = 1 << 1,
  ncclNvlsHostModeDisable = INT_MAX
} ncclNvlsHostMode_t;

/* Communicator configuration. Initialise with NCCL_CONFIG_INITIALIZER, then
 * set fields. size, magic and version say which layout the caller compiled:
 * the library reads only the first `size` bytes, and fields newer than
 * `version` take their defaults. Each field is checked against NCCL's range
 * (ncclInvalidArgument); weft uses blocking, minCTAs and maxCTAs (as its
 * channel bounds) and commName, and ignores the others (docs/nccl.md). */
typedef struct ncclConfig_v23100 {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;
  int cgaClusterSize;
  int minCTAs;
  int maxCTAs;
  const char *netName;
  int splitShare;
  int trafficClass;
  const char *commName;
  int collnetEnable;
  int CTAPolicy;
  int shrinkShare;
  int nvlsCTAs;
  int nChannelsPerNetPeer; /* from 2.28 */
  int nvlinkCentricSched;
  int graphUsageMode;      /* from 2.29 */
  int numRmaCtx;
  int maxP2pPeers;         /* from 2.30 */
  int graphStreamOrdering; /* from 2.30.5 */
  int launchOrderImplicit; /* from 2.31 */
  int numRmaSig;
  int rmaEagerInit;
  int hostCftMode;         /* ncclHostCftMode_t */
  int nvlsHostMode;        /* from 2.32: ncclNvlsHostMode_t */
} ncclConfig_t;

#define NCCL_CONFIG_MAGIC NCCL_API_MAGIC
#define NCCL_CONFIG_INITIALIZER                                                \
  {                                                                            \
    sizeof(ncclConfig_t),                    /* size */                        \
    NCCL_CONFIG_MAGIC,                       /* magic */                       \
    NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH), /* version */            \
    NCCL_CONFIG_UNDEF_INT,                   /* blocking */                    \
    NCCL_CONFIG_UNDEF_INT,                   /* cgaClusterSize */              \
    NCCL_CONFIG_UNDEF_INT,                   /* minCTAs */                     \
    NCCL_CONFIG_UNDEF_INT,                   /* maxCTAs */                     \
    NCCL_CONFIG_UNDEF_PTR,                   /* netName */                     \
    NCCL_CONFIG_UNDEF_INT,                   /* splitShare */                  \
    NCCL_CONFIG_UNDEF_INT,                   /* trafficClass */                \
    NCCL_CONFIG_UNDEF_PTR,                   /* commName */                    \
    NCCL_CONFIG_UNDEF_INT,                   /* collnetEnable */               \
    NCCL_CONFIG_UNDEF_INT,                   /* CTAPolicy */                   \
    NCCL_CONFIG_UNDEF_INT,                   /* shrinkShare */                 \
    NCCL_CONFIG_UNDEF_INT,                   /* nvlsCTAs */                    \
    NCCL_CONFIG_UNDEF_INT,                   /* nChannelsPerNetPeer */         \
    NCCL_CONFIG_UNDEF_INT,                   /* nvlinkCentricSched */          \
    NCCL_CONFIG_UNDEF_INT,                   /* graphUsageMode */              \
    NCCL_CONFIG_UNDEF_INT,                   /* numRmaCtx */                   \
    NCCL_CONFIG_UNDEF_INT,                   /* maxP2pPeers */                 \
    NCCL_CONFIG_UNDEF_INT,                   /* graphStreamOrdering */         \
    NCCL_CONFIG_UNDEF_INT,                   /* launchOrderImplicit */         \
    NCCL_CONFIG_UNDEF_INT,                   /* numRmaSig */                   \
    NCCL_CONFIG_UNDEF_INT,                   /* rmaEagerInit */                \
    NCCL_CONFIG_UNDEF_INT,                   /* hostCftMode */                 \
    NCCL_CONFIG_UNDEF_INT                    /* nvlsHostMode */                \
  }

/* One vendor option, keyed by (vendorId, optionId); options chain through
 * next (no cycles, no duplicate keys) and hang off ncclCollConfig_t.ext.
 * NCCL ignores them all, and so does weft. */
typedef struct ncclConfigExt {
  struct ncclConfigExt *next;
  struct {
    int vendorId; /* non-zero, below 2^24 */
    int optionId;
  } key;
  union {
    int i;
    const char *s;
    void *raw;
  } val;
} ncclConfigExt_t;

/* Per-call configuration of the nccl*Config collectives (from 2.31).
 * Initialise with NCCL_COLLCONFIG_INITIALIZER, set the same on every rank;
 * the struct only grows at its end, and size/version say which layout the
 * caller compiled. A NULL config is the plain call. docs/nccl.md says which
 * fields weft honours. */
typedef struct ncclCollConfig_v23200 {
  size_t size;
  unsigned int magic;
  unsigned int version;
  ncclConfigExt_t *ext;
  int minCTAs;
  int maxCTAs;
  int nvlsCTAs;
  int cgaClusterSize;
  const char *algSelection; /* NULL or "" is automatic */
  int forceAlgSelection;    /* 1: a selection that cannot be met is an error */
  int CTAPolicy;            /* NCCL_CTA_POLICY_*; unset: the communicator's */
  uint64_t userProfilerTag; /* for profilers; values with the top bit set are NCCL's */
  cudaEvent_t launchCompletionEvent; /* from 2.32 */
} ncclCollConfig_t;

#define NCCL_COLLCONFIG_INITIALIZER                                            \
  {                                                                            \
    sizeof(ncclCollConfig_t),                /* size */                        \
    NCCL_API_MAGIC,                          /* magic */                       \
    NCCL_VERSION_CODE,                       /* version */                     \
    NCCL_CONFIG_UNDEF_PTR,                   /* ext */                         \
    NCCL_CONFIG_UNDEF_INT,                   /* minCTAs */                     \
    NCCL_CONFIG_UNDEF_INT,                   /* maxCTAs */                     \
    NCCL_CONFIG_UNDEF_INT,                   /* nvlsCTAs */                    \
    NCCL_CONFIG_UNDEF_INT,                   /* cgaClusterSize */              \
    NCCL_CONFIG_UNDEF_PTR,                   /* algSelection */                \
    1,                                       /* forceAlgSelection */           \
    NCCL_CONFIG_UNDEF_INT,                   /* CTAPolicy */                   \
    0,                                       /* userProfilerTag */             \
    NCCL_CONFIG_UNDEF_PTR                    /* launchCompletionEvent */       \
  }

/* ncclSetEncryption's configuration (from 2.32): TLS with a pre-shared key
 * (NUL-terminated, at least 32 bytes) on the library's TCP sockets. */
#define NCCL_ENCRYPTION_MODE_NONE 0
#define NCCL_ENCRYPTION_MODE_PSK 1
typedef struct ncclEncryptionConfig {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int mode;
  const char *psk;
} ncclEncryptionConfig_t;

#define NCCL_ENCRYPTION_CONFIG_INITIALIZER                                     \
  {                                                                            \
    sizeof(ncclEncryptionConfig_t),          /* size */                        \
    NCCL_API_MAGIC,                          /* magic */                       \
    NCCL_VERSION_CODE,                       /* version */                     \
    NCCL_ENCRYPTION_MODE_NONE,               /* mode */                        \
    NCCL_CONFIG_UNDEF_PTR                    /* psk */                         \
  }

/* Filled by ncclGroupSimulateEnd: the cost model's estimate, in
 * microseconds, of the group had it run. */
typedef struct ncclSimInfo_v22200 {
  size_t size;
  unsigned int magic;
  unsigned int version;
  float estimatedTime;
} ncclSimInfo_t;

#define NCCL_SIM_INFO_MAGIC 0x74685283
#define NCCL_SIM_INFO_INITIALIZER                                              \
  {                                                                            \
    sizeof(ncclSimInfo_t), NCCL_SIM_INFO_MAGIC,                                \
        NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH), NCCL_UNDEF_FLOAT     \
  }

/* Reductions. Values >= ncclNumOps are ops made by ncclRedOpCreatePreMulSum. */
typedef enum { ncclNumOps_dummy = 5 } ncclRedOp_dummy_t;
typedef enum {
  ncclSum = 0,
  ncclProd = 1,
  ncclMax = 2,
  ncclMin = 3,
  ncclAvg = 4,
  ncclNumOps = 5,
  /* the largest value that keeps the enum the size of an int */
  ncclMaxRedOp = 0x7fffffff >> (32 - 8 * sizeof(ncclRedOp_dummy_t))
} ncclRedOp_t;

typedef enum {
  ncclInt8 = 0, ncclChar = 0,
  ncclUint8 = 1,
  ncclInt32 = 2, ncclInt = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6, ncclHalf = 6,
  ncclFloat32 = 7, ncclFloat = 7,
  ncclFloat64 = 8, ncclDouble = 8,
  ncclBfloat16 = 9,
  ncclFloat8e4m3 = 10,
  ncclFloat8e5m2 = 11,
  ncclNumTypes = 12
} ncclDataType_t;

/* Where the scalar of ncclRedOpCreatePreMulSum lives: read each time the op
 * runs (Device), or copied before the call returns (HostImmediate). */
typedef enum {
  ncclScalarDevice = 0,
  ncclScalarHostImmediate = 1
} ncclScalarResidence_t;

/* ncclCommMemStats: what to report. weft counts the scratch buffers it
 * keeps per communicator (host memory for host ranks), which is what
 * NCCL_SUSPEND_MEM releases; connection FIFOs are not counted. */
typedef enum {
  ncclStatGpuMemSuspend = 0,   /* bytes ncclCommSuspend(NCCL_SUSPEND_MEM) would release */
  ncclStatGpuMemSuspended = 1, /* 1 while suspended, else 0 */
  ncclStatGpuMemPersist = 2,   /* bytes counted that suspending keeps: 0 in weft */
  ncclStatGpuMemTotal = 3      /* Suspend + Persist */
} ncclCommMemStat_t;

/* ncclWaitSignal: wait for opCnt signals from peer on (sigIdx, ctx). */
typedef struct {
  int opCnt;
  int peer;
  int sigIdx;
  int ctx;
} ncclWaitSignalDesc_t;

/* ncclParamBind's handle onto one of the library's parameters. */
typedef struct ncclParamHandle *ncclParamHandle_t;

/* The host side of NCCL's device API (nccl_device.h in NCCL). weft has no
 * device communicators or symmetric memory: the types are opaque here. */
typedef struct ncclDevComm ncclDevComm_t;
typedef struct ncclDevCommRequirements ncclDevCommRequirements_t;
typedef struct ncclDevResourceRequirements ncclDevResourceRequirements_t;
typedef struct ncclCommProperties ncclCommProperties_t;
typedef struct ncclLsaBarrierHandle ncclLsaBarrierHandle_t;
typedef struct ncclGinBarrierHandle ncclGinBarrierHandle_t;
typedef struct ncclLLA2AHandle ncclLLA2AHandle_t;
struct ncclGinOutboxHandle;
struct ncclGinInboxA2AHandle;
/* A team: nRanks ranks, this one at `rank`, world ranks `stride` apart. */
typedef struct ncclTeam {
  int nRanks, rank, stride;
} ncclTeam_t;
typedef struct ncclMultimemHandle {
  void *mcBasePtr;
} ncclMultimemHandle_t;
/* CFT (compute fabric transport, from 2.31): a logical endpoint's id, and
 * which ranks ncclTeamCft's team holds. */
typedef uint32_t ncclCftLeId;
typedef ncclCftLeId ncclCftLeId_t;
typedef enum {
  NCCL_CFT_TEAM_FLAT = 0,
  NCCL_CFT_TEAM_HIER_MULTIMEM = 1,
  NCCL_CFT_TEAM_HIER_LSA = 2
} ncclCftTeamMode_t;

/* The declarations come in pairs, nccl* and pnccl*. */
#define NCCL_WEFT_API(ret, name, args) ret name args; ret p##name args

/* --- Memory ---------------------------------------------------------------- */
/* Memory that collectives move with fewer copies (weftMemAlloc). */
NCCL_WEFT_API(ncclResult_t, ncclMemAlloc, (void **ptr, size_t size));
NCCL_WEFT_API(ncclResult_t, ncclMemFree, (void *ptr));

/* --- Versions, ids, communicators --------------------------------------- */
NCCL_WEFT_API(ncclResult_t, ncclGetVersion, (int *version));
/* Starts a rendezvous service in this process, which must live until every
 * rank has joined. Send the id to the other ranks. */
NCCL_WEFT_API(ncclResult_t, ncclGetUniqueId, (ncclUniqueId *uniqueId));
/* Process-wide TLS on the library's sockets: weft's are plaintext (peers
 * prove the id's secret), so NCCL_ENCRYPTION_MODE_NONE succeeds and
 * NCCL_ENCRYPTION_MODE_PSK returns ncclInvalidUsage. */
NCCL_WEFT_API(ncclResult_t, ncclSetEncryption, (const ncclEncryptionConfig_t *config));
NCCL_WEFT_API(ncclResult_t, ncclCommInitRankConfig,
              (ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
               ncclConfig_t *config));
NCCL_WEFT_API(ncclResult_t, ncclCommInitRank,
              (ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank));
/* ndev ranks in this process; collectives on them go inside a group. */
NCCL_WEFT_API(ncclResult_t, ncclCommInitAll, (ncclComm_t *comm, int ndev, const int *devlist));
NCCL_WEFT_API(ncclResult_t, ncclCommFinalize, (ncclComm_t comm));
NCCL_WEFT_API(ncclResult_t, ncclCommDestroy, (ncclComm_t comm));
NCCL_WEFT_API(ncclResult_t, ncclCommAbort, (ncclComm_t comm));
NCCL_WEFT_API(ncclResult_t, ncclCommSplit,
              (ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config));
/* Called by the ranks that stay (not by those in excludeRanksList, which may
 * be dead): a new communicator of them, in their old order. */
NCCL_WEFT_API(ncclResult_t, ncclCommShrink,
              (ncclComm_t comm, int *excludeRanksList, int excludeRanksCount,
               ncclComm_t *newcomm, ncclConfig_t *config, int shrinkFlags));
/* Stops every operation in flight on comm, here and (through the
 * connections) on its peers, which fail with an error. When it returns the
 * communicator is quiet: ncclCommGetAsyncError reports ncclSuccess, new
 * operations on it are refused with ncclInvalidUsage, and split, shrink and
 * destroy work. revokeFlags must be NCCL_REVOKE_DEFAULT. */
NCCL_WEFT_API(ncclResult_t, ncclCommRevoke, (ncclComm_t comm, int revokeFlags));
/* A fresh id for ncclCommGrow, made by the existing rank that will be the
 * grow's root; one at a time per communicator, until a grow consumes it. */
NCCL_WEFT_API(ncclResult_t, ncclCommGetUniqueId, (ncclComm_t comm, ncclUniqueId *uniqueId));
/* A communicator of nRanks ranks: comm's ranks keep their numbers, new ranks
 * take the others. Existing ranks pass comm and rank -1, the root also the
 * id from ncclCommGetUniqueId, the others NULL; new ranks pass comm NULL,
 * that id and their rank. With config NULL, existing ranks keep the parent's
 * timeout and name. */
NCCL_WEFT_API(ncclResult_t, ncclCommGrow,
              (ncclComm_t comm, int nRanks, const ncclUniqueId *uniqueId, int rank,
               ncclComm_t *newcomm, ncclConfig_t *config));
/* While suspended a communicator refuses operations (ncclInvalidUsage);
 * NCCL_SUSPEND_MEM also frees its scratch buffers, allocated again when
 * needed after ncclCommResume. */
NCCL_WEFT_API(ncclResult_t, ncclCommSuspend, (ncclComm_t comm, int flags));
NCCL_WEFT_API(ncclResult_t, ncclCommResume, (ncclComm_t comm));
NCCL_WEFT_API(ncclResult_t, ncclCommMemStats,
              (ncclComm_t comm, ncclCommMemStat_t stat, uint64_t *value));
/* As ncclCommInitRankConfig with nId ids, the same on every rank. */
NCCL_WEFT_API(ncclResult_t, ncclCommInitRankScalable,
              (ncclComm_t *newcomm, int nranks, int myrank, int nId, ncclUniqueId *commIds,
               ncclConfig_t *config));

/* --- Errors and logging --------------------------------------------------- */
NCCL_WEFT_API(const char *, ncclGetErrorString, (ncclResult_t result));
NCCL_WEFT_API(const char *, ncclGetLastError, (ncclComm_t comm));
/* Reads NCCL_DEBUG, NCCL_DEBUG_SUBSYS and NCCL_DEBUG_FILE again (NCCL 2.30
 * deprecates it; it stays exported). */
NCCL_WEFT_API(void, ncclResetDebugInit, (void));
/* The same, under the name NCCL 2.32 exports for its own tests; it has no
 * pnccl twin. */
void ncclResetDebugInitInternal(void);
NCCL_WEFT_API(ncclResult_t, ncclCommGetAsyncError, (ncclComm_t comm, ncclResult_t *asyncError));

/* --- Communicator queries and registration --------------------------------- */
NCCL_WEFT_API(ncclResult_t, ncclCommCount, (const ncclComm_t comm, int *count));
NCCL_WEFT_API(ncclResult_t, ncclCommCuDevice, (const ncclComm_t comm, int *device));
NCCL_WEFT_API(ncclResult_t, ncclCommUserRank, (const ncclComm_t comm, int *rank));
NCCL_WEFT_API(ncclResult_t, ncclCommRegister,
              (const ncclComm_t comm, void *buff, size_t size, void **handle));
NCCL_WEFT_API(ncclResult_t, ncclCommDeregister, (const ncclComm_t comm, void *handle));
NCCL_WEFT_API(ncclResult_t, ncclCommWindowRegister,
              (ncclComm_t comm, void *buff, size_t size, ncclWindow_t *win, int winFlags));
NCCL_WEFT_API(ncclResult_t, ncclCommWindowDeregister, (ncclComm_t comm, ncclWindow_t win));
/* The buffer a window was registered with. */
NCCL_WEFT_API(ncclResult_t, ncclWinGetUserPtr, (ncclComm_t comm, ncclWindow_t win, void **outUserPtr));

/* --- Reduction operators --------------------------------------------------- */
NCCL_WEFT_API(ncclResult_t, ncclRedOpCreatePreMulSum,
              (ncclRedOp_t *op, void *scalar, ncclDataType_t datatype,
               ncclScalarResidence_t residence, ncclComm_t comm));
NCCL_WEFT_API(ncclResult_t, ncclRedOpDestroy, (ncclRedOp_t op, ncclComm_t comm));

/* --- Collectives ----------------------------------------------------------- */
/* Counts are in elements. In place: sendbuff == recvbuff for all-reduce,
 * broadcast and reduce; sendbuff == recvbuff + rank*sendcount for
 * all-gather; recvbuff == sendbuff + rank*recvcount for reduce-scatter. */
NCCL_WEFT_API(ncclResult_t, ncclReduce,
              (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
               ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream));
NCCL_WEFT_API(ncclResult_t, ncclBcast,
              (void *buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
               cudaStream_t stream));
NCCL_WEFT_API(ncclResult_t, ncclBroadcast,
              (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
               int root, ncclComm_t comm, cudaStream_t stream));
NCCL_WEFT_API(ncclResult_t, ncclAllReduce,
              (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream));
NCCL_WEFT_API(ncclResult_t, ncclReduceScatter,
              (const void *sendbuff, void *recvbuff, size_t recvcount,
               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
               cudaStream_t stream));
NCCL_WEFT_API(ncclResult_t, ncclAllGather,
              (const void *sendbuff, void *recvbuff, size_t sendcount,
               ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream));

/* Block j of sendbuff goes to rank j
 * (all-to-all, scatter from root); gather puts rank i's sendbuff at block i of
 * root's recvbuff. */
NCCL_WEFT_API(ncclResult_t, ncclAlltoAll,
              (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
               ncclComm_t comm, cudaStream_t stream));
NCCL_WEFT_API(ncclResult_t, ncclGather,
              (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
               int root, ncclComm_t comm, cudaStream_t stream));
NCCL_WEFT_API(ncclResult_t, ncclScatter,
              (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
               int root, ncclComm_t comm, cudaStream_t stream));

/* Each collective with a trailing per-call configuration (from 2.31); a NULL
 * config is the plain call. */
NCCL_WEFT_API(ncclResult_t, ncclAllReduceConfig,
              (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream,
               const ncclCollConfig_t *config));
NCCL_WEFT_API(ncclResult_t, ncclBroadcastConfig,
              (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
               int root, ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t *config));
NCCL_WEFT_API(ncclResult_t, ncclReduceConfig,
              (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
               ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream,
               const ncclCollConfig_t *config));
NCCL_WEFT_API(ncclResult_t, ncclAllGatherConfig,
              (const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
               ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t *config));
NCCL_WEFT_API(ncclResult_t, ncclReduceScatterConfig,
              (const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,
               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream,
               const ncclCollConfig_t *config));
NCCL_WEFT_API(ncclResult_t, ncclAlltoAllConfig,
              (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
               ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t *config));
NCCL_WEFT_API(ncclResult_t, ncclGatherConfig,
              (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
               int root, ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t *config));
NCCL_WEFT_API(ncclResult_t, ncclScatterConfig,
              (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
               int root, ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t *config));

/* --- Point-to-point -------------------------------------------------------- */
NCCL_WEFT_API(ncclResult_t, ncclSend,
              (const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
               ncclComm_t comm, cudaStream_t stream));
NCCL_WEFT_API(ncclResult_t, ncclRecv,
              (void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
               ncclComm_t comm, cudaStream_t stream));

/* One-sided puts and signals into peers' windows: weft has no remote memory
 * access, so these return ncclInvalidUsage. */
NCCL_WEFT_API(ncclResult_t, ncclPutSignal,
              (const void *localbuff, size_t count, ncclDataType_t datatype, int peer,
               ncclWindow_t peerWin, size_t peerWinOffset, int sigIdx, int ctx,
               unsigned int flags, ncclComm_t comm, cudaStream_t stream));
NCCL_WEFT_API(ncclResult_t, ncclSignal,
              (int peer, int sigIdx, int ctx, unsigned int flags, ncclComm_t comm,
               cudaStream_t stream));
NCCL_WEFT_API(ncclResult_t, ncclWaitSignal,
              (int nDesc, ncclWaitSignalDesc_t *signalDescs, ncclComm_t comm,
               cudaStream_t stream));

/* --- Groups ---------------------------------------------------------------- */
NCCL_WEFT_API(ncclResult_t, ncclGroupStart, (void));
NCCL_WEFT_API(ncclResult_t, ncclGroupEnd, (void));
/* Ends the group without running it; fills simInfo (may be NULL). */
NCCL_WEFT_API(ncclResult_t, ncclGroupSimulateEnd, (ncclSimInfo_t *simInfo));

/* --- Parameters ------------------------------------------------------------ */
/* weft's environment parameters, by name: WEFT_* (weftConfigPrint lists
 * them) or an NCCL_* name weft maps onto one (NCCL_DEBUG, NCCL_ALGO, ...).
 * Integer parameters read as I64 (and the narrower types when the value
 * fits), the others as Str. Returned strings live until the thread's next
 * call of the same function. */
NCCL_WEFT_API(ncclResult_t, ncclParamBind, (ncclParamHandle_t *out, const char *key));
NCCL_WEFT_API(ncclResult_t, ncclParamGetI8, (ncclParamHandle_t h, int8_t *out));
NCCL_WEFT_API(ncclResult_t, ncclParamGetI16, (ncclParamHandle_t h, int16_t *out));
NCCL_WEFT_API(ncclResult_t, ncclParamGetI32, (ncclParamHandle_t h, int32_t *out));
NCCL_WEFT_API(ncclResult_t, ncclParamGetI64, (ncclParamHandle_t h, int64_t *out));
NCCL_WEFT_API(ncclResult_t, ncclParamGetU8, (ncclParamHandle_t h, uint8_t *out));
NCCL_WEFT_API(ncclResult_t, ncclParamGetU16, (ncclParamHandle_t h, uint16_t *out));
NCCL_WEFT_API(ncclResult_t, ncclParamGetU32, (ncclParamHandle_t h, uint32_t *out));
NCCL_WEFT_API(ncclResult_t, ncclParamGetU64, (ncclParamHandle_t h, uint64_t *out));
NCCL_WEFT_API(ncclResult_t, ncclParamGetStr, (ncclParamHandle_t h, const char **out));
/* The value's bytes into out (maxLen at most): an int64_t for integers, the
 * text and its NUL for strings; *len says how many. */
NCCL_WEFT_API(ncclResult_t, ncclParamGet, (ncclParamHandle_t h, void *out, int maxLen, int *len));
NCCL_WEFT_API(ncclResult_t, ncclParamGetParameter,
              (const char *key, const char **value, int *valueLen));
NCCL_WEFT_API(ncclResult_t, ncclParamGetAllParameterKeys, (const char ***table, int *tableLen));
/* Prints every parameter, its value, default and meaning, to stdout. */
NCCL_WEFT_API(void, ncclParamDumpAll, (void));

/* --- NCCL's device API (host side) ----------------------------------------- */
/* Device communicators, symmetric-memory pointers, barriers and GIN
 * resources: weft has none, and each returns ncclInvalidUsage with a message
 * naming it (also comm's last error). ncclLLA2ACalcSlots returns -1. */
NCCL_WEFT_API(ncclResult_t, ncclDevCommCreate,
              (ncclComm_t comm, const ncclDevCommRequirements_t *reqs, ncclDevComm_t *outDevComm));
NCCL_WEFT_API(ncclResult_t, ncclDevCommDestroy, (ncclComm_t comm, const ncclDevComm_t *devComm));
NCCL_WEFT_API(ncclResult_t, ncclCommQueryProperties, (ncclComm_t comm, ncclCommProperties_t *props));
NCCL_WEFT_API(ncclResult_t, ncclGetLsaMultimemDevicePointer,
              (ncclWindow_t window, size_t offset, void **outPtr));
NCCL_WEFT_API(ncclResult_t, ncclGetMultimemDevicePointer,
              (ncclWindow_t window, size_t offset, ncclMultimemHandle_t multimem, void **outPtr));
NCCL_WEFT_API(ncclResult_t, ncclGetLsaDevicePointer,
              (ncclWindow_t window, size_t offset, int lsaRank, void **outPtr));
NCCL_WEFT_API(ncclResult_t, ncclGetPeerDevicePointer,
              (ncclWindow_t window, size_t offset, int peer, void **outPtr));
NCCL_WEFT_API(ncclResult_t, ncclLsaBarrierCreateRequirement,
              (ncclTeam_t team, int nBarriers, ncclLsaBarrierHandle_t *outHandle,
               ncclDevResourceRequirements_t *outReq));
NCCL_WEFT_API(ncclResult_t, ncclGinBarrierCreateRequirement,
              (ncclComm_t comm, ncclTeam_t team, int nBarriers, ncclGinBarrierHandle_t *outHandle,
               ncclDevResourceRequirements_t *outReq));
NCCL_WEFT_API(ncclResult_t, ncclGinOutboxCreateRequirement,
              (int nBlocks, int size_log2, struct ncclGinOutboxHandle *outHandle,
               ncclDevResourceRequirements_t *outReq));
NCCL_WEFT_API(ncclResult_t, ncclGinInboxA2ACreateRequirement,
              (ncclTeam_t peers, int nBlocks, int size_log2, struct ncclGinInboxA2AHandle *outHandle,
               ncclDevResourceRequirements_t *outReq));
NCCL_WEFT_API(int, ncclLLA2ACalcSlots, (int maxElts, int maxEltSize));
NCCL_WEFT_API(ncclResult_t, ncclLLA2ACreateRequirement,
              (int nBlocks, int nSlots, ncclLLA2AHandle_t *outHandle,
               ncclDevResourceRequirements_t *outReq));
/* Teams are arithmetic, and weft answers them: the world is every rank;
 * the load/store-accessible (LSA) team is this rank alone, since no peer's
 * window is mapped here; the rail team is then the world again. A bad comm
 * gives a team of 0 ranks, and the rank conversions -1. */
NCCL_WEFT_API(ncclTeam_t, ncclTeamWorld, (ncclComm_t comm));
NCCL_WEFT_API(ncclTeam_t, ncclTeamLsa, (ncclComm_t comm));
NCCL_WEFT_API(ncclTeam_t, ncclTeamRail, (ncclComm_t comm));
NCCL_WEFT_API(int, ncclTeamRankToWorld, (ncclComm_t comm, ncclTeam_t team, int rank));
NCCL_WEFT_API(int, ncclTeamRankToLsa, (ncclComm_t comm, ncclTeam_t team, int rank));
/* CFT (from 2.31): weft has no fabric endpoints. The teams are empty (0
 * ranks) and the endpoint queries return ncclInvalidArgument, as NCCL's do
 * on a communicator without CFT; each leaves a message naming itself. */
#ifdef __cplusplus /* C++ callers may leave out the mode, as with NCCL */
ncclTeam_t ncclTeamCft(ncclComm_t comm, ncclCftTeamMode_t mode = NCCL_CFT_TEAM_FLAT);
ncclTeam_t pncclTeamCft(ncclComm_t comm, ncclCftTeamMode_t mode = NCCL_CFT_TEAM_FLAT);
#else
NCCL_WEFT_API(ncclTeam_t, ncclTeamCft, (ncclComm_t comm, ncclCftTeamMode_t mode));
#endif
NCCL_WEFT_API(ncclTeam_t, ncclTeamCftMultimem, (ncclComm_t comm));
NCCL_WEFT_API(ncclResult_t, ncclGetMultimemDeviceLeInfo,
              (ncclWindow_t window, size_t offset, ncclCftLeId *leId, size_t *leOffset));
NCCL_WEFT_API(ncclResult_t, ncclGetCftDeviceLeInfo,
              (ncclWindow_t window, size_t offset, int peerCft, ncclTeam_t cftTeam,
               ncclCftLeId *leId, size_t *leOffset));
NCCL_WEFT_API(ncclResult_t, ncclGetPeerDeviceLeInfo,
              (ncclWindow_t window, size_t offset, int peerWorld, ncclCftLeId *leId,
               size_t *leOffset));

#undef NCCL_WEFT_API

#ifdef __cplusplus
}
#endif
#endif /* NCCL_H_ */
