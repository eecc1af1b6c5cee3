// Host events: a record marks a point in a stream; synchronize, query and
// stream waits see exactly the work queued before it.
#include <gtest/gtest.h>

#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <thread>
#include <vector>

#include "harness.h"

using namespace weft_test;

namespace {

// Rank 1 joins 400 ms late. On rank 0 an event recorded after the all-reduce
// is pending until the peer joins; synchronize returns with the result there.
TEST(HostEvent, RecordAfterWork) {
  auto status = run_ranks(2, [](const RankCtx &ctx) {
    weftComm_t comm;
    if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
      return rank_fail(ctx, "init");
    std::vector<float> buf(4099, (float)(ctx.rank + 1));
    if (ctx.rank == 1) {
      usleep(400000);
      weftAllReduce(buf.data(), buf.data(), buf.size(), weftFloat32, weftSum, comm, nullptr);
      weftCommDestroy(comm);
      return 0;
    }
    weftStream_t stream;
    weftEvent_t ev;
    if (weftStreamCreate(&stream) != weftSuccess || weftEventCreate(&ev) != weftSuccess)
      return rank_fail(ctx, "create");
    if (weftEventQuery(ev) != weftSuccess) return rank_fail(ctx, "a fresh event is not complete");
    double t0 = now_s();
    weftAllReduce(buf.data(), buf.data(), buf.size(), weftFloat32, weftSum, comm, stream);
    if (weftEventRecord(ev, stream) != weftSuccess) return rank_fail(ctx, "record");
    if (weftEventQuery(ev) != weftInProgress)
      return rank_fail(ctx, "event complete before the peer joined");
    if (weftEventSynchronize(ev) != weftSuccess) return rank_fail(ctx, "event sync");
    double waited = now_s() - t0;
    if (waited < 0.3) return rank_fail(ctx, "event completed after %.3f s, too early", waited);
    for (float v : buf)
      if (v != 3.0f) return rank_fail(ctx, "result %g at event completion, want 3", v);
    if (weftEventQuery(ev) != weftSuccess) return rank_fail(ctx, "query after sync");
    // NULL stream: complete at once
    if (weftEventRecord(ev, nullptr) != weftSuccess || weftEventQuery(ev) != weftSuccess)
      return rank_fail(ctx, "record on the NULL stream is not complete");
    weftEventDestroy(ev);
    weftStreamDestroy(stream);
    weftCommDestroy(comm);
    return 0;
  });
  EXPECT_EQ(status[0], 0);
  EXPECT_EQ(status[1], 0);
}

// Stream B waits on an event of stream A: B's own later record completes
// only after A's all-reduce, although B has nothing else queued.
TEST(HostEvent, StreamWaitsForAnother) {
  auto status = run_ranks(2, [](const RankCtx &ctx) {
    weftComm_t comm;
    if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
      return rank_fail(ctx, "init");
    std::vector<double> buf(777, ctx.rank + 1.0);
    if (ctx.rank == 1) {
      usleep(400000);
      weftAllReduce(buf.data(), buf.data(), buf.size(), weftFloat64, weftSum, comm, nullptr);
      weftCommDestroy(comm);
      return 0;
    }
    weftStream_t a, b;
    weftEvent_t ev_a, ev_b;
    weftStreamCreate(&a);
    weftStreamCreate(&b);
    weftEventCreate(&ev_a);
    weftEventCreate(&ev_b);
    weftAllReduce(buf.data(), buf.data(), buf.size(), weftFloat64, weftSum, comm, a);
    weftEventRecord(ev_a, a);
    if (weftStreamWaitEvent(b, ev_a) != weftSuccess) return rank_fail(ctx, "wait event");
    weftEventRecord(ev_b, b);
    usleep(100000);
    if (weftEventQuery(ev_b) != weftInProgress || weftStreamQuery(b) != weftInProgress)
      return rank_fail(ctx, "stream b ran past its wait");
    if (weftEventSynchronize(ev_b) != weftSuccess) return rank_fail(ctx, "sync b");
    if (weftEventQuery(ev_a) != weftSuccess) return rank_fail(ctx, "b passed before a's event");
    for (double v : buf)
      if (v != 3.0) return rank_fail(ctx, "b saw %g, want 3", v);
    weftEventDestroy(ev_a);
    weftEventDestroy(ev_b);
    weftStreamDestroy(a);
    weftStreamDestroy(b);
    weftCommDestroy(comm);
    return 0;
  });
  EXPECT_EQ(status[0], 0);
  EXPECT_EQ(status[1], 0);
}

// A wait is for the record before it, whatever records come later: stream
// b waits on ev recorded after an all-reduce on a (pending until rank 1
// joins, 400 ms late); ev recorded again on the NULL stream (done at once)
// does not release b. ev is destroyed with b's wait still queued, which
// holds it: b passes once a's all-reduce is done.
TEST(HostEvent, AWaitIsForTheRecordBeforeIt) {
  auto status = run_ranks(2, [](const RankCtx &ctx) {
    weftComm_t comm;
    if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
      return rank_fail(ctx, "init");
    std::vector<double> buf(777, ctx.rank + 1.0);
    if (ctx.rank == 1) {
      usleep(400000);
      weftAllReduce(buf.data(), buf.data(), buf.size(), weftFloat64, weftSum, comm, nullptr);
      weftCommDestroy(comm);
      return 0;
    }
    weftStream_t a, b;
    weftEvent_t ev, ev_b;
    if (weftStreamCreate(&a) != weftSuccess || weftStreamCreate(&b) != weftSuccess ||
        weftEventCreate(&ev) != weftSuccess || weftEventCreate(&ev_b) != weftSuccess)
      return rank_fail(ctx, "create");
    weftAllReduce(buf.data(), buf.data(), buf.size(), weftFloat64, weftSum, comm, a);
    weftEventRecord(ev, a);
    if (weftStreamWaitEvent(b, ev) != weftSuccess) return rank_fail(ctx, "wait event");
    if (weftEventRecord(ev, nullptr) != weftSuccess || weftEventQuery(ev) != weftSuccess)
      return rank_fail(ctx, "a record on the NULL stream is not done at once");
    weftEventRecord(ev_b, b);
    if (weftEventDestroy(ev) != weftSuccess) return rank_fail(ctx, "destroy");
    usleep(100000);
    if (weftEventQuery(ev_b) != weftInProgress)
      return rank_fail(ctx, "stream b passed its wait before a's record");
    if (weftEventSynchronize(ev_b) != weftSuccess) return rank_fail(ctx, "sync b");
    for (double v : buf)
      if (v != 3.0) return rank_fail(ctx, "b passed with %g in the buffer, want 3", v);
    weftEventDestroy(ev_b);
    weftStreamDestroy(a);
    weftStreamDestroy(b);
    weftCommDestroy(comm);
    return 0;
  });
  EXPECT_EQ(status[0], 0);
  EXPECT_EQ(status[1], 0);
}

// Sends and receives crossing between two ranks, each waited for with
// weftEventSynchronizeOnStream, which runs them on the caller when the
// stream's thread is idle and waits for that thread otherwise: every
// round's data arrives, whichever thread ran it, and an all-reduce at the
// head of the queue (which the caller leaves to the stream's thread) still
// comes first.
TEST(HostEvent, SynchronizeOnStreamRunsSendsAndReceives) {
  auto status = run_ranks(2, [](const RankCtx &ctx) {
    weftComm_t comm;
    if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
      return rank_fail(ctx, "init");
    weftStream_t stream;
    weftEvent_t ev;
    if (weftStreamCreate(&stream) != weftSuccess || weftEventCreate(&ev) != weftSuccess)
      return rank_fail(ctx, "create");
    const int peer = 1 - ctx.rank;
    std::vector<int> out(257), in(257);
    for (int round = 0; round < 200; round++) {
      for (size_t i = 0; i < out.size(); i++) out[i] = ctx.rank * 100000 + round * 1000 + (int)i;
      std::fill(in.begin(), in.end(), -1);
      // on rank 0 the send first, on rank 1 the receive: blocking calls in
      // this order on one thread would deadlock above a connection's room
      if (ctx.rank == 0) {
        weftSend(out.data(), out.size(), weftInt32, peer, comm, stream);
        weftRecv(in.data(), in.size(), weftInt32, peer, comm, stream);
      } else {
        weftRecv(in.data(), in.size(), weftInt32, peer, comm, stream);
        weftSend(out.data(), out.size(), weftInt32, peer, comm, stream);
      }
      if (weftEventRecord(ev, stream) != weftSuccess) return rank_fail(ctx, "record");
      if (weftEventSynchronizeOnStream(ev, stream) != weftSuccess)
        return rank_fail(ctx, "synchronize on stream, round %d", round);
      if (weftEventQuery(ev) != weftSuccess) return rank_fail(ctx, "event not complete");
      for (size_t i = 0; i < in.size(); i++)
        if (in[i] != peer * 100000 + round * 1000 + (int)i)
          return rank_fail(ctx, "round %d: got %d at %zu", round, in[i], i);
    }
    std::vector<float> buf(1000, (float)(ctx.rank + 1));
    weftAllReduce(buf.data(), buf.data(), buf.size(), weftFloat32, weftSum, comm, stream);
    weftSend(out.data(), out.size(), weftInt32, peer, comm, stream);
    weftRecv(in.data(), in.size(), weftInt32, peer, comm, stream);
    weftEventRecord(ev, stream);
    if (weftEventSynchronizeOnStream(ev, stream) != weftSuccess)
      return rank_fail(ctx, "synchronize behind an all-reduce");
    for (float v : buf)
      if (v != 3.0f) return rank_fail(ctx, "all-reduce result %g, want 3", v);
    if (in[0] != peer * 100000 + 199 * 1000) return rank_fail(ctx, "last receive got %d", in[0]);
    if (weftStreamSynchronize(stream) != weftSuccess) return rank_fail(ctx, "stream sync");
    weftEventDestroy(ev);
    weftStreamDestroy(stream);
    weftCommDestroy(comm);
    return 0;
  });
  EXPECT_EQ(status[0], 0);
  EXPECT_EQ(status[1], 0);
}

// Waiting on a send's record with weftEventSynchronizeOnStream returns once
// the send is done, though a receive queued after the record waits for a
// message the peer sends only after this rank's next send (which follows
// the wait): the caller runs no receive queued behind the record it waits
// for. 300 rounds; before, the wait could run the receive and hang.
TEST(HostEvent, SynchronizeOnStreamStopsAtItsRecord) {
  auto status = run_ranks(2, [](const RankCtx &ctx) {
    weftComm_t comm;
    if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
      return rank_fail(ctx, "init");
    weftCommSetTimeout(comm, 10000);
    weftStream_t stream;
    weftEvent_t sent;
    if (weftStreamCreate(&stream) != weftSuccess || weftEventCreate(&sent) != weftSuccess)
      return rank_fail(ctx, "create");
    std::vector<int> x(1000), y(1000), z(10);
    for (int round = 0; round < 300; round++) {
      if (ctx.rank == 0) {
        std::fill(x.begin(), x.end(), round);
        weftSend(x.data(), x.size(), weftInt32, 1, comm, stream);
        weftEventRecord(sent, stream);
        weftRecv(y.data(), y.size(), weftInt32, 1, comm, stream);
        if (weftEventSynchronizeOnStream(sent, stream) != weftSuccess)
          return rank_fail(ctx, "round %d: synchronize on the send's record", round);
        std::fill(z.begin(), z.end(), round);
        weftSend(z.data(), z.size(), weftInt32, 1, comm, stream);
        if (weftStreamSynchronize(stream) != weftSuccess)
          return rank_fail(ctx, "round %d: stream: %s", round, weftGetLastError(nullptr));
        if (y[0] != round + 1) return rank_fail(ctx, "round %d: got %d", round, y[0]);
      } else {
        if (weftRecv(x.data(), x.size(), weftInt32, 0, comm, nullptr) != weftSuccess ||
            weftRecv(z.data(), z.size(), weftInt32, 0, comm, nullptr) != weftSuccess)
          return rank_fail(ctx, "round %d: receive", round);
        std::fill(y.begin(), y.end(), round + 1);
        if (weftSend(y.data(), y.size(), weftInt32, 0, comm, nullptr) != weftSuccess)
          return rank_fail(ctx, "round %d: send", round);
      }
    }
    weftEventDestroy(sent);
    weftStreamDestroy(stream);
    weftCommDestroy(comm);
    return 0;
  });
  EXPECT_EQ(status[0], 0);
  EXPECT_EQ(status[1], 0);
}

TEST(HostEvent, BadArguments) {
  EXPECT_EQ(weftEventCreate(nullptr), weftInvalidArgument);
  uint64_t not_an_event[4] = {0};
  EXPECT_EQ(weftEventRecord(not_an_event, nullptr), weftInvalidArgument);
  EXPECT_EQ(weftEventQuery(nullptr), weftInvalidArgument);
  weftEvent_t ev;
  ASSERT_EQ(weftEventCreate(&ev), weftSuccess);
  EXPECT_EQ(weftEventRecord(ev, not_an_event), weftInvalidArgument);
  EXPECT_EQ(weftEventSynchronize(ev), weftSuccess);  // never recorded: complete
  EXPECT_EQ(weftStreamWaitEvent(nullptr, ev), weftSuccess);
  EXPECT_EQ(weftEventSynchronizeOnStream(ev, not_an_event), weftInvalidArgument);
  EXPECT_EQ(weftEventSynchronizeOnStream(nullptr, nullptr), weftInvalidArgument);
  EXPECT_EQ(weftEventDestroy(ev), weftSuccess);
}

}  // namespace

