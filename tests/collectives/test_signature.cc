// WEFT_CHECK (ranks compare each collective's signature and refuse a
// mismatch) and the always-on check the slots carry.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <signal.h>
#include <stdlib.h>
#include <time.h>

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

// --- WEFT_CHECK ----------------------------------------------------------

RunOptions check_on() { return small_slots({{"WEFT_CHECK", "1"}}); }

// Every rank must get weftInvalidUsage and exactly this message.
int expect_mismatch(const RankCtx &ctx, weftComm_t comm, weftResult_t res,
                    const std::string &message) {
  FAIL_IF(res != weftInvalidUsage, "mismatch returned %s, want weftInvalidUsage (%s)",
          weftGetErrorString(res), weftGetLastError(comm));
  FAIL_IF(message != weftGetLastError(comm), "message\n  \"%s\"\nwant\n  \"%s\"",
          weftGetLastError(comm), message.c_str());
  weftResult_t async = weftInternalError;
  FAIL_IF(weftCommGetAsyncError(comm, &async) != weftSuccess || async != weftSuccess,
          "a mismatch broke the comm");
  return 0;
}

// Collectives that agree still run, and give right results, with the check on.
TEST(Check, MatchingCallsRunCorrectly) {
  run_comm(4, check_on(), [](const RankCtx &ctx, weftComm_t comm) {
    const std::vector<int> all = {0, 1, 2, 3};
    TRY_RC(expect_works(ctx, comm, all, "checked"));
    // rooted collectives and reduce-scatter, each checked too
    for (int root = 0; root < ctx.nranks; root++) {
      int64_t v[5];
      for (int i = 0; i < 5; i++) v[i] = ctx.rank == root ? 100 * root + i : -1;
      FAIL_IF(weftBcast(v, 5, weftInt64, root, comm, nullptr) != weftSuccess, "bcast: %s",
              weftGetLastError(comm));
      for (int i = 0; i < 5; i++) FAIL_IF(v[i] != 100 * root + i, "bcast root %d wrong", root);
      double s = ctx.rank + 1, t = 0;
      FAIL_IF(weftReduce(&s, &t, 1, weftFloat64, weftMax, root, comm, nullptr) != weftSuccess,
              "reduce: %s", weftGetLastError(comm));
      FAIL_IF(ctx.rank == root && t != 4.0, "reduce max to root %d is %g", root, t);
    }
    std::vector<uint32_t> send(4 * 3), recv(3);
    for (size_t i = 0; i < send.size(); i++) send[i] = (uint32_t)(i * (ctx.rank + 1));
    FAIL_IF(weftReduceScatter(send.data(), recv.data(), 3, weftUint32, weftSum, comm, nullptr) !=
                weftSuccess, "reduce-scatter: %s", weftGetLastError(comm));
    for (int i = 0; i < 3; i++)
      FAIL_IF(recv[i] != (uint32_t)((3 * ctx.rank + i) * 10), "reduce-scatter element %d", i);
    // and inside a group
    float a[2] = {1, (float)ctx.rank}, b[8] = {0};
    FAIL_IF(weftGroupStart() != weftSuccess, "group start");
    weftAllReduce(a, a, 2, weftFloat32, weftSum, comm, nullptr);
    weftAllGather(a, b, 2, weftFloat32, comm, nullptr);
    FAIL_IF(weftGroupEnd() != weftSuccess, "group: %s", weftGetLastError(comm));
    for (int r = 0; r < 4; r++)
      FAIL_IF(b[2 * r] != 4 || b[2 * r + 1] != 6, "grouped all-gather block %d: %g %g", r,
              b[2 * r], b[2 * r + 1]);
    // the check was on all along: 13 collectives above, so this is #14
    int32_t c = 0;
    weftResult_t res = weftReduce(&c, &c, 1, weftInt32, weftSum, ctx.rank == 3 ? 2 : 0, comm,
                                  nullptr);
    TRY_RC(expect_mismatch(ctx, comm, res,
                           "WEFT_CHECK: Reduce #14: root differs: ranks 0-2 have 0, "
                           "rank 3 has 2"));
    return 0;
  });
}

// Ranks hold 1, 2, 3; rank 1 all-reduces with a pre-multiply op of scalar
// 2, the others with sum, and rank 0 comes late_us late: every rank gets 8.
int premul_on_rank1(const RankCtx &ctx, weftComm_t comm, useconds_t late_us) {
  float x = (float)(ctx.rank + 1);
  weftRedOp_t op = weftSum;
  float scalar = 2.0f;
  if (ctx.rank == 1)
    FAIL_IF(weftRedOpCreatePreMulSum(&op, &scalar, weftFloat32, weftScalarHostImmediate, comm) !=
                weftSuccess,
            "premul: %s", weftGetLastError(comm));
  if (ctx.rank == 0 && late_us > 0) usleep(late_us);
  FAIL_IF(weftAllReduce(&x, &x, 1, weftFloat32, op, comm, nullptr) != weftSuccess,
          "all-reduce: %s", weftGetLastError(comm));
  FAIL_IF(x != 8.0f, "1 + 2*2 + 3 gave %g", x);
  if (ctx.rank == 1) weftRedOpDestroy(op, comm);
  return 0;
}

