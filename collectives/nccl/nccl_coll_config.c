/* The nccl*Config collectives (NCCL 2.31 on): each collective with a
 * trailing ncclCollConfig_t.
 *
 * The configuration is read as ncclConfig_t is: only the caller's `size`
 * bytes (at least 2.31's 64), with the fields newer than its `version` at
 * their defaults, and checked (magic, policy, forceAlgSelection,
 * algSelection). algSelection is honoured: the call takes the cheapest of
 * the pairs it allows that weft runs (the ring with SIMPLE or LL, and for
 * all-reduce the tree too; plan_tune), and with forceAlgSelection a
 * selection that is malformed or leaves none of them is refused; without
 * it such a selection leaves the call to the tuner. The channels are the
 * communicator's: as NCCL does with values it cannot use, the CTA counts
 * and cluster size are accepted whatever they are; the CTA policy is
 * accepted. ext and userProfilerTag are for vendors and profilers
 * and are ignored, as NCCL ignores ext. launchCompletionEvent asks for a
 * CUDA event recorded at the kernel's launch, which weft does not record: a
 * non-NULL event is refused with ncclInvalidUsage rather than left
 * unrecorded. Then the call is the plain one (its pnccl name, so that a
 * profiler that interposes nccl* sees one call). */
#include <ctype.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <strings.h>

#include "nccl_shim.h"
#include "../core/plan.h"

/* The size of NCCL 2.31's ncclCollConfig_t, the first: the fields up to
 * userProfilerTag. */
#define COLL_CONFIG_V2_31_NBYTES offsetof(ncclCollConfig_t, launchCompletionEvent)
_Static_assert(sizeof(void *) != 8 || COLL_CONFIG_V2_31_NBYTES == 64,
               "NCCL 2.31's ncclCollConfig_t is 64 bytes");

/* The collectives, for what algSelection may name on each. */
enum coll_config_coll {
  CC_ALLREDUCE,
  CC_BROADCAST,
  CC_REDUCE,
  CC_ALLGATHER,
  CC_REDUCESCATTER,
  CC_POINT_TO_POINT /* all-to-all, gather, scatter: sends and receives, no algorithm */
};

/* --- algSelection ------------------------------------------------------------ */

/* NCCL's algorithm and protocol names. A selection is a set of (algorithm,
 * protocol) pairs: bit ALG_BIT(a, p) of a 32-bit mask. */
static const char *const sel_algo_names[] = {"TREE", "RING",      "COLLNET_DIRECT", "COLLNET_CHAIN",
                                             "NVLS", "NVLS_TREE", "PAT",            "SYMK"};
static const char *const sel_proto_names[] = {"LL", "LL128", "SIMPLE"};
enum { SEL_TREE, SEL_RING };
enum { SEL_LL, SEL_LL128, SEL_SIMPLE };
#define SEL_NALGO ((int)(sizeof sel_algo_names / sizeof sel_algo_names[0]))
#define SEL_NPROTO ((int)(sizeof sel_proto_names / sizeof sel_proto_names[0]))
#define ALG_BIT(a, p) (UINT32_C(1) << ((a) * SEL_NPROTO + (p)))
#define SEL_ALL ((UINT32_C(1) << (SEL_NALGO * SEL_NPROTO)) - 1)
_Static_assert(SEL_NALGO * SEL_NPROTO <= 32, "a selection fits 32 bits");

/* What weft runs of those, per collective: ring with simple or LL, and for
 * all-reduce the tree too. */
static uint32_t sel_runnable(enum coll_config_coll coll) {
  uint32_t ring = ALG_BIT(SEL_RING, SEL_SIMPLE) | ALG_BIT(SEL_RING, SEL_LL);
  uint32_t tree = ALG_BIT(SEL_TREE, SEL_SIMPLE) | ALG_BIT(SEL_TREE, SEL_LL);
  return coll == CC_ALLREDUCE ? ring | tree : coll == CC_POINT_TO_POINT ? 0 : ring;
}

/* The pairs one name covers: an algorithm (all its protocols), a protocol
 * (every algorithm with it), or ALGORITHM_PROTOCOL; case-insensitive. 0 for
 * no such name. */
