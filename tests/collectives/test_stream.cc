// Host streams: calls return at once, work runs in order, errors surface at
// synchronize.
#include <gtest/gtest.h>

#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <string>
#include <thread>
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

// An abort while a receive waits on a stream (its peer not calling weft)
// returns at once, as on a comm that works: what the abort cut short is its
// own doing, not the comm breaking (a broken comm answers its peers'
// questions a while before it is freed; this one took 1 s to). The stream
// then reports the abort.
TEST(HostStream, AbortWithAReceiveQueuedReturnsAtOnce) {
  auto status = run_ranks(2, [](const RankCtx &ctx) {
    weftComm_t comm;
    if (int rc = init(ctx, &comm)) return rc;
    if (ctx.rank == 1) {
      sleep(1);  // in no call while rank 0 aborts
      weftCommDestroy(comm);
      return 0;
    }
    weftStream_t stream;
    weftStreamCreate(&stream);
    float x[8] = {0};
    if (weftRecv(x, 8, weftFloat32, 1, comm, stream) != weftSuccess)
      return rank_fail(ctx, "enqueue: %s", weftGetLastError(nullptr));
    usleep(50000);
    const double t0 = now_s();
    if (weftCommAbort(comm) != weftSuccess) return rank_fail(ctx, "abort failed");
    const double took = now_s() - t0;
    if (took > 0.5) return rank_fail(ctx, "the abort took %.2f s", took);
    if (weftStreamSynchronize(stream) != weftRemoteError)
      return rank_fail(ctx, "the stream did not report the abort");
    weftStreamDestroy(stream);
    return 0;
  });
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

// A stream's thread writes the states of its calls into the trace while the
// calling thread records the next ones: with a ring of 2 entries, every call
// queued reuses a slot whose call the stream may be finishing. Each rank
// queues 3000 one-element all-reduces without waiting; after synchronize the
// results are right and the trace holds the last two calls, whole and
// completed (a slot written by both at once was left odd, unreadable, or
// holding the new call with the old one's state; ThreadSanitizer runs it).
TEST(HostStream, TraceWrittenByCallerAndStream) {
  RunOptions opts;
  opts.env = {{"WEFT_TRACE_ENTRIES", "2"}};
  auto status = run_ranks(2, [](const RankCtx &ctx) {
    weftComm_t comm;
    if (int rc = init(ctx, &comm)) return rc;
    weftStream_t stream;
    if (weftStreamCreate(&stream) != weftSuccess) return rank_fail(ctx, "stream create");
    const int calls = 3000;
    std::vector<int64_t> in(calls), out(calls, -1);
    for (int i = 0; i < calls; i++) in[i] = (int64_t)i * (ctx.rank + 1);
    for (int i = 0; i < calls; i++)
      if (weftAllReduce(&in[i], &out[i], 1, weftInt64, weftSum, comm, stream) != weftSuccess)
        return rank_fail(ctx, "enqueue %d: %s", i, weftGetLastError(comm));
    if (weftStreamSynchronize(stream) != weftSuccess)
      return rank_fail(ctx, "sync: %s", weftGetLastError(nullptr));
    for (int i = 0; i < calls; i++)
      if (out[i] != 3 * (int64_t)i) return rank_fail(ctx, "call %d: %lld, want %d", i,
                                                      (long long)out[i], 3 * i);
    char *text = nullptr;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (f == nullptr) return rank_fail(ctx, "open_memstream");
    weftResult_t res = weftCommTraceDump(comm, f);
    fclose(f);
    std::string dump(text != nullptr ? text : "");
    free(text);
    if (res != weftSuccess) return rank_fail(ctx, "dump: %s", weftGetLastError(nullptr));
    int completed = 0;
    for (size_t at = 0; (at = dump.find("\"state\": \"completed\"", at)) != std::string::npos;
         at++)
      completed++;
    const std::string last = "\"record_id\": " + std::to_string(calls);
    const std::string before = "\"record_id\": " + std::to_string(calls - 1);
    if (completed != 2 || dump.find(last) == std::string::npos ||
        dump.find(before) == std::string::npos)
      return rank_fail(ctx, "the trace does not hold calls %d and %d, completed:\n%s", calls - 1,
                       calls, dump.c_str());
    weftStreamDestroy(stream);
    weftCommDestroy(comm);
    return 0;
  }, opts);
  EXPECT_EQ(status[0], 0);
  EXPECT_EQ(status[1], 0);
}

// Sends and receives queued one by one on a stream advance together: each
// rank queues a send of more than a connection holds to the next rank, then
// the receive from the previous one. Were they run one item after another,
// every send would wait for a receive queued behind its peer's own send.
// 2 and 3 ranks; an event after each operation.
TEST(HostStream, SendsAndReceivesAdvanceTogether) {
  for (int n : {2, 3}) {
    RunOptions opts;
    opts.env = {{"WEFT_TIMEOUT", "10"}};
    auto status = run_ranks(n, [](const RankCtx &ctx) {
      weftComm_t comm;
      if (int rc = init(ctx, &comm)) return rc;
      weftStream_t stream;
      weftEvent_t sent, received;
      weftStreamCreate(&stream);
      weftEventCreate(&sent);
      weftEventCreate(&received);
      const size_t count = (size_t)3 << 20; /* 12 MiB of int32 */
      const int next = (ctx.rank + 1) % ctx.nranks, prev = (ctx.rank + ctx.nranks - 1) % ctx.nranks;
      std::vector<int32_t> out(count), in(count, -1);
      for (size_t i = 0; i < count; i++) out[i] = (int32_t)(ctx.rank * 1000003 + i);
      if (weftSend(out.data(), count, weftInt32, next, comm, stream) != weftSuccess ||
          weftEventRecord(sent, stream) != weftSuccess ||
          weftRecv(in.data(), count, weftInt32, prev, comm, stream) != weftSuccess ||
          weftEventRecord(received, stream) != weftSuccess)
        return rank_fail(ctx, "enqueue: %s", weftGetLastError(comm));
      if (weftEventSynchronize(received) != weftSuccess) return rank_fail(ctx, "event sync");
      if (weftEventQuery(sent) != weftSuccess) return rank_fail(ctx, "the send's event is pending");
      if (weftStreamSynchronize(stream) != weftSuccess)
        return rank_fail(ctx, "sync: %s", weftGetLastError(nullptr));
      for (size_t i = 0; i < count; i++)
        if (in[i] != (int32_t)(prev * 1000003 + i))
          return rank_fail(ctx, "in[%zu] = %d, want %d", i, in[i], (int32_t)(prev * 1000003 + i));
      weftEventDestroy(sent);
      weftEventDestroy(received);
      weftStreamDestroy(stream);
      weftCommDestroy(comm);
      return 0;
    }, opts);
    for (int s : status) EXPECT_EQ(s, 0) << n << " ranks";
  }
}

// A gather or scatter queued on a stream runs among the sends and receives
// around it, as they do: rank 0 queues the call then a send to rank 1, rank 1
// a receive from rank 0 then the call (a gather to rank 0, a scatter from
// rank 1: rank 0 waits for rank 1's part). Run one item after another, rank
// 1's receive would wait for the send behind rank 0's call, which waits for
// rank 1's part (it did, until WEFT_TIMEOUT, once the call had a mark of its
// own). The results are checked, and the trace ends with every call done.
TEST(HostStream, GatherAmongSendsAdvances) {
  for (const char *kind : {"gather", "scatter"}) {
    SCOPED_TRACE(kind);
    RunOptions opts;
    opts.env = {{"WEFT_TIMEOUT", "10"}};
    auto status = run_ranks(2, [kind](const RankCtx &ctx) {
      weftComm_t comm;
      if (int rc = init(ctx, &comm)) return rc;
      weftStream_t stream;
      weftStreamCreate(&stream);
      const size_t n = 1000;
      std::vector<float> mine(2 * n), all(2 * n, -1), msg(n, 7.0f), got(n, -1);
      for (size_t i = 0; i < mine.size(); i++) mine[i] = (float)(ctx.rank * 10000 + i);
      auto call = [&]() {
        if (kind[0] == 'g')
          return weftGather(mine.data(), all.data(), n, weftFloat32, 0, comm, stream);
        return weftScatter(mine.data(), all.data(), n, weftFloat32, 1, comm, stream);
      };
      weftResult_t a, b;
      if (ctx.rank == 0) {
        a = call();
        b = weftSend(msg.data(), n, weftFloat32, 1, comm, stream);
      } else {
        a = weftRecv(got.data(), n, weftFloat32, 0, comm, stream);
        b = call();
      }
      if (a != weftSuccess || b != weftSuccess) return rank_fail(ctx, "enqueue: %s", weftGetLastError(comm));
      if (weftStreamSynchronize(stream) != weftSuccess)
        return rank_fail(ctx, "sync: %s", weftGetLastError(nullptr));
      if (ctx.rank == 1 && got[n - 1] != 7.0f) return rank_fail(ctx, "the send's data: %g", got[n - 1]);
      for (size_t i = 0; i < n; i++) {
        float want = -1; // what all[i] and all[n + i] must hold
        float want2 = -1;
        if (kind[0] == 'g' && ctx.rank == 0) want = (float)i, want2 = (float)(10000 + i);
        if (kind[0] == 's') want = (float)(10000 + ctx.rank * n + i);
        if (all[i] != want || (kind[0] != 's' && all[n + i] != want2))
          return rank_fail(ctx, "element %zu: %g %g, want %g %g", i, all[i], all[n + i], want,
                           want2);
      }
      char *dump = nullptr;
      size_t len = 0;
      FILE *f = open_memstream(&dump, &len);
      weftCommTraceDump(comm, f);
      fclose(f);
      const bool pending = strstr(dump, "\"scheduled\"") || strstr(dump, "\"started\"");
      free(dump);
      if (pending) return rank_fail(ctx, "a call in the trace did not end");
      weftStreamDestroy(stream);
      weftCommDestroy(comm);
      return 0;
    }, opts);
    for (int s : status) EXPECT_EQ(s, 0);
  }
}

// A send queued behind a receive that waits starts at once: rank 0 queues a
// receive from rank 1, then a send to it; rank 1 answers only once it has
// the send (blocking calls). Then a collective queued behind them runs after
// both, in order.
TEST(HostStream, SendQueuedBehindWaitingReceive) {
  RunOptions opts;
  opts.env = {{"WEFT_TIMEOUT", "10"}};
  auto status = run_ranks(2, [](const RankCtx &ctx) {
    weftComm_t comm;
    if (int rc = init(ctx, &comm)) return rc;
    std::vector<float> ask(1000, 1.0f + ctx.rank), answer(1000, -1), sum(100, 1.0f);
    if (ctx.rank == 1) {
      if (weftRecv(answer.data(), answer.size(), weftFloat32, 0, comm, nullptr) != weftSuccess ||
          weftSend(ask.data(), ask.size(), weftFloat32, 0, comm, nullptr) != weftSuccess ||
          weftAllReduce(sum.data(), sum.data(), sum.size(), weftFloat32, weftSum, comm,
                        nullptr) != weftSuccess)
        return rank_fail(ctx, "rank 1: %s", weftGetLastError(comm));
      weftCommDestroy(comm);
      return answer[0] == 1.0f ? 0 : rank_fail(ctx, "got %g, want 1", answer[0]);
    }
    weftStream_t stream;
    weftStreamCreate(&stream);
    if (weftRecv(answer.data(), answer.size(), weftFloat32, 1, comm, stream) != weftSuccess ||
        weftSend(ask.data(), ask.size(), weftFloat32, 1, comm, stream) != weftSuccess ||
        weftAllReduce(sum.data(), sum.data(), sum.size(), weftFloat32, weftSum, comm, stream) !=
            weftSuccess)
      return rank_fail(ctx, "enqueue: %s", weftGetLastError(comm));
    if (weftStreamSynchronize(stream) != weftSuccess)
      return rank_fail(ctx, "sync: %s", weftGetLastError(nullptr));
    if (answer[0] != 2.0f || sum[0] != 2.0f)
      return rank_fail(ctx, "answer %g (want 2), sum %g (want 2)", answer[0], sum[0]);
    weftStreamDestroy(stream);
    weftCommDestroy(comm);
    return 0;
  }, opts);
  for (int s : status) EXPECT_EQ(s, 0);
}

// Sends and receives queued back to back advance together only where they
// touch different buffers: rank 1 forwards what it receives (a receive, then
// a send of the same buffer) and reuses a buffer it sends from (a send of 4
// MiB, more than a FIFO holds, then a receive into it). Each waits for the
// op before it, as on a CUDA stream; advancing together, the forward sent
// the poison and the receive overwrote the send's data while it was read.
TEST(HostStream, DependentSendsAndReceivesKeepOrder) {
  RunOptions opts;
  opts.env = {{"WEFT_TIMEOUT", "20"}};
  auto status = run_ranks(3, [](const RankCtx &ctx) {
    weftComm_t comm;
    if (int rc = init(ctx, &comm)) return rc;
    const size_t small = 1000, big = 1 << 20; // floats
    std::vector<float> buf(big, -1.0f), got(big, -1.0f);
    const struct timespec late = {0, 300 * 1000 * 1000};
    if (ctx.rank == 0) { // late with what rank 1 forwards, then its next message
      nanosleep(&late, nullptr);
      std::vector<float> a(small, 7.0f), b(big, 9.0f);
      if (weftSend(a.data(), small, weftFloat32, 1, comm, nullptr) != weftSuccess ||
          weftSend(b.data(), big, weftFloat32, 1, comm, nullptr) != weftSuccess)
        return rank_fail(ctx, "send: %s", weftGetLastError(comm));
    } else if (ctx.rank == 1) {
      std::vector<float> out(big, 5.0f);
      weftStream_t stream;
      if (weftStreamCreate(&stream) != weftSuccess) return rank_fail(ctx, "stream");
      // RAW: forward the small message; WAR: send `out`, then receive into it
      if (weftRecv(buf.data(), small, weftFloat32, 0, comm, stream) != weftSuccess ||
          weftSend(buf.data(), small, weftFloat32, 2, comm, stream) != weftSuccess ||
          weftSend(out.data(), big, weftFloat32, 2, comm, stream) != weftSuccess ||
          weftRecv(out.data(), big, weftFloat32, 0, comm, stream) != weftSuccess)
        return rank_fail(ctx, "enqueue: %s", weftGetLastError(comm));
      if (weftStreamSynchronize(stream) != weftSuccess)
        return rank_fail(ctx, "sync: %s", weftGetLastError(nullptr));
      for (size_t i = 0; i < big; i++)
        if (out[i] != 9.0f) return rank_fail(ctx, "received %zu: %g, want 9", i, out[i]);
      weftStreamDestroy(stream);
    } else {
      if (weftRecv(got.data(), small, weftFloat32, 1, comm, nullptr) != weftSuccess)
        return rank_fail(ctx, "recv: %s", weftGetLastError(comm));
      for (size_t i = 0; i < small; i++)
        if (got[i] != 7.0f) return rank_fail(ctx, "forwarded %zu: %g, want 7", i, got[i]);
      nanosleep(&late, nullptr); // the 4 MiB send waits for this receive
      if (weftRecv(got.data(), big, weftFloat32, 1, comm, nullptr) != weftSuccess)
        return rank_fail(ctx, "recv big: %s", weftGetLastError(comm));
      for (size_t i = 0; i < big; i++)
        if (got[i] != 5.0f) return rank_fail(ctx, "sent from a reused buffer %zu: %g, want 5", i, got[i]);
    }
    weftCommDestroy(comm);
    return 0;
  }, opts);
  for (int s : status) EXPECT_EQ(s, 0);
}

}  // namespace

