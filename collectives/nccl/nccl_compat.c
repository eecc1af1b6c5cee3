/* libnccl.so.2: the NCCL 2.32 API (include/nccl.h) over weft.
 *
 * Most calls map one to one: NCCL's enum values are weft's (checked below),
 * a ncclComm_t is a weftComm_t, a ncclUniqueId is a weftUniqueId and a
 * cudaStream_t is passed on as a weftStream_t. What needs more than a cast:
 *   - ncclConfig_t is read under NCCL's rule for older layouts (config_read);
 *   - NCCL_* environment variables that weft has an equivalent for are
 *     copied to the WEFT_* ones when the library loads (nccl_env.c);
 *   - every nccl* symbol has a pnccl* alias, as NCCL exports for profilers.
 * The build links weft in statically and exports only nccl* and pnccl*. */
#include <limits.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "nccl_shim.h"
#include "../core/plan.h"

/* --- The ABI: NCCL's values are weft's ------------------------------------ */

#define SAME_VALUE(a, b) _Static_assert((int)(a) == (int)(b), #a " != " #b)
SAME_VALUE(ncclSuccess, weftSuccess);
SAME_VALUE(ncclUnhandledCudaError, weftUnhandledCudaError);
SAME_VALUE(ncclSystemError, weftSystemError);
SAME_VALUE(ncclInternalError, weftInternalError);
SAME_VALUE(ncclInvalidArgument, weftInvalidArgument);
SAME_VALUE(ncclInvalidUsage, weftInvalidUsage);
SAME_VALUE(ncclRemoteError, weftRemoteError);
SAME_VALUE(ncclInProgress, weftInProgress);
/* every weft result is an NCCL one; weft never returns ncclTimeout */
SAME_VALUE(ncclTimeout, weftNumResults);
SAME_VALUE(ncclInt8, weftInt8);
SAME_VALUE(ncclUint8, weftUint8);
SAME_VALUE(ncclInt32, weftInt32);
SAME_VALUE(ncclUint32, weftUint32);
SAME_VALUE(ncclInt64, weftInt64);
SAME_VALUE(ncclUint64, weftUint64);
SAME_VALUE(ncclFloat16, weftFloat16);
SAME_VALUE(ncclFloat32, weftFloat32);
SAME_VALUE(ncclFloat64, weftFloat64);
SAME_VALUE(ncclBfloat16, weftBfloat16);
SAME_VALUE(ncclFloat8e4m3, weftFloat8e4m3);
SAME_VALUE(ncclFloat8e5m2, weftFloat8e5m2);
SAME_VALUE(ncclNumTypes, weftNumTypes);
SAME_VALUE(ncclSum, weftSum);
SAME_VALUE(ncclProd, weftProd);
SAME_VALUE(ncclMax, weftMax);
SAME_VALUE(ncclMin, weftMin);
SAME_VALUE(ncclAvg, weftAvg);
SAME_VALUE(ncclNumOps, weftNumOps);
SAME_VALUE(ncclScalarDevice, weftScalarDevice);
SAME_VALUE(ncclScalarHostImmediate, weftScalarHostImmediate);
SAME_VALUE(NCCL_SPLIT_NOCOLOR, WEFT_SPLIT_NOCOLOR);
_Static_assert(sizeof(ncclUniqueId) == sizeof(weftUniqueId), "unique id sizes differ");
_Static_assert(sizeof(ncclRedOp_t) == sizeof(weftRedOp_t), "op sizes differ");
_Static_assert(sizeof(ncclDataType_t) == sizeof(weftDataType_t), "datatype sizes differ");

#define COMM(c) ((weftComm_t)(c))
#define STREAM(s) ((weftStream_t)(s))
/* Operations refuse to start on a revoked, suspended or finalized
 * communicator, before their arguments are looked at (compat_comm_usable). */
#define USABLE(comm, fn)                                                       \
  do {                                                                         \
    weftResult_t usable_ = compat_comm_usable(COMM(comm), fn);                 \
    if (usable_ != weftSuccess) return (ncclResult_t)usable_;                  \
  } while (0)
/* The same for a compared collective (coll, with its arguments), which a
 * refusal still numbers (compat_coll_refused). */
/* The same for an all-to-all, gather or scatter (compat_coll_mark_refused). */
#define USABLE_MARK(comm, fn, coll, sendbuff, recvbuff, count, datatype, root)   \
  do {                                                                         \
    weftResult_t usable_ = compat_comm_usable(COMM(comm), fn);                 \
    if (usable_ != weftSuccess) {                                              \
      compat_coll_mark_refused(COMM(comm), coll, sendbuff, recvbuff, count,    \
                               (weftDataType_t)(datatype), root, usable_);     \
      return (ncclResult_t)usable_;                                            \
    }                                                                          \
  } while (0)
#define USABLE_COLL(comm, fn, coll, count, datatype, op, root)                 \
  do {                                                                         \
    weftResult_t usable_ = compat_comm_usable(COMM(comm), fn);                 \
    if (usable_ != weftSuccess) {                                              \
      compat_coll_refused(COMM(comm), coll, count, (weftDataType_t)(datatype), \
                          (weftRedOp_t)(op), root, usable_);                   \
      return (ncclResult_t)usable_;                                            \
    }                                                                          \
  } while (0)

/* --- Configuration --------------------------------------------------------- */