// A pre-multiplied sum is a sum whatever each rank's scalar (NCCL takes a
// scalar per rank): one rank's, against the others' plain sum, runs with the
// check on as without it (once, the check compared the rank's own handle
// and refused it as "op differs ... has ?").
TEST(Check, PreMulSumOnOneRankIsASum) {
  run_comm(3, check_on(), [](const RankCtx &ctx, weftComm_t comm) {
    return premul_on_rank1(ctx, comm, 0);
  });
}

// The same where the call stalls long enough for the ranks to ask where
// the others are (rank 0 comes a second late): the question's verdict takes
// it for a sum too (it compared each rank's own handle and failed the call).
TEST(Check, PreMulSumOnOneRankStalledIsASum) {
  run_comm(3, small_slots({{"WEFT_HANG_ASK_MS", "100"}}), [](const RankCtx &ctx, weftComm_t comm) {
    return premul_on_rank1(ctx, comm, 1000000);
  });
}

// One rank's count differs: every rank refuses, names the ranks, writes
// nothing, and the comm goes on working.
TEST(Check, CountMismatchOnEveryRank) {
  run_comm(3, check_on(), [](const RankCtx &ctx, weftComm_t comm) {
    TRY_RC(expect_allreduce(ctx, comm, {0, 1, 2}, "before"));  // collective #1
    const size_t count = ctx.rank == 1 ? 1000 : 1024;
    std::vector<float> in(1024, 1.0f), out(1024, -3.0f);
    weftResult_t res = weftAllReduce(in.data(), out.data(), count, weftFloat32, weftSum, comm,
                                     nullptr);
    TRY_RC(expect_mismatch(ctx, comm, res,
                           "WEFT_CHECK: AllReduce #2: count differs: ranks 0,2 have 1024, "
                           "rank 1 has 1000"));
    for (float v : out) FAIL_IF(v != -3.0f, "a refused all-reduce wrote its output");
    TRY_RC(expect_works(ctx, comm, {0, 1, 2}, "after"));
    return 0;
  });
}

// Gather, scatter and all-to-all (groups of sends and receives) are checked
// as collectives: a root or count one rank has of its own is refused on
// every rank before anything moves, the comm goes on, and correct calls
// give right results.
TEST(Check, GatherScatterAlltoAllChecked) {
  run_comm(3, check_on(), [](const RankCtx &ctx, weftComm_t comm) {
    std::vector<int32_t> in(8 * 3), out(8 * 3, -1);
    for (size_t i = 0; i < in.size(); i++) in[i] = (int32_t)(100 * ctx.rank + (int)i);
    weftResult_t res =
        weftGather(in.data(), out.data(), 8, weftInt32, ctx.rank == 2 ? 1 : 0, comm, nullptr);
    TRY_RC(expect_mismatch(ctx, comm, res,
                           "WEFT_CHECK: Gather #1: root differs: ranks 0,1 have 0, rank 2 has 1"));
    res = weftScatter(in.data(), out.data(), ctx.rank == 0 ? 4 : 8, weftInt32, 1, comm, nullptr);
    TRY_RC(expect_mismatch(ctx, comm, res,
                           "WEFT_CHECK: Scatter #2: count differs: rank 0 has 4, ranks 1,2 "
                           "have 8"));
    res = weftAlltoAll(in.data(), out.data(), ctx.rank == 1 ? 2 : 8, weftInt32, comm, nullptr);
    TRY_RC(expect_mismatch(ctx, comm, res,
                           "WEFT_CHECK: AlltoAll #3: count differs: ranks 0,2 have 8, rank 1 "
                           "has 2"));
    // a count of 0 on one rank: it sends and receives nothing, compared all the same
    res = weftScatter(in.data(), out.data(), ctx.rank == 2 ? 0 : 8, weftInt32, 0, comm, nullptr);
    TRY_RC(expect_mismatch(ctx, comm, res,
                           "WEFT_CHECK: Scatter #4: count differs: ranks 0,1 have 8, rank 2 "
                           "has 0"));
    res = weftAlltoAll(in.data(), out.data(), ctx.rank == 0 ? 0 : 8, weftInt32, comm, nullptr);
    TRY_RC(expect_mismatch(ctx, comm, res,
                           "WEFT_CHECK: AlltoAll #5: count differs: rank 0 has 0, ranks 1,2 "
                           "have 8"));
    for (int32_t v : out) FAIL_IF(v != -1, "a refused call wrote its output");
    // of 0 everywhere: agreed, nothing moves
    FAIL_IF(weftGather(in.data(), out.data(), 0, weftInt32, 1, comm, nullptr) != weftSuccess,
            "gather of 0: %s", weftGetLastError(comm));
    FAIL_IF(weftGather(in.data(), out.data(), 8, weftInt32, 2, comm, nullptr) != weftSuccess,
            "gather: %s", weftGetLastError(comm));
    for (int r = 0; ctx.rank == 2 && r < 3; r++)
      for (int i = 0; i < 8; i++)
        FAIL_IF(out[8 * r + i] != 100 * r + i, "gathered block %d element %d: %d", r, i,
                out[8 * r + i]);
    TRY_RC(expect_works(ctx, comm, {0, 1, 2}, "after"));
    return 0;
  });
}