// Two communicators queue on one host stream, the first's all-reduce waiting
// for a peer that never calls: an abort or a revoke of the second, whose
// all-reduce is queued behind it, returns at once (it waited for the first's
// timeout, 600 s by default), and the stream then reports the second's
// operation as not run. The first's peer never comes: it times out (3 s).
TEST(HostStream, AbortOfACommQueuedBehindAnotherCommsStuckCallReturnsAtOnce) {
  for (const bool revoke : {false, true}) {
    RunOptions opts;
    opts.env = {{"WEFT_TIMEOUT", "3"}};
    opts.allow_warnings = true;
    auto status = run_ranks(1, [revoke](const RankCtx &ctx) {
      weftComm_t a[2], b[2];
      FAIL_IF(weftCommInitAll(a, 2, nullptr) != weftSuccess ||
                  weftCommInitAll(b, 2, nullptr) != weftSuccess,
              "init: %s", weftGetLastError(nullptr));
      weftStream_t s;
      FAIL_IF(weftStreamCreate(&s) != weftSuccess, "stream");
      static float buf_b[64], buf_a[64];
      FAIL_IF(weftAllReduce(buf_b, buf_b, 64, weftFloat32, weftSum, b[0], s) != weftSuccess,
              "queue b");
      FAIL_IF(weftAllReduce(buf_a, buf_a, 64, weftFloat32, weftSum, a[0], s) != weftSuccess,
              "queue a");
      usleep(200000); // the stream is inside b's all-reduce
      const double t0 = now_s();
      const weftResult_t res = revoke ? weftCommRevoke(a[0], 0) : weftCommAbort(a[0]);
      const double took = now_s() - t0;
      FAIL_IF(res != weftSuccess, "%s: %s", revoke ? "revoke" : "abort", weftGetLastError(nullptr));
      FAIL_IF(took > 1.0, "%s took %.2f s (behind b's stuck all-reduce)",
              revoke ? "revoke" : "abort", took);
      FAIL_IF(weftStreamSynchronize(s) == weftSuccess, "the stream reported no failure");
      const std::string why = weftGetLastError(nullptr);
      FAIL_IF(why.find("rank 1 never called it") == std::string::npos &&
                  why.find("was not run") == std::string::npos,
              "the stream's error: %s", why.c_str());
      // both are reported, the first kept: a second synchronize is clean
      FAIL_IF(weftStreamSynchronize(s) != weftSuccess, "a second synchronize: %s",
              weftGetLastError(nullptr));
      if (revoke) weftCommAbort(a[0]);
      weftCommAbort(a[1]);
      weftCommAbort(b[0]);
      weftCommAbort(b[1]);
      FAIL_IF(weftStreamDestroy(s) != weftSuccess, "stream destroy");
      (void)ctx;
      return 0;
    }, opts);
    EXPECT_EQ(status[0], 0) << (revoke ? "revoke" : "abort");
  }
}