static uint32_t sel_atom(const char *name, size_t len) {
  for (int p = 0; p < SEL_NPROTO; p++)
    if (strlen(sel_proto_names[p]) == len && strncasecmp(name, sel_proto_names[p], len) == 0) {
      uint32_t all = 0;
      for (int a = 0; a < SEL_NALGO; a++) all |= ALG_BIT(a, p);
      return all;
    }
  for (int a = 0; a < SEL_NALGO; a++) {
    size_t alen = strlen(sel_algo_names[a]);
    if (alen > len || strncasecmp(name, sel_algo_names[a], alen) != 0) continue;
    if (alen == len) return ALG_BIT(a, SEL_LL) | ALG_BIT(a, SEL_LL128) | ALG_BIT(a, SEL_SIMPLE);
    const char *suffix = name + alen + 1;
    size_t slen = len - alen - 1;
    if (name[alen] != '_') continue;
    for (int p = 0; p < SEL_NPROTO; p++)
      if (strlen(sel_proto_names[p]) == slen && strncasecmp(suffix, sel_proto_names[p], slen) == 0)
        return ALG_BIT(a, p);
  }
  return 0;
}

/* Parses text, NCCL's syntax: terms joined by ',' (or), each of names
 * joined by '+' (and), a name after '^' negated; blanks around names are
 * ignored. Returns 0 and the selected pairs in *mask_out, or -1 where the
 * text does not parse (an empty or unknown name). */
static int sel_parse(const char *text, uint32_t *mask_out) {
  uint32_t any = 0;
  const char *s = text;
  for (;;) { /* one term */
    uint32_t all = SEL_ALL;
    for (;;) { /* one name */
      while (isspace((unsigned char)*s)) s++;
      int negate = *s == '^';
      if (negate) s++;
      while (isspace((unsigned char)*s)) s++;
      size_t len = strcspn(s, ",+");
      size_t name_len = len;
      while (name_len > 0 && isspace((unsigned char)s[name_len - 1])) name_len--;
      uint32_t atom = name_len > 0 ? sel_atom(s, name_len) : 0;
      if (atom == 0) return -1;
      all &= negate ? SEL_ALL & ~atom : atom;
      s += len;
      if (*s != '+') break;
      s++;
    }
    any |= all;
    if (*s == '\0') break;
    s++; /* ',' */
  }
  *mask_out = any;
  return 0;
}

/* Whether the call may go on under c's algSelection. With
 * forceAlgSelection a selection that does not parse, or that leaves no
 * algorithm and protocol weft runs for coll, is refused; without it either
 * leaves the choice to the tuner. A selection that parses and that weft
 * can meet also leaves it to the tuner: weft's tuner takes no per-call
 * restriction, only the communicator's (WEFT_ALGO, WEFT_PROTO). */
/* The pairs of mask weft runs, as a call's alg_select (PLAN_SELECT bits). */
static unsigned sel_plan_bits(uint32_t mask) {
  unsigned bits = 0;
  if (mask & ALG_BIT(SEL_RING, SEL_SIMPLE)) bits |= PLAN_SELECT(ALGO_RING, PROTO_SIMPLE);
  if (mask & ALG_BIT(SEL_RING, SEL_LL)) bits |= PLAN_SELECT(ALGO_RING, PROTO_LL);
  if (mask & ALG_BIT(SEL_TREE, SEL_SIMPLE)) bits |= PLAN_SELECT(ALGO_TREE, PROTO_SIMPLE);
  if (mask & ALG_BIT(SEL_TREE, SEL_LL)) bits |= PLAN_SELECT(ALGO_TREE, PROTO_LL);
  return bits;
}

static weftResult_t sel_check(const ncclCollConfig_t *c, enum coll_config_coll coll,
                              const char *fn, unsigned *select_out) {
  if (c->algSelection == NULL || c->algSelection[0] == '\0') return weftSuccess;
  uint32_t mask = 0;
  if (sel_parse(c->algSelection, &mask) != 0) {
    if (!c->forceAlgSelection) {
      WEFT_INFO(LOG_COLL, "%s: algSelection \"%s\" does not parse: automatic", fn,
                c->algSelection);
      return weftSuccess;
    }
    return weft_error_set(weftInvalidArgument,
                          "%s: ncclCollConfig_t.algSelection \"%s\" does not parse (names such "
                          "as RING, TREE, RING_SIMPLE, TREE_LL joined by ',' or '+', '^' "
                          "negating one)",
                          fn, c->algSelection);
  }
  if (coll == CC_POINT_TO_POINT) return weftSuccess;
  if ((mask & sel_runnable(coll)) != 0) {
    /* the call takes the cheapest pair of those weft runs (plan_tune) */
    *select_out = sel_plan_bits(mask & sel_runnable(coll));
    return weftSuccess;
  }
  if (!c->forceAlgSelection) return weftSuccess;
  return weft_error_set(weftInvalidArgument,
                        "%s: ncclCollConfig_t.algSelection \"%s\" with forceAlgSelection leaves "
                        "nothing weft runs for this collective (%s with SIMPLE or LL)",
                        fn, c->algSelection, coll == CC_ALLREDUCE ? "RING or TREE" : "RING");
}

