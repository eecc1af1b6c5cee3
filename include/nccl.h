/*
 * nccl.h for weft's libnccl.so.2: the NCCL 2.27 API, implemented over weft.
 *
 * Programs written for NCCL compile against this header and run on weft, or
 * keep their NCCL build and load weft's libnccl.so.2 in its place: the types,
 * enum values, struct layouts and symbol names are NCCL 2.27's, so the ABI is
 * the same. ncclGetVersion reports 22707 (NCCL 2.27.7).
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
#endif

#define NCCL_MAJOR 2
#define NCCL_MINOR 27
#define NCCL_PATCH 7
#define NCCL_SUFFIX ""

/* Up to 2.8 the code was X*1000 + Y*100 + Z; from 2.9 on, X*10000 + Y*100 + Z. */
#define NCCL_VERSION(X, Y, Z)                                                  \
  (((X) <= 2 && (Y) <= 8) ? (X) * 1000 + (Y) * 100 + (Z)                       \
                          : (X) * 10000 + (Y) * 100 + (Z))
#define NCCL_VERSION_CODE 22707

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ncclComm *ncclComm_t;
typedef struct ncclWindow *ncclWindow_t;
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
  ncclNumResults = 8
} ncclResult_t;

#define NCCL_CONFIG_UNDEF_INT INT_MIN
#define NCCL_CONFIG_UNDEF_PTR NULL
#define NCCL_SPLIT_NOCOLOR -1
#define NCCL_UNDEF_FLOAT -1.0f

/* ncclCommWindowRegister flags */
#define NCCL_WIN_DEFAULT 0x00
#define NCCL_WIN_COLL_SYMMETRIC 0x01

/* ncclConfig_t.CTAPolicy values */
#define NCCL_CTA_POLICY_DEFAULT 0x00
#define NCCL_CTA_POLICY_EFFICIENCY 0x01

/* ncclCommShrink flags */
#define NCCL_SHRINK_DEFAULT 0x00 /* the parent is healthy */
#define NCCL_SHRINK_ABORT 0x01   /* the parent may hold failed operations */

/* Communicator configuration. Initialise with NCCL_CONFIG_INITIALIZER, then
 * set fields. size, magic and version say which layout the caller compiled:
 * the library reads only the first `size` bytes, and fields newer than
 * `version` take their defaults. weft uses blocking, minCTAs and maxCTAs (as
 * its channel bounds) and commName; the others are accepted and ignored. */
typedef struct ncclConfig_v22700 {
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
} ncclConfig_t;

#define NCCL_CONFIG_MAGIC 0xcafebeef
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
    NCCL_CONFIG_UNDEF_INT                    /* nvlsCTAs */                    \
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
/* As ncclCommInitRankConfig with nId ids, the same on every rank. */
NCCL_WEFT_API(ncclResult_t, ncclCommInitRankScalable,
              (ncclComm_t *newcomm, int nranks, int myrank, int nId, ncclUniqueId *commIds,
               ncclConfig_t *config));

/* --- Errors and logging --------------------------------------------------- */
NCCL_WEFT_API(const char *, ncclGetErrorString, (ncclResult_t result));
NCCL_WEFT_API(const char *, ncclGetLastError, (ncclComm_t comm));
/* Reads NCCL_DEBUG, NCCL_DEBUG_SUBSYS and NCCL_DEBUG_FILE again. */
NCCL_WEFT_API(void, ncclResetDebugInit, (void));
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

/* NCCL 2.28's collectives, also provided: block j of sendbuff goes to rank j
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

/* --- Point-to-point -------------------------------------------------------- */
NCCL_WEFT_API(ncclResult_t, ncclSend,
              (const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
               ncclComm_t comm, cudaStream_t stream));
NCCL_WEFT_API(ncclResult_t, ncclRecv,
              (void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
               ncclComm_t comm, cudaStream_t stream));

/* --- Groups ---------------------------------------------------------------- */
NCCL_WEFT_API(ncclResult_t, ncclGroupStart, (void));
NCCL_WEFT_API(ncclResult_t, ncclGroupEnd, (void));
/* Ends the group without running it; fills simInfo (may be NULL). */
NCCL_WEFT_API(ncclResult_t, ncclGroupSimulateEnd, (ncclSimInfo_t *simInfo));

#undef NCCL_WEFT_API

#ifdef __cplusplus
}
#endif
#endif /* NCCL_H_ */
