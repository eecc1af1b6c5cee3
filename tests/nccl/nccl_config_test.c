/* NCCL 2.31-2.32's additions through libnccl.so.2, written against nccl.h
 * alone: every nccl*Config collective on host memory must leave exactly
 * the bytes the plain call leaves (random inputs, odd counts, poisoned
 * outputs and their guards, in place and out of place, NULL and filled-in
 * configs), bad configs are refused with a message naming the call, and the
 * calls weft refuses (TLS encryption, CFT teams and endpoints) fail as
 * documented with their message in ncclGetLastError. Run under weftrun. */
#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nccl_elems.h"

int g_rank, g_nranks, g_failures;

/* xorshift: each rank's inputs differ, and each call's */
static uint64_t rng_state;
static int64_t rng_small(int is_unsigned) {
  rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
  int64_t v = (int64_t)(rng_state % 101);
  return is_unsigned ? v : v - 50;
}

enum coll { ALLREDUCE, BROADCAST, REDUCE, ALLGATHER, REDUCESCATTER, ALLTOALL, GATHER, SCATTER, NCOLL };
static const char *const coll_names[NCOLL] = {"AllReduce",     "Broadcast", "Reduce",
                                              "AllGather",     "ReduceScatter", "AlltoAll",
                                              "Gather",        "Scatter"};

/* Elements of the send and receive buffers of one call of c on count. */
static void coll_sizes(enum coll c, size_t count, size_t *send_n, size_t *recv_n) {
  size_t all = count * (size_t)g_nranks;
  *send_n = count, *recv_n = count;
  if (c == ALLGATHER || c == GATHER) *recv_n = all;
  if (c == REDUCESCATTER || c == SCATTER) *send_n = all;
  if (c == ALLTOALL) *send_n = *recv_n = all;
}

/* One call, plain (config_mode 0), Config with NULL (1) or with cfg (2), or
 * the pnccl name (3). */
static ncclResult_t coll_call(enum coll c, const void *s, void *r, size_t count, ncclDataType_t t,
                              ncclRedOp_t op, int root, ncclComm_t comm, int config_mode,
                              const ncclCollConfig_t *cfg) {
  const ncclCollConfig_t *k = config_mode == 1 ? NULL : cfg;
  switch (c) {
  case ALLREDUCE:
    if (config_mode == 0) return ncclAllReduce(s, r, count, t, op, comm, NULL);
    if (config_mode == 3) return pncclAllReduceConfig(s, r, count, t, op, comm, NULL, k);
    return ncclAllReduceConfig(s, r, count, t, op, comm, NULL, k);
  case BROADCAST:
    if (config_mode == 0) return ncclBroadcast(s, r, count, t, root, comm, NULL);
    if (config_mode == 3) return pncclBroadcastConfig(s, r, count, t, root, comm, NULL, k);
    return ncclBroadcastConfig(s, r, count, t, root, comm, NULL, k);
  case REDUCE:
    if (config_mode == 0) return ncclReduce(s, r, count, t, op, root, comm, NULL);
    if (config_mode == 3) return pncclReduceConfig(s, r, count, t, op, root, comm, NULL, k);
    return ncclReduceConfig(s, r, count, t, op, root, comm, NULL, k);
  case ALLGATHER:
    if (config_mode == 0) return ncclAllGather(s, r, count, t, comm, NULL);
    if (config_mode == 3) return pncclAllGatherConfig(s, r, count, t, comm, NULL, k);
    return ncclAllGatherConfig(s, r, count, t, comm, NULL, k);
  case REDUCESCATTER:
    if (config_mode == 0) return ncclReduceScatter(s, r, count, t, op, comm, NULL);
    if (config_mode == 3) return pncclReduceScatterConfig(s, r, count, t, op, comm, NULL, k);
    return ncclReduceScatterConfig(s, r, count, t, op, comm, NULL, k);
  case ALLTOALL:
    if (config_mode == 0) return ncclAlltoAll(s, r, count, t, comm, NULL);
    if (config_mode == 3) return pncclAlltoAllConfig(s, r, count, t, comm, NULL, k);
    return ncclAlltoAllConfig(s, r, count, t, comm, NULL, k);
  case GATHER:
    if (config_mode == 0) return ncclGather(s, r, count, t, root, comm, NULL);
    if (config_mode == 3) return pncclGatherConfig(s, r, count, t, root, comm, NULL, k);
    return ncclGatherConfig(s, r, count, t, root, comm, NULL, k);
  default:
    if (config_mode == 0) return ncclScatter(s, r, count, t, root, comm, NULL);
    if (config_mode == 3) return pncclScatterConfig(s, r, count, t, root, comm, NULL, k);
    return ncclScatterConfig(s, r, count, t, root, comm, NULL, k);
  }
}

