// weftCommShrink (a communicator of the ranks that remain, made without the
// excluded ones) and weftGroupSimulateEnd (a group estimated, not run).
#include <gtest/gtest.h>

#include <signal.h>

#include <cstring>
#include <string>
#include <vector>

#include "harness.h"

using namespace weft_test;

namespace {

RunOptions shrink_options() {
  RunOptions opts;
  opts.timeout_s = 60;
  opts.env = {{"WEFT_SLOT_BYTES", "1024"}, {"WEFT_NSLOTS", "4"}, {"WEFT_TIMEOUT", "4"}};
  return opts;
}

// All-reduce of random doubles on comm, checked against every rank's data
// regenerated from the seed. old_ranks[r] is the seed rank of new rank r.
int check_allreduce(const RankCtx &ctx, weftComm_t comm, const std::vector<int> &old_ranks) {
  int n = 0, r = -1;
  FAIL_IF(weftCommCount(comm, &n) != weftSuccess || weftCommUserRank(comm, &r) != weftSuccess,
          "count/rank of the new comm");
  FAIL_IF(n != (int)old_ranks.size(), "new comm has %d ranks, want %zu", n, old_ranks.size());
  FAIL_IF(old_ranks[r] != ctx.rank, "old rank %d became rank %d", ctx.rank, r);
  const size_t count = 5003;
  auto data = [&](int old_rank) {
    Rng rng(test_seed() + (uint64_t)old_rank);
    std::vector<double> v(count);
    for (auto &x : v) x = (double)(rng.next() % 1000);
    return v;
  };
  std::vector<double> buf = data(ctx.rank), want(count, 0.0);
  for (int o : old_ranks) {
    auto v = data(o);
    for (size_t i = 0; i < count; i++) want[i] += v[i];
  }
  FAIL_IF(weftAllReduce(buf.data(), buf.data(), count, weftFloat64, weftSum, comm, nullptr) !=
              weftSuccess,
          "all-reduce on the new comm: %s", weftGetLastError(comm));
  for (size_t i = 0; i < count; i++)
    FAIL_IF(buf[i] != want[i], "element %zu: %g, want %g", i, buf[i], want[i]);
  return 0;
}

// A rank dies; the others see the error, then shrink around it and carry on.
TEST(CommShrink, AroundADeadRank) {
  RunOptions opts = shrink_options();
  opts.allow_warnings = true;  // the dead peer is warned about
  auto status = run_ranks(4, [](const RankCtx &ctx) {
    weftComm_t comm;
    if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
      return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
    const int dead = 2;
    if (ctx.rank == dead) raise(SIGKILL);
    float x[256] = {0};
    FAIL_IF(weftAllReduce(x, x, 256, weftFloat32, weftSum, comm, nullptr) != weftRemoteError,
            "all-reduce with a dead peer did not fail");
    weftComm_t shrunk = nullptr;
    weftResult_t res = weftCommShrink(comm, &dead, 1, &shrunk, nullptr);
    FAIL_IF(res != weftSuccess, "shrink: %s", weftGetLastError(comm));
    int rc = check_allreduce(ctx, shrunk, {0, 1, 3});
    weftCommDestroy(shrunk);
    weftCommAbort(comm);
    return rc;
  }, opts);
  EXPECT_EQ(status[0], 0);
  EXPECT_EQ(status[1], 0);
  EXPECT_EQ(status[2], 128 + SIGKILL);
  EXPECT_EQ(status[3], 0);
}

// Excluded ranks that are alive just do not call; the lowest survivor leads
// even when it is not rank 0; a config is honoured.
TEST(CommShrink, HealthyCommWithoutTheEnds) {
  auto status = run_ranks(4, [](const RankCtx &ctx) {
    weftComm_t comm;
    if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
      return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
    const int excluded[2] = {3, 0};
    int rc = 0;
    if (ctx.rank == 1 || ctx.rank == 2) {
      weftConfig_t cfg = WEFT_CONFIG_INITIALIZER;
      cfg.commName = "shrunk";
      cfg.maxChannels = 1;
      weftComm_t shrunk = nullptr;
      FAIL_IF(weftCommShrink(comm, excluded, 2, &shrunk, &cfg) != weftSuccess, "shrink: %s",
              weftGetLastError(comm));
      rc = check_allreduce(ctx, shrunk, {1, 2});
      weftCommDestroy(shrunk);
      // the parent is untouched: all four ranks still use it
    }
    if (rc == 0) rc = check_allreduce(ctx, comm, {0, 1, 2, 3});
    weftCommDestroy(comm);
    return rc;
  }, shrink_options());
  for (int r = 0; r < 4; r++) EXPECT_EQ(status[r], 0) << "rank " << r;
}

// Bad lists are refused on the calling rank, before any message.
TEST(CommShrink, BadArguments) {
  auto status = run_ranks(3, [](const RankCtx &ctx) {
    weftComm_t comm;
    if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
      return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
    weftComm_t out = nullptr;
    const int other = (ctx.rank + 1) % 3, self = ctx.rank, range = 7;
    const int twice[2] = {other, other}, all[3] = {0, 1, 2};
    struct {
      const int *list;
      int n;
      weftComm_t *out;
      weftResult_t want;
      const char *text;
    } cases[] = {
        {&range, 1, &out, weftInvalidArgument, "not in 0..2"},
        {twice, 2, &out, weftInvalidArgument, "excluded twice"},
        {all, 3, &out, weftInvalidArgument, "at least one must remain"},
        {nullptr, 1, &out, weftInvalidArgument, "NULL"},
        {&self, 1, &out, weftInvalidArgument, "its own exclude list"},
        {&other, 1, nullptr, weftInvalidArgument, "newcomm is NULL"},
        {&other, -1, &out, weftInvalidArgument, "-1 ranks"},
    };
    for (auto &c : cases) {
      weftResult_t res = weftCommShrink(comm, c.list, c.n, c.out, nullptr);
      FAIL_IF(res != c.want, "case '%s' returned %s", c.text, weftGetErrorString(res));
      FAIL_IF(std::strstr(weftGetLastError(comm), c.text) == nullptr,
              "case '%s': message '%s'", c.text, weftGetLastError(comm));
    }
    FAIL_IF(out != nullptr, "a refused shrink wrote *newcomm");
    FAIL_IF(weftCommShrink(nullptr, &other, 1, &out, nullptr) != weftInvalidArgument,
            "NULL comm accepted");
    weftCommDestroy(comm);
    return 0;
  }, shrink_options());
  for (int r = 0; r < 3; r++) EXPECT_EQ(status[r], 0) << "rank " << r;
}

// --- weftGroupSimulateEnd ---------------------------------------------------

TEST(GroupSimulateEnd, EstimatesWithoutRunning) {
  auto status = run_ranks(3, [](const RankCtx &ctx) {
    weftComm_t comm;
    if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
      return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
    std::vector<float> small(16, 1.0f), big(1 << 20, 1.0f);
    float t_small = -1, t_big = -1, t_both = -1;
    weftGroupStart();
    weftAllReduce(small.data(), small.data(), small.size(), weftFloat32, weftSum, comm, nullptr);
    FAIL_IF(weftGroupSimulateEnd(&t_small) != weftSuccess, "simulate: %s",
            weftGetLastError(nullptr));
    weftGroupStart();
    weftGroupStart();  // nested: the inner end estimates what is recorded so far
    weftAllReduce(big.data(), big.data(), big.size(), weftFloat32, weftSum, comm, nullptr);
    float inner = -7;
    FAIL_IF(weftGroupSimulateEnd(&inner) != weftSuccess, "inner simulate: %s",
            weftGetLastError(nullptr));
    FAIL_IF(weftGroupSimulateEnd(&t_big) != weftSuccess, "simulate big");
    FAIL_IF(inner != t_big, "the inner simulate end estimated %g us, the outer %g", inner, t_big);
    weftGroupStart();
    weftAllReduce(small.data(), small.data(), small.size(), weftFloat32, weftSum, comm, nullptr);
    weftAllReduce(big.data(), big.data(), big.size(), weftFloat32, weftSum, comm, nullptr);
    FAIL_IF(weftGroupSimulateEnd(&t_both) != weftSuccess, "simulate both");
    FAIL_IF(!(t_small > 0 && t_big > t_small && t_both > t_big),
            "estimates small %g, big %g, both %g us", t_small, t_big, t_both);
    for (float v : big) FAIL_IF(v != 1.0f, "a simulated all-reduce ran");
    for (float v : small) FAIL_IF(v != 1.0f, "a simulated all-reduce ran");
    // a gather is priced as its sends and receives, its mark (a collective's
    // number in the trace) as nothing
    float t_gather = -1, t_p2p = -1;
    std::vector<float> gathered(16 * ctx.nranks);
    weftGroupStart();
    weftGather(small.data(), gathered.data(), small.size(), weftFloat32, 0, comm, nullptr);
    FAIL_IF(weftGroupSimulateEnd(&t_gather) != weftSuccess, "simulate gather");
    weftGroupStart();
    weftSend(small.data(), small.size(), weftFloat32, 0, comm, nullptr);
    for (int p = 0; ctx.rank == 0 && p < ctx.nranks; p++)
      weftRecv(gathered.data() + 16 * p, 16, weftFloat32, p, comm, nullptr);
    FAIL_IF(weftGroupSimulateEnd(&t_p2p) != weftSuccess, "simulate sends");
    FAIL_IF(!(t_p2p > 0) || t_gather != t_p2p, "gather estimated %g us, its sends and receives %g",
            t_gather, t_p2p);
    FAIL_IF(weftGroupSimulateEnd(&t_small) != weftInvalidUsage, "simulate end without a group");
    // nested in a group that an end closes, as NCCL's: the inner simulate end
    // estimates and keeps the calls, which the outer end runs
    std::vector<float> data(1000);
    Rng rng(test_seed() + 5);
    for (float &v : data) v = (float)(rng.next() % 1000);
    const std::vector<float> sent = data;
    float nested = -7;
    weftGroupStart();
    weftGroupStart();
    weftAllReduce(data.data(), data.data(), data.size(), weftFloat32, weftSum, comm, nullptr);
    FAIL_IF(weftGroupSimulateEnd(&nested) != weftSuccess, "nested simulate: %s",
            weftGetLastError(nullptr));
    FAIL_IF(!(nested > 0), "a nested simulate end succeeded with no estimate (%g)", nested);
    FAIL_IF(data != sent, "a nested simulate end ran its group");
    FAIL_IF(weftGroupEnd() != weftSuccess, "outer end: %s", weftGetLastError(comm));
    for (size_t i = 0; i < data.size(); i++)
      FAIL_IF(data[i] != sent[i] * ctx.nranks, "the outer end's all-reduce gave %g at %zu, not %g",
              data[i], i, sent[i] * ctx.nranks);
    // after simulating, a real group still runs and matches
    FAIL_IF(weftAllReduce(small.data(), small.data(), small.size(), weftFloat32, weftSum, comm,
                          nullptr) != weftSuccess,
            "all-reduce after simulations");
    FAIL_IF(small[0] != (float)ctx.nranks, "all-reduce after simulations gave %g", small[0]);
    weftCommDestroy(comm);
    return 0;
  }, shrink_options());
  for (int r = 0; r < 3; r++) EXPECT_EQ(status[r], 0) << "rank " << r;
}

}  // namespace