/* --- The check ----------------------------------------------------------------- */

/* Whether user (may be NULL) is a configuration weft runs the call with. */
static weftResult_t coll_config_check_(const ncclCollConfig_t *user, enum coll_config_coll coll,
                                       const char *fn, unsigned *select_out) {
  *select_out = 0;
  if (user == NULL) return weftSuccess;
  const ncclCollConfig_t defaults = NCCL_COLLCONFIG_INITIALIZER;
  ncclCollConfig_t c = defaults;
  size_t size;
  memcpy(&size, user, sizeof size);
  if (size < COLL_CONFIG_V2_31_NBYTES)
    return weft_error_set(weftInvalidArgument,
                          "%s: ncclCollConfig_t size %zu is too small (NCCL 2.31's is %zu)", fn,
                          size, (size_t)COLL_CONFIG_V2_31_NBYTES);
  memcpy(&c, user, size < sizeof c ? size : sizeof c);
  if (c.magic != NCCL_API_MAGIC)
    return weft_error_set(weftInvalidArgument,
                          "%s: ncclCollConfig_t was not initialised with "
                          "NCCL_COLLCONFIG_INITIALIZER (magic 0x%x)",
                          fn, c.magic);
  if (c.version < NCCL_VERSION(2, 32, 0)) c.launchCompletionEvent = defaults.launchCompletionEvent;

  /* minCTAs, maxCTAs, nvlsCTAs, cgaClusterSize: any value (NCCL ignores
   * those out of range and lowers minCTAs above maxCTAs to 1) */
  const int policies = NCCL_CTA_POLICY_EFFICIENCY | NCCL_CTA_POLICY_ZERO;
  if (c.CTAPolicy != NCCL_CONFIG_UNDEF_INT && (c.CTAPolicy & ~policies) != 0)
    return weft_error_set(weftInvalidArgument, "%s: ncclCollConfig_t.CTAPolicy is %d", fn,
                          c.CTAPolicy);
  if (c.forceAlgSelection != 0 && c.forceAlgSelection != 1)
    return weft_error_set(weftInvalidArgument,
                          "%s: ncclCollConfig_t.forceAlgSelection is %d: must be 0 or 1", fn,
                          c.forceAlgSelection);
  weftResult_t res = sel_check(&c, coll, fn, select_out);
  if (res != weftSuccess) return res;
  if (c.launchCompletionEvent != NULL)
    return weft_error_set(weftInvalidUsage,
                          "%s: ncclCollConfig_t.launchCompletionEvent is not supported by weft "
                          "(it records no launch event)",
                          fn);
  return weftSuccess;
}

/* The same, a refusal kept as comm's last error. */
static ncclResult_t coll_config_check(const ncclCollConfig_t *user, enum coll_config_coll coll,
                                      ncclComm_t comm, const char *fn, unsigned *select_out) {
  weftResult_t res = coll_config_check_(user, coll, fn, select_out);
  if (res != weftSuccess) compat_comm_error_keep((weftComm_t)comm);
  return (ncclResult_t)res;
}

/* Checks config, then returns call, made with the pairs its algSelection
 * allows. A refused call of a compared collective (coll, with its count,
 * datatype, op and root; -1: none) still takes its number
 * (compat_coll_refused). */
#define CONFIG_CALL(config, cc, comm, fn, coll, count, datatype, op, root, call)    \
  do {                                                                             \
    unsigned select_;                                                              \
    ncclResult_t res_ = coll_config_check(config, cc, comm, fn, &select_);         \
    if (res_ != ncclSuccess) {                                                     \
      compat_coll_refused((weftComm_t)(comm), coll, count, (weftDataType_t)(datatype), \
                          (weftRedOp_t)(op), root, (weftResult_t)res_);            \
      return res_;                                                                 \
    }                                                                              \
    compat_select_next(select_);                                                   \
    res_ = call;                                                                   \
    compat_select_next(0);                                                         \
    return res_;                                                                   \
  } while (0)

NCCL_EXPORT ncclResult_t ncclAllReduceConfig(const void *sendbuff, void *recvbuff, size_t count,
                                             ncclDataType_t datatype, ncclRedOp_t op,
                                             ncclComm_t comm, cudaStream_t stream,
                                             const ncclCollConfig_t *config) {
  CONFIG_CALL(config, CC_ALLREDUCE, comm, "ncclAllReduceConfig", COLL_ALLREDUCE, count,
              datatype, op, -1,
              pncclAllReduce(sendbuff, recvbuff, count, datatype, op, comm, stream));
}
NCCL_PROFILING_ALIAS(ncclAllReduceConfig);

