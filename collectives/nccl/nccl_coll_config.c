/* The nccl*Config collectives (NCCL 2.31 on): each collective with a
 * trailing ncclCollConfig_t.
 *
 * The configuration is read as ncclConfig_t is: only the caller's `size`
 * bytes, with the fields newer than its `version` at their defaults, and
 * checked (magic, CTA bounds, policy, forceAlgSelection). weft has no
 * per-call tuning: its tuner picks algorithm and channels from the size and
 * the communicator's settings (WEFT_ALGO / NCCL_ALGO, minCTAs and maxCTAs of
 * the communicator's config), so the CTA counts, cluster size, CTA policy
 * and algSelection are accepted and leave the call as the plain one; ext
 * and userProfilerTag are for vendors and profilers and are ignored, as
 * NCCL ignores ext. launchCompletionEvent asks for a CUDA event recorded at
 * the kernel's launch, which weft does not record: a non-NULL event is
 * refused with ncclInvalidUsage rather than left unrecorded. Then the call
 * is the plain one (its pnccl name, so that a profiler that interposes
 * nccl* sees one call). */
#include <stddef.h>
#include <string.h>

#include "nccl_shim.h"

static ncclResult_t coll_config_refuse(ncclComm_t comm, weftResult_t code, const char *fn,
                                       const char *what, int value) {
  weftResult_t res = weft_error_set(code, "%s: ncclCollConfig_t.%s is %d", fn, what, value);
  compat_comm_error_keep((weftComm_t)comm);
  return (ncclResult_t)res;
}

/* Whether user (may be NULL) is a configuration weft runs the call with. */
static ncclResult_t coll_config_check(const ncclCollConfig_t *user, ncclComm_t comm,
                                      const char *fn) {
  if (user == NULL) return ncclSuccess;
  const ncclCollConfig_t defaults = NCCL_COLLCONFIG_INITIALIZER;
  ncclCollConfig_t c = defaults;
  size_t size;
  memcpy(&size, user, sizeof size);
  if (size < offsetof(ncclCollConfig_t, ext)) {
    weftResult_t res =
        weft_error_set(weftInvalidArgument, "%s: ncclCollConfig_t size %zu is too small", fn, size);
    compat_comm_error_keep((weftComm_t)comm);
    return (ncclResult_t)res;
  }
  memcpy(&c, user, size < sizeof c ? size : sizeof c);
  if (c.magic != NCCL_API_MAGIC) {
    weftResult_t res = weft_error_set(weftInvalidArgument,
                                      "%s: ncclCollConfig_t was not initialised with "
                                      "NCCL_COLLCONFIG_INITIALIZER (magic 0x%x)",
                                      fn, c.magic);
    compat_comm_error_keep((weftComm_t)comm);
    return (ncclResult_t)res;
  }
  if (c.version < NCCL_VERSION(2, 32, 0)) c.launchCompletionEvent = defaults.launchCompletionEvent;

  const struct {
    const char *name;
    int value;
  } ctas[] = {{"minCTAs", c.minCTAs},
              {"maxCTAs", c.maxCTAs},
              {"nvlsCTAs", c.nvlsCTAs},
              {"cgaClusterSize", c.cgaClusterSize}};
  for (size_t i = 0; i < sizeof ctas / sizeof ctas[0]; i++)
    if (ctas[i].value != NCCL_CONFIG_UNDEF_INT && ctas[i].value < 0)
      return coll_config_refuse(comm, weftInvalidArgument, fn, ctas[i].name, ctas[i].value);
  if (c.minCTAs != NCCL_CONFIG_UNDEF_INT && c.maxCTAs != NCCL_CONFIG_UNDEF_INT &&
      c.minCTAs > c.maxCTAs)
    return coll_config_refuse(comm, weftInvalidArgument, fn, "minCTAs (above maxCTAs)", c.minCTAs);
  const int policies = NCCL_CTA_POLICY_EFFICIENCY | NCCL_CTA_POLICY_ZERO;
  if (c.CTAPolicy != NCCL_CONFIG_UNDEF_INT && (c.CTAPolicy & ~policies) != 0)
    return coll_config_refuse(comm, weftInvalidArgument, fn, "CTAPolicy", c.CTAPolicy);
  if (c.forceAlgSelection != 0 && c.forceAlgSelection != 1)
    return coll_config_refuse(comm, weftInvalidArgument, fn, "forceAlgSelection",
                              c.forceAlgSelection);
  if (c.launchCompletionEvent != NULL) {
    weftResult_t res = weft_error_set(weftInvalidUsage,
                                      "%s: ncclCollConfig_t.launchCompletionEvent is not "
                                      "supported by weft (it records no launch event)",
                                      fn);
    compat_comm_error_keep((weftComm_t)comm);
    return (ncclResult_t)res;
  }
  return ncclSuccess;
}

