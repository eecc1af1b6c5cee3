// A dead, stuck or aborted peer becomes an error within the timeout, never a hang.
#include <gtest/gtest.h>

#include <pthread.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <string>
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

}  // namespace