/* An int field of ncclConfig_t: the NCCL version that added it (a caller's
 * config of an older version leaves it at its default) and the values NCCL
 * accepts (NCCL_CONFIG_UNDEF_INT is always accepted: "unset"). */
struct config_int_field {
  const char *name;
  size_t offset;
  unsigned int since;
  int min, max;
};

#define CONFIG_INT(field, since_code, lo, hi)                                   \
  {#field, offsetof(ncclConfig_t, field), since_code, lo, hi}
/* INT_MIN to INT_MAX: any value (NCCL checks none) */
static const struct config_int_field config_int_fields[] = {
    CONFIG_INT(blocking, NCCL_VERSION(2, 14, 0), 0, 1),
    CONFIG_INT(cgaClusterSize, NCCL_VERSION(2, 17, 0), 0, INT_MAX),
    CONFIG_INT(minCTAs, NCCL_VERSION(2, 17, 0), 1, INT_MAX),
    CONFIG_INT(maxCTAs, NCCL_VERSION(2, 17, 0), 1, INT_MAX),
    CONFIG_INT(splitShare, 0, 0, 1),
    CONFIG_INT(trafficClass, NCCL_VERSION(2, 25, 0), INT_MIN, INT_MAX),
    CONFIG_INT(collnetEnable, NCCL_VERSION(2, 27, 0), 0, 1),
    CONFIG_INT(CTAPolicy, NCCL_VERSION(2, 27, 0), 0,
               NCCL_CTA_POLICY_EFFICIENCY | NCCL_CTA_POLICY_ZERO),
    CONFIG_INT(shrinkShare, NCCL_VERSION(2, 27, 0), 0, 1),
    CONFIG_INT(nvlsCTAs, NCCL_VERSION(2, 27, 0), 1, INT_MAX),
    CONFIG_INT(nChannelsPerNetPeer, NCCL_VERSION(2, 28, 0), 1, 64), /* NCCL's MAXCHANNELS */
    CONFIG_INT(nvlinkCentricSched, NCCL_VERSION(2, 28, 0), 0, 1),
    CONFIG_INT(graphUsageMode, NCCL_VERSION(2, 29, 0), 0, 2),
    CONFIG_INT(numRmaCtx, NCCL_VERSION(2, 29, 0), 0, INT_MAX),
    CONFIG_INT(maxP2pPeers, NCCL_VERSION(2, 30, 0), 1, INT_MAX),
    CONFIG_INT(graphStreamOrdering, NCCL_VERSION(2, 30, 5), 0, 1),
    CONFIG_INT(launchOrderImplicit, NCCL_VERSION(2, 31, 0), 0, 1),
    CONFIG_INT(numRmaSig, NCCL_VERSION(2, 31, 0), 0, INT_MAX),
    CONFIG_INT(rmaEagerInit, NCCL_VERSION(2, 31, 0), 0, 1),
    CONFIG_INT(hostCftMode, NCCL_VERSION(2, 31, 0), ncclHostCftEnable, ncclHostCftFallback),
    /* ncclNvlsHostMode_t's flags combine: not checked */
    CONFIG_INT(nvlsHostMode, NCCL_VERSION(2, 32, 0), INT_MIN, INT_MAX),
};
#undef CONFIG_INT
/* a field added to ncclConfig_t after nvlsHostMode needs its line above */
_Static_assert(sizeof(void *) != 8 || sizeof(ncclConfig_t) == 120,
               "ncclConfig_t has a field that config_int_fields does not list");

static int *config_int(ncclConfig_t *c, const struct config_int_field *f) {
  return (int *)(void *)((char *)c + f->offset);
}

static int config_int_default(const struct config_int_field *f) {
  ncclConfig_t defaults = NCCL_CONFIG_INITIALIZER;
  return *config_int(&defaults, f);
}

/* "ncclConfig_t.<name> is <value>: must be 0 or 1" and the like. */
static ncclResult_t config_int_refuse(const struct config_int_field *f, int value) {
  char range[64];
  if (f->max == INT_MAX) snprintf(range, sizeof range, "at least %d", f->min);
  else if (f->max == f->min + 1) snprintf(range, sizeof range, "%d or %d", f->min, f->max);
  else snprintf(range, sizeof range, "%d to %d", f->min, f->max);
  return RES(weft_error_set(weftInvalidArgument,
                            "ncclConfig_t.%s is %d: must be %s (or NCCL_CONFIG_UNDEF_INT)",
                            f->name, value, range));
}

/* Reads an ncclConfig_t of any 2.x layout into weft's config: only the
 * caller's `size` bytes, and fields newer than its `version` (or cut by its
 * size) take their defaults, unchecked; the others are checked against
 * NCCL's ranges. weft honours blocking, minCTAs, maxCTAs and commName; the
 * other fields are checked and then ignored (docs/nccl.md). */
ncclResult_t nccl_config_read(const ncclConfig_t *user, weftConfig_t *cfg,
                              weftConfig_t **cfg_out_p) {
  *cfg_out_p = NULL;
  if (user == NULL) return ncclSuccess;
  const ncclConfig_t defaults = NCCL_CONFIG_INITIALIZER;
  ncclConfig_t c = defaults;
  size_t size;
  memcpy(&size, user, sizeof size);
  if (size < offsetof(ncclConfig_t, blocking))
    return RES(weft_error_set(weftInvalidArgument, "ncclConfig_t size %zu is too small", size));
  memcpy(&c, user, size < sizeof c ? size : sizeof c);
  if (c.magic != NCCL_CONFIG_MAGIC)
    return RES(weft_error_set(weftInvalidArgument,
                              "ncclConfig_t was not initialised with NCCL_CONFIG_INITIALIZER "
                              "(magic 0x%x)",
                              c.magic));
  if (c.version < NCCL_VERSION(2, 17, 0)) c.netName = defaults.netName;
  for (size_t i = 0; i < sizeof config_int_fields / sizeof config_int_fields[0]; i++) {
    const struct config_int_field *f = &config_int_fields[i];
    int *value = config_int(&c, f);
    if (c.version < f->since || size < f->offset + sizeof(int)) {
      *value = config_int_default(f);
      continue;
    }
    if (*value != NCCL_CONFIG_UNDEF_INT && (*value < f->min || *value > f->max))
      return config_int_refuse(f, *value);
  }
  if (c.minCTAs != NCCL_CONFIG_UNDEF_INT && c.maxCTAs != NCCL_CONFIG_UNDEF_INT &&
      c.minCTAs > c.maxCTAs)
    return RES(weft_error_set(weftInvalidArgument, "ncclConfig_t.minCTAs %d > maxCTAs %d",
                              c.minCTAs, c.maxCTAs));

  const weftConfig_t wdefaults = WEFT_CONFIG_INITIALIZER;
  *cfg = wdefaults;
  cfg->blocking = c.blocking == NCCL_CONFIG_UNDEF_INT ? WEFT_CONFIG_UNDEF_INT : c.blocking;
  /* NCCL clamps CTA counts to what it has; weft's channels play their part
   * (the comm clamps them for its host rings and its device channels) */
  cfg->minChannels = c.minCTAs == NCCL_CONFIG_UNDEF_INT ? WEFT_CONFIG_UNDEF_INT : c.minCTAs;
  cfg->maxChannels = c.maxCTAs == NCCL_CONFIG_UNDEF_INT ? WEFT_CONFIG_UNDEF_INT : c.maxCTAs;
  cfg->commName = size >= offsetof(ncclConfig_t, collnetEnable) ? c.commName : NULL;
  *cfg_out_p = cfg;
  return ncclSuccess;
}

/* --- Encryption ------------------------------------------------------------ */

/* Checked as NCCL checks it; then mode NONE is what weft's sockets are, and
 * PSK is refused: weft has no TLS, and a job that asked for encryption must
 * not run in the clear. */
NCCL_EXPORT ncclResult_t ncclSetEncryption(const ncclEncryptionConfig_t *config) {
  ncclEncryptionConfig_t c = NCCL_ENCRYPTION_CONFIG_INITIALIZER;
  if (config != NULL) {
    if (config->magic != NCCL_API_MAGIC)
      return RES(weft_error_set(weftInvalidArgument,
                                "ncclSetEncryption: config was not initialised with "
                                "NCCL_ENCRYPTION_CONFIG_INITIALIZER (magic 0x%x)",
                                config->magic));
    memcpy(&c, config, config->size < sizeof c ? config->size : sizeof c);
  }
  switch (c.mode) {
  case NCCL_ENCRYPTION_MODE_NONE:
    return ncclSuccess;
  case NCCL_ENCRYPTION_MODE_PSK:
    if (c.psk == NULL || strlen(c.psk) < 32)
      return RES(weft_error_set(weftInvalidArgument,
                                "ncclSetEncryption: NCCL_ENCRYPTION_MODE_PSK needs a psk of at "
                                "least 32 bytes"));
    return RES(weft_error_set(weftInvalidUsage,
                              "ncclSetEncryption: TLS encryption of sockets is not supported by "
                              "weft"));
  default:
    return RES(weft_error_set(weftInvalidArgument,
                              "ncclSetEncryption: mode %d is not an encryption mode", c.mode));
  }
}
NCCL_PROFILING_ALIAS(ncclSetEncryption);

/* --- Memory ---------------------------------------------------------------- */

/* NCCL's is device memory of the current device, whose context it makes
 * current if need be; weftMemAlloc's is device memory where the thread has
 * a context, so the context is made first where there is a device (host
 * memory on a machine without one). */
NCCL_EXPORT ncclResult_t ncclMemAlloc(void **ptr, size_t size) {
  compat_device_ctx_make();
  return RES(weftMemAlloc(ptr, size));
}
NCCL_PROFILING_ALIAS(ncclMemAlloc);

NCCL_EXPORT ncclResult_t ncclMemFree(void *ptr) { return RES(weftMemFree(ptr)); }
NCCL_PROFILING_ALIAS(ncclMemFree);

/* --- Versions, ids, communicators ------------------------------------------ */

NCCL_EXPORT ncclResult_t ncclGetVersion(int *version) {
  weft_error_clear();
  if (version == NULL) return RES(weft_error_set(weftInvalidArgument, "ncclGetVersion: version is NULL"));
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}
NCCL_PROFILING_ALIAS(ncclGetVersion);

/* With NCCL_COMM_ID=host:port every process computes the same id without
 * talking to the others, and rank 0 serves the rendezvous on that address
 * when it joins (comm_id_root_start), as NCCL does. */
static ncclResult_t comm_id_from_env(int *set_p, weftUniqueId *id_out) {
  const char *fixed = getenv("NCCL_COMM_ID");
  *set_p = fixed != NULL && *fixed != '\0';
  return *set_p ? RES(compat_id_from_hostport(fixed, "NCCL_COMM_ID", id_out)) : ncclSuccess;
}

static ncclResult_t comm_id_root_start(int rank, const ncclUniqueId *commId) {
  int set;
  weftUniqueId id;
  ncclResult_t res = comm_id_from_env(&set, &id);
  if (res != ncclSuccess || !set || rank != 0 || memcmp(&id, commId, sizeof id) != 0) return res;
  return RES(compat_id_root_start(&id));
}

NCCL_EXPORT ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId) {
  nccl_env_first_use();
  weft_error_clear();
  if (uniqueId == NULL) return RES(weft_error_set(weftInvalidArgument, "uniqueId is NULL"));
  int set;
  weftUniqueId id;
  ncclResult_t res = comm_id_from_env(&set, &id);
  if (res != ncclSuccess) return res;
  if (!set) return RES(weftGetUniqueId((weftUniqueId *)uniqueId));
  memcpy(uniqueId, &id, sizeof id);
  return ncclSuccess;
}
NCCL_PROFILING_ALIAS(ncclGetUniqueId);