#define CONFIG_CHECK(config, comm, fn)                                         \
  do {                                                                         \
    ncclResult_t checked_ = coll_config_check(config, comm, fn);               \
    if (checked_ != ncclSuccess) return checked_;                              \
  } while (0)

NCCL_EXPORT ncclResult_t ncclAllReduceConfig(const void *sendbuff, void *recvbuff, size_t count,
                                             ncclDataType_t datatype, ncclRedOp_t op,
                                             ncclComm_t comm, cudaStream_t stream,
                                             const ncclCollConfig_t *config) {
  CONFIG_CHECK(config, comm, "ncclAllReduceConfig");
  return pncclAllReduce(sendbuff, recvbuff, count, datatype, op, comm, stream);
}
NCCL_PROFILING_ALIAS(ncclAllReduceConfig);

NCCL_EXPORT ncclResult_t ncclBroadcastConfig(const void *sendbuff, void *recvbuff, size_t count,
                                             ncclDataType_t datatype, int root, ncclComm_t comm,
                                             cudaStream_t stream,
                                             const ncclCollConfig_t *config) {
  CONFIG_CHECK(config, comm, "ncclBroadcastConfig");
  return pncclBroadcast(sendbuff, recvbuff, count, datatype, root, comm, stream);
}
NCCL_PROFILING_ALIAS(ncclBroadcastConfig);

NCCL_EXPORT ncclResult_t ncclReduceConfig(const void *sendbuff, void *recvbuff, size_t count,
                                          ncclDataType_t datatype, ncclRedOp_t op, int root,
                                          ncclComm_t comm, cudaStream_t stream,
                                          const ncclCollConfig_t *config) {
  CONFIG_CHECK(config, comm, "ncclReduceConfig");
  return pncclReduce(sendbuff, recvbuff, count, datatype, op, root, comm, stream);
}
NCCL_PROFILING_ALIAS(ncclReduceConfig);

NCCL_EXPORT ncclResult_t ncclAllGatherConfig(const void *sendbuff, void *recvbuff,
                                             size_t sendcount, ncclDataType_t datatype,
                                             ncclComm_t comm, cudaStream_t stream,
                                             const ncclCollConfig_t *config) {
  CONFIG_CHECK(config, comm, "ncclAllGatherConfig");
  return pncclAllGather(sendbuff, recvbuff, sendcount, datatype, comm, stream);
}
NCCL_PROFILING_ALIAS(ncclAllGatherConfig);

NCCL_EXPORT ncclResult_t ncclReduceScatterConfig(const void *sendbuff, void *recvbuff,
                                                 size_t recvcount, ncclDataType_t datatype,
                                                 ncclRedOp_t op, ncclComm_t comm,
                                                 cudaStream_t stream,
                                                 const ncclCollConfig_t *config) {
  CONFIG_CHECK(config, comm, "ncclReduceScatterConfig");
  return pncclReduceScatter(sendbuff, recvbuff, recvcount, datatype, op, comm, stream);
}
NCCL_PROFILING_ALIAS(ncclReduceScatterConfig);

NCCL_EXPORT ncclResult_t ncclAlltoAllConfig(const void *sendbuff, void *recvbuff, size_t count,
                                            ncclDataType_t datatype, ncclComm_t comm,
                                            cudaStream_t stream, const ncclCollConfig_t *config) {
  CONFIG_CHECK(config, comm, "ncclAlltoAllConfig");
  return pncclAlltoAll(sendbuff, recvbuff, count, datatype, comm, stream);
}
NCCL_PROFILING_ALIAS(ncclAlltoAllConfig);

NCCL_EXPORT ncclResult_t ncclGatherConfig(const void *sendbuff, void *recvbuff, size_t count,
                                          ncclDataType_t datatype, int root, ncclComm_t comm,
                                          cudaStream_t stream, const ncclCollConfig_t *config) {
  CONFIG_CHECK(config, comm, "ncclGatherConfig");
  return pncclGather(sendbuff, recvbuff, count, datatype, root, comm, stream);
}
NCCL_PROFILING_ALIAS(ncclGatherConfig);

NCCL_EXPORT ncclResult_t ncclScatterConfig(const void *sendbuff, void *recvbuff, size_t count,
                                           ncclDataType_t datatype, int root, ncclComm_t comm,
                                           cudaStream_t stream, const ncclCollConfig_t *config) {
  CONFIG_CHECK(config, comm, "ncclScatterConfig");
  return pncclScatter(sendbuff, recvbuff, count, datatype, root, comm, stream);
}
NCCL_PROFILING_ALIAS(ncclScatterConfig);
