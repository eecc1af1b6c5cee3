// weftCommSplit: new communicators from an old one's ranks.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <signal.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "harness.h"
#include "split_signature.h"

extern "C" {
#include "collectives/api/config.h"
#include "collectives/core/signature.h"
#include "collectives/core/params.h"
#include "collectives/core/plan.h"
}

using namespace weft_test;


namespace {

// --- split -------------------------------------------------------------

// Six ranks split by rank % 2 and by rank % 3, keys reversing the old order;
// both sets of communicators live at once and work independently.
TEST(CommSplit, ByColorWithReversingKeys) {
  run_comm(6, small_slots(), [](const RankCtx &ctx, weftComm_t comm) {
    const int r = ctx.rank;
    weftComm_t by2 = nullptr, by3 = nullptr;
    FAIL_IF(weftCommSplit(comm, r % 2, ctx.nranks - r, &by2, nullptr) != weftSuccess,
            "split by 2: %s", weftGetLastError(comm));
    FAIL_IF(weftCommSplit(comm, r % 3, -r, &by3, nullptr) != weftSuccess, "split by 3: %s",
            weftGetLastError(comm));
    static const std::vector<int> members2[2] = {{4, 2, 0}, {5, 3, 1}};
    static const std::vector<int> members3[3] = {{3, 0}, {4, 1}, {5, 2}};
    // interleave calls on the two splits and the parent
    TRY_RC(expect_shape(ctx, by2, members2[r % 2], "by 2"));
    TRY_RC(expect_shape(ctx, by3, members3[r % 3], "by 3"));
    TRY_RC(expect_allreduce(ctx, by2, members2[r % 2], "by 2"));
    TRY_RC(expect_allreduce(ctx, by3, members3[r % 3], "by 3"));
    TRY_RC(expect_allreduce(ctx, comm, {0, 1, 2, 3, 4, 5}, "parent"));
    TRY_RC(expect_allgather(ctx, by3, members3[r % 3], "by 3"));
    TRY_RC(expect_allgather(ctx, by2, members2[r % 2], "by 2"));
    FAIL_IF(weftCommDestroy(by2) != weftSuccess, "destroy by 2");
    FAIL_IF(weftCommDestroy(by3) != weftSuccess, "destroy by 3");
    return 0;
  });
}

// Equal keys keep the parent's order; one color for all copies the parent.
TEST(CommSplit, EqualKeysKeepOldOrder) {
  run_comm(5, small_slots(), [](const RankCtx &ctx, weftComm_t comm) {
    weftComm_t halves = nullptr, copy = nullptr;
    FAIL_IF(weftCommSplit(comm, ctx.rank / 3, 0, &halves, nullptr) != weftSuccess, "split: %s",
            weftGetLastError(comm));
    FAIL_IF(weftCommSplit(comm, 0, 0, &copy, nullptr) != weftSuccess, "copy: %s",
            weftGetLastError(comm));
    static const std::vector<int> members[2] = {{0, 1, 2}, {3, 4}};
    TRY_RC(expect_works(ctx, halves, members[ctx.rank / 3], "halves"));
    TRY_RC(expect_works(ctx, copy, {0, 1, 2, 3, 4}, "copy"));
    weftCommDestroy(halves);
    weftCommDestroy(copy);
    return 0;
  });
}

// WEFT_SPLIT_NOCOLOR ranks take part and get NULL; the others form a comm,
// and the parent still works afterwards.
TEST(CommSplit, NoColorGetsNull) {
  run_comm(6, small_slots(), [](const RankCtx &ctx, weftComm_t comm) {
    const bool out = ctx.rank == 2 || ctx.rank == 5;
    weftComm_t sub = (weftComm_t)&ctx;  // must be overwritten either way
    weftResult_t res =
        weftCommSplit(comm, out ? WEFT_SPLIT_NOCOLOR : 7, ctx.rank, &sub, nullptr);
    FAIL_IF(res != weftSuccess, "split: %s", weftGetLastError(comm));
    if (out) {
      FAIL_IF(sub != nullptr, "a NOCOLOR rank got a communicator");
    } else {
      TRY_RC(expect_works(ctx, sub, {0, 1, 3, 4}, "colored"));
      weftCommDestroy(sub);
    }
    TRY_RC(expect_works(ctx, comm, {0, 1, 2, 3, 4, 5}, "parent after split"));
    return 0;
  });
}

// A split of a split, with a config; the ancestors are destroyed first and
// the youngest still works.
TEST(CommSplit, NestedAndParentsDestroyedFirst) {
  run_comm(6, small_slots(), [](const RankCtx &ctx, weftComm_t &comm) {
    weftComm_t child = nullptr, grandchild = nullptr;
    FAIL_IF(weftCommSplit(comm, ctx.rank % 2, -ctx.rank, &child, nullptr) != weftSuccess,
            "split: %s", weftGetLastError(comm));
    static const std::vector<int> children[2] = {{4, 2, 0}, {5, 3, 1}};
    const std::vector<int> &siblings = children[ctx.rank % 2];
    TRY_RC(expect_works(ctx, child, siblings, "child"));
    int crank = -1;
    weftCommUserRank(child, &crank);
    weftConfig_t config = WEFT_CONFIG_INITIALIZER;
    config.maxChannels = 1;
    config.commName = "grandchild";
    FAIL_IF(weftCommSplit(child, crank < 2 ? 0 : 1, 0, &grandchild, &config) != weftSuccess,
            "nested split: %s", weftGetLastError(child));
    const std::vector<int> mine = crank < 2 ? std::vector<int>{siblings[0], siblings[1]}
                                            : std::vector<int>{siblings[2]};
    TRY_RC(expect_works(ctx, grandchild, mine, "grandchild"));
    // parent, then child: the grandchild depends on neither
    FAIL_IF(weftCommDestroy(comm) != weftSuccess, "destroy parent");
    comm = nullptr;
    TRY_RC(expect_works(ctx, child, siblings, "child without its parent"));
    FAIL_IF(weftCommDestroy(child) != weftSuccess, "destroy child");
    for (int i = 0; i < 3; i++) TRY_RC(expect_works(ctx, grandchild, mine, "orphaned grandchild"));
    FAIL_IF(weftCommDestroy(grandchild) != weftSuccess, "destroy grandchild");
    return 0;
  });
}

// Bad arguments get weftInvalidArgument (or weftInvalidUsage) and a message,
// and leave *newcomm alone; a one-rank split works.
TEST(CommSplit, BadArguments) {
  weftUniqueId id;
  ASSERT_EQ(weftGetUniqueId(&id), weftSuccess) << weftGetLastError(nullptr);
  weftComm_t comm;
  ASSERT_EQ(weftCommInitRank(&comm, 1, id, 0), weftSuccess) << weftGetLastError(nullptr);
  weftComm_t sub = (weftComm_t)&id;
  EXPECT_EQ(weftCommSplit(nullptr, 0, 0, &sub, nullptr), weftInvalidArgument);
  EXPECT_PRED2(contains, weftGetLastError(nullptr), "comm is NULL");
  EXPECT_EQ(weftCommSplit(comm, 0, 0, nullptr, nullptr), weftInvalidArgument);
  EXPECT_PRED2(contains, weftGetLastError(comm), "newcomm is NULL");
  EXPECT_EQ(weftCommSplit(comm, -2, 0, &sub, nullptr), weftInvalidArgument);
  EXPECT_PRED2(contains, weftGetLastError(comm), "color -2");
  EXPECT_EQ(weftCommSplit(comm, INT32_MIN, 0, &sub, nullptr), weftInvalidArgument);
  weftConfig_t bad = WEFT_CONFIG_INITIALIZER;
  bad.magic = 0;
  EXPECT_EQ(weftCommSplit(comm, 0, 0, &sub, &bad), weftInvalidArgument);
  EXPECT_PRED2(contains, weftGetLastError(comm), "WEFT_CONFIG_INITIALIZER");
  EXPECT_EQ(sub, (weftComm_t)&id) << "a failed split wrote *newcomm";

  // the comm survives bad calls; a split of one rank is a comm of one
  ASSERT_EQ(weftCommSplit(comm, 3, 0, &sub, nullptr), weftSuccess) << weftGetLastError(comm);
  int n = 0, r = -1;
  EXPECT_EQ(weftCommCount(sub, &n), weftSuccess);
  EXPECT_EQ(weftCommUserRank(sub, &r), weftSuccess);
  EXPECT_EQ(n, 1);
  EXPECT_EQ(r, 0);
  float x[3] = {1, 2, 3}, y[3] = {0, 0, 0};
  EXPECT_EQ(weftAllReduce(x, y, 3, weftFloat32, weftSum, sub, nullptr), weftSuccess);
  EXPECT_EQ(y[2], 3.0f);
  EXPECT_EQ(weftCommDestroy(sub), weftSuccess);
  ASSERT_EQ(weftCommSplit(comm, WEFT_SPLIT_NOCOLOR, 0, &sub, nullptr), weftSuccess);
  EXPECT_EQ(sub, nullptr);

  EXPECT_EQ(weftCommFinalize(comm), weftSuccess);
  EXPECT_EQ(weftCommSplit(comm, 0, 0, &sub, nullptr), weftInvalidUsage);
  EXPECT_PRED2(contains, weftGetLastError(comm), "finalized");
  EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
}

// A comm broken by a dead peer refuses to split, with its error.
TEST(CommSplit, BrokenCommReturnsItsError) {
  RunOptions opts = small_slots({{"WEFT_TIMEOUT", "10"}});
  opts.allow_warnings = true;  // the dead peer is warned about
  auto status = run_ranks(2, [](const RankCtx &ctx) {
    weftComm_t comm;
    if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
      return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
    if (ctx.rank == 1) raise(SIGKILL);
    float x[64] = {0};
    FAIL_IF(weftAllReduce(x, x, 64, weftFloat32, weftSum, comm, nullptr) != weftRemoteError,
            "all-reduce with a dead peer did not fail");
    weftComm_t sub = nullptr;
    weftResult_t res = weftCommSplit(comm, 0, 0, &sub, nullptr);
    FAIL_IF(res != weftRemoteError, "split of a broken comm returned %s",
            weftGetErrorString(res));
    FAIL_IF(!contains(weftGetLastError(comm), "broken by an earlier error"),
            "message: %s", weftGetLastError(comm));
    FAIL_IF(sub != nullptr, "split of a broken comm wrote *newcomm");
    // each later call's refusal names the cause once (each used to wrap the
    // last refusal's text again)
    for (int i = 0; i < 3; i++) {
      FAIL_IF(weftAllReduce(x, x, 64, weftFloat32, weftSum, comm, nullptr) != weftRemoteError,
              "all-reduce %d on a broken comm did not fail", i);
      const std::string e = weftGetLastError(comm);
      size_t times = 0;
      for (size_t at = e.find("broken by an earlier error"); at != std::string::npos;
           at = e.find("broken by an earlier error", at + 1))
        times++;
      FAIL_IF(times != 1 || !contains(e.c_str(), "rank 1"), "call %d: %s", i, e.c_str());
    }
    weftCommAbort(comm);
    return 0;
  }, opts);
  EXPECT_EQ(status[0], 0);
  EXPECT_EQ(status[1], 128 + SIGKILL);
}

// A rank that dies, or stops, before a split: the others' split fails, and
// the rank after it in the bootstrap ring names it (the ring's previous rank,
// and what asking the ranks found: gone, or not answering).
TEST(CommSplit, RankLostBeforeItNamed) {
  for (bool stop : {false, true}) {
    RunOptions opts;
    opts.timeout_s = 30;
    opts.env = {{"WEFT_TIMEOUT", "2"}};
    auto status = run_ranks(3, [&](const RankCtx &ctx) {
      weftComm_t comm, sub;
      if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
        return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
      if (ctx.rank == 2 && stop && fork() == 0) {  // ends the stopped rank after the others
        sleep(4);
        kill(getppid(), SIGKILL);
        _exit(0);
      }
      if (ctx.rank == 2) raise(stop ? SIGSTOP : SIGKILL);
      weftResult_t res = weftCommSplit(comm, 0, ctx.rank, &sub, nullptr);
      const std::string msg = weftGetLastError(comm);
      printf("rank %d (%s): %s\n", ctx.rank, stop ? "stopped" : "killed", msg.c_str());
      FAIL_IF(res == weftSuccess, "the split succeeded");
      const char *want = stop ? "receiving from rank 2" : "rank 2, the previous in the bootstrap ring";
      const char *want2 = stop ? "rank 2 did not answer" : "rank 2 is gone";
      FAIL_IF(ctx.rank == 0 && (msg.find(want) == std::string::npos ||
                                msg.find(want2) == std::string::npos),
              "rank 2 not named: %s", msg.c_str());
      weftCommAbort(comm);
      return 0;
    }, opts);
    EXPECT_EQ(status[0], 0) << (stop ? "stopped" : "killed");
    EXPECT_EQ(status[1], 0) << (stop ? "stopped" : "killed");
  }
}

}  // namespace