// Ranks call different collectives: named, by rank.
TEST(Check, CollectiveMismatchOnEveryRank) {
  run_comm(3, check_on(), [](const RankCtx &ctx, weftComm_t comm) {
    std::vector<int32_t> in(16, ctx.rank), out(16 * 3, -1);
    weftResult_t res = ctx.rank == 2
                           ? weftAllGather(in.data(), out.data(), 16, weftInt32, comm, nullptr)
                           : weftAllReduce(in.data(), out.data(), 16, weftInt32, weftSum, comm,
                                           nullptr);
    TRY_RC(expect_mismatch(ctx, comm, res,
                           "WEFT_CHECK: #1: collective differs: ranks 0,1 AllReduce, "
                           "rank 2 AllGather"));
    for (int32_t v : out) FAIL_IF(v != -1, "a refused collective wrote its output");
    TRY_RC(expect_works(ctx, comm, {0, 1, 2}, "after"));
    return 0;
  });
}

// Several fields differ at once; ranks that agree are written as ranges.
TEST(Check, SeveralFieldsAndRankRanges) {
  run_comm(5, check_on(), [](const RankCtx &ctx, weftComm_t comm) {
    const bool odd = ctx.rank == 3;
    int32_t buf[8] = {0};
    weftResult_t res = weftBroadcast(buf, buf, 8, odd ? weftInt32 : weftFloat32, odd ? 1 : 0,
                                     comm, nullptr);
    TRY_RC(expect_mismatch(ctx, comm, res,
                           "WEFT_CHECK: Broadcast #1: datatype differs: ranks 0-2,4 have "
                           "float32, rank 3 has int32; root differs: ranks 0-2,4 have 0, "
                           "rank 3 has 1"));
    // the op of a reduction, three ways
    static const weftRedOp_t ops[5] = {weftSum, weftMax, weftSum, weftMin, weftMax};
    float x = 1, y = 0;
    res = weftAllReduce(&x, &y, 1, weftFloat32, ops[ctx.rank], comm, nullptr);
    TRY_RC(expect_mismatch(ctx, comm, res,
                           "WEFT_CHECK: AllReduce #2: op differs: ranks 0,2 have sum, "
                           "ranks 1,4 have max, rank 3 has min"));
    return 0;
  });
}

// Inside a group, the mismatching operation stops the group on every rank.
TEST(Check, MismatchInsideGroup) {
  run_comm(2, check_on(), [](const RankCtx &ctx, weftComm_t comm) {
    float a[5] = {1, 1, 1, 1, 1}, b[5] = {0, 0, 0, 0, 0};
    FAIL_IF(weftGroupStart() != weftSuccess, "group start");
    weftAllReduce(a, a, 4, weftFloat32, weftSum, comm, nullptr);
    weftAllReduce(b, b, ctx.rank == 0 ? 4 : 5, weftFloat32, weftSum, comm, nullptr);
    weftResult_t res = weftGroupEnd();
    FAIL_IF(res != weftInvalidUsage, "group returned %s", weftGetErrorString(res));
    FAIL_IF(!contains(weftGetLastError(comm),
                      "WEFT_CHECK: AllReduce #2: count differs: rank 0 has 4, rank 1 has 5"),
            "message: %s", weftGetLastError(comm));
    FAIL_IF(a[0] != 2 || a[3] != 2, "the group's first, matching all-reduce did not run");
    TRY_RC(expect_works(ctx, comm, {0, 1}, "after"));
    return 0;
  });
}

// A call one rank refuses (a root out of range on rank 0 alone) still takes
// its number there: the peers' call, which waits for rank 0, is compared
// with rank 0's next call and both refuse it, naming the numbers, instead of
// pairing with it and running. Nothing is written.
TEST(Check, ARefusedCallIsNotPairedWithTheNext) {
  run_comm(3, check_on(), [](const RankCtx &ctx, weftComm_t comm) {
    TRY_RC(expect_allreduce(ctx, comm, {0, 1, 2}, "before"));  // collective #1
    int64_t v[4];
    for (int i = 0; i < 4; i++) v[i] = ctx.rank == 0 ? 10 + i : -1;
    weftResult_t res = weftBcast(v, 4, weftInt64, ctx.rank == 0 ? 7 : 0, comm, nullptr);
    if (ctx.rank == 0) {
      FAIL_IF(res != weftInvalidArgument, "root 7 of 3 ranks returned %s",
              weftGetErrorString(res));
      res = weftBcast(v, 4, weftInt64, 0, comm, nullptr);  // #3 here, #2 on the peers
    }
    TRY_RC(expect_mismatch(ctx, comm, res,
                           "WEFT_CHECK: Broadcast #3: sequence number differs: rank 0 has 3, "
                           "ranks 1,2 have 2"));
    for (int i = 0; i < 4; i++)
      FAIL_IF(v[i] != (ctx.rank == 0 ? 10 + i : -1), "element %d is %lld", i, (long long)v[i]);
    return 0;
  });
}

// A group that fails on one rank (an invalid datatype in it) runs none of
// its calls there, and each still takes its number: rank 0's next call is
// #4 where rank 1's is #2, and both refuse it rather than pair them.
TEST(Check, AFailedGroupsCallsKeepTheirNumbers) {
  run_comm(2, check_on(), [](const RankCtx &ctx, weftComm_t comm) {
    TRY_RC(expect_allreduce(ctx, comm, {0, 1}, "before"));  // collective #1
    float a[4] = {1, 1, 1, 1};
    if (ctx.rank == 0) {
      FAIL_IF(weftGroupStart() != weftSuccess, "group start");
      weftAllReduce(a, a, 4, weftFloat32, weftSum, comm, nullptr);
      weftAllReduce(a, a, 4, (weftDataType_t)99, weftSum, comm, nullptr);
      weftResult_t res = weftGroupEnd();
      FAIL_IF(res != weftInvalidArgument, "group returned %s", weftGetErrorString(res));
      FAIL_IF(a[0] != 1, "the failed group's all-reduce ran");
    }
    weftResult_t res = weftAllReduce(a, a, 4, weftFloat32, weftSum, comm, nullptr);
    TRY_RC(expect_mismatch(ctx, comm, res,
                           "WEFT_CHECK: AllReduce #4: sequence number differs: rank 0 has 4, "
                           "rank 1 has 2"));
    for (float x : a) FAIL_IF(x != 1, "a refused all-reduce wrote %g", x);
    return 0;
  });
}