/* A refusal of the layer's own while a group is open fails the group too,
 * as NCCL's: its end returns it and creates nothing. */
static ncclResult_t group_refused(ncclResult_t res) {
  compat_group_fail((weftResult_t)res);
  return res;
}

static ncclResult_t init_rank_config(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
                                     ncclConfig_t *config) {
  nccl_env_first_use();
  weft_error_clear();
  if (comm != NULL) *comm = NULL; /* what a failed init leaves, as NCCL's */
  weftConfig_t cfg, *cfgp;
  ncclResult_t res = nccl_config_read(config, &cfg, &cfgp);
  if (res != ncclSuccess) return group_refused(res);
  nccl_version_banner(rank);
  res = comm_id_root_start(rank, &commId);
  if (res != ncclSuccess) return group_refused(res);
  weftUniqueId id;
  memcpy(&id, &commId, sizeof id);
  return RES(compat_comm_init((weftComm_t *)comm, nranks, &id, rank, cfgp));
}

NCCL_EXPORT ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId,
                                                int rank, ncclConfig_t *config) {
  return init_rank_config(comm, nranks, commId, rank, config);
}
NCCL_PROFILING_ALIAS(ncclCommInitRankConfig);

NCCL_EXPORT ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId,
                                          int rank) {
  return init_rank_config(comm, nranks, commId, rank, NULL);
}
NCCL_PROFILING_ALIAS(ncclCommInitRank);

