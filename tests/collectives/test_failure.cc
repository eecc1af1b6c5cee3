// A dead, stuck or aborted peer becomes an error within the timeout, never a hang.
#include <gtest/gtest.h>

#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "harness.h"

using namespace weft_test;

namespace {

struct Call {
  weftComm_t comm;
  std::vector<float> *buf;
  bool repeat;       // call again after each success, for up to 30 s
  weftResult_t res;
  double seconds;    // how long the last call took
};

void *allreduce_thread(void *p) {
  Call *c = (Call *)p;
  double start = now_s();
  do {
    double t0 = now_s();
    c->res = weftAllReduce(c->buf->data(), c->buf->data(), c->buf->size(), weftFloat32,
                           weftSum, c->comm, nullptr);
    c->seconds = now_s() - t0;
  } while (c->repeat && c->res == weftSuccess && now_s() - start < 30);
  return nullptr;
}

// All ranks run all-reduces back to back and one is killed: whatever step
// the others are in, they get weftRemoteError, well inside WEFT_TIMEOUT, and
// the comm reports it.
TEST(Failure, RankDiesMidCollective) {
  const int timeout_s = 10;
  for (int nranks : {2, 4}) {
    RunOptions opts;
    opts.timeout_s = 60;
    opts.env = {{"WEFT_TIMEOUT", std::to_string(timeout_s)}, {"WEFT_SLOT_BYTES", "4096"}};
    auto status = run_ranks(nranks, [&](const RankCtx &ctx) {
      weftComm_t comm;
      if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
        return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
      std::vector<float> buf(1 << 20, 1.0f);
      Call call{comm, &buf, true, weftSuccess, 0};
      pthread_t tid;
      pthread_create(&tid, nullptr, allreduce_thread, &call);
      if (ctx.rank == ctx.nranks - 1) {
        usleep(200000);  // well into the stream of collectives
        raise(SIGKILL);
      }
      pthread_join(tid, nullptr);
      if (call.res != weftRemoteError)
        return rank_fail(ctx, "got %s, want weftRemoteError", weftGetErrorString(call.res));
      if (call.seconds > timeout_s)
        return rank_fail(ctx, "error took %.1f s, beyond WEFT_TIMEOUT", call.seconds);
      weftResult_t async = weftSuccess;
      weftCommGetAsyncError(comm, &async);
      if (async != weftRemoteError) return rank_fail(ctx, "async error not set");
      printf("rank %d: error after %.2f s: %s\n", ctx.rank, call.seconds, weftGetLastError(comm));
      // a broken comm refuses further work at once
      float x = 1;
      if (weftAllReduce(&x, &x, 1, weftFloat32, weftSum, comm, nullptr) == weftSuccess)
        return rank_fail(ctx, "broken comm accepted more work");
      weftCommAbort(comm);
      return 0;
    }, opts);
    for (int r = 0; r < nranks - 1; r++) EXPECT_EQ(status[r], 0) << nranks << " ranks, rank " << r;
    EXPECT_EQ(status[nranks - 1], 128 + SIGKILL);
  }
}

// A peer that never joins the collective: the wait ends with a timeout error.
TEST(Failure, SilentPeerTimesOut) {
  RunOptions opts;
  opts.timeout_s = 30;
  opts.env = {{"WEFT_TIMEOUT", "2"}};
  auto status = run_ranks(2, [](const RankCtx &ctx) {
    weftComm_t comm;
    if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
      return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
    if (ctx.rank == 1) {
      sleep(4);  // alive, but never calls
      weftCommAbort(comm);
      return 0;
    }
    std::vector<float> buf(1024, 1.0f);
    double t0 = now_s();
    weftResult_t res = weftAllReduce(buf.data(), buf.data(), buf.size(), weftFloat32, weftSum,
                                     comm, nullptr);
    double took = now_s() - t0;
    std::string msg = weftGetLastError(comm);
    if (res != weftRemoteError || msg.find("timed out") == std::string::npos)
      return rank_fail(ctx, "got %s: %s", weftGetErrorString(res), msg.c_str());
    if (took < 1.5 || took > 3.5) return rank_fail(ctx, "timeout after %.2f s, want ~2", took);
    weftCommAbort(comm);
    return 0;
  }, opts);
  EXPECT_EQ(status[0], 0);
  EXPECT_EQ(status[1], 0);
}

// weftCommSetTimeout shortens the waits that begin after it: a comm made with
// a 30 s timeout, set to 1 s, gives up on a silent peer after about 1 s. A
// timeout of 0 or less is refused.
TEST(Failure, SetTimeoutAppliesToLaterWaits) {
  RunOptions opts;
  opts.timeout_s = 40;
  opts.env = {{"WEFT_TIMEOUT", "30"}};
  auto status = run_ranks(2, [](const RankCtx &ctx) {
    weftComm_t comm;
    if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
      return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
    if (ctx.rank == 1) {
      sleep(4);  // alive, but never calls
      weftCommAbort(comm);
      return 0;
    }
    if (weftCommSetTimeout(comm, 0) != weftInvalidArgument)
      return rank_fail(ctx, "a timeout of 0 was accepted");
    if (weftCommSetTimeout(nullptr, 1000) != weftInvalidArgument)
      return rank_fail(ctx, "a NULL comm was accepted");
    if (weftCommSetTimeout(comm, 1000) != weftSuccess)
      return rank_fail(ctx, "set: %s", weftGetLastError(comm));
    std::vector<float> buf(1024, 1.0f);
    double t0 = now_s();
    weftResult_t res = weftAllReduce(buf.data(), buf.data(), buf.size(), weftFloat32, weftSum,
                                     comm, nullptr);
    double took = now_s() - t0;
    std::string msg = weftGetLastError(comm);
    if (res != weftRemoteError || msg.find("timed out") == std::string::npos)
      return rank_fail(ctx, "got %s: %s", weftGetErrorString(res), msg.c_str());
    if (took > 3.5) return rank_fail(ctx, "timeout after %.2f s, want ~1 (was 30)", took);
    weftCommAbort(comm);
    return 0;
  }, opts);
  EXPECT_EQ(status[0], 0);
  EXPECT_EQ(status[1], 0);
}

// weftCommAbort from another thread unblocks a rank waiting in a collective,
// and the peer sees the abort as an error instead of waiting for the timeout.
TEST(Failure, AbortFromAnotherThread) {
  RunOptions opts;
  opts.timeout_s = 60;
  opts.env = {{"WEFT_TIMEOUT", "30"}};
  auto status = run_ranks(2, [](const RankCtx &ctx) {
    weftComm_t comm;
    if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
      return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
    std::vector<float> buf(4096, 1.0f);
    // one call together first: connections that algorithms make on first use exist
    if (weftAllReduce(buf.data(), buf.data(), buf.size(), weftFloat32, weftSum, comm, nullptr) !=
        weftSuccess)
      return rank_fail(ctx, "first all-reduce: %s", weftGetLastError(comm));
    if (ctx.rank == 0) {
      Call call{comm, &buf, false, weftSuccess, 0};
      pthread_t tid;
      pthread_create(&tid, nullptr, allreduce_thread, &call);
      usleep(300000);  // the thread is now waiting for rank 1
      double t0 = now_s();
      if (weftCommAbort(comm) != weftSuccess) return rank_fail(ctx, "abort failed");
      pthread_join(tid, nullptr);
      if (call.res != weftRemoteError)
        return rank_fail(ctx, "aborted call got %s", weftGetErrorString(call.res));
      if (now_s() - t0 > 2) return rank_fail(ctx, "abort took %.2f s", now_s() - t0);
      return 0;
    }
    usleep(1000000);  // join late: rank 0 has aborted by now
    // data rank 0 queued before its abort may still complete one call; the
    // next must fail at once instead of waiting for the timeout
    double t0 = now_s();
    weftResult_t res = weftSuccess;
    for (int i = 0; i < 2 && res == weftSuccess; i++)
      res = weftAllReduce(buf.data(), buf.data(), buf.size(), weftFloat32, weftSum, comm, nullptr);
    double took = now_s() - t0;
    if (res != weftRemoteError) return rank_fail(ctx, "peer got %s", weftGetErrorString(res));
    if (took > 5) return rank_fail(ctx, "peer noticed the abort only after %.1f s", took);
    weftCommAbort(comm);
    return 0;
  }, opts);
  EXPECT_EQ(status[0], 0);
  EXPECT_EQ(status[1], 0);
}

bool contains(const char *text, const char *needle) { return strstr(text, needle) != nullptr; }

// All ranks' all-reduce of (rank + 1) over count floats: sum n (n + 1) / 2.
int allreduce_works(const RankCtx &ctx, weftComm_t comm, size_t count, const char *when) {
  std::vector<float> buf(count, (float)(ctx.rank + 1));
  weftResult_t res =
      weftAllReduce(buf.data(), buf.data(), count, weftFloat32, weftSum, comm, nullptr);
  FAIL_IF(res != weftSuccess, "all-reduce %s: %s", when, weftGetLastError(comm));
  const float want = (float)(ctx.nranks * (ctx.nranks + 1) / 2);
  for (size_t i = 0; i < count; i++)
    FAIL_IF(buf[i] != want, "all-reduce %s: element %zu is %g, want %g", when, i, buf[i], want);
  return 0;
}

// A revoked comm still splits, the new comm works, and both are destroyed.
int split_works_then_destroy(const RankCtx &ctx, weftComm_t comm, const char *when) {
  weftComm_t child = nullptr;
  FAIL_IF(weftCommSplit(comm, 0, ctx.rank, &child, nullptr) != weftSuccess || child == nullptr,
          "split %s: %s", when, weftGetLastError(comm));
  TRY_RC(allreduce_works(ctx, child, 1000, "on the split of a revoked comm"));
  FAIL_IF(weftCommDestroy(child) != weftSuccess, "destroy child: %s", weftGetLastError(child));
  FAIL_IF(weftCommDestroy(comm) != weftSuccess, "destroy: %s", weftGetLastError(comm));
  return 0;
}

// weftCommRevoke from another thread ends a call waiting on a late peer, as
// an abort does, but keeps the comm: later operations are refused at once
// with a message (the comm is not freed under a thread that was about to
// call), bad flags are refused, and once every rank has revoked, the comm
// still splits into a working one and is destroyed.
TEST(Failure, RevokeFromAnotherThreadKeepsTheComm) {
  RunOptions opts;
  opts.timeout_s = 60;
  opts.env = {{"WEFT_TIMEOUT", "30"}};
  auto status = run_ranks(2, [](const RankCtx &ctx) {
    weftComm_t comm;
    if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
      return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
    std::vector<float> buf(4096, 1.0f);
    TRY_RC(allreduce_works(ctx, comm, 4096, "before the revoke"));
    if (ctx.rank == 0) {
      // an older refusal's text, which the revoked call's must replace
      FAIL_IF(weftBroadcast(buf.data(), buf.data(), 1, weftFloat32, -1, comm, nullptr) !=
                  weftInvalidArgument, "a broadcast of root -1 was not refused");
      Call call{comm, &buf, false, weftSuccess, 0};
      pthread_t tid;
      pthread_create(&tid, nullptr, allreduce_thread, &call);
      usleep(300000); // the thread is now waiting for rank 1
      double t0 = now_s();
      FAIL_IF(weftCommRevoke(comm, 0) != weftSuccess, "revoke: %s", weftGetLastError(comm));
      pthread_join(tid, nullptr);
      FAIL_IF(call.res == weftSuccess, "the revoked call succeeded");
      FAIL_IF(now_s() - t0 > 2, "revoke took %.2f s", now_s() - t0);
      FAIL_IF(!contains(weftGetLastError(comm), "cut short by a revoke"),
              "the comm's last error after the revoked call: %s", weftGetLastError(comm));
    } else {
      usleep(1000000); // join late: rank 0 has revoked by now
      double t0 = now_s();
      weftResult_t res = weftSuccess;
      for (int i = 0; i < 2 && res == weftSuccess; i++)
        res = weftAllReduce(buf.data(), buf.data(), buf.size(), weftFloat32, weftSum, comm,
                            nullptr);
      FAIL_IF(res == weftSuccess, "the peer's calls succeeded after a revoke");
      FAIL_IF(now_s() - t0 > 5, "the peer noticed the revoke only after %.1f s", now_s() - t0);
      FAIL_IF(weftCommRevoke(comm, 0) != weftSuccess, "revoke: %s", weftGetLastError(comm));
    }
    // refused at once, with the reason; a second revoke is harmless
    double t0 = now_s();
    FAIL_IF(weftAllReduce(buf.data(), buf.data(), buf.size(), weftFloat32, weftSum, comm,
                          nullptr) != weftInvalidUsage, "an all-reduce after the revoke was not "
            "refused");
    FAIL_IF(!contains(weftGetLastError(comm), "revoked"), "refusal says: %s",
            weftGetLastError(comm));
    FAIL_IF(weftSend(buf.data(), 1, weftFloat32, 1 - ctx.rank, comm, nullptr) !=
                weftInvalidUsage, "a send after the revoke was not refused");
    FAIL_IF(now_s() - t0 > 1, "refusals took %.2f s", now_s() - t0);
    FAIL_IF(weftCommRevoke(comm, 4) != weftInvalidArgument, "revoke flags 4 accepted");
    FAIL_IF(weftCommRevoke(comm, 0) != weftSuccess, "a second revoke: %s", weftGetLastError(comm));
    weftResult_t async = weftInternalError;
    FAIL_IF(weftCommGetAsyncError(comm, &async) != weftSuccess || async != weftSuccess,
            "async error after the revoke: %s", weftGetErrorString(async));
    return split_works_then_destroy(ctx, comm, "after the revoke");
  }, opts);
  EXPECT_EQ(status[0], 0);
  EXPECT_EQ(status[1], 0);
}

// A revoke reaches a peer that waits on a connection not made yet (its first
// receive from the revoking rank, its first all-reduce: their connections
// are made by a bootstrap exchange on first use) within about a second, as
// it reaches one on a connection made before: the peer's error, then its own
// revoke, and the comm still splits. Such a peer used to wait until
// WEFT_TIMEOUT (30 s here; the watchdog's 60 s ends the test).
TEST(Failure, RevokeReachesAPeerWaitingOnAConnectionNotMadeYet) {
  RunOptions opts;
  opts.timeout_s = 60;
  opts.env = {{"WEFT_TIMEOUT", "30"}};
  for (int op : {0, 1}) {  // 0: a receive, 1: an all-reduce
    auto status = run_ranks(2, [op](const RankCtx &ctx) {
      weftComm_t comm;
      if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
        return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
      Rng rng(test_seed() + (uint64_t)ctx.rank);
      std::vector<float> buf(64);
      for (float &v : buf) v = (float)(rng.next() % 1000);
      if (ctx.rank == 0) {
        usleep(500000);  // rank 1 waits on rank 0 by now
        FAIL_IF(weftCommRevoke(comm, 0) != weftSuccess, "revoke: %s", weftGetLastError(comm));
      } else {
        double t0 = now_s();
        weftResult_t res =
            op == 0 ? weftRecv(buf.data(), buf.size(), weftFloat32, 0, comm, nullptr)
                    : weftAllReduce(buf.data(), buf.data(), buf.size(), weftFloat32, weftSum,
                                    comm, nullptr);
        const double took = now_s() - t0;
        FAIL_IF(res == weftSuccess, "%s from the revoking rank succeeded",
                op == 0 ? "a receive" : "an all-reduce");
        FAIL_IF(took > 3, "%s noticed the revoke only after %.1f s (%s)",
                op == 0 ? "a receive" : "an all-reduce", took, weftGetLastError(comm));
        FAIL_IF(weftCommRevoke(comm, 0) != weftSuccess, "revoke: %s", weftGetLastError(comm));
      }
      return split_works_then_destroy(ctx, comm, "after a revoke of a cold connection");
    }, opts);
    EXPECT_EQ(status[0], 0) << (op == 0 ? "receive" : "all-reduce");
    EXPECT_EQ(status[1], 0) << (op == 0 ? "receive" : "all-reduce");
  }
}

// Operations checked before a revoke and run after it (recorded in a group,
// on every rank) are refused when they start, and break nothing: the async
// error stays clear and the comm still splits. They used to run with the
// abort flag lowered again, fail on the poisoned connections and break the
// comm's bootstrap, so that the split failed on every rank.
TEST(Failure, RevokeRefusesWhatAGroupRecordedBeforeIt) {
  RunOptions opts;
  opts.timeout_s = 60;
  opts.env = {{"WEFT_TIMEOUT", "30"}};
  for (int nranks : {2, 3}) {
    auto status = run_ranks(nranks, [](const RankCtx &ctx) {
      weftComm_t comm;
      if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
        return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
      TRY_RC(allreduce_works(ctx, comm, 1000, "before the revoke"));
      std::vector<float> buf(4096, 1.0f);
      FAIL_IF(weftGroupStart() != weftSuccess, "group start");
      FAIL_IF(weftAllReduce(buf.data(), buf.data(), buf.size(), weftFloat32, weftSum, comm,
                            nullptr) != weftSuccess, "recording: %s", weftGetLastError(comm));
      FAIL_IF(weftSend(buf.data(), 16, weftFloat32, (ctx.rank + 1) % ctx.nranks, comm, nullptr) !=
                  weftSuccess, "recording a send: %s", weftGetLastError(comm));
      FAIL_IF(weftRecv(buf.data() + 16, 16, weftFloat32, (ctx.rank + ctx.nranks - 1) % ctx.nranks,
                       comm, nullptr) != weftSuccess, "recording a receive: %s",
              weftGetLastError(comm));
      FAIL_IF(weftCommRevoke(comm, 0) != weftSuccess, "revoke: %s", weftGetLastError(comm));
      double t0 = now_s();
      weftResult_t end = weftGroupEnd();
      FAIL_IF(end != weftInvalidUsage, "the group after the revoke gave %s",
              weftGetErrorString(end));
      FAIL_IF(now_s() - t0 > 2, "the refused group took %.2f s", now_s() - t0);
      weftResult_t async = weftInternalError;
      FAIL_IF(weftCommGetAsyncError(comm, &async) != weftSuccess || async != weftSuccess,
              "async error after the refused group: %s", weftGetErrorString(async));
      return split_works_then_destroy(ctx, comm, "after the refused group");
    }, opts);
    for (int r = 0; r < nranks; r++) EXPECT_EQ(status[r], 0) << nranks << " ranks, rank " << r;
  }
}

struct RevokeRace {
  weftComm_t comm;
  int first_back = 0;       // set by the first revoke to return
  weftResult_t shrunk = weftInternalError;
  char why[256] = "";
};

// Revokes; the first thread back shrinks rank 1 out at once, as a watchdog's
// recovery does.
void *revoke_then_shrink(void *p) {
  RevokeRace *r = (RevokeRace *)p;
  weftCommRevoke(r->comm, 0);
  if (__atomic_exchange_n(&r->first_back, 1, __ATOMIC_SEQ_CST) == 0) {
    int exclude = 1;
    weftComm_t child = nullptr;
    r->shrunk = weftCommShrink(r->comm, &exclude, 1, &child, nullptr);
    if (r->shrunk != weftSuccess) snprintf(r->why, sizeof r->why, "%s", weftGetLastError(r->comm));
    else weftCommDestroy(child);
  }
  return nullptr;
}

// Two threads revoke a comm at once while a call waits on it: neither
// returns before the revoke is done, so a shrink right after the first one
// back works. The second used to return while the abort flag was still up
// ("communicator was aborted"). Rank 1 of the pair never calls.
TEST(Failure, TwoRevokesAtOnceBothWaitForTheRevoke) {
  for (int trial = 0; trial < 20; trial++) {
    SCOPED_TRACE("trial " + std::to_string(trial));
    weftComm_t comms[2];
    ASSERT_EQ(weftCommInitAll(comms, 2, nullptr), weftSuccess) << weftGetLastError(nullptr);
    std::vector<float> buf(1024, 1.0f);
    Call call{comms[0], &buf, false, weftSuccess, 0};
    RevokeRace race{comms[0]};
    pthread_t waiting, a, b;
    pthread_create(&waiting, nullptr, allreduce_thread, &call);
    usleep(2000);
    pthread_create(&a, nullptr, revoke_then_shrink, &race);
    pthread_create(&b, nullptr, revoke_then_shrink, &race);
    pthread_join(a, nullptr);
    pthread_join(b, nullptr);
    pthread_join(waiting, nullptr);
    EXPECT_EQ(race.shrunk, weftSuccess) << "shrink right after a revoke returned: " << race.why;
    EXPECT_EQ(weftCommDestroy(comms[0]), weftSuccess) << weftGetLastError(comms[0]);
    weftCommAbort(comms[1]);
    if (HasFailure()) break;
  }
}

struct Watchdog {
  weftComm_t comm;
  weftResult_t res = weftInternalError;
};

void *revoke_thread(void *p) {
  Watchdog *w = (Watchdog *)p;
  w->res = weftCommRevoke(w->comm, 0);
  return nullptr;
}

// A watchdog thread revokes the comm a call waits on; the caller, its call
// failed, destroys the comm at once. Destroy waits for the revoke still in
// progress instead of freeing the comm under it (a use after free that the
// sanitizer builds catch).
TEST(Failure, DestroyRightAfterARevokeWaitsForIt) {
  for (int trial = 0; trial < 5; trial++) {
    SCOPED_TRACE("trial " + std::to_string(trial));
    weftComm_t comms[2];
    ASSERT_EQ(weftCommInitAll(comms, 2, nullptr), weftSuccess) << weftGetLastError(nullptr);
    std::vector<float> buf(1024, 1.0f);
    Watchdog dog{comms[0]};
    pthread_t tid;
    std::thread caller([&] {
      usleep(1000);
      pthread_create(&tid, nullptr, revoke_thread, &dog);
    });
    weftResult_t res = weftAllReduce(buf.data(), buf.data(), buf.size(), weftFloat32, weftSum,
                                     comms[0], nullptr);
    caller.join();
    EXPECT_NE(res, weftSuccess) << "the revoked all-reduce succeeded";
    EXPECT_EQ(weftCommDestroy(comms[0]), weftSuccess) << weftGetLastError(comms[0]);
    pthread_join(tid, nullptr);
    EXPECT_EQ(dog.res, weftSuccess);
    weftCommAbort(comms[1]);
  }
}

// One rank's own buffer is bad (a NULL input on a broadcast's root, a NULL
// output on one rank of an all-reduce): that rank gets weftInvalidArgument
// at once and its comm breaks, so the others, already waiting in the
// collective, fail within a second or so instead of at WEFT_TIMEOUT. A bad
// datatype on every rank, by contrast, leaves the comm working.
TEST(Failure, ArgumentErrorOnOneRankStopsTheOthers) {
  const int timeout_s = 30;
  for (int nranks : {2, 3})
    for (int which : {0, 1}) {
      RunOptions opts;
      opts.timeout_s = 90;
      opts.env = {{"WEFT_TIMEOUT", std::to_string(timeout_s)}};
      const int bad_rank = which == 0 ? 0 : nranks - 1;
      auto status = run_ranks(nranks, [&](const RankCtx &ctx) {
        weftComm_t comm;
        if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
          return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
        // the same bad datatype everywhere: refused, and nobody waits
        float x[4] = {1, 2, 3, 4};
        FAIL_IF(weftAllReduce(x, x, 4, (weftDataType_t)99, weftSum, comm, nullptr) !=
                    weftInvalidArgument, "bad datatype accepted");
        TRY_RC(allreduce_works(ctx, comm, 1000, "after a bad datatype on every rank"));
        std::vector<float> buf(4096, (float)ctx.rank);
        if (ctx.rank == bad_rank) usleep(300000);  // the others wait in the call by now
        const bool bad = ctx.rank == bad_rank;
        double t0 = now_s();
        weftResult_t res;
        if (which == 0)  // broadcast from rank 0, whose input is NULL
          res = weftBroadcast(bad ? nullptr : buf.data(), buf.data(), buf.size(), weftFloat32, 0,
                              comm, nullptr);
        else  // all-reduce where the last rank's output is NULL
          res = weftAllReduce(buf.data(), bad ? nullptr : buf.data(), buf.size(), weftFloat32,
                              weftSum, comm, nullptr);
        double took = now_s() - t0;
        std::string msg = weftGetLastError(comm);
        if (bad) {
          FAIL_IF(res != weftInvalidArgument || msg.find("is NULL") == std::string::npos,
                  "bad call got %s: %s", weftGetErrorString(res), msg.c_str());
          // the comm is broken for this rank too, and says why
          res = weftAllReduce(x, x, 4, weftFloat32, weftSum, comm, nullptr);
          msg = weftGetLastError(comm);
          FAIL_IF(res == weftSuccess || msg.find("is NULL") == std::string::npos,
                  "next call on the broken comm got %s: %s", weftGetErrorString(res),
                  msg.c_str());
        } else {
          FAIL_IF(res != weftRemoteError, "peer got %s: %s", weftGetErrorString(res),
                  msg.c_str());
          FAIL_IF(took > 5, "peer waited %.1f s (WEFT_TIMEOUT %d s): %s", took, timeout_s,
                  msg.c_str());
          printf("rank %d: error after %.2f s: %s\n", ctx.rank, took, msg.c_str());
        }
        weftResult_t async = weftSuccess;
        weftCommGetAsyncError(comm, &async);
        FAIL_IF(async == weftSuccess, "the comm does not report the failure");
        weftCommAbort(comm);
        return 0;
      }, opts);
      for (int r = 0; r < nranks; r++)
        EXPECT_EQ(status[r], 0) << nranks << " ranks, case " << which << ", rank " << r;
    }
}

// A split that one rank refuses (bad color, NULL newcomm) fails on every
// rank within a second or so, naming that rank; the parent goes on working,
// and a good split after it works.
TEST(Failure, SplitRefusedOnOneRankFailsEverywhere) {
  RunOptions opts;
  opts.timeout_s = 90;
  opts.env = {{"WEFT_TIMEOUT", "30"}};
  auto status = run_ranks(3, [&](const RankCtx &ctx) {
    weftComm_t comm;
    if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
      return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
    for (int round = 0; round < 2; round++) {
      const int bad_rank = round == 0 ? 1 : 2;
      weftComm_t sub = nullptr;
      double t0 = now_s();
      weftResult_t res;
      if (ctx.rank != bad_rank) res = weftCommSplit(comm, 0, ctx.rank, &sub, nullptr);
      else if (round == 0) res = weftCommSplit(comm, -5, ctx.rank, &sub, nullptr);
      else res = weftCommSplit(comm, 0, ctx.rank, nullptr, nullptr);
      double took = now_s() - t0;
      const char *msg = weftGetLastError(comm);
      if (ctx.rank == bad_rank) {
        FAIL_IF(res != weftInvalidArgument ||
                    !contains(msg, round == 0 ? "color -5" : "newcomm is NULL"),
                "round %d: refused split got %s: %s", round, weftGetErrorString(res), msg);
      } else {
        char want[64];
        snprintf(want, sizeof want, "rank %d refused its call", bad_rank);
        FAIL_IF(res != weftInvalidUsage || !contains(msg, want),
                "round %d: peer got %s: %s", round, weftGetErrorString(res), msg);
        FAIL_IF(took > 5, "round %d: peer waited %.1f s", round, took);
      }
      FAIL_IF(sub != nullptr, "round %d: a refused split made a comm", round);
      TRY_RC(allreduce_works(ctx, comm, 777, "on the parent after a refused split"));
    }
    weftComm_t sub = nullptr;
    FAIL_IF(weftCommSplit(comm, ctx.rank % 2, 0, &sub, nullptr) != weftSuccess,
            "good split: %s", weftGetLastError(comm));
    int n = 0;
    weftCommCount(sub, &n);
    FAIL_IF(n != (ctx.rank % 2 ? 1 : 2), "split comm has %d ranks", n);
    weftCommDestroy(sub);
    weftCommDestroy(comm);
    return 0;
  }, opts);
  for (int r = 0; r < 3; r++) EXPECT_EQ(status[r], 0) << "rank " << r;
}

// A forked child holds a copy of its parent's comm: every call on it is
// refused with a message saying so (the parent's connections are not the
// child's to use or close), and the parent's comm is unharmed.
TEST(Failure, ForkedChildMayNotUseParentsComm) {
  RunOptions opts;
  opts.timeout_s = 60;
  opts.env = {{"WEFT_TIMEOUT", "20"}};
  auto status = run_ranks(2, [&](const RankCtx &ctx) {
    weftComm_t comm;
    if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
      return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
    TRY_RC(allreduce_works(ctx, comm, 5000, "before the fork"));
    pid_t child = fork();
    if (child == 0) {
      float x[3] = {1, 2, 3};
      int code = 0, v = -1;
      double t0 = now_s();
      if (weftAllReduce(x, x, 3, weftFloat32, weftSum, comm, nullptr) != weftInvalidUsage) code = 1;
      else if (!contains(weftGetLastError(comm), "is a fork of it")) code = 2;
      else if (weftCommUserRank(comm, &v) != weftInvalidUsage || v != -1) code = 3;
      else if (weftCommSplit(comm, 0, 0, &comm, nullptr) != weftInvalidUsage) code = 4;
      else if (weftCommDestroy(comm) != weftInvalidUsage) code = 5;
      else if (weftCommAbort(comm) != weftInvalidUsage) code = 6;
      else if (now_s() - t0 > 1) code = 7;
      if (code != 0) fprintf(stderr, "child: step %d: %s\n", code, weftGetLastError(comm));
      _exit(code);
    }
    FAIL_IF(child < 0, "fork: %s", strerror(errno));
    int wstatus = 0;
    waitpid(child, &wstatus, 0);
    FAIL_IF(!WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0,
            "the forked child's calls were not refused (status 0x%x)", wstatus);
    TRY_RC(allreduce_works(ctx, comm, 5000, "after the child's attempts"));
    TRY_RC(allreduce_works(ctx, comm, 300000, "large, after the child's attempts"));
    weftCommDestroy(comm);
    return 0;
  }, opts);
  for (int r = 0; r < 2; r++) EXPECT_EQ(status[r], 0) << "rank " << r;
}

// A rank killed while its peers copy from and to its buffers through the
// kernel (cross-memory attach, WEFT_CMA_MAP=0): whatever step they are in
// (the copy itself: ESRCH or a torn-down address space; a FIFO wait), the
// survivor gets weftRemoteError naming the dead rank, never a system error.
TEST(Failure, RankDiesDuringSingleCopy) {
  for (int trial = 0; trial < 4; trial++) {
    RunOptions opts;
    opts.timeout_s = 60;
    opts.env = {{"WEFT_TIMEOUT", "20"}, {"WEFT_ALGO", "cma"}, {"WEFT_CMA_MAP", "0"}};
    const useconds_t delay_us = 100000 + 70000 * (useconds_t)trial;
    auto status = run_ranks(2, [&](const RankCtx &ctx) {
      weftComm_t comm;
      if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
        return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
      std::vector<float> buf(4 << 20, 1.0f);
      Call call{comm, &buf, true, weftSuccess, 0};
      pthread_t tid;
      pthread_create(&tid, nullptr, allreduce_thread, &call);
      if (ctx.rank == 1) {
        usleep(delay_us);
        raise(SIGKILL);
      }
      pthread_join(tid, nullptr);
      const char *msg = weftGetLastError(comm);
      FAIL_IF(call.res != weftRemoteError, "got %s, want weftRemoteError: %s",
              weftGetErrorString(call.res), msg);
      FAIL_IF(!contains(msg, "rank 1"), "the error does not name rank 1: %s", msg);
      FAIL_IF(call.seconds > 5, "error after %.1f s", call.seconds);
      printf("trial %d: error after %.2f s: %s\n", trial, call.seconds, msg);
      weftCommAbort(comm);
      return 0;
    }, opts);
    EXPECT_EQ(status[0], 0) << "trial " << trial;
    EXPECT_EQ(status[1], 128 + SIGKILL) << "trial " << trial;
  }
}

}  // namespace