// weftEventSynchronizeOnStream returns once its record is reached, leaving
// what another thread queued behind the record (here a receive whose send
// comes only after the synchronize returned) to the stream's thread: it took
// that receive in and waited for it, a deadlock until the peer's timeout.
TEST(HostEvent, SynchronizeOnStreamLeavesWhatIsQueuedBehindItsRecord) {
  const size_t big = 2u << 20; // int32 elements: 8 MiB, more than a FIFO holds
  std::vector<int> big0(big, 3), big1(big, 0);
  weftComm_t data[2], signal[2];
  ASSERT_EQ(weftCommInitAll(data, 2, nullptr), weftSuccess);
  ASSERT_EQ(weftCommInitAll(signal, 2, nullptr), weftSuccess);
  for (int r = 0; r < 2; r++) { // a regression fails in 10 s, not WEFT_TIMEOUT's 600
    ASSERT_EQ(weftCommSetTimeout(data[r], 10000), weftSuccess);
    ASSERT_EQ(weftCommSetTimeout(signal[r], 10000), weftSuccess);
  }
  weftStream_t s;
  weftEvent_t ev;
  ASSERT_EQ(weftStreamCreate(&s), weftSuccess);
  ASSERT_EQ(weftEventCreate(&ev), weftSuccess);
  int sig0 = 42, sig1 = 0, late = 0, late_value = 7;
  const double t0 = now_s();
  double synced = -1;
  weftResult_t sync_res = weftInternalError;
  std::thread t1([&] {
    EXPECT_EQ(weftSend(big0.data(), big, weftInt32, 1, data[0], s), weftSuccess);
    EXPECT_EQ(weftEventRecord(ev, s), weftSuccess);
    sync_res = weftEventSynchronizeOnStream(ev, s);
    synced = now_s() - t0;
    EXPECT_EQ(weftSend(&sig0, 1, weftInt32, 1, signal[0], nullptr), weftSuccess);
  });
  std::thread t2([&] {
    usleep(100000);
    EXPECT_EQ(weftRecv(&late, 1, weftInt32, 1, data[0], s), weftSuccess);
  });
  std::thread rank1([&] {
    usleep(500000);
    EXPECT_EQ(weftRecv(big1.data(), big, weftInt32, 0, data[1], nullptr), weftSuccess);
    EXPECT_EQ(weftRecv(&sig1, 1, weftInt32, 0, signal[1], nullptr), weftSuccess)
        << weftGetLastError(nullptr);
    EXPECT_EQ(weftSend(&late_value, 1, weftInt32, 0, data[1], nullptr), weftSuccess);
  });
  t1.join();
  t2.join();
  rank1.join();
  EXPECT_EQ(sync_res, weftSuccess);
  EXPECT_LT(synced, 3.0) << "the synchronize waited for the receive queued behind its record";
  EXPECT_EQ(weftStreamSynchronize(s), weftSuccess) << weftGetLastError(nullptr);
  EXPECT_EQ(sig1, 42);
  EXPECT_EQ(late, 7);
  EXPECT_EQ(big1[big - 1], 3);
  weftEventDestroy(ev);
  weftStreamDestroy(s);
  for (int r = 0; r < 2; r++) {
    weftCommDestroy(data[r]);
    weftCommDestroy(signal[r]);
  }
}