/* weft needs one rendezvous, not one per id: every rank joins the first. */
NCCL_EXPORT ncclResult_t ncclCommInitRankScalable(ncclComm_t *newcomm, int nranks, int myrank,
                                                  int nId, ncclUniqueId *commIds,
                                                  ncclConfig_t *config) {
  weft_error_clear();
  if (nId < 1 || commIds == NULL)
    return group_refused(RES(weft_error_set(
        weftInvalidArgument, "ncclCommInitRankScalable: needs at least one id (nId %d, ids %p)",
        nId, (void *)commIds)));
  if (nId > nranks) /* as NCCL: an id serves one rank at least */
    return group_refused(RES(weft_error_set(
        weftInvalidArgument, "ncclCommInitRankScalable: %d ids for %d ranks (at most one a rank)",
        nId, nranks)));
  return init_rank_config(newcomm, nranks, commIds[0], myrank, config);
}
NCCL_PROFILING_ALIAS(ncclCommInitRankScalable);

/* Without devlist NCCL takes the first ndev CUDA devices; weft's ranks stay
 * on the host where the process sees fewer (a machine without GPUs). */
NCCL_EXPORT ncclResult_t ncclCommInitAll(ncclComm_t *comm, int ndev, const int *devlist) {
  nccl_env_first_use();
  nccl_version_banner(0);
  weft_error_clear();
  /* as NCCL: a device named twice is refused */
  for (int i = 0; devlist != NULL && i < ndev; i++)
    for (int j = 0; j < i; j++)
      if (devlist[i] == devlist[j])
        return RES(weft_error_set(weftInvalidUsage,
                                  "ncclCommInitAll: device %d is named twice in devlist (at %d "
                                  "and %d)",
                                  devlist[i], j, i));
  int *first = NULL;
  if (devlist == NULL && ndev > 0 && compat_device_count() >= ndev) {
    first = malloc((size_t)ndev * sizeof *first);
    if (first == NULL) return RES(weft_error_set(weftSystemError, "out of memory"));
    for (int i = 0; i < ndev; i++) first[i] = i;
  }
  ncclResult_t res = RES(weftCommInitAll((weftComm_t *)comm, ndev, first ? first : devlist));
  free(first);
  return res;
}
NCCL_PROFILING_ALIAS(ncclCommInitAll);

NCCL_EXPORT ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  /* as NCCL: nothing to finalize for NULL, and a second finalize is refused
   * (weft's own returns the async error again) */
  if (comm == NULL) return ncclSuccess;
  weft_error_clear();
  if (comm_check(COMM(comm)) == weftSuccess && comm_life(COMM(comm)) == COMM_FINALIZED)
    return RES(weft_error_set(weftInvalidArgument,
                              "ncclCommFinalize: the communicator is finalized already"));
  return RES(weftCommFinalize(COMM(comm)));
}
NCCL_PROFILING_ALIAS(ncclCommFinalize);

