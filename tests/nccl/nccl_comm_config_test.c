/* ncclConfig_t through libnccl.so.2, written against nccl.h alone: each
 * field NCCL checks is refused out of its range (ncclInvalidArgument, with
 * the field and the value in ncclGetLastError) and accepted at its bounds
 * and unset; a field newer than the config's `version` is left at its
 * default, not refused; a rank that splits with NCCL_SPLIT_NOCOLOR does not
 * read its config, so a bad one does not fail the others' split. Run under
 * weftrun. */
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nccl_check.h"

int g_rank, g_nranks, g_failures;

/* A field, where it lies, the NCCL version that added it and its range. */
struct field_case {
  const char *name;
  size_t offset;
  unsigned int since;
  int min, max; /* INT_MAX: no upper bound */
};

#define FIELD(f, since, lo, hi) {#f, offsetof(ncclConfig_t, f), since, lo, hi}
static const struct field_case fields[] = {
    FIELD(blocking, NCCL_VERSION(2, 14, 0), 0, 1),
    FIELD(cgaClusterSize, NCCL_VERSION(2, 17, 0), 0, INT_MAX),
    FIELD(minCTAs, NCCL_VERSION(2, 17, 0), 1, INT_MAX),
    FIELD(maxCTAs, NCCL_VERSION(2, 17, 0), 1, INT_MAX),
    FIELD(splitShare, 0, 0, 1),
    FIELD(collnetEnable, NCCL_VERSION(2, 27, 0), 0, 1),
    FIELD(CTAPolicy, NCCL_VERSION(2, 27, 0), 0, 3),
    FIELD(shrinkShare, NCCL_VERSION(2, 27, 0), 0, 1),
    FIELD(nvlsCTAs, NCCL_VERSION(2, 27, 0), 1, INT_MAX),
    FIELD(nChannelsPerNetPeer, NCCL_VERSION(2, 28, 0), 1, 64),
    FIELD(nvlinkCentricSched, NCCL_VERSION(2, 28, 0), 0, 1),
    FIELD(graphUsageMode, NCCL_VERSION(2, 29, 0), 0, 2),
    FIELD(numRmaCtx, NCCL_VERSION(2, 29, 0), 0, INT_MAX),
    FIELD(maxP2pPeers, NCCL_VERSION(2, 30, 0), 1, INT_MAX),
    FIELD(graphStreamOrdering, NCCL_VERSION(2, 30, 5), 0, 1),
    FIELD(launchOrderImplicit, NCCL_VERSION(2, 31, 0), 0, 1),
    FIELD(numRmaSig, NCCL_VERSION(2, 31, 0), 0, INT_MAX),
    FIELD(rmaEagerInit, NCCL_VERSION(2, 31, 0), 0, 1),
    FIELD(hostCftMode, NCCL_VERSION(2, 31, 0), 1, 3),
};
#undef FIELD
#define NFIELDS (sizeof fields / sizeof fields[0])

static void field_set(ncclConfig_t *c, const struct field_case *f, int value) {
  memcpy((char *)c + f->offset, &value, sizeof value);
}

/* The version just before f's: the last code without it. */
static unsigned int version_before(const struct field_case *f) {
  return f->since == NCCL_VERSION(2, 30, 5) ? NCCL_VERSION(2, 30, 4) : f->since - 100;
}

/* Whether ncclCommInitRankConfig's config check passes c: the call is made
 * with rank -1, which weft refuses after the config was read, before any
 * rendezvous. 1: passed (refused for the rank), 0: refused for the config
 * (its last error must name the field and the value), -1: neither. */