/* Whether c can run in place here, and where its send buffer then lies in
 * the receive buffer (in elements). */
static int in_place_offset(enum coll c, size_t count, int root, size_t *offset_p) {
  switch (c) {
  case ALLREDUCE:
  case BROADCAST:
  case REDUCE:
    *offset_p = 0;
    return 1;
  case ALLGATHER:
    *offset_p = (size_t)g_rank * count;
    return 1;
  case GATHER:
    *offset_p = (size_t)root * count;
    return 1;
  default: /* the receive buffer lies in the send buffer: not covered here */
    return 0;
  }
}

/* The plain call and the Config call (config_mode) on the same inputs leave
 * the same bytes in the output and its guard. */
static void compare_one(enum coll c, ncclDataType_t t, ncclRedOp_t op, size_t count, int in_place,
                        int root, ncclComm_t comm, int config_mode, const ncclCollConfig_t *cfg,
                        const char *cfg_name) {
  size_t send_n, recv_n, offset = 0;
  coll_sizes(c, count, &send_n, &recv_n);
  if (in_place && !in_place_offset(c, count, root, &offset)) return;
  const size_t es = type_sizes[t];
  void *input = buf_alloc(send_n, t);
  const int is_unsigned = type_is_unsigned(t);
  for (size_t i = 0; i < send_n; i++) elem_set(input, t, i, (double)rng_small(is_unsigned));
  void *out[2];
  for (int k = 0; k < 2; k++) {
    out[k] = buf_alloc(recv_n, t);
    void *send;
    if (in_place) {
      send = (char *)out[k] + offset * es;
      memcpy(send, input, send_n * es);
    } else {
      send = buf_alloc(send_n, t);
      memcpy(send, input, send_n * es);
    }
    NCCL_OK(coll_call(c, send, out[k], count, t, op, root, comm, k == 0 ? 0 : config_mode, cfg));
    if (!in_place) free(send);
  }
  if (memcmp(out[0], out[1], (recv_n + GUARD) * es) != 0)
    FAIL("%sConfig (%s) %s count %zu root %d%s: output differs from the plain call's",
         coll_names[c], cfg_name, type_names[t], count, root, in_place ? " in place" : "");
  check_guard(out[1], recv_n, t, coll_names[c]);
  free(out[0]);
  free(out[1]);
  free(input);
}