/* comm's windows around its free (the windows' section, below). */
static void windows_close_begin(ncclComm_t comm);
static void windows_close_end(ncclComm_t comm, int freed);

NCCL_EXPORT ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  /* NCCL accepts a NULL communicator here */
  if (comm == NULL) return ncclSuccess;
  nccl_comm_close_begin(comm);
  windows_close_begin(comm);
  ncclResult_t res = RES(weftCommDestroy(COMM(comm)));
  windows_close_end(comm, res == ncclSuccess);
  nccl_comm_close_end(comm, res == ncclSuccess);
  return res;
}
NCCL_PROFILING_ALIAS(ncclCommDestroy);

NCCL_EXPORT ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm == NULL) return ncclSuccess;
  nccl_comm_close_begin(comm);
  windows_close_begin(comm);
  ncclResult_t res = RES(weftCommAbort(COMM(comm)));
  windows_close_end(comm, res == ncclSuccess);
  nccl_comm_close_end(comm, res == ncclSuccess);
  return res;
}
NCCL_PROFILING_ALIAS(ncclCommAbort);

/* A rank that passes NCCL_SPLIT_NOCOLOR makes no communicator: as in NCCL,
 * its config is not read, so a bad one cannot fail the others' split. */
NCCL_EXPORT ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                                       ncclConfig_t *config) {
  weft_error_clear();
  /* as NCCL: NULL until a communicator is made, whatever refuses the call */
  if (newcomm != NULL) *newcomm = NULL;
  weftConfig_t cfg, *cfgp = NULL;
  ncclResult_t res =
      color == NCCL_SPLIT_NOCOLOR ? ncclSuccess : nccl_config_read(config, &cfg, &cfgp);
  if (res != ncclSuccess) {
    /* in a group it fails the group, whose end then runs nothing; outside
     * one the peers learn of it at once (their splits run now) */
    return compat_group_depth() > 0
               ? group_refused(res)
               : RES(compat_comm_split_refused(COMM(comm), key, (weftResult_t)res));
  }
  return RES(compat_comm_split(COMM(comm), color, key, (weftComm_t *)newcomm, cfgp));
}
NCCL_PROFILING_ALIAS(ncclCommSplit);

/* weft's shrink never waits on the parent's operations, so NCCL_SHRINK_ABORT
 * and NCCL_SHRINK_DEFAULT behave alike. */
NCCL_EXPORT ncclResult_t ncclCommShrink(ncclComm_t comm, int *excludeRanksList,
                                        int excludeRanksCount, ncclComm_t *newcomm,
                                        ncclConfig_t *config, int shrinkFlags) {
  weft_error_clear();
  if (shrinkFlags != NCCL_SHRINK_DEFAULT && shrinkFlags != NCCL_SHRINK_ABORT)
    return group_refused(RES(weft_error_set(weftInvalidArgument,
                                            "ncclCommShrink: unknown flags 0x%x", shrinkFlags)));
  weftConfig_t cfg, *cfgp;
  ncclResult_t res = nccl_config_read(config, &cfg, &cfgp);
  if (res != ncclSuccess) return group_refused(res);
  /* in a group recorded, as a split: one thread may shrink several ranks */
  return RES(compat_comm_shrink(COMM(comm), excludeRanksList, excludeRanksCount,
                                (weftComm_t *)newcomm, cfgp));
}
NCCL_PROFILING_ALIAS(ncclCommShrink);

/* --- Errors ---------------------------------------------------------------- */

NCCL_EXPORT const char *ncclGetErrorString(ncclResult_t result) {
  if (result == ncclTimeout) return "operation timed out";
  return weftGetErrorString((weftResult_t)result);
}
NCCL_PROFILING_ALIAS(ncclGetErrorString);

/* comm's last failure; for NULL the thread's, or where the thread's last
 * call did not fail, the last failure an NCCL call returned on any thread
 * or an async error reported (NCCL keeps one text for the process: a
 * watchdog thread asks it about another thread's failure). A comm that is
 * not live (destroyed or aborted already) is not read: it counts as NULL,
 * as NCCL's ignores its comm. */
NCCL_EXPORT const char *ncclGetLastError(ncclComm_t comm) {
  const char *text = comm != NULL ? compat_comm_error_text(COMM(comm)) : NULL;
  if (text != NULL) return text;
  return weft_error_text()[0] != '\0' ? weft_error_text() : weft_error_text_process();
}
NCCL_PROFILING_ALIAS(ncclGetLastError);

NCCL_EXPORT ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError) {
  ncclResult_t res = RES(weftCommGetAsyncError(COMM(comm), (weftResult_t *)asyncError));
  /* the comm's failure, reported here, is the process's last for a
   * watchdog's ncclGetLastError(NULL) */
  if (res == ncclSuccess && *asyncError != ncclSuccess && *asyncError != ncclInProgress)
    weft_error_publish(weftGetLastError(COMM(comm)));
  return res;
}
NCCL_PROFILING_ALIAS(ncclCommGetAsyncError);

/* --- Communicator queries and registration --------------------------------- */

NCCL_EXPORT ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) {
  return RES(weftCommCount(COMM(comm), count));
}
NCCL_PROFILING_ALIAS(ncclCommCount);