NCCL_EXPORT ncclResult_t ncclBroadcastConfig(const void *sendbuff, void *recvbuff, size_t count,
                                             ncclDataType_t datatype, int root, ncclComm_t comm,
                                             cudaStream_t stream,
                                             const ncclCollConfig_t *config) {
  CONFIG_CALL(config, CC_BROADCAST, comm, "ncclBroadcastConfig", COLL_BROADCAST, count,
              datatype, ncclSum, root,
              pncclBroadcast(sendbuff, recvbuff, count, datatype, root, comm, stream));
}
NCCL_PROFILING_ALIAS(ncclBroadcastConfig);

NCCL_EXPORT ncclResult_t ncclReduceConfig(const void *sendbuff, void *recvbuff, size_t count,
                                          ncclDataType_t datatype, ncclRedOp_t op, int root,
                                          ncclComm_t comm, cudaStream_t stream,
                                          const ncclCollConfig_t *config) {
  CONFIG_CALL(config, CC_REDUCE, comm, "ncclReduceConfig", COLL_REDUCE, count, datatype,
              op, root,
              pncclReduce(sendbuff, recvbuff, count, datatype, op, root, comm, stream));
}
NCCL_PROFILING_ALIAS(ncclReduceConfig);

NCCL_EXPORT ncclResult_t ncclAllGatherConfig(const void *sendbuff, void *recvbuff,
                                             size_t sendcount, ncclDataType_t datatype,
                                             ncclComm_t comm, cudaStream_t stream,
                                             const ncclCollConfig_t *config) {
  CONFIG_CALL(config, CC_ALLGATHER, comm, "ncclAllGatherConfig", COLL_ALLGATHER,
              sendcount, datatype, ncclSum, -1,
              pncclAllGather(sendbuff, recvbuff, sendcount, datatype, comm, stream));
}
NCCL_PROFILING_ALIAS(ncclAllGatherConfig);

NCCL_EXPORT ncclResult_t ncclReduceScatterConfig(const void *sendbuff, void *recvbuff,
                                                 size_t recvcount, ncclDataType_t datatype,
                                                 ncclRedOp_t op, ncclComm_t comm,
                                                 cudaStream_t stream,
                                                 const ncclCollConfig_t *config) {
  CONFIG_CALL(config, CC_REDUCESCATTER, comm, "ncclReduceScatterConfig", COLL_REDUCESCATTER,
              recvcount, datatype, op, -1,
              pncclReduceScatter(sendbuff, recvbuff, recvcount, datatype, op, comm, stream));
}
NCCL_PROFILING_ALIAS(ncclReduceScatterConfig);

NCCL_EXPORT ncclResult_t ncclAlltoAllConfig(const void *sendbuff, void *recvbuff, size_t count,
                                            ncclDataType_t datatype, ncclComm_t comm,
                                            cudaStream_t stream, const ncclCollConfig_t *config) {
  CONFIG_CALL(config, CC_POINT_TO_POINT, comm, "ncclAlltoAllConfig", -1, 0, datatype,
              ncclSum, -1,
              pncclAlltoAll(sendbuff, recvbuff, count, datatype, comm, stream));
}
NCCL_PROFILING_ALIAS(ncclAlltoAllConfig);

NCCL_EXPORT ncclResult_t ncclGatherConfig(const void *sendbuff, void *recvbuff, size_t count,
                                          ncclDataType_t datatype, int root, ncclComm_t comm,
                                          cudaStream_t stream, const ncclCollConfig_t *config) {
  CONFIG_CALL(config, CC_POINT_TO_POINT, comm, "ncclGatherConfig", -1, 0, datatype,
              ncclSum, -1,
              pncclGather(sendbuff, recvbuff, count, datatype, root, comm, stream));
}
NCCL_PROFILING_ALIAS(ncclGatherConfig);

NCCL_EXPORT ncclResult_t ncclScatterConfig(const void *sendbuff, void *recvbuff, size_t count,
                                           ncclDataType_t datatype, int root, ncclComm_t comm,
                                           cudaStream_t stream, const ncclCollConfig_t *config) {
  CONFIG_CALL(config, CC_POINT_TO_POINT, comm, "ncclScatterConfig", -1, 0, datatype,
              ncclSum, -1,
              pncclScatter(sendbuff, recvbuff, count, datatype, root, comm, stream));
}
NCCL_PROFILING_ALIAS(ncclScatterConfig);
