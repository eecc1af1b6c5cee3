// Process-wide state under several threads: group workers are kept, the
// waits' oversubscribed mode ends with the last communicator that needed it,
// the tuner's rules and the parameters load safely from concurrent threads,
// and the async error is read while another thread records it. The
// ThreadSanitizer build runs this suite (tools/scripts/sanitize.sh).
#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <thread>
#include <vector>

#include "tests/collectives/coll_ref.h"
#include "tests/harness.h"

extern "C" {
#include "collectives/api/config.h"
#include "collectives/core/comm.h"
#include "collectives/core/params.h"
#include "collectives/core/trace.h"
#include "transport/base/param.h"
#include "transport/base/wait.h"
}

namespace {

using weft_test::Rng;
using weft_test::check_reduction;
using weft_test::make_input;
using weft_test::now_s;
using weft_test::test_seed;

int count_threads() {
  int n = 0;
  std::vector<char> buf(256);
  FILE *f = fopen("/proc/self/status", "r");
  if (f == nullptr) return -1;
  while (fgets(buf.data(), (int)buf.size(), f) != nullptr)
    if (sscanf(buf.data(), "Threads: %d", &n) == 1) break;
  fclose(f);
  return n;
}

// Runs one all-reduce over every comm as one group; checks the results.
void group_allreduce(weftComm_t *comms, int n, size_t count, uint64_t seed) {
  std::string why;
  EXPECT_TRUE(weft_test::group_allreduce_check(comms, n, count, seed, &why)) << why;
}

// A caller driving several ranks through groups gets worker threads (named
// weft-group) once; later groups reuse them instead of starting a thread per
// comm per call.
TEST(Threads, GroupWorkersAreKept) {
  for (int n : {2, 3, 5}) {
    std::vector<weftComm_t> comms(n);
    ASSERT_EQ(weftCommInitAll(comms.data(), n, nullptr), weftSuccess) << weftGetLastError(nullptr);
    Rng rng(test_seed() + n);
    group_allreduce(comms.data(), n, 1 + rng.next() % 5000, rng.next());
    int workers = weft_test::count_threads_named("weft-group");
    int threads = count_threads();
    ASSERT_GT(threads, 0) << "/proc/self/status unreadable";
    EXPECT_GE(workers, n - 1) << n << " comms: the group's workers are not kept";
    for (int i = 0; i < 40; i++) group_allreduce(comms.data(), n, 1 + rng.next() % 5000, rng.next());
    EXPECT_EQ(weft_test::count_threads_named("weft-group"), workers) << n << " comms";
    EXPECT_EQ(count_threads(), threads) << n << " comms: threads started by later groups";
    for (int r = 0; r < n; r++) EXPECT_EQ(weftCommDestroy(comms[r]), weftSuccess);
  }
}

// Groups from several caller threads at once share the kept workers safely.
TEST(Threads, GroupsFromSeveralThreads) {
  const int ncallers = 3, n = 2;
  std::vector<std::vector<weftComm_t>> comms(ncallers, std::vector<weftComm_t>(n));
  for (auto &c : comms) ASSERT_EQ(weftCommInitAll(c.data(), n, nullptr), weftSuccess);
  std::vector<std::thread> callers;
  for (int t = 0; t < ncallers; t++)
    callers.emplace_back([&, t] {
      Rng rng(test_seed() * 31 + t);
      for (int i = 0; i < 15; i++) group_allreduce(comms[t].data(), n, 1 + rng.next() % 3000, rng.next());
    });
  for (auto &th : callers) th.join();
  for (auto &c : comms)
    for (auto comm : c) EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
}

// Ranks that outnumber the CPUs put the waits in their oversubscribed mode
// (no spinning); the mode ends when those communicators are gone.
TEST(Threads, OversubscribedModeEndsWithItsComms) {
  cpu_set_t saved, one;
  ASSERT_EQ(sched_getaffinity(0, sizeof saved, &saved), 0);
  struct weft_wait w;
  wait_begin(&w, 1000000000ull, nullptr, nullptr, 0, 0, "test");
  ASSERT_EQ(w.spin_mask, 255u) << "oversubscribed before any communicator";
  CPU_ZERO(&one);
  for (int c = 0; c < CPU_SETSIZE; c++)
    if (CPU_ISSET(c, &saved)) {
      CPU_SET(c, &one);
      break;
    }
  // every thread of this process (the ranks are threads here) on one CPU
  ASSERT_EQ(sched_setaffinity(0, sizeof one, &one), 0);
  weftComm_t comms[3];
  weftResult_t res = weftCommInitAll(comms, 3, nullptr);
  sched_setaffinity(0, sizeof saved, &saved);
  ASSERT_EQ(res, weftSuccess) << weftGetLastError(nullptr);
  wait_begin(&w, 1000000000ull, nullptr, nullptr, 0, 0, "test");
  EXPECT_EQ(w.spin_mask, 0u) << "3 ranks on 1 CPU: the waits should yield at once";
  group_allreduce(comms, 3, 777, test_seed());
  for (auto c : comms) EXPECT_EQ(weftCommDestroy(c), weftSuccess);
  wait_begin(&w, 1000000000ull, nullptr, nullptr, 0, 0, "test");
  EXPECT_EQ(w.spin_mask, 255u) << "still oversubscribed after every comm is destroyed";
}

// Each rank's own thread calls the collective: the first calls after a
// parameter reset parse WEFT_ALGO and load parameters on every thread at once.
// Each WEFT_ALGO is set in a process of its own before any thread starts
// (this process's group workers could be reading the environment).
TEST(Threads, TunerRulesFromConcurrentThreads) {
  const int n = 4;
  for (const char *spec : {"ring", "tree", "^rd", "ring,rd", ""}) {
    weft_test::RunOptions opts;
    opts.env = {{"WEFT_ALGO", spec}};
    auto status = weft_test::run_ranks(1, [&](const weft_test::RankCtx &ctx) {
      weftComm_t comms[n];
      FAIL_IF(weftCommInitAll(comms, n, nullptr) != weftSuccess, "init: %s",
              weftGetLastError(nullptr));
      weft_params_reset();  // no thread runs here: the threads below start after it
      std::vector<std::vector<uint8_t>> inputs, outs(n);
      const size_t count = 4099;
      for (int r = 0; r < n; r++) {
        inputs.push_back(make_input(weftFloat32, weftSum, count, test_seed() + r, r));
        outs[r].assign(count * 4, 0xa5);
      }
      std::vector<std::thread> ranks;
      std::vector<weftResult_t> res(n, weftInternalError);
      for (int r = 0; r < n; r++)
        ranks.emplace_back([&, r] {
          for (int i = 0; i < 3 && (i == 0 || res[r] == weftSuccess); i++)
            res[r] = weftAllReduce(inputs[r].data(), outs[r].data(), count, weftFloat32, weftSum,
                                   comms[r], nullptr);
        });
      for (auto &t : ranks) t.join();
      for (int r = 0; r < n; r++) {
        FAIL_IF(res[r] != weftSuccess, "WEFT_ALGO=%s rank %d: %s", spec, r,
                weftGetErrorString(res[r]));
        std::string why;
        FAIL_IF(!check_reduction(weftFloat32, weftSum, inputs, outs[r].data(), count, &why),
                "WEFT_ALGO=%s rank %d: %s", spec, r, why.c_str());
      }
      for (auto c : comms) FAIL_IF(weftCommDestroy(c) != weftSuccess, "destroy");
      return 0;
    }, opts);
    EXPECT_EQ(status[0], 0) << "WEFT_ALGO=" << spec;
  }
}

// A thread's calls of the same arguments again skip the checks and the
// tuner (enqueue.c's memo). What they depend on still counts: a settings
// reset changes the pick of the next such call, a freed comm forgets it,
// and a call after a refusal is checked again. Every call's result is
// checked against the reduction of random inputs, into a poisoned output.
TEST(Threads, RepeatedCallsFollowSettingsAndComms) {
  weft_test::RunOptions opts;
  opts.env = {{"WEFT_ALGO", ""}};
  auto status = weft_test::run_ranks(2, [&](const weft_test::RankCtx &ctx) {
    weftComm_t comm;
    FAIL_IF(weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess, "init: %s",
            weftGetLastError(nullptr));
    const uint64_t seed = test_seed() + 17;
    printf("seed %llu\n", (unsigned long long)seed);
    for (const size_t count : {2ul, 5ul}) {
      std::vector<std::vector<uint8_t>> inputs;
      for (int r = 0; r < ctx.nranks; r++)
        inputs.push_back(make_input(weftFloat32, weftSum, count, seed + count, r));
      std::vector<uint8_t> out(count * 4);
      // the algorithm of comm's last call, from its trace
      auto last_algo = [](weftComm_t c) {
        struct trace_call call;
        return trace_latest(((struct weftComm *)c)->trace, &call, 1) == 1 ? call.algo : -1;
      };
      auto calls = [&](weftComm_t c, int times, const char *when) {
        for (int i = 0; i < times; i++) {
          std::fill(out.begin(), out.end(), 0xff);  // NaN
          FAIL_IF(weftAllReduce(inputs[ctx.rank].data(), out.data(), count, weftFloat32,
                                weftSum, c, nullptr) != weftSuccess,
                  "%s: call %d: %s", when, i, weftGetLastError(c));
          std::string why;
          FAIL_IF(!check_reduction(weftFloat32, weftSum, inputs, out.data(), count, &why),
                  "%s: call %d of %zu elements: %s", when, i, count, why.c_str());
        }
        return 0;
      };
      TRY_RC(calls(comm, 3, "default settings"));
      const int picked = last_algo(comm);
      FAIL_IF(picked == ALGO_RING || picked < 0, "%zu elements took algorithm %d", count, picked);
      setenv("WEFT_ALGO", "ring", 1);
      weft_params_reset();
      TRY_RC(calls(comm, 3, "WEFT_ALGO=ring"));
      FAIL_IF(last_algo(comm) != ALGO_RING, "after WEFT_ALGO=ring and a reset: algorithm %d",
              last_algo(comm));
      setenv("WEFT_ALGO", "", 1);
      weft_params_reset();
      TRY_RC(calls(comm, 2, "settings back"));
      FAIL_IF(last_algo(comm) != picked, "settings back: algorithm %d, not %d",
              last_algo(comm), picked);
      // a refused call between two of the same arguments
      FAIL_IF(weftAllReduce(inputs[ctx.rank].data(), out.data(), count, (weftDataType_t)99,
                            weftSum, comm, nullptr) != weftInvalidArgument,
              "a bad datatype was not refused");
      TRY_RC(calls(comm, 2, "after a refusal"));
    }
    // a comm freed: the memo's comm may come back as another's address
    weftComm_t other;
    FAIL_IF(weftCommSplit(comm, 0, ctx.rank, &other, nullptr) != weftSuccess, "split: %s",
            weftGetLastError(comm));
    const uint64_t epoch = weft_memo_epoch_get();
    FAIL_IF(weftCommDestroy(comm) != weftSuccess, "destroy");
    FAIL_IF(weft_memo_epoch_get() == epoch, "a freed comm left the memo's epoch as it was");
    std::vector<float> in(2, (float)ctx.rank + 1.0f), res(2, -1.0f);
    for (int i = 0; i < 3; i++) {
      FAIL_IF(weftAllReduce(in.data(), res.data(), 2, weftFloat32, weftSum, other, nullptr) !=
                  weftSuccess, "on the split comm: %s", weftGetLastError(other));
      FAIL_IF(res[0] != 3.0f || res[1] != 3.0f, "on the split comm: %g %g", res[0], res[1]);
    }
    FAIL_IF(weftCommDestroy(other) != weftSuccess, "destroy");
    return 0;
  }, opts);
  EXPECT_EQ(status[0], 0);
  EXPECT_EQ(status[1], 0);
}

// One thread reads the async error while the thread in a collective records
// it: the reader sees weftSuccess, then the failure, and nothing else.
TEST(Threads, AsyncErrorSeenFromAnotherThread) {
  weftComm_t comms[2];
  ASSERT_EQ(weftCommInitAll(comms, 2, nullptr), weftSuccess) << weftGetLastError(nullptr);
  // one call together first: connections that algorithms make on first use exist
  group_allreduce(comms, 2, 1 << 16, test_seed());
  std::vector<float> buf(1 << 16, 1.0f);
  weftResult_t call_res = weftSuccess;
  std::thread rank0([&] {
    call_res = weftAllReduce(buf.data(), buf.data(), buf.size(), weftFloat32, weftSum, comms[0],
                             nullptr);
  });
  weftResult_t seen = weftSuccess;
  double t0 = now_s(), aborted_at = 0;
  while (seen == weftSuccess && now_s() - t0 < 20) {
    ASSERT_EQ(weftCommGetAsyncError(comms[0], &seen), weftSuccess);
    if (aborted_at == 0 && now_s() - t0 > 0.2) {
      // rank 1 never joins the call: it goes away, and rank 0's call fails
      ASSERT_EQ(weftCommAbort(comms[1]), weftSuccess);
      aborted_at = now_s();
    }
  }
  rank0.join();
  EXPECT_EQ(call_res, weftRemoteError) << weftGetErrorString(call_res);
  EXPECT_EQ(seen, weftRemoteError) << "the reader saw " << weftGetErrorString(seen);
  EXPECT_LT(now_s() - aborted_at, 5.0) << "the failure took too long to reach the reader";
  weftResult_t again = weftSuccess;
  EXPECT_EQ(weftCommGetAsyncError(comms[0], &again), weftSuccess);
  EXPECT_EQ(again, weftRemoteError) << "the first error stays";
  EXPECT_EQ(weftCommAbort(comms[0]), weftSuccess);
}

// weftGetLastError(comm) while another thread's calls on comm fail (a
// stream's worker, or a watchdog asking while the caller fails): each text
// read is one failure's whole text, never a mix of two, and a text once
// returned stays as it was while later failures rewrite the comm's.
TEST(Threads, LastErrorReadWhileAnotherThreadFails) {
  weftComm_t comm;
  ASSERT_EQ(weftCommInitAll(&comm, 1, nullptr), weftSuccess) << weftGetLastError(nullptr);
  int count = 0;
  ASSERT_EQ(weftCommCount(comm, nullptr), weftInvalidArgument);
  const std::string short_text = weftGetLastError(comm);
  ASSERT_EQ(weftCommSetTimeout(comm, -1000000000), weftInvalidArgument);
  const std::string long_text = weftGetLastError(comm);
  ASSERT_NE(short_text, long_text);
  ASSERT_NE(long_text.find(short_text.substr(0, 3)), 0u) << "the texts must differ from the start";
  std::atomic<bool> stop{false};
  std::thread failing([&] {
    while (!stop.load()) {
      weftCommCount(comm, nullptr);
      weftCommSetTimeout(comm, -1000000000);
    }
  });
  long torn = 0, reads = 0, changed = 0;
  std::string example;
  const double t0 = now_s();
  while (now_s() - t0 < 1.0) {
    const char *text = weftGetLastError(comm);
    const std::string first = text;
    reads++;
    if (first != short_text && first != long_text) {
      torn++;
      example = first;
    }
    sched_yield();
    if (std::string(text) != first) changed++;
  }
  stop = true;
  failing.join();
  EXPECT_EQ(torn, 0) << "of " << reads << " reads, e.g. \"" << example << "\"";
  EXPECT_EQ(changed, 0) << "of " << reads << " texts changed after they were returned";
  EXPECT_EQ(weftCommCount(comm, &count), weftSuccess);
  EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
}

// An abort or a revoke from another thread while rank 0 is inside a group's
// end (an all-reduce its peer never joins, then many sends: the end still
// touches the comm after the all-reduce fails) or inside an all-to-all whose
// WEFT_CHECK=1 comparison waits on the bootstrap: the call fails, nothing is
// used after the abort freed it (a crash before), and the revoke returns
// only once the call has (it returned at once, the call waiting for
// WEFT_TIMEOUT). Each case in a process of its own, with its settings.
TEST(Threads, AbortOrRevokeWhileInAGroupsEnd) {
  struct Case {
    const char *what;
    bool check, revoke, alltoall;
  } cases[] = {
      {"abort, group of an all-reduce and 20000 sends", false, false, false},
      {"abort, all-to-all under WEFT_CHECK=1", true, false, true},
      {"revoke, all-to-all under WEFT_CHECK=1", true, true, true},
  };
  for (const Case &c : cases) {
    weft_test::RunOptions opts;
    opts.env = {{"WEFT_TIMEOUT", "30"}};
    if (c.check) opts.env.push_back({"WEFT_CHECK", "1"});
    opts.allow_warnings = true;
    auto status = weft_test::run_ranks(1, [&c](const weft_test::RankCtx &ctx) {
      for (int round = 0; round < 3; round++) {
        weftComm_t comms[2];
        if (weftCommInitAll(comms, 2, nullptr) != weftSuccess)
          return weft_test::rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
        weftResult_t got = weftSuccess;
        double returned = 0;
        std::thread rank0([&] {
          static float x[16], y[16], s[1];
          if (c.alltoall) {
            got = weftAlltoAll(x, y, 1, weftFloat32, comms[0], nullptr);
          } else {
            weftGroupStart();
            weftAllReduce(x, y, 16, weftFloat32, weftSum, comms[0], nullptr);
            for (int i = 0; i < 20000; i++) weftSend(s, 1, weftFloat32, 1, comms[0], nullptr);
            got = weftGroupEnd();
          }
          returned = now_s();
        });
        usleep(200000);
        const double t0 = now_s();
        const weftResult_t res = c.revoke ? weftCommRevoke(comms[0], 0) : weftCommAbort(comms[0]);
        const double done = now_s();
        rank0.join();
        if (res != weftSuccess) return weft_test::rank_fail(ctx, "%s: it failed", c.what);
        if (got == weftSuccess) return weft_test::rank_fail(ctx, "%s: the call succeeded", c.what);
        if (returned - t0 > 5)
          return weft_test::rank_fail(ctx, "%s: the call returned after %.1f s", c.what,
                                      returned - t0);
        // the call's thread reads its clock after it left the library, which
        // may be after the revoke's thread read its own: 0.1 s of slack
        // (without the wait the call returned at its timeout, 30 s later)
        if (c.revoke && returned > done + 0.1)
          return weft_test::rank_fail(ctx, "%s: the revoke returned %.3f s before the call did",
                                      c.what, returned - done);
        if (c.revoke) weftCommDestroy(comms[0]);
        weftCommAbort(comms[1]);
      }
      return 0;
    }, opts);
    EXPECT_EQ(status[0], 0) << c.what;
  }
}

// A group over two comms, an abort of one from another thread: it waits for
// that comm's ops only, not for the other comm's (the abort of A waited until
// B's all-reduce ended, 3 s later, or for WEFT_TIMEOUT where B's peer never
// came).
TEST(Threads, AbortOfOneCommOfAGroupWaitsForItsOwnOps) {
  weft_test::RunOptions opts;
  opts.env = {{"WEFT_TIMEOUT", "30"}};
  opts.allow_warnings = true;
  auto status = weft_test::run_ranks(1, [](const weft_test::RankCtx &ctx) {
    weftComm_t a[2], b[2];
    if (weftCommInitAll(a, 2, nullptr) != weftSuccess || weftCommInitAll(b, 2, nullptr) != weftSuccess)
      return weft_test::rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
    static float x[16], y[16], u[16], v[16];
    weftResult_t got = weftSuccess;
    std::thread rank0([&] {  // a[1] never joins; b[1] joins after 3 s
      weftGroupStart();
      weftAllReduce(x, y, 16, weftFloat32, weftSum, a[0], nullptr);
      weftAllReduce(x, y, 16, weftFloat32, weftSum, b[0], nullptr);
      got = weftGroupEnd();
    });
    std::thread late([&] {
      usleep(3000000);
      weftAllReduce(u, v, 16, weftFloat32, weftSum, b[1], nullptr);
    });
    usleep(500000);
    const double t0 = now_s();
    weftCommAbort(a[0]);
    const double took = now_s() - t0;
    rank0.join();
    late.join();
    weftCommAbort(a[1]);
    weftCommDestroy(b[0]);
    weftCommDestroy(b[1]);
    if (took > 1.5) return weft_test::rank_fail(ctx, "the abort of A took %.1f s", took);
    if (got == weftSuccess) return weft_test::rank_fail(ctx, "the group succeeded");
    return 0;
  }, opts);
  EXPECT_EQ(status[0], 0);
}

}  // namespace