NCCL_EXPORT ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device) {
  return RES(weftCommCuDevice(COMM(comm), device));
}
NCCL_PROFILING_ALIAS(ncclCommCuDevice);

NCCL_EXPORT ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) {
  return RES(weftCommUserRank(COMM(comm), rank));
}
NCCL_PROFILING_ALIAS(ncclCommUserRank);

NCCL_EXPORT ncclResult_t ncclCommRegister(const ncclComm_t comm, void *buff, size_t size,
                                          void **handle) {
  return RES(weftCommRegister(COMM(comm), buff, size, handle));
}
NCCL_PROFILING_ALIAS(ncclCommRegister);

/* A NULL handle (NCCL hands one out where registration is off) is nothing
 * to deregister, as NCCL's. */
NCCL_EXPORT ncclResult_t ncclCommDeregister(const ncclComm_t comm, void *handle) {
  if (handle == NULL) {
    weft_error_clear();
    return comm == NULL ? RES(weft_error_set(weftInvalidArgument, "comm is NULL")) : ncclSuccess;
  }
  return RES(weftCommDeregister(COMM(comm), handle));
}
NCCL_PROFILING_ALIAS(ncclCommDeregister);

/* A window is a registration and the buffer it covers: weft has no separate
 * symmetric-memory kernels, so NCCL_WIN_COLL_SYMMETRIC and
 * NCCL_WIN_STRICT_ORDERING are accepted and change nothing.
 *
 * The process's windows are listed, each in an entry of its own whose first
 * member is what the caller holds: a window passed in is looked up in the
 * list, never read before it is found, so that one never handed out or
 * deregistered already is refused rather than read. Any thread registers. */
struct window_entry {
  struct ncclWindow_vidmem win; /* first: the caller's ncclWindow_t */
  struct window_entry *next;
  int closing; /* its comm is being freed: only windows_close_end sees it */
};
static pthread_mutex_t windows_lock = PTHREAD_MUTEX_INITIALIZER;
static struct window_entry *windows;

/* win's entry, or NULL; under windows_lock. */
static struct window_entry *window_find(ncclWindow_t win) {
  for (struct window_entry *e = windows; e != NULL; e = e->next)
    if (&e->win == win && !e->closing) return e;
  return NULL;
}

NCCL_EXPORT ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void *buff, size_t size,
                                                ncclWindow_t *win, int winFlags) {
  weft_error_clear();
  if (win == NULL)
    return RES(weft_error_set(weftInvalidArgument, "ncclCommWindowRegister: win is NULL"));
  /* the device API's flags: it is refused as a whole (ncclDevCommCreate) */
  if (winFlags & (NCCL_WIN_GIN_ONLY | NCCL_WIN_CFT_COUNTED))
    return RES(weft_error_set(weftInvalidUsage,
                              "ncclCommWindowRegister: flags 0x%x (NCCL_WIN_GIN_ONLY, "
                              "NCCL_WIN_CFT_COUNTED) serve NCCL's device API, which weft does "
                              "not support",
                              winFlags & (NCCL_WIN_GIN_ONLY | NCCL_WIN_CFT_COUNTED)));
  if (winFlags & ~(NCCL_WIN_DEFAULT | NCCL_WIN_COLL_SYMMETRIC | NCCL_WIN_STRICT_ORDERING))
    return RES(weft_error_set(weftInvalidArgument, "ncclCommWindowRegister: unknown flags 0x%x",
                              winFlags));
  struct window_entry *e = calloc(1, sizeof *e);
  if (e == NULL) return RES(weft_error_set(weftSystemError, "ncclCommWindowRegister: out of memory"));
  weftResult_t res = weftCommRegister(COMM(comm), buff, size, &e->win.handle);
  if (res != weftSuccess) {
    free(e);
    return RES(res);
  }
  e->win.magic = NCCL_WINDOW_MAGIC;
  e->win.comm = comm;
  e->win.buff = buff;
  e->win.nbytes = size;
  pthread_mutex_lock(&windows_lock);
  e->next = windows;
  windows = e;
  pthread_mutex_unlock(&windows_lock);
  *win = &e->win;
  return ncclSuccess;
}
NCCL_PROFILING_ALIAS(ncclCommWindowRegister);

ncclComm_t nccl_window_comm(ncclWindow_t win) {
  pthread_mutex_lock(&windows_lock);
  const struct window_entry *e = window_find(win);
  ncclComm_t comm = e != NULL ? e->win.comm : NULL;
  pthread_mutex_unlock(&windows_lock);
  return comm;
}

/* Copies win to copy_out where it is a window of comm (and with take, out
 * of the list: the caller frees it); refused otherwise, win unread. */
static ncclResult_t window_check(ncclComm_t comm, ncclWindow_t win, const char *fn, int take,
                                 struct ncclWindow_vidmem *copy_out) {
  weftResult_t res = compat_comm_check(COMM(comm));
  if (res != weftSuccess) return RES(res);
  pthread_mutex_lock(&windows_lock);
  struct window_entry *e = window_find(win);
  const int ours = e != NULL && e->win.comm == comm;
  if (ours) *copy_out = e->win;
  for (struct window_entry **at = &windows; ours && take && *at != NULL; at = &(*at)->next)
    if (*at == e) {
      *at = e->next;
      break;
    }
  pthread_mutex_unlock(&windows_lock);
  if (!ours)
    return RES(weft_error_set(weftInvalidArgument,
                              "%s: window %p was not registered with this communicator (or was "
                              "deregistered already)",
                              fn, (void *)win));
  return ncclSuccess;
}

