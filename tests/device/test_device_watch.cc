// The host half of the device executor's watch (device_watch.c), run on
// every machine with a CUDA build: real communicators of ranks in one
// process (their bootstraps, query threads and traces), each given a
// device state whose kernel words are plain host memory that the test
// writes as the kernels would (launch_done.h). Checked: device calls enter
// the trace and read as their words say; weftCommGetAsyncError's watch asks
// the peers once a comm's kernels have ended nothing for WEFT_HANG_ASK_MS,
// and a count that differs under the oldest unfinished call's number (a
// call queued behind twelve more) fails every rank with weftInvalidUsage
// naming the count and the number, and raises each rank's kernel abort
// word; ranks that agree are left running; a kernel that timed out gets
// the verdict naming the rank that never called. The GPU's own run is
// DeviceMismatch in test_device_mismatch.cc.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "tests/device/fake_device.h"
#include "weft.h"
extern "C" {
#include "collectives/core/comm.h"
#include "collectives/core/params.h"
#include "collectives/core/trace.h"
#include "transport/base/param.h"
#include "transport/base/wait.h"
}

namespace {

// Sets a WEFT_* variable for one test, forgetting the cached settings both
// times.
struct Env {
  const char *name;
  Env(const char *n, const char *v) : name(n) {
    setenv(n, v, 1);
    reset();
  }
  ~Env() {
    unsetenv(name);
    reset();
  }
  static void reset() {
    struct weft_param *const tables[] = {wait_params, trace_params, coll_params, NULL};
    param_tables_reset(tables);
  }
};

// Real comms of n ranks in one process, each given an emulated device
// state (taken away before the comms go).
struct Job {
  std::vector<weftComm_t> comms;
  std::vector<struct fake_device *> dev;
  explicit Job(int n) : comms(n) {
    EXPECT_EQ(weftCommInitAll(comms.data(), n, nullptr), weftSuccess) << weftGetLastError(nullptr);
    for (auto c : comms) dev.push_back(fake_device_attach(c));
  }
  ~Job() {
    for (auto *f : dev) fake_device_detach(f);
    for (auto c : comms) weftCommDestroy(c);
  }
};

// Polls each rank's weftCommGetAsyncError until every one in which[] has
// an error or limit_s passed; the seconds it took.
double poll(const std::vector<weftComm_t> &comms, const std::vector<int> &which, double limit_s,
            std::vector<weftResult_t> &async, std::vector<std::string> &text) {
  async.assign(comms.size(), weftSuccess);
  text.assign(comms.size(), "");
  const auto t0 = std::chrono::steady_clock::now();
  for (;;) {
    size_t failed = 0;
    for (int r : which) {
      if (async[r] == weftSuccess) {
        EXPECT_EQ(weftCommGetAsyncError(comms[r], &async[r]), weftSuccess);
        if (async[r] != weftSuccess) text[r] = weftGetLastError(comms[r]);
      }
      failed += async[r] != weftSuccess;
    }
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (failed == which.size() || s > limit_s) return s;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

TEST(DeviceWatch, CountThatDiffersFoundByAskingBehindQueuedCalls) {
  Env timeout("WEFT_TIMEOUT", "30");
  const int k = 3;
  Job job(k);
  auto &dev = job.dev;
  // #1 agrees and ends on every rank; #2 differs on rank 0 (as on either
  // side of a protocol threshold: no kernel compares); twelve more queue
  for (int r = 0; r < k; r++) {
    fake_device_launch(dev[r], 1000, 1, 0);
    fake_device_end(dev[r], 1, 1);
    fake_device_launch(dev[r], r == 0 ? 1000 : 4u << 20, 4, 0);
    for (int i = 0; i < 12; i++) fake_device_launch(dev[r], 1000, 1, 0);
  }
  struct trace_call c;
  ASSERT_TRUE(trace_oldest_unfinished(job.comms[1]->trace, &c));
  EXPECT_EQ(c.seq, 2u);
  EXPECT_EQ(c.state, TRACE_STARTED) << "launch 1 ended: launch 2 runs";
  std::vector<weftResult_t> async;
  std::vector<std::string> text;
  const double s = poll(job.comms, {0, 1, 2}, 5.0, async, text);
  printf("every rank failed after %.2f s\n", s);
  EXPECT_LT(s, 1.5) << "asked after WEFT_HANG_ASK_MS (500 ms)";
  EXPECT_GT(s, 0.3) << "not before a stall of WEFT_HANG_ASK_MS";
  for (int r = 0; r < k; r++) {
    printf("  rank %d: %d %s\n", r, (int)async[r], text[r].c_str());
    EXPECT_EQ(async[r], weftInvalidUsage) << "rank " << r;
    EXPECT_NE(text[r].find("count differs"), std::string::npos) << text[r];
    EXPECT_NE(text[r].find("#2"), std::string::npos) << text[r];
    EXPECT_EQ(fake_device_abort_word(dev[r]), 1u) << "rank " << r << "'s kernels told to stop";
  }
}

// The same call on protocols that differ (a setting changed on one rank
// after the comm's init compared them): their kernels use different FIFOs;
// the question names it.
TEST(DeviceWatch, ProtocolsThatDifferNamed) {
  Env ask("WEFT_HANG_ASK_MS", "200");
  const int k = 2;
  Job job(k);
  auto &dev = job.dev;
  for (int r = 0; r < k; r++) fake_device_launch(dev[r], 1024, 1, r == 0 ? 1 : 0);
  std::vector<weftResult_t> async;
  std::vector<std::string> text;
  const double s = poll(job.comms, {0, 1}, 5.0, async, text);
  printf("every rank failed after %.2f s\n", s);
  for (int r = 0; r < k; r++) {
    printf("  rank %d: %d %s\n", r, (int)async[r], text[r].c_str());
    EXPECT_EQ(async[r], weftInvalidUsage) << "rank " << r;
    EXPECT_NE(text[r].find("AllReduce #1: protocol differs: rank 0 LL, rank 1 SIMPLE"),
              std::string::npos)
        << text[r];
  }
}

TEST(DeviceWatch, AgreeingRanksAreLeftRunning) {
  Env ask("WEFT_HANG_ASK_MS", "100");
  const int k = 2;
  Job job(k);
  auto &dev = job.dev;
  for (int r = 0; r < k; r++) fake_device_launch(dev[r], 1 << 20, 2, 0); // a long call, the same on both
  std::vector<weftResult_t> async;
  std::vector<std::string> text;
  poll(job.comms, {0, 1}, 0.8, async, text); // asks at 0.1, 0.2, 0.4 s
  for (int r = 0; r < k; r++) {
    EXPECT_EQ(async[r], weftSuccess) << text[r];
    EXPECT_EQ(fake_device_abort_word(dev[r]), 0u);
  }
  for (int r = 0; r < k; r++) fake_device_end(dev[r], 1, 2);
  struct trace_call c;
  EXPECT_EQ(trace_oldest_unfinished(job.comms[0]->trace, &c), 0) << "completed";
}

TEST(DeviceWatch, TimeoutGetsTheVerdict) {
  Env timeout("WEFT_TIMEOUT", "30");
  Env ask("WEFT_HANG_ASK_MS", "0"); // no stall questions: the verdict alone
  const int k = 3;
  Job job(k);
  auto &dev = job.dev;
  for (int r = 0; r < k; r++) {
    fake_device_launch(dev[r], 4096, 1, 0);
    fake_device_end(dev[r], 1, 1);
  }
  // ranks 0 and 1 call #2, rank 2 does not; their kernels time out
  for (int r = 0; r < 2; r++) {
    fake_device_launch(dev[r], 4096, 2, 0);
    fake_device_time_out(dev[r], 2);
    fake_device_end(dev[r], 2, 2);
  }
  std::vector<weftResult_t> async;
  std::vector<std::string> text;
  poll(job.comms, {0, 1}, 5.0, async, text);
  for (int r = 0; r < 2; r++) {
    printf("  rank %d: %d %s\n", r, (int)async[r], text[r].c_str());
    EXPECT_EQ(async[r], weftSystemError) << "rank " << r;
    EXPECT_NE(text[r].find("AllReduce #2 (4096 float32 sum) timed out after 30.0 s on device "
                           "memory"),
              std::string::npos)
        << text[r];
    EXPECT_NE(text[r].find("rank 2 never called it (its last: AllReduce #1, completed "
                           "(enqueued"),
              std::string::npos)
        << text[r];
    EXPECT_NE(text[r].find("gave up: no progress from rank"), std::string::npos) << text[r];
    struct trace_call c;
    ASSERT_TRUE(trace_oldest_unfinished(job.comms[r]->trace, &c));
    EXPECT_EQ(c.seq, 2u);
    EXPECT_EQ(c.state, TRACE_FAILED);
  }
  weftResult_t idle = weftSuccess;
  weftCommGetAsyncError(job.comms[2], &idle);
  EXPECT_EQ(idle, weftSuccess) << "the rank that skipped it has nothing running";
}

} // namespace
