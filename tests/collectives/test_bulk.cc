// Bulk collectives (collectives/algo/bulk.c) over UCX's TCP, every rank on a
// "host" of its own: every datatype x op of all-reduce and reduce-scatter and
// every datatype of all-gather, in place and out of place, on 2 to 4 ranks
// with chunks small enough that each call cycles its window many times (one
// case with 4 KiB slots, so that its 64 KiB chunks go by rendezvous from
// staged copies); the tuner's choice; another communicator's slots moving
// while a bulk call waits; failures in the middle of a transfer (a peer
// killed, a peer silent past WEFT_TIMEOUT, an abort from another thread),
// each an error within the timeout, never a hang; and refused calls whose
// buffers are unmapped while their peers still hold what was sent. Skipped
// in builds without UCX.
#include <gtest/gtest.h>

#include <pthread.h>
#include <sys/mman.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "coll_ref.h"
#include "harness.h"
#include "weft_build_config.h"
extern "C" {
#include "collectives/algo/bulk.h"
#include "collectives/core/comm.h"
#include "collectives/api/config.h"
#include "collectives/core/params.h"
}

using namespace weft_test;

namespace {

#define SKIP_WITHOUT_UCX() \
  if (!WEFT_HAVE_UCX) GTEST_SKIP() << "weft was built without UCX (libucx-dev)"

// Only UCX connects ranks on different hosts, and no wait watches a peer's
// pid: news of a failure comes through UCX alone, as between hosts.
std::vector<std::pair<std::string, std::string>> ucx_env(int timeout_s) {
  return {{"WEFT_TRANSPORT", "ucx"}, {"UCX_TLS", "tcp"}, {"WEFT_TIMEOUT", std::to_string(timeout_s)}};
}

uint64_t bulk_calls(weftComm_t comm) { return bulk_comm_calls(reinterpret_cast<weftComm *>(comm)); }

int init(const RankCtx &ctx, weftComm_t *comm) {
  if (weftCommInitRank(comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
    return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
  return 0;
}

struct BulkCase {
  int nranks;
  const char *chunk;   // WEFT_BULK_CHUNK_NBYTES
  const char *window;  // WEFT_BULK_WINDOW
  const char *slot;    // WEFT_SLOT_BYTES (the eager size: larger sends are staged), or null
};

class Bulk : public testing::TestWithParam<BulkCase> {};

// Every datatype x op (all-reduce, reduce-scatter) and datatype (all-gather),
// in place and out of place; each case's count drawn from {1, 1009, 70001}
// and its buffers from weftMemAllocHost or malloc (seeded).
TEST_P(Bulk, EveryCollectiveTypeOp) {
  SKIP_WITHOUT_UCX();
  const BulkCase bc = GetParam();
  const uint64_t seed = test_seed() + bc.nranks;
  RunOptions opts;
  opts.host_of = one_host_per_rank("bulk-test-host");
  opts.timeout_s = 600;
  opts.env = ucx_env(60);
  opts.env.push_back({"WEFT_ALGO", "bulk"});
  opts.env.push_back({"WEFT_BULK_CHUNK_NBYTES", bc.chunk});
  opts.env.push_back({"WEFT_BULK_WINDOW", bc.window});
  if (bc.slot != nullptr) opts.env.push_back({"WEFT_SLOT_BYTES", bc.slot});
  auto status = run_ranks(bc.nranks, [&](const RankCtx &ctx) {
    weftComm_t comm;
    if (int rc = init(ctx, &comm)) return rc;
    Rng rng(seed);
    const size_t counts[] = {1, 1009, 70001};
    int rc = 0, ncalls = 0;
    for (int t = 0; t < weftNumTypes && rc == 0; t++)
      for (int ip = 0; ip < 2 && rc == 0; ip++) {
        auto ty = static_cast<weftDataType_t>(t);
        for (int op = -1; op < weftNumOps && rc == 0; op++) {
          const Coll c = op < 0 ? kAllGather : op % 2 == ip ? kAllReduce : kReduceScatter;
          const auto o = static_cast<weftRedOp_t>(op < 0 ? 0 : op);
          const size_t count = counts[rng.next() % 3];
          const bool ws = rng.next() % 2, wr = rng.next() % 2;
          rc = check_coll(ctx, comm, c, ty, o, count, ip, ws, wr, rng.next());
          ncalls++;
        }
      }
    if (rc == 0 && bulk_calls(comm) != (uint64_t)ncalls)
      rc = rank_fail(ctx, "%llu of %d calls ran bulk", (unsigned long long)bulk_calls(comm),
                     ncalls);
    weftCommDestroy(comm);
    return rc;
  }, opts);
  for (int r = 0; r < bc.nranks; r++) EXPECT_EQ(status[r], 0) << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(Cases, Bulk,
                         testing::Values(BulkCase{2, "4096", "3", nullptr},
                                         BulkCase{3, "8192", "2", nullptr},
                                         BulkCase{4, "4096", "5", nullptr},
                                         BulkCase{2, "256K", "8", nullptr},
                                         BulkCase{3, "64K", "1", "4096"}),
                         [](const testing::TestParamInfo<BulkCase> &i) {
                           return "ranks" + std::to_string(i.param.nranks) + "_chunk" +
                                  i.param.chunk + "_window" + i.param.window +
                                  (i.param.slot ? std::string("_slot") + i.param.slot : "");
                         });

// Every reduction op of every type on 2 ranks (the single-exchange all-reduce)
// and 3, large enough for many default-sized chunks in flight.
TEST(BulkLarge, AllReduceManyDefaultChunks) {
  SKIP_WITHOUT_UCX();
  const uint64_t seed = test_seed();
  for (int nranks : {2, 3}) {
    RunOptions opts;
    opts.host_of = one_host_per_rank("bulk-test-host");
    opts.timeout_s = 300;
    opts.env = ucx_env(60);
    opts.env.push_back({"WEFT_ALGO", "bulk"});
    auto status = run_ranks(nranks, [&](const RankCtx &ctx) {
      weftComm_t comm;
      if (int rc = init(ctx, &comm)) return rc;
      int rc = check_coll(ctx, comm, kAllReduce, weftFloat32, weftSum, (3u << 20) + 7, false,
                          true, false, seed);
      if (rc == 0)
        rc = check_coll(ctx, comm, kAllReduce, weftBfloat16, weftAvg, (2u << 20) + 1, true,
                        false, false, seed + 1);
      if (rc == 0)
        rc = check_coll(ctx, comm, kReduceScatter, weftFloat64, weftMax, (1u << 19) + 3, false,
                        true, true, seed + 2);
      weftCommDestroy(comm);
      return rc;
    }, opts);
    for (int r = 0; r < nranks; r++) EXPECT_EQ(status[r], 0) << nranks << " ranks, rank " << r;
  }
}

// Without WEFT_ALGO the tuner runs every all-reduce and all-gather bulk over
// UCX (from WEFT_BULK_MIN_NBYTES, 0 by default), and none over shared memory.
TEST(BulkTuner, OverUcxFromTheMinimum) {
  SKIP_WITHOUT_UCX();
  const uint64_t seed = test_seed();
  struct {
    bool ucx;
    const char *min;
    uint64_t want;  // bulk calls of the two below
  } cases[] = {{true, "0", 2}, {true, "64K", 1}, {false, "0", 0}};
  for (const auto &c : cases) {
    RunOptions opts;
    opts.timeout_s = 120;
    if (c.ucx) opts.env = ucx_env(60);
    if (c.ucx) opts.host_of = one_host_per_rank("bulk-test-host");
    opts.env.push_back({"WEFT_ALGO", ""});  // "": unset
    opts.env.push_back({"WEFT_BULK_MIN_NBYTES", c.min});
    auto status = run_ranks(2, [&](const RankCtx &ctx) {
      weftComm_t comm;
      if (c.ucx) {
        if (int rc = init(ctx, &comm)) return rc;
      } else if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess) {
        return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
      }
      int rc = check_coll(ctx, comm, kAllReduce, weftFloat32, weftSum, 1000, false, false, false,
                          seed);
      if (rc == 0)
        rc = check_coll(ctx, comm, kAllGather, weftFloat32, weftSum, 1 << 18, false, false,
                        false, seed + 1);
      if (rc == 0 && bulk_calls(comm) != c.want)
        rc = rank_fail(ctx, "%llu bulk calls, want %llu", (unsigned long long)bulk_calls(comm),
                       (unsigned long long)c.want);
      weftCommDestroy(comm);
      return rc;
    }, opts);
    const std::string what = std::string(c.ucx ? "ucx" : "shm") + ", minimum " + c.min;
    EXPECT_EQ(status[0], 0) << what;
    EXPECT_EQ(status[1], 0) << what;
  }
}

// A bulk all-reduce of `count` floats on another thread, timed.
struct Call {
  weftComm_t comm;
  size_t count;
  int repeat;  // calls back to back, until one fails
  weftResult_t res;
  double seconds;  // the failing (or last) call's
};

void *allreduce_thread(void *arg) {
  auto *c = static_cast<Call *>(arg);
  std::vector<float> buf(c->count, 1.0f);
  for (int i = 0; i < c->repeat; i++) {
    double t0 = now_s();
    c->res = weftAllReduce(buf.data(), buf.data(), buf.size(), weftFloat32, weftSum, c->comm,
                           nullptr);
    c->seconds = now_s() - t0;
    if (c->res != weftSuccess) break;
  }
  return nullptr;
}

// A bulk call waiting on a peer keeps another communicator's slots moving: rank
// 0 starts a bulk all-reduce on one thread and a ring all-gather (slots, over
// UCX) on a second communicator from another; rank 1 joins the all-reduce only
// once the all-gather is done. The all-gather needs rank 0's slots sent while
// its bulk call waits, so both finish only if that call (or the proxy) moves
// every connection, well inside WEFT_TIMEOUT.
TEST(BulkBeside, OtherCommunicatorsSlotsMoveDuringACall) {
  SKIP_WITHOUT_UCX();
  const int timeout_s = 20;
  const uint64_t seed = test_seed();
  RunOptions opts;
  opts.host_of = one_host_per_rank("bulk-test-host");
  opts.timeout_s = 120;
  opts.env = ucx_env(timeout_s);
  opts.env.push_back({"WEFT_ALGO", "allreduce:bulk;allgather:ring"});
  auto status = run_ranks(2, [&](const RankCtx &ctx) {
    weftComm_t comm, other;
    if (int rc = init(ctx, &comm)) return rc;
    if (weftCommSplit(comm, 0, ctx.rank, &other, nullptr) != weftSuccess)
      return rank_fail(ctx, "split: %s", weftGetLastError(comm));
    Call call{comm, 1u << 20, 1, weftSuccess, 0};
    pthread_t tid;
    if (ctx.rank == 0) pthread_create(&tid, nullptr, allreduce_thread, &call);
    double t0 = now_s();
    int rc = check_coll(ctx, other, kAllGather, weftFloat32, weftSum, 1 << 16, false, false,
                        false, seed);
    const double gather_s = now_s() - t0;
    if (ctx.rank == 0) pthread_join(tid, nullptr);
    else allreduce_thread(&call);
    if (rc == 0 && call.res != weftSuccess)
      rc = rank_fail(ctx, "all-reduce: %s", weftGetLastError(comm));
    if (rc == 0 && bulk_calls(comm) != 1)
      rc = rank_fail(ctx, "%llu bulk calls, want 1", (unsigned long long)bulk_calls(comm));
    if (rc == 0 && bulk_calls(other) != 0)
      rc = rank_fail(ctx, "the all-gather ran bulk");
    if (rc == 0 && gather_s > timeout_s / 4.0)
      rc = rank_fail(ctx, "the all-gather took %.1f s", gather_s);
    weftCommDestroy(other);
    weftCommDestroy(comm);
    return rc;
  }, opts);
  EXPECT_EQ(status[0], 0);
  EXPECT_EQ(status[1], 0);
}

// A rank SIGKILLed while large all-reduces stream: every other rank gets
// weftRemoteError naming a rank well inside WEFT_TIMEOUT.
TEST(BulkFailure, RankKilledMidTransfer) {
  SKIP_WITHOUT_UCX();
  const int timeout_s = 30;
  for (int nranks : {2, 3}) {
    RunOptions opts;
    opts.host_of = one_host_per_rank("bulk-test-host");
    opts.timeout_s = 120;
    opts.allow_warnings = true;
    opts.env = ucx_env(timeout_s);
    opts.env.push_back({"WEFT_ALGO", "bulk"});
    auto status = run_ranks(nranks, [&](const RankCtx &ctx) {
      weftComm_t comm;
      if (int rc = init(ctx, &comm)) return rc;
      Call call{comm, 4u << 20, 1000000, weftSuccess, 0};
      pthread_t tid;
      pthread_create(&tid, nullptr, allreduce_thread, &call);
      if (ctx.rank == ctx.nranks - 1) {
        usleep(500000);  // well into the stream of calls
        raise(SIGKILL);
      }
      pthread_join(tid, nullptr);
      std::string msg = weftGetLastError(comm);
      if (call.res != weftRemoteError)
        return rank_fail(ctx, "got %s, want weftRemoteError: %s", weftGetErrorString(call.res),
                         msg.c_str());
      if (call.seconds > timeout_s / 3.0)
        return rank_fail(ctx, "error took %.1f s, WEFT_TIMEOUT is %d s: %s", call.seconds,
                         timeout_s, msg.c_str());
      if (msg.find("rank ") == std::string::npos)
        return rank_fail(ctx, "message does not name a peer: %s", msg.c_str());
      printf("rank %d: error after %.3f s: %s\n", ctx.rank, call.seconds, msg.c_str());
      weftCommAbort(comm);
      return 0;
    }, opts);
    for (int r = 0; r < nranks - 1; r++) EXPECT_EQ(status[r], 0) << nranks << " ranks, rank " << r;
    EXPECT_EQ(status[nranks - 1], 128 + SIGKILL);
  }
}

// Two ranks over UCX running bulk, with WEFT_TIMEOUT timeout_s.
RunOptions silent_peer_opts(int timeout_s) {
  RunOptions opts;
  opts.host_of = one_host_per_rank("bulk-test-host");
  opts.timeout_s = 60;
  opts.allow_warnings = true;
  opts.env = ucx_env(timeout_s);
  opts.env.push_back({"WEFT_ALGO", "bulk"});
  return opts;
}

// One call together (the endpoints are up); then rank 1 stays alive but
// silent for silent_s and aborts. Returns -1 on rank 0 (go on), else the
// rank's status.
int call_once_then_silent(const RankCtx &ctx, weftComm_t comm, int silent_s) {
  Call first{comm, 1u << 20, 1, weftSuccess, 0};
  allreduce_thread(&first);
  if (first.res != weftSuccess) return rank_fail(ctx, "first call: %s", weftGetLastError(comm));
  if (ctx.rank == 0) return -1;
  sleep(silent_s);
  weftCommAbort(comm);
  return 0;
}

// A live peer that stops calling: the waiting rank's transfers are given up
// after WEFT_TIMEOUT with a timeout error (and its buffer freed as the call
// returns).
TEST(BulkFailure, SilentPeerTimesOut) {
  SKIP_WITHOUT_UCX();
  auto status = run_ranks(2, [](const RankCtx &ctx) {
    weftComm_t comm;
    if (int rc = init(ctx, &comm)) return rc;
    if (int rc = call_once_then_silent(ctx, comm, 5); rc >= 0) return rc;
    Call call{comm, 1u << 20, 1, weftSuccess, 0};
    allreduce_thread(&call);
    std::string msg = weftGetLastError(comm);
    if (call.res != weftRemoteError || msg.find("timed out") == std::string::npos)
      return rank_fail(ctx, "got %s: %s", weftGetErrorString(call.res), msg.c_str());
    if (call.seconds < 1.5 || call.seconds > 4.5)
      return rank_fail(ctx, "timeout after %.2f s, want ~2", call.seconds);
    weftCommAbort(comm);
    return 0;
  }, silent_peer_opts(2));
  EXPECT_EQ(status[0], 0);
  EXPECT_EQ(status[1], 0);
}

// weftCommAbort from another thread ends a bulk call waiting on a silent
// peer at once.
TEST(BulkFailure, AbortFromAnotherThread) {
  SKIP_WITHOUT_UCX();
  auto status = run_ranks(2, [](const RankCtx &ctx) {
    weftComm_t comm;
    if (int rc = init(ctx, &comm)) return rc;
    if (int rc = call_once_then_silent(ctx, comm, 3); rc >= 0) return rc;
    Call call{comm, 1u << 20, 1, weftSuccess, 0};
    pthread_t tid;
    pthread_create(&tid, nullptr, allreduce_thread, &call);
    usleep(300000);  // the call now waits for rank 1
    double t0 = now_s();
    if (weftCommAbort(comm) != weftSuccess) return rank_fail(ctx, "abort failed");
    pthread_join(tid, nullptr);
    if (call.res != weftRemoteError)
      return rank_fail(ctx, "aborted call got %s", weftGetErrorString(call.res));
    if (now_s() - t0 > 3) return rank_fail(ctx, "abort took %.2f s", now_s() - t0);
    return 0;
  }, silent_peer_opts(30));
  EXPECT_EQ(status[0], 0);
  EXPECT_EQ(status[1], 0);
}

// Every rank of a process-shared barrier arrives (count is zeroed before the
// ranks fork; each use takes its own generation).
bool shared_barrier(int *count, int nranks, int generation, double timeout_s) {
  __atomic_add_fetch(count, 1, __ATOMIC_SEQ_CST);
  const double until = now_s() + timeout_s;
  while (__atomic_load_n(count, __ATOMIC_SEQ_CST) < nranks * generation) {
    if (now_s() > until) return false;
    usleep(1000);
  }
  return true;
}

// A refused bulk call over UCX's shared-memory transports, whose rendezvous
// the receiver's process reads from the sender's memory (cross-memory
// attach): one rank's count differs, so the rank before it, whose own check
// passed, sends it chunks it never asks for. Every rank then unmaps its
// buffers and only then destroys its communicator; no rank's process may
// end inside UCX (a read of an unmapped buffer ends the reader), and every
// rank fails the call. Buffers of 1 MiB and more, far above the eager size.
TEST(BulkRefused, BuffersFreedBeforeThePeersLetGo) {
  SKIP_WITHOUT_UCX();
  int *arrived = (int *)mmap(nullptr, sizeof(int), PROT_READ | PROT_WRITE,
                             MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(arrived, MAP_FAILED);
  const struct {
    Coll coll;
    int nranks;
  } cases[] = {{kAllReduce, 3}, {kAllGather, 3}, {kReduceScatter, 3}, {kAllReduce, 4},
               {kAllGather, 4}};
  for (const auto &c : cases) {
    *arrived = 0;
    RunOptions opts;
    opts.timeout_s = 60;
    opts.allow_warnings = true;  // UCX's own, at destroy, on what the call left
    opts.env = {{"WEFT_TRANSPORT", "ucx"}, {"UCX_TLS", "posix,sysv,cma,self"},
                {"WEFT_TIMEOUT", "30"},    {"WEFT_ALGO", "bulk"}};
    const char *name = c.coll == kAllReduce ? "all-reduce" : c.coll == kAllGather ? "all-gather"
                                                                                  : "reduce-scatter";
    printf("%s, %d ranks, rank 0's count differs\n", name, c.nranks);
    fflush(stdout);
    auto status = run_ranks(c.nranks, [&](const RankCtx &ctx) {
      weftComm_t comm;
      if (int rc = init(ctx, &comm)) return rc;
      const size_t count = (256u << 10) + (ctx.rank == 0 ? 64 : 0); /* floats */
      const size_t n = (size_t)ctx.nranks;
      const size_t in_nbytes = 4 * (c.coll == kReduceScatter ? count * n : count);
      const size_t out_nbytes = 4 * (c.coll == kAllGather ? count * n : count);
      void *in = mmap(nullptr, in_nbytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                      -1, 0);
      void *out = mmap(nullptr, out_nbytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                       -1, 0);
      FAIL_IF(in == MAP_FAILED || out == MAP_FAILED, "mmap: %m");
      memset(in, 0x3f, in_nbytes);
      weftResult_t res =
          c.coll == kAllReduce
              ? weftAllReduce(in, out, count, weftFloat32, weftSum, comm, nullptr)
          : c.coll == kAllGather ? weftAllGather(in, out, count, weftFloat32, comm, nullptr)
                                 : weftReduceScatter(in, out, count, weftFloat32, weftSum, comm,
                                                     nullptr);
      printf("  rank %d: %s: %s\n", ctx.rank, weftGetErrorString(res), weftGetLastError(comm));
      fflush(stdout);
      munmap(in, in_nbytes);
      munmap(out, out_nbytes);
      FAIL_IF(res == weftSuccess, "a refused call returned success");
      // every buffer is gone before any rank's UCX worker goes (and with it
      // what the call left unanswered); no process ends before they all have
      FAIL_IF(!shared_barrier(arrived, ctx.nranks, 1, 20), "the others never freed their buffers");
      weftCommDestroy(comm);
      FAIL_IF(!shared_barrier(arrived, ctx.nranks, 2, 20), "the others never destroyed theirs");
      return 0;
    }, opts);
    for (int r = 0; r < c.nranks; r++) EXPECT_EQ(status[r], 0) << name << ", rank " << r;
  }
  munmap(arrived, sizeof(int));
}

// Hosts of unequal size: ranks 0 and 1 on one host, 2 (and 4) alone or in
// pairs on others. A rank alone on its host has both its ring hops across
// hosts, so its own connections could move bulk where its neighbours' shared
// memory hops cannot: every rank must take the same path (the comm decides
// from every rank's transports), or the lone rank waits in the bulk path
// while the others run the ring, until the timeout. Each all-reduce, large
// enough for bulk where it runs, gives the sum, well inside WEFT_TIMEOUT,
// and no rank ran a call bulk.
TEST(BulkUneven, HostsOfUnequalSizeTakeOnePath) {
  SKIP_WITHOUT_UCX();
  for (const std::vector<int> &hosts :
       {std::vector<int>{0, 0, 1}, std::vector<int>{0, 0, 1, 1, 2}, std::vector<int>{0, 1, 1}}) {
    const int n = (int)hosts.size();
    RunOptions opts;
    opts.host_of = [&](int rank) { return "bulk-uneven-" + std::to_string(hosts[rank]); };
    opts.timeout_s = 120;
    opts.env = {{"UCX_TLS", "tcp"}, {"WEFT_TIMEOUT", "20"}};  // shm within a host
    auto status = run_ranks(n, [&](const RankCtx &ctx) {
      weftComm_t comm;
      if (int rc = init(ctx, &comm)) return rc;
      for (size_t count : {(size_t)1, (size_t)(1u << 20) + 3}) {
        std::vector<float> x(count, (float)(ctx.rank + 1)), y(count, 0);
        const double t0 = now_s();
        FAIL_IF(weftAllReduce(x.data(), y.data(), count, weftFloat32, weftSum, comm, nullptr) !=
                    weftSuccess,
                "%d ranks, all-reduce of %zu after %.1f s: %s", n, count, now_s() - t0,
                weftGetLastError(comm));
        const float want = (float)(n * (n + 1) / 2);
        for (size_t i = 0; i < count; i++)
          FAIL_IF(y[i] != want, "%d ranks, count %zu: element %zu is %g, not %g", n, count, i,
                  y[i], want);
      }
      FAIL_IF(bulk_calls(comm) != 0, "%d ranks: %llu calls ran bulk on a ring with shared "
              "memory hops", n, (unsigned long long)bulk_calls(comm));
      weftCommDestroy(comm);
      return 0;
    }, opts);
    for (int r = 0; r < n; r++) EXPECT_EQ(status[r], 0) << n << " ranks, rank " << r;
  }
}

}  // namespace