NCCL_EXPORT ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win) {
  weft_error_clear();
  struct ncclWindow_vidmem w;
  ncclResult_t res = window_check(comm, win, "ncclCommWindowDeregister", 1, &w);
  if (res != ncclSuccess) return res;
  free((struct window_entry *)(void *)win); /* taken out of the list: this thread's alone */
  return RES(weftCommDeregister(COMM(comm), w.handle));
}
NCCL_PROFILING_ALIAS(ncclCommWindowDeregister);

NCCL_EXPORT ncclResult_t ncclWinGetUserPtr(ncclComm_t comm, ncclWindow_t win, void **outUserPtr) {
  weft_error_clear();
  if (outUserPtr == NULL)
    return RES(weft_error_set(weftInvalidArgument, "ncclWinGetUserPtr: outUserPtr is NULL"));
  struct ncclWindow_vidmem w;
  ncclResult_t res = window_check(comm, win, "ncclWinGetUserPtr", 0, &w);
  if (res != ncclSuccess) return res;
  *outUserPtr = w.buff;
  return ncclSuccess;
}
NCCL_PROFILING_ALIAS(ncclWinGetUserPtr);

/* Around the free of comm (ncclCommDestroy, ncclCommAbort): its windows are
 * set aside before, so that a communicator made at the same address once it
 * is freed has none of them; after, they are freed (their registrations went
 * with comm), or put back where the free was refused (freed 0). */
static void windows_close_begin(ncclComm_t comm) {
  pthread_mutex_lock(&windows_lock);
  for (struct window_entry *e = windows; e != NULL; e = e->next)
    if (e->win.comm == comm) e->closing = 1;
  pthread_mutex_unlock(&windows_lock);
}

static void windows_close_end(ncclComm_t comm, int freed) {
  struct window_entry *gone = NULL;
  pthread_mutex_lock(&windows_lock);
  for (struct window_entry **at = &windows; *at != NULL;) {
    struct window_entry *e = *at;
    if (e->win.comm != comm || !e->closing) {
      at = &e->next;
    } else if (!freed) {
      e->closing = 0;
      at = &e->next;
    } else {
      *at = e->next;
      e->next = gone;
      gone = e;
    }
  }
  pthread_mutex_unlock(&windows_lock);
  while (gone != NULL) {
    struct window_entry *next = gone->next;
    free(gone);
    gone = next;
  }
}

/* --- Reduction operators --------------------------------------------------- */

NCCL_EXPORT ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t *op, void *scalar,
                                                  ncclDataType_t datatype,
                                                  ncclScalarResidence_t residence,
                                                  ncclComm_t comm) {
  return RES(weftRedOpCreatePreMulSum((weftRedOp_t *)op, scalar, (weftDataType_t)datatype,
                                      (weftScalarResidence_t)residence, COMM(comm)));
}
NCCL_PROFILING_ALIAS(ncclRedOpCreatePreMulSum);

NCCL_EXPORT ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  return RES(weftRedOpDestroy((weftRedOp_t)op, COMM(comm)));
}
NCCL_PROFILING_ALIAS(ncclRedOpDestroy);

/* --- Groups ---------------------------------------------------------------- */

/* weft's group: one per thread for both APIs. Inside it, ncclCommInitRank
 * and ncclCommSplit are recorded (compat_comm_init, compat_comm_split) and
 * run at the outermost end, before the group's operations. */
NCCL_EXPORT ncclResult_t ncclGroupStart(void) { return RES(weftGroupStart()); }
NCCL_PROFILING_ALIAS(ncclGroupStart);

NCCL_EXPORT ncclResult_t ncclGroupEnd(void) {
  weft_error_clear();
  return RES(weftGroupEnd());
}
NCCL_PROFILING_ALIAS(ncclGroupEnd);

NCCL_EXPORT ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t *simInfo) {
  weft_error_clear();
  /* an inner end leaves simInfo alone, as NCCL's: the outermost estimates */
  if (compat_group_depth() > 1) return RES(weftGroupSimulateEnd(NULL));
  if (simInfo != NULL && (simInfo->magic != NCCL_SIM_INFO_MAGIC ||
                          simInfo->size < offsetof(ncclSimInfo_t, estimatedTime) + sizeof(float))) {
    /* the group still ends, as NCCL's does, so that the caller is not left in one */
    weftGroupSimulateEnd(NULL);
    return RES(weft_error_set(weftInvalidArgument,
                              "ncclSimInfo_t was not initialised with NCCL_SIM_INFO_INITIALIZER"));
  }
  /* without simInfo, NCCL's simulated end is its group end: the group runs */
  if (simInfo == NULL) return RES(weftGroupEnd());
  float us = 0;
  ncclResult_t res = RES(weftGroupSimulateEnd(&us));
  if (res == ncclSuccess && simInfo != NULL) simInfo->estimatedTime = us;
  return res;
}
NCCL_PROFILING_ALIAS(ncclGroupSimulateEnd);

/* --- Collectives and point-to-point ---------------------------------------- */

