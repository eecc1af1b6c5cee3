// Calls on device memory in a comm's trace (device_watch.c), checked on the
// host over words written as the kernels write them: launch_done_state reads
// where a call's launches stand from the comm's ended words and error word;
// a trace whose probe is that function shows each device call queued,
// running, completed or failed as the words change, in trace_latest, in
// trace_oldest_unfinished and in the JSON dump; and the verdict's text says
// of a device call what the host knows (its kernel's end is not timed).
// The GPU's own run is DeviceMismatch in test_device_mismatch.cc.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "weft.h"
extern "C" {
#include "collectives/core/hang.h"
#include "collectives/core/plan.h"
#include "collectives/core/trace.h"
#include "collectives/exec/device/dev_types.h"
#include "collectives/exec/device/launch_done.h"
}

namespace {

constexpr int kWords = 64;

// The words a comm's kernels report in, as the host sees them, written as
// dev_done_report writes them.
struct Words {
  uint64_t ended[kWords] = {};
  uint32_t error = 0;
  uint64_t failed = 0;
  // block b of launch seq ends: names the launch failed first where the
  // error word is set and no earlier launch is named
  void end_block(uint64_t seq, int b) {
    if (error != 0 && failed == 0) failed = seq;
    ended[b] = seq;
  }
  void end(uint64_t seq, int nblocks) {
    for (int b = 0; b < nblocks; b++) end_block(seq, b);
  }
  enum launch_state state(uint64_t first, uint64_t last, int nblocks) {
    return launch_done_state(ended, kWords, &failed, first, last, nblocks);
  }
};

TEST(LaunchDoneState, FollowsTheWords) {
  Words w;
  // the comm's first call: launches 1..2, the last of 3 blocks
  EXPECT_EQ(w.state(1, 2, 3), LAUNCH_RUNNING); // nothing before it
  // a later call's launch 5 (of 2 blocks) waits for 3 and 4
  EXPECT_EQ(w.state(5, 5, 2), LAUNCH_QUEUED);
  w.end(1, 4);
  EXPECT_EQ(w.state(1, 2, 3), LAUNCH_RUNNING);
  w.end_block(2, 0);
  w.end_block(2, 1);
  EXPECT_EQ(w.state(1, 2, 3), LAUNCH_RUNNING) << "one block of the last launch still runs";
  w.end_block(2, 2);
  EXPECT_EQ(w.state(1, 2, 3), LAUNCH_OK);
  EXPECT_EQ(w.state(5, 5, 2), LAUNCH_QUEUED) << "launch 4 has not begun to end";
  w.end(3, 1);
  w.end_block(4, 0);
  EXPECT_EQ(w.state(5, 5, 2), LAUNCH_RUNNING) << "a block of launch 4 ended";
  // launch 4's other block gives up: 4 and every later launch read failed,
  // 1..3 (ended before, though nobody read them then) completed
  w.error = DEV_GAVE_UP_TIMEOUT;
  w.end_block(4, 1);
  EXPECT_EQ(w.failed, 4u);
  w.end(5, 2);
  EXPECT_EQ(w.failed, 4u) << "the first launch named stays";
  EXPECT_EQ(w.state(5, 5, 2), LAUNCH_FAILED);
  EXPECT_EQ(w.state(4, 4, 2), LAUNCH_FAILED);
  EXPECT_EQ(w.state(3, 3, 1), LAUNCH_OK);
  EXPECT_EQ(w.state(1, 2, 3), LAUNCH_OK);
}

TEST(LaunchDoneState, RandomEndsAndFailures) {
  const unsigned seed = 20261203u;
  std::mt19937 rng(seed);
  std::printf("seed %u\n", seed);
  for (int round = 0; round < 200; round++) {
    Words w;
    // launches 1..n, each of 1..8 blocks, ended in order up to a random block
    const int n = 1 + (int)(rng() % 12);
    std::vector<int> nblocks(n + 1);
    for (int i = 1; i <= n; i++) nblocks[i] = 1 + (int)(rng() % 8);
    const int upto = (int)(rng() % (n + 1)); // launches 1..upto ended whole
    const int fail_seed = (int)(rng() % (n + 2));
    for (int i = 1; i <= upto; i++) {
      if (i == fail_seed) w.error = DEV_GAVE_UP_POISON; // set by a block of launch i
      w.end((uint64_t)i, nblocks[i]);
    }
    int partial = 0;
    if (upto < n) { // some blocks of launch upto+1
      partial = (int)(rng() % nblocks[upto + 1]);
      for (int b = 0; b < partial; b++) w.ended[b] = (uint64_t)upto + 1;
    }
    // a launch among them gave up (or none): it and those after it fail
    const int fail_at = fail_seed >= 1 ? fail_seed : n + 1; // 0 or n+1: none
    for (int i = 1; i <= n; i++) {
      const enum launch_state s = w.state((uint64_t)i, (uint64_t)i, nblocks[i]);
      if (i <= upto && i >= fail_at) EXPECT_EQ(s, LAUNCH_FAILED) << "round " << round << " launch " << i;
      else if (i <= upto) EXPECT_EQ(s, LAUNCH_OK) << "round " << round << " launch " << i;
      else if (i == upto + 1 || (i == upto + 2 && partial > 0))
        EXPECT_EQ(s, LAUNCH_RUNNING) << "round " << round << " launch " << i;
      else EXPECT_EQ(s, LAUNCH_QUEUED) << "round " << round << " launch " << i;
    }
  }
}

// A trace whose device calls' states come from w, as device_watch.c's probe.
void probe(void *arg, const struct trace_launch *l, int32_t *state, int32_t *result,
           int32_t *waiting_on) {
  Words *w = static_cast<Words *>(arg);
  switch (w->state(l->first, l->last, (int)l->nblocks)) {
    case LAUNCH_QUEUED: *state = TRACE_SCHEDULED; break;
    case LAUNCH_RUNNING: *state = TRACE_STARTED; break;
    case LAUNCH_OK: *state = TRACE_COMPLETED; *result = weftSuccess; break;
    default: *state = TRACE_FAILED; *result = weftSystemError; *waiting_on = 3;
  }
}

// A trace whose device calls read their states from w (probe), for one test.
struct ProbedTrace {
  struct trace *t;
  Words w;
  ProbedTrace(int rank, int nranks, uint64_t job, const char *name)
      : t(trace_create(rank, nranks, job, name)) {
    trace_launch_probe_set(t, probe, &w);
  }
  ~ProbedTrace() {
    trace_launch_probe_set(t, nullptr, nullptr);
    trace_destroy(t);
  }
};

struct weft_plan allreduce(size_t count) {
  struct weft_plan p;
  memset(&p, 0, sizeof p);
  plan_init(&p, COLL_ALLREDUCE, nullptr, nullptr, count, weftFloat32, weftSum, -1);
  p.on_device = 1;
  return p;
}

std::string dump(const struct trace *t) {
  char *buf = nullptr;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  EXPECT_EQ(trace_dump(t, f, TRACE_ON_REQUEST, nullptr), weftSuccess);
  fclose(f);
  std::string s(buf, len);
  free(buf);
  return s;
}

TEST(DeviceTrace, StatesFollowTheLaunches) {
  ProbedTrace pt(0, 4, 0x1234, "device");
  ASSERT_NE(pt.t, nullptr);
  struct trace *t = pt.t;
  Words &w = pt.w;
  const struct weft_plan a = allreduce(1024), b = allreduce(7);
  const struct trace_launch la = {1, 1, 2}, lb = {2, 3, 4};
  const uint64_t ia = trace_record_launched(t, &a, &la);
  const uint64_t ib = trace_record_launched(t, &b, &lb);
  const uint64_t ic = trace_record_done(t, &b, weftSuccess); // a call that launched nothing
  struct trace_call c;
  ASSERT_TRUE(trace_get(t, ia, &c));
  EXPECT_EQ(c.state, TRACE_STARTED);
  EXPECT_EQ(c.on_device, 1);
  ASSERT_TRUE(trace_get(t, ib, &c));
  EXPECT_EQ(c.state, TRACE_SCHEDULED);
  ASSERT_TRUE(trace_get(t, ic, &c));
  EXPECT_EQ(c.state, TRACE_COMPLETED);
  EXPECT_EQ(c.on_device, 0);
  // the newest call completed: nothing unfinished behind it
  EXPECT_EQ(trace_oldest_unfinished(t, &c), 0);
  const struct weft_plan d = allreduce(99);
  const struct trace_launch ld = {4, 4, 1};
  const uint64_t id = trace_record_launched(t, &d, &ld);
  ASSERT_TRUE(trace_oldest_unfinished(t, &c));
  EXPECT_EQ(c.id, id);
  w.end(1, 2);
  w.end(3, 4);
  ASSERT_TRUE(trace_get(t, ia, &c));
  EXPECT_EQ(c.state, TRACE_COMPLETED);
  ASSERT_TRUE(trace_get(t, ib, &c));
  EXPECT_EQ(c.state, TRACE_COMPLETED);
  ASSERT_TRUE(trace_get(t, id, &c));
  EXPECT_EQ(c.state, TRACE_STARTED);
  std::string json = dump(t);
  EXPECT_NE(json.find("\"state\": \"started\", \"device\": true"), std::string::npos) << json;
  // launch 4 gives up: the call reads failed, waiting on the stalled peer
  w.error = DEV_GAVE_UP_TIMEOUT;
  w.end(4, 1);
  ASSERT_TRUE(trace_get(t, id, &c));
  EXPECT_EQ(c.state, TRACE_FAILED);
  EXPECT_EQ(c.result, weftSystemError);
  EXPECT_EQ(c.waiting_on, 3);
  ASSERT_TRUE(trace_oldest_unfinished(t, &c));
  EXPECT_EQ(c.id, id);
  ASSERT_TRUE(trace_get(t, ib, &c));
  EXPECT_EQ(c.state, TRACE_COMPLETED) << "ended before the failure";
  json = dump(t);
  EXPECT_NE(json.find("\"state\": \"failed\", \"device\": true, \"waiting_on\": 3"),
            std::string::npos)
      << json;
  // without the probe (the device state freed), calls read as recorded
  trace_launch_probe_set(t, nullptr, nullptr);
  ASSERT_TRUE(trace_get(t, id, &c));
  EXPECT_EQ(c.state, TRACE_SCHEDULED);
}

// A call that launched nothing carries the launch of the call before it
// (first past last): it completes with that one, never ahead of it.
TEST(DeviceTrace, CallWithoutLaunchesCompletesWithThePreviousOne) {
  ProbedTrace pt(0, 2, 0x77, "behind");
  ASSERT_NE(pt.t, nullptr);
  struct trace *t = pt.t;
  Words &w = pt.w;
  const struct weft_plan a = allreduce(1 << 20), empty = allreduce(0);
  const struct trace_launch la = {1, 1, 3}, behind = {2, 1, 3};
  const uint64_t ia = trace_record_launched(t, &a, &la);
  const uint64_t ie = trace_record_launched(t, &empty, &behind);
  struct trace_call c;
  ASSERT_TRUE(trace_get(t, ie, &c));
  EXPECT_EQ(c.state, TRACE_SCHEDULED) << "launch 1 has not begun to end";
  ASSERT_TRUE(trace_oldest_unfinished(t, &c));
  EXPECT_EQ(c.id, ia) << "the stuck call, not the empty one after it";
  w.end_block(1, 0);
  ASSERT_TRUE(trace_get(t, ie, &c));
  EXPECT_EQ(c.state, TRACE_STARTED);
  w.end(1, 3);
  ASSERT_TRUE(trace_get(t, ie, &c));
  EXPECT_EQ(c.state, TRACE_COMPLETED);
  EXPECT_EQ(trace_oldest_unfinished(t, &c), 0);
}

// A peer's answer starts at the call before its oldest unfinished one, so
// that a call stuck behind more queued calls than an answer holds is in it,
// and ends with its newest calls.
TEST(DeviceTrace, WindowStartsBeforeTheOldestUnfinished) {
  ProbedTrace pt(1, 2, 0x99, "window");
  ASSERT_NE(pt.t, nullptr);
  struct trace *t = pt.t;
  Words &w = pt.w;
  const struct weft_plan p = allreduce(64);
  for (uint64_t i = 1; i <= 15; i++) { // call i as launch i, one block each
    const struct trace_launch l = {i, i, 1};
    trace_record_launched(t, &p, &l);
  }
  w.end(2, 1); // calls 1 and 2 completed; 3 runs; 4..15 queued behind it
  struct trace_call calls[10];
  int n = trace_window(t, calls, 10);
  ASSERT_EQ(n, 10);
  EXPECT_EQ(calls[0].seq, 2u);
  EXPECT_EQ(calls[0].state, TRACE_COMPLETED);
  EXPECT_EQ(calls[1].seq, 3u);
  EXPECT_EQ(calls[1].state, TRACE_STARTED);
  // 14 from there: five from there, then the newest five
  EXPECT_EQ(calls[4].seq, 6u);
  EXPECT_EQ(calls[5].seq, 11u);
  EXPECT_EQ(calls[9].seq, 15u);
  EXPECT_EQ(calls[9].state, TRACE_SCHEDULED);
  // every call completed: the latest ten
  w.end(15, 1);
  n = trace_window(t, calls, 10);
  ASSERT_EQ(n, 10);
  EXPECT_EQ(calls[0].seq, 6u);
  EXPECT_EQ(calls[9].seq, 15u);
  EXPECT_EQ(calls[9].state, TRACE_COMPLETED);
}

TEST(DeviceTrace, VerdictSaysWhatTheHostKnows) {
  // rank 0 is in a device all-reduce #2; rank 1's last was #1, whose kernel
  // ended at an unknown time
  struct trace_call r0[2], r1[1];
  memset(r0, 0, sizeof r0);
  memset(r1, 0, sizeof r1);
  const int64_t now = 100000000000ll;
  for (int i = 0; i < 2; i++) {
    r0[i] = trace_call{};
    r0[i].id = r0[i].seq = (uint64_t)i + 1;
    r0[i].count = 1024;
    r0[i].coll = COLL_ALLREDUCE;
    r0[i].datatype = weftFloat32;
    r0[i].op = weftSum;
    r0[i].root = -1;
    r0[i].waiting_on = -1;
    r0[i].nranks = 2;
    r0[i].on_device = 1;
    r0[i].t_created_ns = now - 3000000000ll;
  }
  r0[0].state = TRACE_COMPLETED;
  r0[1].state = TRACE_STARTED;
  r1[0] = r0[0];
  struct hang_view views[2] = {};
  views[0] = hang_view{HANG_ANSWERED, r0, 2, now, 0};
  views[1] = hang_view{HANG_ANSWERED, r1, 1, now, 0};
  char text[1024];
  ASSERT_EQ(hang_verdict(&r0[1], "timed out after 30.0 s on device memory", views, 2, text,
                         sizeof text),
            weftSuccess);
  const std::string s = text;
  EXPECT_NE(s.find("AllReduce #2 (1024 float32 sum) timed out after 30.0 s on device memory"),
            std::string::npos) << s;
  EXPECT_NE(s.find("rank 1 never called it (its last: AllReduce #1, completed (enqueued 3.0 s "
                   "ago))"),
            std::string::npos) << s;
  EXPECT_NE(s.find("rank 0 waits on rank 1"), std::string::npos) << s;
  // a different collective under #2 on rank 1 is a mismatch
  struct trace_call r1b[2] = {r0[0], r0[1]};
  r1b[1].count = 1000;
  views[1] = hang_view{HANG_ANSWERED, r1b, 2, now, 0};
  EXPECT_EQ(hang_verdict(&r0[1], "stalls", views, 2, text, sizeof text), weftInvalidUsage);
  EXPECT_NE(std::string(text).find("count differs"), std::string::npos) << text;
  // the same call on another protocol and algorithm: named too (device calls only)
  r1b[1].count = 1024;
  r1b[1].proto = 1;
  r1b[1].algo = 1;
  EXPECT_EQ(hang_verdict(&r0[1], "stalls", views, 2, text, sizeof text), weftInvalidUsage);
  EXPECT_NE(std::string(text).find("AllReduce #2: algorithm differs: rank 0 ring, rank 1 tree; "
                                   "protocol differs: rank 0 SIMPLE, rank 1 LL"),
            std::string::npos)
      << text;
  r1b[1].algo = r1b[1].proto = -1; // a plan that decides nothing (WEFT_DETERMINISTIC)
  EXPECT_EQ(hang_verdict(&r0[1], "stalls", views, 2, text, sizeof text), weftSuccess) << text;
  r1b[1].algo = r1b[1].proto = 1;
  r0[1].on_device = r1b[1].on_device = 0; // on host memory the data paths compare
  EXPECT_EQ(hang_verdict(&r0[1], "stalls", views, 2, text, sizeof text), weftSuccess) << text;
}

} // namespace