// A send and a receive queued on two streams, each rank's thread destroying
// its comm at once without a synchronize: the destroy waits for the queued
// work (it was refused, "in use by another thread", when it came between the
// run's last retired op and the end of its hold on the comm).
TEST(HostStream, DestroyRightAfterQueuedSendRecvWaits) {
  weftStream_t streams[2];
  ASSERT_EQ(weftStreamCreate(&streams[0]), weftSuccess);
  ASSERT_EQ(weftStreamCreate(&streams[1]), weftSuccess);
  int bad = 0;
  std::string first;
  for (int it = 0; it < 400; it++) {
    weftComm_t comms[2];
    ASSERT_EQ(weftCommInitAll(comms, 2, nullptr), weftSuccess);
    static int buf[2][64];
    weftResult_t res[2];
    std::string text[2];
    std::thread t[2];
    for (int r = 0; r < 2; r++)
      t[r] = std::thread([&, r] {
        const weftResult_t q = r == 0 ? weftSend(buf[0], 64, weftInt32, 1, comms[0], streams[0])
                                      : weftRecv(buf[1], 64, weftInt32, 0, comms[1], streams[1]);
        res[r] = q != weftSuccess ? q : weftCommDestroy(comms[r]);
        if (res[r] != weftSuccess) text[r] = weftGetLastError(nullptr);
      });
    for (auto &th : t) th.join();
    for (int r = 0; r < 2; r++)
      if (res[r] != weftSuccess && bad++ == 0) first = text[r];
    ASSERT_EQ(weftStreamSynchronize(streams[0]), weftSuccess);
    ASSERT_EQ(weftStreamSynchronize(streams[1]), weftSuccess);
  }
  EXPECT_EQ(bad, 0) << "e.g. " << first;
  weftStreamDestroy(streams[0]);
  weftStreamDestroy(streams[1]);
}