NCCL_EXPORT ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count,
                                    ncclDataType_t datatype, ncclRedOp_t op, int root,
                                    ncclComm_t comm, cudaStream_t stream) {
  USABLE_COLL(comm, "ncclReduce", COLL_REDUCE, count, datatype, op, root);
  return RES(weftReduce(sendbuff, recvbuff, count, (weftDataType_t)datatype, (weftRedOp_t)op,
                        root, COMM(comm), STREAM(stream)));
}
NCCL_PROFILING_ALIAS(ncclReduce);

NCCL_EXPORT ncclResult_t ncclBcast(void *buff, size_t count, ncclDataType_t datatype, int root,
                                   ncclComm_t comm, cudaStream_t stream) {
  USABLE_COLL(comm, "ncclBcast", COLL_BROADCAST, count, datatype, ncclSum, root);
  return RES(weftBcast(buff, count, (weftDataType_t)datatype, root, COMM(comm), STREAM(stream)));
}
NCCL_PROFILING_ALIAS(ncclBcast);

NCCL_EXPORT ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                                       ncclDataType_t datatype, int root, ncclComm_t comm,
                                       cudaStream_t stream) {
  USABLE_COLL(comm, "ncclBroadcast", COLL_BROADCAST, count, datatype, ncclSum, root);
  return RES(weftBroadcast(sendbuff, recvbuff, count, (weftDataType_t)datatype, root, COMM(comm),
                           STREAM(stream)));
}
NCCL_PROFILING_ALIAS(ncclBroadcast);

NCCL_EXPORT ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                                       ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                       cudaStream_t stream) {
  USABLE_COLL(comm, "ncclAllReduce", COLL_ALLREDUCE, count, datatype, op, -1);
  return RES(weftAllReduce(sendbuff, recvbuff, count, (weftDataType_t)datatype, (weftRedOp_t)op,
                           COMM(comm), STREAM(stream)));
}
NCCL_PROFILING_ALIAS(ncclAllReduce);

NCCL_EXPORT ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                                           ncclDataType_t datatype, ncclRedOp_t op,
                                           ncclComm_t comm, cudaStream_t stream) {
  USABLE_COLL(comm, "ncclReduceScatter", COLL_REDUCESCATTER, recvcount, datatype, op, -1);
  return RES(weftReduceScatter(sendbuff, recvbuff, recvcount, (weftDataType_t)datatype,
                               (weftRedOp_t)op, COMM(comm), STREAM(stream)));
}
NCCL_PROFILING_ALIAS(ncclReduceScatter);

NCCL_EXPORT ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                                       ncclDataType_t datatype, ncclComm_t comm,
                                       cudaStream_t stream) {
  USABLE_COLL(comm, "ncclAllGather", COLL_ALLGATHER, sendcount, datatype, ncclSum, -1);
  return RES(weftAllGather(sendbuff, recvbuff, sendcount, (weftDataType_t)datatype, COMM(comm),
                           STREAM(stream)));
}
NCCL_PROFILING_ALIAS(ncclAllGather);

/* Block j of sendbuff goes to rank j. */
NCCL_EXPORT ncclResult_t ncclAlltoAll(const void *sendbuff, void *recvbuff, size_t count,
                                      ncclDataType_t datatype, ncclComm_t comm,
                                      cudaStream_t stream) {
  USABLE_MARK(comm, "ncclAlltoAll", COLL_ALLTOALL, sendbuff, recvbuff, count, datatype, -1);
  return RES(weftAlltoAll(sendbuff, recvbuff, count, (weftDataType_t)datatype, COMM(comm),
                          STREAM(stream)));
}
NCCL_PROFILING_ALIAS(ncclAlltoAll);

NCCL_EXPORT ncclResult_t ncclGather(const void *sendbuff, void *recvbuff, size_t count,
                                    ncclDataType_t datatype, int root, ncclComm_t comm,
                                    cudaStream_t stream) {
  USABLE_MARK(comm, "ncclGather", COLL_GATHER, sendbuff, recvbuff, count, datatype, root);
  return RES(weftGather(sendbuff, recvbuff, count, (weftDataType_t)datatype, root, COMM(comm),
                        STREAM(stream)));
}
NCCL_PROFILING_ALIAS(ncclGather);

NCCL_EXPORT ncclResult_t ncclScatter(const void *sendbuff, void *recvbuff, size_t count,
                                     ncclDataType_t datatype, int root, ncclComm_t comm,
                                     cudaStream_t stream) {
  USABLE_MARK(comm, "ncclScatter", COLL_SCATTER, sendbuff, recvbuff, count, datatype, root);
  return RES(weftScatter(sendbuff, recvbuff, count, (weftDataType_t)datatype, root, COMM(comm),
                         STREAM(stream)));
}
NCCL_PROFILING_ALIAS(ncclScatter);

NCCL_EXPORT ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype,
                                  int peer, ncclComm_t comm, cudaStream_t stream) {
  USABLE(comm, "ncclSend");
  return RES(weftSend(sendbuff, count, (weftDataType_t)datatype, peer, COMM(comm),
                      STREAM(stream)));
}
NCCL_PROFILING_ALIAS(ncclSend);

NCCL_EXPORT ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                                  ncclComm_t comm, cudaStream_t stream) {
  USABLE(comm, "ncclRecv");
  return RES(weftRecv(recvbuff, count, (weftDataType_t)datatype, peer, COMM(comm),
                      STREAM(stream)));
}
NCCL_PROFILING_ALIAS(ncclRecv);