static void test_config_results(ncclComm_t comm) {
  static const ncclDataType_t types[] = {ncclFloat32, ncclInt64, ncclBfloat16, ncclUint8};
  static const size_t counts[] = {0, 1, 7, 1001, 12289};
  static const ncclRedOp_t ops[] = {ncclSum, ncclMax};
  ncclConfigExt_t ext2 = {NULL, {0x5eed, 2}, {0}};
  ncclConfigExt_t ext1 = {&ext2, {0x5eed, 1}, {0}};
  ext1.val.s = "vendor option";
  ext2.val.i = 7;
  ncclCollConfig_t filled = NCCL_COLLCONFIG_INITIALIZER;
  filled.ext = &ext1;
  filled.minCTAs = 1;
  filled.maxCTAs = 4;
  filled.nvlsCTAs = 2;
  filled.cgaClusterSize = 1;
  filled.algSelection = "ring,tree";
  filled.forceAlgSelection = 0;
  filled.CTAPolicy = NCCL_CTA_POLICY_EFFICIENCY;
  filled.userProfilerTag = 42;
  ncclCollConfig_t plain = NCCL_COLLCONFIG_INITIALIZER;
  /* a 2.31 caller's config: no launchCompletionEvent, junk where it would be */
  struct {
    ncclCollConfig_t c;
  } old;
  memset(&old, 0x5a, sizeof old);
  ncclCollConfig_t older = NCCL_COLLCONFIG_INITIALIZER;
  memcpy(&old.c, &older, offsetof(ncclCollConfig_t, launchCompletionEvent));
  old.c.size = offsetof(ncclCollConfig_t, launchCompletionEvent);
  old.c.version = NCCL_VERSION(2, 31, 2);

  const struct {
    int mode;
    const ncclCollConfig_t *cfg;
    const char *name;
  } configs[] = {{1, NULL, "NULL"},
                 {2, &plain, "initializer"},
                 {2, &filled, "every field set"},
                 {2, &old.c, "a 2.31 layout"},
                 {3, &filled, "pnccl"}};
  const int nconfigs = sizeof configs / sizeof configs[0];
  int iter = 0;
  for (int c = 0; c < NCOLL; c++)
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++)
      for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++)
        for (int in_place = 0; in_place < 2; in_place++) {
          iter++;
          const int reduces = c == ALLREDUCE || c == REDUCE || c == REDUCESCATTER;
          ncclRedOp_t op = reduces ? ops[iter % 2] : ncclSum;
          int root = iter % g_nranks;
          int k = iter % nconfigs;
          rng_state = 0x9e3779b97f4a7c15ull * (uint64_t)(g_rank + 1) + (uint64_t)iter;
          compare_one((enum coll)c, types[ti], op, counts[ci], in_place, root, comm,
                      configs[k].mode, configs[k].cfg, configs[k].name);
        }
  /* every configuration on every collective at one odd size */
  for (int c = 0; c < NCOLL; c++)
    for (int k = 0; k < nconfigs; k++) {
      rng_state = 0x2545f4914f6cdd1dull * (uint64_t)(g_rank + 1) + (uint64_t)(c * 16 + k);
      compare_one((enum coll)c, ncclFloat32, ncclSum, 333, 0, (c + k) % g_nranks, comm,
                  configs[k].mode, configs[k].cfg, configs[k].name);
    }
}

/* Inside a group, as NCCL allows. */
static void test_config_grouped(ncclComm_t comm) {
  const size_t count = 515;
  ncclCollConfig_t cfg = NCCL_COLLCONFIG_INITIALIZER;
  float *a = buf_alloc(count, ncclFloat32), *b = buf_alloc(count * (size_t)g_nranks, ncclFloat32);
  for (size_t i = 0; i < count; i++) a[i] = (float)(g_rank + 1);
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclAllReduceConfig(a, a, count, ncclFloat32, ncclSum, comm, NULL, &cfg));
  NCCL_OK(ncclAllGatherConfig(a, b, count, ncclFloat32, comm, NULL, &cfg));
  NCCL_OK(ncclGroupEnd());
  const float sum = (float)g_nranks * (float)(g_nranks + 1) / 2;
  for (size_t i = 0; i < count; i++)
    if (a[i] != sum) {
      FAIL("grouped AllReduceConfig [%zu]: got %g, want %g", i, a[i], sum);
      break;
    }
  check_guard(b, count * (size_t)g_nranks, ncclFloat32, "grouped AllGatherConfig");
  free(a);
  free(b);
}