static int config_passes(ncclUniqueId id, ncclConfig_t *c, const char *field, int value) {
  ncclComm_t comm = NULL;
  ncclResult_t res = ncclCommInitRankConfig(&comm, g_nranks, id, -1, c);
  const char *e = ncclGetLastError(NULL);
  char value_text[32];
  snprintf(value_text, sizeof value_text, " %d", value);
  if (res == ncclInvalidArgument && strstr(e, "ncclConfig_t.") != NULL) {
    char named[64];
    snprintf(named, sizeof named, "ncclConfig_t.%s ", field);
    EXPECT(strstr(e, named) != NULL && strstr(e, value_text) != NULL,
           "%s = %d: the refusal does not name the field and value: '%s'", field, value, e);
    return 0;
  }
  if (res == ncclInvalidArgument && comm == NULL) return 1;
  FAIL("%s = %d: ncclCommInitRankConfig with rank -1 gave %d ('%s')", field, value, (int)res, e);
  return -1;
}

/* Every checked field alone: refused just outside its range and at the
 * extremes of int, accepted at its bounds and unset. */
static void test_field_ranges(ncclUniqueId id) {
  for (size_t i = 0; i < NFIELDS; i++) {
    const struct field_case *f = &fields[i];
    const int bad[] = {f->min - 1, INT_MIN + 1, f->max == INT_MAX ? f->min - 2 : f->max + 1,
                       f->max == INT_MAX ? f->min - 1 : INT_MAX};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
      ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
      field_set(&c, f, bad[k]);
      EXPECT(config_passes(id, &c, f->name, bad[k]) == 0, "%s = %d accepted", f->name, bad[k]);
    }
    const int good[] = {f->min, f->max, NCCL_CONFIG_UNDEF_INT, f->min + (f->max > f->min)};
    for (size_t k = 0; k < sizeof good / sizeof good[0]; k++) {
      ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
      field_set(&c, f, good[k]);
      if (strcmp(f->name, "minCTAs") == 0 && good[k] != NCCL_CONFIG_UNDEF_INT)
        c.maxCTAs = INT_MAX; /* minCTAs <= maxCTAs */
      EXPECT(config_passes(id, &c, f->name, good[k]) == 1, "%s = %d refused", f->name, good[k]);
    }
  }
  /* the message says the range */
  ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
  c.nChannelsPerNetPeer = 65;
  config_passes(id, &c, "nChannelsPerNetPeer", 65);
  EXPECT(strstr(ncclGetLastError(NULL), "1 to 64") != NULL, "no range in '%s'",
         ncclGetLastError(NULL));
  c = (ncclConfig_t)NCCL_CONFIG_INITIALIZER;
  c.hostCftMode = 0;
  config_passes(id, &c, "hostCftMode", 0);
  EXPECT(strstr(ncclGetLastError(NULL), "1 to 3") != NULL, "no range in '%s'",
         ncclGetLastError(NULL));
}

/* A field newer than the config's version is not read (so not refused),
 * from the version that added it on it is; and a config whose size ends
 * before a field leaves that field unread too. */
static void test_version_gating(ncclUniqueId id) {
  for (size_t i = 0; i < NFIELDS; i++) {
    const struct field_case *f = &fields[i];
    if (f->since == 0) continue; /* read at every version */
    ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
    field_set(&c, f, f->min - 1);
    c.version = version_before(f);
    EXPECT(config_passes(id, &c, f->name, f->min - 1) == 1,
           "%s = %d refused from a version %u config, which has no %s", f->name, f->min - 1,
           c.version, f->name);
    c.version = f->since;
    EXPECT(config_passes(id, &c, f->name, f->min - 1) == 0,
           "%s = %d accepted from a version %u config", f->name, f->min - 1, c.version);
  }
  ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
  c.size = offsetof(ncclConfig_t, launchOrderImplicit);
  c.launchOrderImplicit = 9;
  c.hostCftMode = 0;
  EXPECT(config_passes(id, &c, "launchOrderImplicit", 9) == 1,
         "a field beyond the config's size was read");
}

static void expect_comm_works(ncclComm_t comm, const char *what) {
  int n = 0;
  NCCL_OK(ncclCommCount(comm, &n));
  long long v = 1, sum = 0;
  NCCL_OK(ncclAllReduce(&v, &sum, 1, ncclInt64, ncclSum, comm, NULL));
  EXPECT(sum == n, "%s: all-reduce of 1 gave %lld on %d ranks", what, sum, n);
}