// Without WEFT_CHECK the check sends nothing: rank 0 calls it alone and it
// returns at once (with the check on, it would wait for rank 1 until the
// timeout); then collectives run as usual, and the always-on check still
// refuses a mismatch.
TEST(Check, OffCostsNothing) {
  RunOptions opts = small_slots({{"WEFT_TIMEOUT", "5"}});
  opts.env_unset = {"WEFT_CHECK"};  // even where the suite runs with it
  run_comm(2, opts, [](const RankCtx &ctx, weftComm_t comm) {
    if (ctx.rank == 0) {
      struct weft_plan plan;
      memset(&plan, 0, sizeof plan);
      plan.coll = COLL_ALLREDUCE;
      plan.count = 4;
      plan.datatype = weftFloat32;
      plan.root = -1;
      struct timespec t0, t1;
      clock_gettime(CLOCK_MONOTONIC, &t0);
      weftResult_t res = signature_agree(comm, &plan);
      clock_gettime(CLOCK_MONOTONIC, &t1);
      double s = (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
      FAIL_IF(res != weftSuccess || s > 1.0, "check without WEFT_CHECK: %s after %.2f s",
              weftGetErrorString(res), s);
    }
    TRY_RC(expect_works(ctx, comm, {0, 1}, "unchecked"));
    // without WEFT_CHECK a mismatch is still found on both ranks, by the
    // signature that rides after the data of recursive doubling's first slot
    int32_t x[4] = {1, 2, 3, 4};
    weftResult_t res =
        weftAllReduce(x, x, 4, ctx.rank ? weftUint32 : weftInt32, weftSum, comm, nullptr);
    FAIL_IF(res != weftInvalidUsage, "unchecked all-reduce: %s", weftGetErrorString(res));
    const std::string want =
        "ranks disagree on a collective: AllReduce #3: datatype differs: rank 0 has int32, rank 1 "
        "has uint32"; // the comm's third call
    FAIL_IF(want != weftGetLastError(comm), "message\n  \"%s\"\nwant\n  \"%s\"",
            weftGetLastError(comm), want.c_str());
    FAIL_IF(x[0] != 1 || x[3] != 4, "a refused all-reduce wrote its output");
    return 0;
  });
}

// --- the always-on check ----------------------------------------------------

// A call that one rank skips (refused there alone, or dropped with a group
// that failed there) takes its number, which the always-on signature
// carries modulo 256: that rank's next call, the same in every other field
// as the peers' pending one, differs from it by the number, so no rank
// pairs them (without the number they paired and succeeded, rank 0 a call
// ahead), on every path, without WEFT_CHECK.
struct SkipPath {
  const char *name;
  std::vector<std::pair<std::string, std::string>> env;
  bool bcast;    // the skipped call: a broadcast refused for its root, else a failed group
  size_t count;  // elements of the call
};
const SkipPath kSkipPaths[] = {
    {"ring simple, broadcast", {{"WEFT_ALGO", "ring"}, {"WEFT_PROTO", "simple"}}, true, 1000},
    {"ring ll, broadcast", {{"WEFT_ALGO", "ring"}, {"WEFT_PROTO", "ll"}}, true, 1000},
    {"ring over sockets, broadcast", {{"WEFT_ALGO", "ring"}, {"WEFT_TRANSPORT", "socket"}},
     true, 1000},
    {"single copy, broadcast", {{"WEFT_ALGO", "cma"}}, true, 70000},
    {"ring simple, all-reduce", {{"WEFT_ALGO", "ring"}, {"WEFT_PROTO", "simple"}}, false, 1000},
    {"tree, all-reduce", {{"WEFT_ALGO", "tree"}}, false, 1000},
    {"recursive doubling, all-reduce", {{"WEFT_ALGO", "rd"}}, false, 64},
    {"direct, all-reduce", {{"WEFT_ALGO", "direct"}}, false, 64},
    {"single copy, all-reduce", {{"WEFT_ALGO", "cma"}}, false, 70000},
    {"deterministic, all-reduce", {{"WEFT_DETERMINISTIC", "1"}}, false, 1000},
};

// A group that one rank only simulates (weftGroupSimulateEnd: time
// estimation, which a framework may ask for on some ranks) runs nothing and
// takes no number: the ranks' next calls pair, and each rank's trace numbers
// them alike, with no call left pending (the simulated calls had been put in
// the trace, numbered, and never ran).
TEST(AlwaysOnCheck, ASimulatedGroupTakesNoNumber) {
  RunOptions opts = small_slots();
  opts.env_unset = {"WEFT_CHECK"};
  run_comm(2, opts, [&](const RankCtx &ctx, weftComm_t comm) {
    TRY_RC(expect_allreduce(ctx, comm, {0, 1}, "before"));  // collective #1
    std::vector<float> a(100, (float)(ctx.rank + 1));
    if (ctx.rank == 0) {
      float us = -1;
      FAIL_IF(weftGroupStart() != weftSuccess, "group start");
      weftAllReduce(a.data(), a.data(), a.size(), weftFloat32, weftSum, comm, nullptr);
      weftBcast(a.data(), a.size(), weftFloat32, 1, comm, nullptr);
      weftAllReduce(a.data(), a.data(), a.size(), (weftDataType_t)99, weftSum, comm, nullptr);
      const weftResult_t res = weftGroupSimulateEnd(&us);
      FAIL_IF(res != weftInvalidArgument, "the simulated group returned %s",
              weftGetErrorString(res));
      FAIL_IF(weftGroupStart() != weftSuccess, "group start");
      weftAllReduce(a.data(), a.data(), a.size(), weftFloat32, weftSum, comm, nullptr);
      FAIL_IF(weftGroupSimulateEnd(&us) != weftSuccess || !(us > 0), "simulated: %s, %g us",
              weftGetLastError(comm), us);
      for (float v : a) FAIL_IF(v != 1.0f, "a simulated all-reduce ran");
    }
    FAIL_IF(weftAllReduce(a.data(), a.data(), a.size(), weftFloat32, weftSum, comm, nullptr) !=
                weftSuccess,
            "the all-reduce after the simulated group: %s", weftGetLastError(comm));
    for (float v : a) FAIL_IF(v != 3.0f, "all-reduce gave %g", v);
    char *text = nullptr;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    FAIL_IF(f == nullptr, "open_memstream");
    const weftResult_t dumped = weftCommTraceDump(comm, f);
    fclose(f);
    const std::string dump(text, len);
    free(text);
    FAIL_IF(dumped != weftSuccess, "trace dump: %s", weftGetLastError(comm));
    size_t calls = 0;
    for (size_t at = dump.find("\"collective_seq_id\""); at != std::string::npos;
         at = dump.find("\"collective_seq_id\"", at + 1))
      calls++;
    FAIL_IF(calls != 2 || dump.find("\"collective_seq_id\": 2") == std::string::npos,
            "rank %d's trace holds %zu collectives, not #1 and #2:\n%s", ctx.rank, calls,
            dump.c_str());
    FAIL_IF(dump.find("scheduled") != std::string::npos, "rank %d's trace holds a pending "
            "call:\n%s", ctx.rank, dump.c_str());
    return 0;
  });
}

TEST(AlwaysOnCheck, ASkippedCallIsNotPairedWithTheNext) {
  int *named = (int *)mmap(nullptr, sizeof(int), PROT_READ | PROT_WRITE,
                           MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(named, MAP_FAILED);
  for (const SkipPath &c : kSkipPaths) {
    SCOPED_TRACE(c.name);
    RunOptions opts = small_slots(c.env);
    opts.env_unset = {"WEFT_CHECK"};
    *named = 0;
    run_comm(3, opts, [&](const RankCtx &ctx, weftComm_t comm) {
      TRY_RC(expect_allreduce(ctx, comm, {0, 1, 2}, "before"));  // collective #1
      std::vector<float> buf(c.count, ctx.rank == 0 ? 2.0f : -1.0f);
      weftResult_t res;
      if (c.bcast) {
        if (ctx.rank == 0) {
          res = weftBcast(buf.data(), c.count, weftFloat32, 7, comm, nullptr);
          FAIL_IF(res != weftInvalidArgument, "%s: root 7 of 3 ranks returned %s", c.name,
                  weftGetErrorString(res));
        }
        // #3 on rank 0, #2 on the others
        res = weftBcast(buf.data(), c.count, weftFloat32, 0, comm, nullptr);
      } else {
        if (ctx.rank == 0) {
          FAIL_IF(weftGroupStart() != weftSuccess, "group start");
          weftAllReduce(buf.data(), buf.data(), c.count, weftFloat32, weftSum, comm, nullptr);
          weftAllReduce(buf.data(), buf.data(), c.count, (weftDataType_t)99, weftSum, comm,
                        nullptr);
          res = weftGroupEnd();
          FAIL_IF(res != weftInvalidArgument, "%s: the group returned %s", c.name,
                  weftGetErrorString(res));
        }
        // #4 on rank 0, #2 on the others
        res = weftAllReduce(buf.data(), buf.data(), c.count, weftFloat32, weftSum, comm,
                            nullptr);
      }
      const char *msg = weftGetLastError(comm);
      printf("%s: rank %d: %s: %s\n", c.name, ctx.rank, weftGetErrorString(res), msg);
      FAIL_IF(res != weftInvalidUsage && res != weftRemoteError,
              "%s: rank %d's call paired with another: %s (%s)", c.name, ctx.rank,
              weftGetErrorString(res), msg);
      if (strstr(msg, "sequence number (modulo 256) differs") != nullptr)
        __atomic_fetch_add(named, 1, __ATOMIC_RELAXED);
      // the ranks are out of step for good: the comm is broken
      weftResult_t async = weftSuccess;
      weftCommGetAsyncError(comm, &async);
      FAIL_IF(async == weftSuccess, "%s: the comm does not report the failure", c.name);
      return 0;
    });
    EXPECT_GE(*named, 1) << "no rank named the call number";
  }
  munmap(named, sizeof(int));
}

// The packed signature (16 bytes, what slots carry) keeps every field whole
// but the call's number, of which it keeps the remainder modulo 256: a plan
// that differs from another in any one field, in any bit of it (the root's
// 24, the number's low 8), never compares equal, and unpacking gives the
// fields back for the message.
TEST(AlwaysOnCheck, PackedSignatureKeepsEveryField) {
  struct weft_plan base;
  memset(&base, 0, sizeof base);
  base.coll = COLL_REDUCE;
  base.count = 0x0123456789abcdefull;
  base.datatype = weftBfloat16;
  base.op = weftMin;
  base.root = 70000;
  base.sig_seq = 0x1234 * 256 + 0xb7;
  struct signature_packed mine;
  signature_pack(&mine, &base);
  EXPECT_TRUE(signature_packed_same(&mine, &mine));
  // at an odd address too, as after 3 bytes of int8 data
  alignas(16) unsigned char slot[40];
  memcpy(slot + 3, &mine, sizeof mine);
  EXPECT_TRUE(signature_packed_same(slot + 3, &mine));
  struct signature full;
  signature_unpack(&full, &mine);
  EXPECT_EQ(full.magic, SIGNATURE_MAGIC);
  EXPECT_EQ(full.coll, COLL_REDUCE);
  EXPECT_EQ(full.count, 0x0123456789abcdefull);
  EXPECT_EQ(full.datatype, weftBfloat16);
  EXPECT_EQ(full.op, weftMin);
  EXPECT_EQ(full.root, 70000);
  EXPECT_EQ(full.seq, 0xb7u);
  EXPECT_EQ(full.seq_modulo, SIGNATURE_SEQ_MODULO);
  {  // the largest root and none (-1) come back as they were
    struct weft_plan p = base;
    for (int root : {SIGNATURE_MAX_RANKS - 1, -1, 0}) {
      p.root = root;
      struct signature_packed packed;
      signature_pack(&packed, &p);
      signature_unpack(&full, &packed);
      EXPECT_EQ(full.root, root);
      EXPECT_EQ(full.seq, 0xb7u) << root;
    }
  }
  {  // 256 calls apart, the number is the same
    struct weft_plan p = base;
    p.sig_seq += SIGNATURE_SEQ_MODULO;
    struct signature_packed packed;
    signature_pack(&packed, &p);
    EXPECT_TRUE(signature_packed_same(&packed, &mine));
  }
  std::vector<std::pair<std::string, struct weft_plan>> odd;
  for (int bit = 0; bit < 64; bit++) {
    struct weft_plan p = base;
    p.count ^= 1ull << bit;
    odd.push_back({"count bit " + std::to_string(bit), p});
  }
  for (int bit = 0; bit < 24; bit++) {
    struct weft_plan p = base;
    p.root = (int)((unsigned)p.root ^ (1u << bit));
    odd.push_back({"root bit " + std::to_string(bit), p});
  }
  for (int bit = 0; bit < 8; bit++) {
    struct weft_plan p = base;
    p.sig_seq ^= 1ull << bit;
    odd.push_back({"call number bit " + std::to_string(bit), p});
  }
  for (int c = 0; c < COLL_NUM; c++) {
    struct weft_plan p = base;
    p.coll = (enum coll_kind)c;
    if (c != COLL_REDUCE) odd.push_back({"collective " + std::to_string(c), p});
  }
  for (int t = 0; t < weftNumTypes; t++) {
    struct weft_plan p = base;
    p.datatype = (weftDataType_t)t;
    if (t != weftBfloat16) odd.push_back({"datatype " + std::to_string(t), p});
  }
  for (int o = 0; o < weftNumOps; o++) {
    struct weft_plan p = base;
    p.op = (weftRedOp_t)o;
    if (o != weftMin) odd.push_back({"op " + std::to_string(o), p});
  }
  for (auto &[what, p] : odd) {
    struct signature_packed theirs;
    signature_pack(&theirs, &p);
    EXPECT_FALSE(signature_packed_same(&theirs, &mine)) << what;
  }
  // bytes that are no signature unpack as none (the message then says so)
  memset(slot, 0x5a, sizeof slot);
  signature_unpack(&full, (const struct signature_packed *)(void *)slot);
  EXPECT_NE(full.magic, SIGNATURE_MAGIC);
}

// One rank's all-reduce differs from the others'. Recursive doubling carries
// each rank's signature after the data of its first slots: the partners of
// the odd rank see the difference there, refuse with weftInvalidUsage and a
// message naming both ranks, and break the comm, so every other rank fails
// too (weftRemoteError), all well inside WEFT_TIMEOUT, and none writes past
// its output (a rank may have reduced a matching partner's data into it).
struct OddCall {
  const char *name;
  int nranks;
  int odd_rank;
  size_t count, odd_count;
  weftDataType_t type, odd_type;
  weftRedOp_t op, odd_op;
  const char *differs;  // the detecting ranks' message, after the prefix
};

const OddCall kOddCalls[] = {
    {"count", 2, 1, 4, 5, weftFloat32, weftFloat32, weftSum, weftSum,
     "count differs: rank 0 has 4, rank 1 has 5"},
    {"op, several pieces", 2, 1, 1000, 1000, weftFloat32, weftFloat32, weftSum, weftMax,
     "op differs: rank 0 has sum, rank 1 has max"},
    {"count, several pieces", 4, 2, 1000, 1001, weftInt32, weftInt32, weftSum, weftSum,
     "count differs: rank 2 has 1001, rank 3 has 1000"},
    {"datatype of the extra rank", 3, 2, 33, 33, weftFloat32, weftInt32, weftSum, weftSum,
     "datatype differs: rank 0 has float32, rank 2 has int32"},
    {"count 1048576 against 1000000 elements", 5, 1, 1048576, 1000000, weftInt8, weftInt8,
     weftMin, weftMin, "count differs: rank 0 has 1048576, rank 1 has 1000000"},
};

TEST(AlwaysOnCheck, RecursiveDoublingMismatchFailsEveryRank) {
  for (const OddCall &c : kOddCalls) {
    RunOptions opts = small_slots({{"WEFT_ALGO", "rd"}});
    run_comm(c.nranks, opts, [&](const RankCtx &ctx, weftComm_t comm) {
      std::vector<int> all(ctx.nranks);
      for (int r = 0; r < ctx.nranks; r++) all[r] = r;
      TRY_RC(expect_allreduce(ctx, comm, all, "before"));
      const bool odd = ctx.rank == c.odd_rank;
      const size_t count = odd ? c.odd_count : c.count;
      const weftDataType_t t = odd ? c.odd_type : c.type;
      const size_t nbytes = count * weftTypeSize(t), guard = 256;
      std::vector<uint8_t> in(nbytes, 1), out(nbytes + guard, 0x5a);
      double t0 = now_s();
      weftResult_t res = weftAllReduce(in.data(), out.data(), count, t, odd ? c.odd_op : c.op,
                                       comm, nullptr);
      double took = now_s() - t0;
      const char *msg = weftGetLastError(comm);
      FAIL_IF(res != weftInvalidUsage && res != weftRemoteError, "%s: got %s: %s", c.name,
              weftGetErrorString(res), msg);
      FAIL_IF(took > 5, "%s: the error took %.1f s (WEFT_TIMEOUT 30 s)", c.name, took);
      for (size_t i = nbytes; i < out.size(); i++)
        FAIL_IF(out[i] != 0x5a, "%s: byte %zu past the output written", c.name, i - nbytes);
      if (res == weftInvalidUsage) {
        const std::string want =
            std::string("ranks disagree on a collective: AllReduce #2: ") + c.differs;
        FAIL_IF(want != msg, "%s: message\n  \"%s\"\nwant\n  \"%s\"", c.name, msg, want.c_str());
      }
      // each rank says whether it refused, so the test sees who did
      int refused = res == weftInvalidUsage;
      printf("%s: rank %d %s after %.3f s: %s\n", c.name, ctx.rank,
             refused ? "refused" : "failed", took, msg);
      weftResult_t async = weftSuccess;
      weftCommGetAsyncError(comm, &async);
      FAIL_IF(async == weftSuccess, "%s: the comm does not report the failure", c.name);
      return 0;
    });
  }
}

// The odd rank's all-reduce is large enough for single copy and the
// others' small enough for recursive doubling: each side finds the other's
// signature at the end of the slot it receives, and both refuse.
TEST(AlwaysOnCheck, SingleCopyAgainstRecursiveDoubling) {
  RunOptions opts;
  opts.timeout_s = 60;
  opts.env = {{"WEFT_TIMEOUT", "30"}};
  run_comm(2, opts, [&](const RankCtx &ctx, weftComm_t comm) {
    const size_t count = ctx.rank == 0 ? 70000 : 1000;
    std::vector<float> in(count, 1.0f), out(count, -1.0f);
    double t0 = now_s();
    weftResult_t res =
        weftAllReduce(in.data(), out.data(), count, weftFloat32, weftSum, comm, nullptr);
    double took = now_s() - t0;
    const std::string want =
        "ranks disagree on a collective: AllReduce #1: count differs: rank 0 has 70000, rank 1 has "
        "1000";
    FAIL_IF(res != weftInvalidUsage || want != weftGetLastError(comm),
            "got %s after %.2f s: %s", weftGetErrorString(res), took, weftGetLastError(comm));
    FAIL_IF(took > 5, "the error took %.1f s", took);
    for (float v : out) FAIL_IF(v != -1.0f, "a refused all-reduce wrote its output");
    return 0;
  });
}

// The ring (SIMPLE) carries each rank's signature after the data of its
// first slot on each link (docs/signature.md). A neighbour of the odd rank
// refuses (the message names both) and breaks the comm. A rank whose part
// was done before that (the root of a broadcast, the first sender of a
// reduce, or a rank that had all it needed) finishes, and its next call
// that waits on a neighbour fails at once; every other rank fails in the
// call. (A reduce where two ranks each think they are the root: each sends
// the other the signature alone of the link out of the root, which the
// other finds where it expects data.)
struct RingOdd {
  const char *name;
  int nranks;
  int odd_rank;
  enum coll_kind coll;
  size_t count, odd_count;
  weftRedOp_t op, odd_op;
  int root, odd_root;
  const char *refusals[2];  // what a refusing rank may say: it and a neighbour
};

#define DISAGREE "ranks disagree on a collective: "
const RingOdd kRingOdds[] = {
    {"all-gather count", 3, 1, COLL_ALLGATHER, 3, 4, weftSum, weftSum, -1, -1,
     {DISAGREE "AllGather #1: count differs: rank 0 has 3, rank 1 has 4",
      DISAGREE "AllGather #1: count differs: rank 1 has 4, rank 2 has 3"}},
    {"all-gather count, 40 and 44 bytes", 3, 1, COLL_ALLGATHER, 10, 11, weftSum, weftSum, -1, -1,
     {DISAGREE "AllGather #1: count differs: rank 0 has 10, rank 1 has 11",
      DISAGREE "AllGather #1: count differs: rank 1 has 11, rank 2 has 10"}},
    {"reduce-scatter op", 4, 3, COLL_REDUCESCATTER, 5, 5, weftSum, weftProd, -1, -1,
     {DISAGREE "ReduceScatter #1: op differs: rank 2 has sum, rank 3 has prod",
      DISAGREE "ReduceScatter #1: op differs: rank 0 has sum, rank 3 has prod"}},
    {"broadcast root", 3, 2, COLL_BROADCAST, 4, 4, weftSum, weftSum, 0, 1,
     {DISAGREE "Broadcast #1: root differs: rank 1 has 0, rank 2 has 1",
      DISAGREE "Broadcast #1: root differs: rank 0 has 0, rank 2 has 1"}},
    {"reduce root", 3, 2, COLL_REDUCE, 5, 5, weftSum, weftSum, 0, 1,
     {DISAGREE "Reduce #1: root differs: rank 1 has 0, rank 2 has 1",
      DISAGREE "Reduce #1: root differs: rank 0 has 0, rank 2 has 1"}},
};

// Runs rank's side of c; counts a refusal in *refused.
int run_ring_odd(const RankCtx &ctx, weftComm_t comm, const RingOdd &c, int *refused) {
  const bool odd = ctx.rank == c.odd_rank;
  const size_t count = odd ? c.odd_count : c.count, n = (size_t)ctx.nranks;
  const size_t send_count = c.coll == COLL_REDUCESCATTER ? count * n : count;
  const size_t recv_count = c.coll == COLL_ALLGATHER ? count * n : count;
  const size_t guard = 64;
  std::vector<float> in(send_count, 1.0f), out(recv_count + guard, -5.0f);
  const weftRedOp_t op = odd ? c.odd_op : c.op;
  const int root = odd ? c.odd_root : c.root;
  double t0 = now_s();
  weftResult_t res = weftInternalError;
  switch (c.coll) {
    case COLL_ALLGATHER:
      res = weftAllGather(in.data(), out.data(), count, weftFloat32, comm, nullptr);
      break;
    case COLL_REDUCESCATTER:
      res = weftReduceScatter(in.data(), out.data(), count, weftFloat32, op, comm, nullptr);
      break;
    case COLL_BROADCAST:
      res = weftBroadcast(in.data(), out.data(), count, weftFloat32, root, comm, nullptr);
      break;
    case COLL_REDUCE:
      res = weftReduce(in.data(), out.data(), count, weftFloat32, op, root, comm, nullptr);
      break;
    default: break;
  }
  double took = now_s() - t0;
  std::string msg = weftGetLastError(comm);
  for (size_t i = recv_count; i < out.size(); i++)
    FAIL_IF(out[i] != -5.0f, "%s: element %zu past the output written", c.name, i - recv_count);
  if (res == weftInvalidUsage) {
    FAIL_IF(msg != c.refusals[0] && msg != c.refusals[1], "%s: refused with \"%s\"", c.name,
            msg.c_str());
    __atomic_add_fetch(refused, 1, __ATOMIC_SEQ_CST);
  }
  if (res == weftSuccess) {
    // its part was done before the refusal: the next call, which waits on
    // the previous rank, fails at once
    float x = 1, y[4];
    t0 = now_s();
    res = weftAllGather(&x, y, 1, weftFloat32, comm, nullptr);
    took = now_s() - t0;
    msg = weftGetLastError(comm);
    // or it sees a neighbour still in the old call: "collective differs"
    if (res == weftInvalidUsage && msg.rfind(DISAGREE, 0) == 0)
      __atomic_add_fetch(refused, 1, __ATOMIC_SEQ_CST);
  }
  FAIL_IF(res != weftInvalidUsage && res != weftRemoteError, "%s: got %s: %s", c.name,
          weftGetErrorString(res), msg.c_str());
  FAIL_IF(took > 5, "%s: the error took %.1f s (WEFT_TIMEOUT 30 s)", c.name, took);
  printf("%s: rank %d: %s after %.3f s: %s\n", c.name, ctx.rank, weftGetErrorString(res), took,
         msg.c_str());
  return 0;
}

TEST(AlwaysOnCheck, RingMismatchFailsEveryRank) {
  int *refused = (int *)mmap(nullptr, sizeof(int), PROT_READ | PROT_WRITE,
                             MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(refused, MAP_FAILED);
  for (const char *transport : {"", "socket"})
    for (const RingOdd &c : kRingOdds) {
      RunOptions opts = small_slots({{"WEFT_ALGO", "ring"}, {"WEFT_PROTO", "simple"}});
      if (transport[0] != '\0') opts.env.push_back({"WEFT_TRANSPORT", transport});
      SCOPED_TRACE(std::string(c.name) + (transport[0] ? " over sockets" : ""));
      *refused = 0;
      run_comm(c.nranks, opts, [&](const RankCtx &ctx, weftComm_t comm) {
        return run_ring_odd(ctx, comm, c, refused);
      });
      EXPECT_GE(*refused, 1) << "no rank named the difference";
    }
  munmap(refused, sizeof(int));
}

}  // namespace