/* Refusals of bad configs: local, before any traffic, on every rank alike. */
static void test_config_refusals(ncclComm_t comm) {
  float x[4] = {1, 2, 3, 4};
  ncclCollConfig_t raw;
  memset(&raw, 0, sizeof raw);
  raw.size = sizeof raw;
  EXPECT(ncclAllReduceConfig(x, x, 4, ncclFloat32, ncclSum, comm, NULL, &raw) == ncclInvalidArgument,
         "config without NCCL_COLLCONFIG_INITIALIZER accepted");
  const char *e = ncclGetLastError(comm);
  EXPECT(strstr(e, "ncclAllReduceConfig") && strstr(e, "NCCL_COLLCONFIG_INITIALIZER"),
         "last error: '%s'", e);

  /* smaller than NCCL 2.31's 64 bytes, the first ncclCollConfig_t */
  ncclCollConfig_t cfg = NCCL_COLLCONFIG_INITIALIZER;
  cfg.size = offsetof(ncclCollConfig_t, userProfilerTag);
  EXPECT(ncclReduceScatterConfig(x, x, 1, ncclFloat32, ncclSum, comm, NULL, &cfg) ==
             ncclInvalidArgument,
         "a %zu-byte config accepted", cfg.size);
  e = ncclGetLastError(comm);
  EXPECT(strstr(e, "ncclReduceScatterConfig") && strstr(e, "too small"), "last error: '%s'", e);

  cfg = (ncclCollConfig_t)NCCL_COLLCONFIG_INITIALIZER;
  cfg.forceAlgSelection = 2;
  EXPECT(ncclAllReduceConfig(x, x, 4, ncclFloat32, ncclSum, comm, NULL, &cfg) ==
             ncclInvalidArgument,
         "forceAlgSelection 2 accepted");

  cfg = (ncclCollConfig_t)NCCL_COLLCONFIG_INITIALIZER;
  cfg.CTAPolicy = 0x40;
  EXPECT(ncclBroadcastConfig(x, x, 4, ncclFloat32, 0, comm, NULL, &cfg) == ncclInvalidArgument,
         "CTAPolicy 0x40 accepted");

  cfg = (ncclCollConfig_t)NCCL_COLLCONFIG_INITIALIZER;
  cfg.launchCompletionEvent = (cudaEvent_t)(void *)x;
  EXPECT(ncclGatherConfig(x, x, 1, ncclFloat32, 0, comm, NULL, &cfg) == ncclInvalidUsage,
         "launchCompletionEvent accepted");
  e = ncclGetLastError(comm);
  EXPECT(strstr(e, "ncclGatherConfig") && strstr(e, "launchCompletionEvent"), "last error: '%s'", e);
}

/* Per-call CTA counts and cluster size: NCCL ignores values it cannot use
 * (and lowers a minCTAs above maxCTAs), so each is accepted and the call is
 * the plain one. */
static void test_config_ctas_accepted(ncclComm_t comm) {
  const struct {
    int min, max, nvls, cga;
    const char *name;
  } cases[] = {{8, 2, 1, 1, "minCTAs 8 > maxCTAs 2"},
               {-1, -5, -3, -2, "negative CTA counts and cluster size"},
               {0, 0, 0, 0, "zeros"},
               {INT_MAX, INT_MAX, INT_MAX, INT_MAX, "INT_MAX"},
               {1, 64, 16, 8, "in range"}};
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    ncclCollConfig_t cfg = NCCL_COLLCONFIG_INITIALIZER;
    cfg.minCTAs = cases[k].min;
    cfg.maxCTAs = cases[k].max;
    cfg.nvlsCTAs = cases[k].nvls;
    cfg.cgaClusterSize = cases[k].cga;
    for (int c = 0; c < NCOLL; c++) {
      rng_state = 0x51ed2701ull * (uint64_t)(g_rank + 1) + (uint64_t)(c * 8 + (int)k);
      compare_one((enum coll)c, ncclFloat32, ncclSum, 77, 0, (c + (int)k) % g_nranks, comm, 2,
                  &cfg, cases[k].name);
    }
  }
}