/* Real communicators from configs with every field at its lower bound, at
 * its upper bound, and an old version's config holding bad values in the
 * fields it does not have. */
static void test_bounds_make_comms(ncclComm_t world) {
  ncclConfig_t low = NCCL_CONFIG_INITIALIZER, high = NCCL_CONFIG_INITIALIZER;
  for (size_t i = 0; i < NFIELDS; i++) {
    field_set(&low, &fields[i], fields[i].min);
    field_set(&high, &fields[i], fields[i].max == INT_MAX ? 1000 : fields[i].max);
  }
  low.blocking = high.blocking = 1;
  ncclConfig_t old = NCCL_CONFIG_INITIALIZER;
  old.version = NCCL_VERSION(2, 27, 0);
  for (size_t i = 0; i < NFIELDS; i++)
    if (fields[i].since > old.version) field_set(&old, &fields[i], fields[i].min - 1);
  const struct {
    ncclConfig_t *c;
    const char *what;
  } cases[] = {{&low, "every field at its lower bound"},
               {&high, "every field at its upper bound (1000 where unbounded)"},
               {&old, "a 2.27 config with bad values in the fields 2.28 on added"}};
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    ncclComm_t child = NULL;
    ncclResult_t res = ncclCommSplit(world, 0, g_rank, &child, cases[k].c);
    EXPECT(res == ncclSuccess && child != NULL, "split with %s: %s (%s)", cases[k].what,
           ncclGetErrorString(res), ncclGetLastError(NULL));
    if (child == NULL) continue;
    expect_comm_works(child, cases[k].what);
    NCCL_OK(ncclCommDestroy(child));
  }
}

/* Rank 0 leaves the split with NCCL_SPLIT_NOCOLOR and a config that would
 * be refused; the others split with none. Every call succeeds. */
static void test_nocolor_bad_config(ncclComm_t world) {
  ncclConfig_t uninitialised;
  memset(&uninitialised, 0, sizeof uninitialised);
  ncclConfig_t out_of_range = NCCL_CONFIG_INITIALIZER;
  out_of_range.graphUsageMode = 7;
  ncclConfig_t *bad[] = {&uninitialised, &out_of_range};
  for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
    ncclComm_t child = (ncclComm_t)&world;
    ncclResult_t res = g_rank == 0
                           ? ncclCommSplit(world, NCCL_SPLIT_NOCOLOR, 0, &child, bad[k])
                           : ncclCommSplit(world, 1, g_rank, &child, NULL);
    EXPECT(res == ncclSuccess, "split with a bad config on the NOCOLOR rank (%zu): %s (%s)", k,
           ncclGetErrorString(res), ncclGetLastError(NULL));
    if (res != ncclSuccess) continue;
    EXPECT((g_rank == 0) == (child == NULL), "NOCOLOR split (%zu): comm %p", k, (void *)child);
    if (child != NULL) {
      expect_comm_works(child, "split without rank 0");
      NCCL_OK(ncclCommDestroy(child));
    }
  }
  expect_comm_works(world, "world after the NOCOLOR splits");
}

int main(void) {
  ncclUniqueId id;
  nccl_test_job(&id);
  if (g_nranks < 2) {
    fprintf(stderr, "nccl_comm_config_test needs 2 ranks or more\n");
    return 2;
  }

  test_field_ranges(id); /* none of these joins the rendezvous */
  test_version_gating(id);
  ncclComm_t world = NULL;
  NCCL_OK(ncclCommInitRank(&world, g_nranks, id, g_rank));
  test_bounds_make_comms(world);
  test_nocolor_bad_config(world);
  NCCL_OK(ncclCommDestroy(world));
  if (g_failures) fprintf(stderr, "rank %d: %d checks failed\n", g_rank, g_failures);
  else if (g_rank == 0) printf("nccl_comm_config_test: %d ranks: all checks passed\n", g_nranks);
  return g_failures ? 1 : 0;
}
