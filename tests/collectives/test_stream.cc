// Host streams: calls return at once, work runs in order, errors surface at
// synchronize.
#include <gtest/gtest.h>

#include <time.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "harness.h"

using namespace weft_test;

namespace {

int init(const RankCtx &ctx, weftComm_t *comm) {
  if (weftCommInitRank(comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
    return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
  return 0;
}

// Rank 1 joins late; rank 0's call on a stream returns at once, the stream
// reports work in progress, and synchronize delivers the right result.
TEST(HostStream, ReturnsBeforeCompletion) {
  auto status = run_ranks(2, [](const RankCtx &ctx) {
    weftComm_t comm;
    if (int rc = init(ctx, &comm)) return rc;
    std::vector<float> buf(1 << 16, (float)(ctx.rank + 1));
    if (ctx.rank == 1) {
      usleep(400000);
      weftAllReduce(buf.data(), buf.data(), buf.size(), weftFloat32, weftSum, comm, nullptr);
      weftCommDestroy(comm);
      return 0;
    }
    weftStream_t stream;
    if (weftStreamCreate(&stream) != weftSuccess) return rank_fail(ctx, "stream create");
    double t0 = now_s();
    weftResult_t res = weftAllReduce(buf.data(), buf.data(), buf.size(), weftFloat32, weftSum,
                                     comm, stream);
    double call = now_s() - t0;
    if (res != weftSuccess) return rank_fail(ctx, "enqueue: %s", weftGetLastError(comm));
    if (call > 0.1) return rank_fail(ctx, "the call took %.3f s: it did not return at once", call);
    if (weftStreamQuery(stream) != weftInProgress)
      return rank_fail(ctx, "query says done while the peer has not joined");
    if (weftStreamSynchronize(stream) != weftSuccess)
      return rank_fail(ctx, "sync: %s", weftGetLastError(nullptr));
    double total = now_s() - t0;
    if (total < 0.3) return rank_fail(ctx, "finished after %.3f s, before the peer joined", total);
    for (float v : buf)
      if (v != 3.0f) return rank_fail(ctx, "result %g, want 3", v);
    if (weftStreamQuery(stream) != weftSuccess) return rank_fail(ctx, "query after sync");
    weftStreamDestroy(stream);
    weftCommDestroy(comm);
    return 0;
  });
  EXPECT_EQ(status[0], 0);
  EXPECT_EQ(status[1], 0);
}

// Operations on one stream run in call order: each all-reduce sees the
// previous one's result, and an all-gather after them sees the last.
TEST(HostStream, OrderOnOneStream) {
  auto status = run_ranks(3, [](const RankCtx &ctx) {
    weftComm_t comm;
    if (int rc = init(ctx, &comm)) return rc;
    weftStream_t stream;
    weftStreamCreate(&stream);
    std::vector<double> x(50000, ctx.rank + 1.0), gathered(3 * 50000, -1);
    for (int i = 0; i < 3; i++)
      if (weftAllReduce(x.data(), x.data(), x.size(), weftFloat64, weftSum, comm, stream) !=
          weftSuccess)
        return rank_fail(ctx, "enqueue %d", i);
    weftAllGather(x.data(), gathered.data(), x.size(), weftFloat64, comm, stream);
    if (weftStreamSynchronize(stream) != weftSuccess)
      return rank_fail(ctx, "sync: %s", weftGetLastError(nullptr));
    // 1+2+3 = 6, then 18, then 54
    for (double v : x)
      if (v != 54) return rank_fail(ctx, "after three all-reduces %g, want 54", v);
    for (double v : gathered)
      if (v != 54) return rank_fail(ctx, "all-gather saw %g, want 54", v);
    weftStreamDestroy(stream);
    weftCommDestroy(comm);
    return 0;
  });
  for (int s : status) EXPECT_EQ(s, 0);
}

// A failure on the stream is reported by synchronize, with the peer named.
TEST(HostStream, ErrorAtSynchronize) {
  RunOptions opts;
  opts.env = {{"WEFT_TIMEOUT", "1"}};
  auto status = run_ranks(2, [](const RankCtx &ctx) {
    weftComm_t comm;
    if (int rc = init(ctx, &comm)) return rc;
    if (ctx.rank == 1) {
      sleep(2);  // never joins
      weftCommAbort(comm);
      return 0;
    }
    weftStream_t stream;
    weftStreamCreate(&stream);
    float x[64] = {0};
    if (weftAllReduce(x, x, 64, weftFloat32, weftSum, comm, stream) != weftSuccess)
      return rank_fail(ctx, "enqueue");
    weftResult_t res = weftStreamSynchronize(stream);
    std::string msg = weftGetLastError(nullptr);
    if (res != weftRemoteError || msg.find("rank 1") == std::string::npos)
      return rank_fail(ctx, "sync got %d: %s", res, msg.c_str());
    weftResult_t async;
    weftCommGetAsyncError(comm, &async);
    if (async != weftRemoteError) return rank_fail(ctx, "comm not marked broken");
    weftStreamDestroy(stream);
    weftCommAbort(comm);
    return 0;
  }, opts);
  EXPECT_EQ(status[0], 0);
  EXPECT_EQ(status[1], 0);
}

TEST(HostStream, BadStreams) {
  weftUniqueId id;
  ASSERT_EQ(weftGetUniqueId(&id), weftSuccess);
  weftComm_t comm;
  ASSERT_EQ(weftCommInitRank(&comm, 1, id, 0), weftSuccess);
  float x[4] = {1, 2, 3, 4};
  int not_a_stream;
  EXPECT_EQ(weftAllReduce(x, x, 4, weftFloat32, weftSum, comm, &not_a_stream), weftInvalidArgument);
  EXPECT_EQ(weftStreamSynchronize(&not_a_stream), weftInvalidArgument);
  EXPECT_EQ(weftStreamCreate(nullptr), weftInvalidArgument);
  weftStream_t a, b;
  ASSERT_EQ(weftStreamCreate(&a), weftSuccess);
  ASSERT_EQ(weftStreamCreate(&b), weftSuccess);
  // one comm, two streams in one group: refused
  weftGroupStart();
  weftAllReduce(x, x, 4, weftFloat32, weftSum, comm, a);
  weftAllReduce(x, x, 4, weftFloat32, weftSum, comm, b);
  EXPECT_EQ(weftGroupEnd(), weftInvalidUsage);
  EXPECT_EQ(weftStreamDestroy(a), weftSuccess);
  EXPECT_EQ(weftStreamDestroy(b), weftSuccess);
  EXPECT_EQ(weftStreamSynchronize(a), weftInvalidArgument) << "destroyed stream accepted";
  EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
}

// One thread drives four ranks asynchronously: a stream per comm, a group
// per step; destroy waits for what is queued.
TEST(HostStream, OneThreadManyRanks) {
  const int n = 4;
  weftComm_t comms[n];
  weftStream_t streams[n];
  ASSERT_EQ(weftCommInitAll(comms, n, nullptr), weftSuccess) << weftGetLastError(nullptr);
  std::vector<std::vector<int64_t>> bufs(n, std::vector<int64_t>(10000));
  for (int r = 0; r < n; r++) {
    ASSERT_EQ(weftStreamCreate(&streams[r]), weftSuccess);
    for (auto &v : bufs[r]) v = r;
  }
  for (int step = 0; step < 2; step++) {
    ASSERT_EQ(weftGroupStart(), weftSuccess);
    for (int r = 0; r < n; r++)
      ASSERT_EQ(weftAllReduce(bufs[r].data(), bufs[r].data(), bufs[r].size(), weftInt64, weftSum,
                              comms[r], streams[r]),
                weftSuccess);
    ASSERT_EQ(weftGroupEnd(), weftSuccess) << weftGetLastError(nullptr);
  }
  for (int r = 0; r < n; r++) {
    EXPECT_EQ(weftStreamDestroy(streams[r]), weftSuccess) << weftGetLastError(nullptr);
    for (int64_t v : bufs[r]) ASSERT_EQ(v, 24) << "rank " << r;  // (0+1+2+3) * 4
    EXPECT_EQ(weftCommDestroy(comms[r]), weftSuccess);
  }
}

}  // namespace