/* algSelection under forceAlgSelection 1 and 0. weft runs RING with SIMPLE
 * or LL, and TREE too for all-reduce; all-to-all, gather and scatter are
 * sends and receives, where only the syntax is checked. */
static void test_config_alg_selection(ncclComm_t comm) {
  const struct {
    enum coll c;
    const char *sel;
    int ok; /* accepted under force 1 */
  } cases[] = {
      {ALLREDUCE, "RING", 1},
      {ALLREDUCE, "tree", 1},
      {ALLREDUCE, "Ring_Simple,TREE_LL", 1},
      {ALLREDUCE, "RING+LL", 1},
      {ALLREDUCE, "^TREE", 1},
      {ALLREDUCE, "NVLS,RING_LL", 1},
      {ALLREDUCE, " ring , tree ", 1},
      {ALLREDUCE, "SIMPLE", 1},
      {ALLREDUCE, "^NVLS+^PAT+^LL128", 1},
      {ALLREDUCE, "NVLS_TREE,COLLNET_DIRECT,COLLNET_CHAIN,PAT,SYMK", 0},
      {ALLREDUCE, "RING_LL128,TREE_LL128", 0},
      {ALLREDUCE, "LL128", 0},
      {ALLREDUCE, "RING+TREE", 0},
      {ALLREDUCE, "RING,", 0},
      {ALLREDUCE, ",RING", 0},
      {ALLREDUCE, "RNG", 0},
      {ALLREDUCE, "RING_LL2", 0},
      {ALLREDUCE, "RING__LL", 0},
      {ALLREDUCE, "RING_", 0},
      {ALLREDUCE, "^", 0},
      {ALLREDUCE, "^^RING", 0},
      {ALLREDUCE, "RING++TREE", 0},
      {ALLREDUCE, "allreduce:ring", 0},
      {ALLREDUCE, "ring;tree", 0},
      {ALLGATHER, "RING_LL", 1},
      {ALLGATHER, "TREE", 0},
      {ALLGATHER, "^RING", 0},
      {BROADCAST, "tree,ring", 1},
      {BROADCAST, "TREE_SIMPLE", 0},
      {REDUCE, "TREE", 0},
      {REDUCESCATTER, "NVLS", 0},
      {REDUCESCATTER, "^TREE", 1},
      {ALLTOALL, "TREE", 1},
      {ALLTOALL, "RNG", 0},
      {GATHER, "NVLS", 1},
      {SCATTER, "RING,", 0},
  };
  float x[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    ncclCollConfig_t cfg = NCCL_COLLCONFIG_INITIALIZER;
    cfg.algSelection = cases[k].sel;
    const enum coll c = cases[k].c;
    char name[96];
    snprintf(name, sizeof name, "algSelection \"%s\" force 1", cases[k].sel);
    if (cases[k].ok) {
      rng_state = 0x7f4a7c15ull * (uint64_t)(g_rank + 1) + (uint64_t)k;
      compare_one(c, ncclFloat32, ncclSum, 129, 0, (int)k % g_nranks, comm, 2, &cfg, name);
    } else {
      ncclResult_t res = coll_call(c, x, x, 1, ncclFloat32, ncclSum, 0, comm, 2, &cfg);
      EXPECT(res == ncclInvalidArgument, "nccl%sConfig: %s accepted (%d)", coll_names[c], name,
             (int)res);
      const char *e = ncclGetLastError(comm);
      EXPECT(strstr(e, coll_names[c]) && strstr(e, "algSelection") && strstr(e, cases[k].sel),
             "%s: last error '%s'", name, e);
    }
    /* without force, one that does not parse or leaves nothing weft runs is
     * automatic; one that does is applied as with force */
    cfg.forceAlgSelection = 0;
    snprintf(name, sizeof name, "algSelection \"%s\" force 0", cases[k].sel);
    rng_state = 0x1b873593ull * (uint64_t)(g_rank + 1) + (uint64_t)k;
    compare_one(c, ncclFloat32, ncclSum, 129, 0, (int)k % g_nranks, comm, 2, &cfg, name);
  }
  /* NULL and "" are automatic, forced or not */
  const char *automatic[] = {NULL, ""};
  for (int k = 0; k < 2; k++) {
    ncclCollConfig_t cfg = NCCL_COLLCONFIG_INITIALIZER;
    cfg.algSelection = automatic[k];
    compare_one(ALLGATHER, ncclFloat32, ncclSum, 33, 0, 0, comm, 2, &cfg, "automatic selection");
  }
}

/* A Config call that one rank alone has refused (a bad CTAPolicy there)
 * still takes its number: that rank's next all-reduce, the same as the
 * peers' pending one in every other field, is not paired with it (without
 * the number rank 1's second call took rank 0's first one's data, and every
 * call succeeded). Outside a group, and inside one, whose end then fails;
 * each on a communicator split for it, which the mismatch breaks. */
static void test_config_refusal_keeps_numbers(ncclComm_t comm) {
  for (int grouped = 0; grouped < 2; grouped++) {
    ncclComm_t sub = NULL;
    NCCL_OK(ncclCommSplit(comm, 0, g_rank, &sub, NULL));
    float a[4] = {1, 1, 1, 1}, b[4] = {2, 2, 2, 2};
    ncclResult_t res;
    if (g_rank == 1) {
      ncclCollConfig_t bad = NCCL_COLLCONFIG_INITIALIZER;
      bad.CTAPolicy = 999;
      if (grouped) NCCL_OK(ncclGroupStart());
      res = ncclAllReduceConfig(a, a, 4, ncclFloat32, ncclSum, sub, NULL, &bad);
      EXPECT(res == ncclInvalidArgument, "CTAPolicy 999 accepted (%d)", (int)res);
      res = ncclAllReduce(b, b, 4, ncclFloat32, ncclSum, sub, NULL);
      if (grouped) {
        EXPECT(res == ncclSuccess, "a grouped call returned %d", (int)res);
        res = ncclGroupEnd();
        EXPECT(res == ncclInvalidArgument, "the group with a refused call returned %d",
               (int)res);
        res = ncclAllReduce(b, b, 4, ncclFloat32, ncclSum, sub, NULL);
      }
    } else {
      res = ncclAllReduce(a, a, 4, ncclFloat32, ncclSum, sub, NULL);
    }
    EXPECT(res != ncclSuccess, "%s: rank %d's all-reduce paired with another (a %g, b %g)",
           grouped ? "grouped" : "alone", g_rank, a[0], b[0]);
    ncclCommAbort(sub);
  }
}

/* The calls weft refuses, and the one it answers. */
static void test_refused(ncclComm_t comm) {
  NCCL_OK(ncclSetEncryption(NULL));
  ncclEncryptionConfig_t enc = NCCL_ENCRYPTION_CONFIG_INITIALIZER;
  NCCL_OK(ncclSetEncryption(&enc)); /* NONE: what weft's sockets are */
  enc.mode = NCCL_ENCRYPTION_MODE_PSK;
  enc.psk = "0123456789abcdef0123456789abcdef-job-key";
  EXPECT(ncclSetEncryption(&enc) == ncclInvalidUsage, "TLS encryption accepted");
  const char *e = ncclGetLastError(NULL);
  EXPECT(strstr(e, "ncclSetEncryption") && strstr(e, "not supported"), "last error: '%s'", e);
  enc.psk = "short";
  EXPECT(ncclSetEncryption(&enc) == ncclInvalidArgument, "a short psk accepted");
  enc.psk = NULL;
  EXPECT(pncclSetEncryption(&enc) == ncclInvalidArgument, "PSK mode without a psk accepted");
  enc.mode = 9;
  EXPECT(ncclSetEncryption(&enc) == ncclInvalidArgument, "mode 9 accepted");
  ncclEncryptionConfig_t bad;
  memset(&bad, 0, sizeof bad);
  EXPECT(ncclSetEncryption(&bad) == ncclInvalidArgument, "uninitialised encryption config");

  ncclTeam_t team = ncclTeamCft(comm, NCCL_CFT_TEAM_FLAT);
  EXPECT(team.nRanks == 0, "ncclTeamCft gave %d ranks", team.nRanks);
  e = ncclGetLastError(comm);
  EXPECT(strstr(e, "ncclTeamCft") && strstr(e, "not supported"), "last error: '%s'", e);
  team = pncclTeamCftMultimem(comm);
  EXPECT(team.nRanks == 0, "ncclTeamCftMultimem gave %d ranks", team.nRanks);
  EXPECT(strstr(ncclGetLastError(comm), "ncclTeamCftMultimem") != NULL, "last error: '%s'",
         ncclGetLastError(comm));

  void *buf = NULL;
  NCCL_OK(ncclMemAlloc(&buf, NCCL_WIN_REQUIRED_ALIGNMENT));
  ncclWindow_t win = NULL;
  NCCL_OK(ncclCommWindowRegister(comm, buf, NCCL_WIN_REQUIRED_ALIGNMENT, &win, NCCL_WIN_DEFAULT));
  ncclCftLeId le = 7;
  size_t le_offset = 7;
  EXPECT(ncclGetMultimemDeviceLeInfo(win, 0, &le, &le_offset) == ncclInvalidArgument,
         "ncclGetMultimemDeviceLeInfo accepted");
  EXPECT(strstr(ncclGetLastError(comm), "ncclGetMultimemDeviceLeInfo") != NULL, "last error: '%s'",
         ncclGetLastError(comm));
  EXPECT(ncclGetCftDeviceLeInfo(win, 0, 0, team, &le, &le_offset) == ncclInvalidArgument,
         "ncclGetCftDeviceLeInfo accepted");
  EXPECT(strstr(ncclGetLastError(comm), "ncclGetCftDeviceLeInfo") != NULL, "last error: '%s'",
         ncclGetLastError(comm));
  EXPECT(ncclGetPeerDeviceLeInfo(win, 0, 0, &le, &le_offset) == ncclInvalidArgument,
         "ncclGetPeerDeviceLeInfo accepted");
  EXPECT(strstr(ncclGetLastError(comm), "ncclGetPeerDeviceLeInfo") != NULL, "last error: '%s'",
         ncclGetLastError(comm));
  EXPECT(le == 7 && le_offset == 7, "a refused query wrote its outputs");
  NCCL_OK(ncclCommWindowDeregister(comm, win));
  NCCL_OK(ncclMemFree(buf));

  ncclResetDebugInitInternal();
}

int main(void) {
  ncclUniqueId id;
  nccl_test_job(&id);
  int version = 0;
  NCCL_OK(ncclGetVersion(&version));
  EXPECT(version == NCCL_VERSION_CODE && version == 23203, "version %d", version);

  ncclComm_t comm = NULL;
  NCCL_OK(ncclCommInitRank(&comm, g_nranks, id, g_rank));
  test_config_results(comm);
  test_config_grouped(comm);
  test_config_refusals(comm);
  test_config_ctas_accepted(comm);
  test_config_alg_selection(comm);
  test_config_refusal_keeps_numbers(comm);
  test_refused(comm);
  NCCL_OK(ncclCommDestroy(comm));
  if (g_failures) fprintf(stderr, "rank %d: %d checks failed\n", g_rank, g_failures);
  else if (g_rank == 0) printf("nccl_config_test: %d ranks: all checks passed\n", g_nranks);
  return g_failures ? 1 : 0;
}
