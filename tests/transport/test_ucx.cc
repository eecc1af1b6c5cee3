// The UCX transport (forced with WEFT_TRANSPORT=ucx, or chosen between hosts):
// all-reduce over UCX's TCP and shared-memory transports against a reference,
// small slots and batches, selection, bad settings, a peer killed mid-stream,
// idle connections kept alive by the heartbeats, and nothing left behind by
// init/destroy cycles. Skipped in builds without UCX.
#include <gtest/gtest.h>

#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "collectives/coll_ref.h"
#include "harness.h"
#include "weft_build_config.h"

extern "C" {
#include "collectives/api/config.h"
#include "collectives/core/params.h"
}

using namespace weft_test;

namespace {

#define SKIP_WITHOUT_UCX() \
  if (!WEFT_HAVE_UCX) GTEST_SKIP() << "weft was built without UCX (libucx-dev)"

const char *const kTcp = "tcp";
const char *const kShm = "posix,sysv,cma,self";

// Makes this rank look like it runs on a host of its own: shm cannot connect
// it and no wait watches a peer's pid, so only UCX carries data and news of
// failures, as between hosts.
struct UcxCase {
  int nranks;
  int slot_nbytes;  // small slots: many slots, batches and flushes per call
  int nslots;
  const char *tls;  // UCX_TLS
  bool own_hosts;   // every rank pretends to be on a host of its own
};

std::string case_name(const testing::TestParamInfo<UcxCase> &info) {
  const UcxCase &c = info.param;
  return "ranks" + std::to_string(c.nranks) + "_slot" + std::to_string(c.slot_nbytes) + "x" +
         std::to_string(c.nslots) + "_" +
         (c.tls == kTcp ? "tcp" : "shm") + (c.own_hosts ? "_hosts" : "");
}

class UcxAllReduce : public testing::TestWithParam<UcxCase> {};

// Every datatype x op x count x placement over UCX.
TEST_P(UcxAllReduce, EveryTypeOpCountPlacement) {
  SKIP_WITHOUT_UCX();
  const UcxCase c = GetParam();
  const uint64_t seed = test_seed();
  RunOptions opts;
  opts.timeout_s = 300;
  opts.env = {{"WEFT_TRANSPORT", "ucx"},
              {"UCX_TLS", c.tls},
              {"WEFT_SLOT_BYTES", std::to_string(c.slot_nbytes)},
              {"WEFT_NSLOTS", std::to_string(c.nslots)},
              {"WEFT_ALGO", "^bulk"},  // the slots (collectives/algo/bulk.c has its own suite)
              {"WEFT_TIMEOUT", "60"}};
  if (c.own_hosts) opts.host_of = one_host_per_rank("ucx-test-host");
  auto status = run_ranks(c.nranks, [&](const RankCtx &ctx) {
    weftComm_t comm;
    if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
      return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
    const size_t counts[] = {0, 1, 1009, 40009};
    int rc = 0;
    for (int t = 0; t < weftNumTypes && rc == 0; t++)
      for (int op = 0; op < weftNumOps && rc == 0; op++)
        for (size_t ci = 0; ci < sizeof counts / sizeof counts[0] && rc == 0; ci++)
          rc = check_allreduce(ctx, comm, (weftDataType_t)t, (weftRedOp_t)op, counts[ci],
                               (t + op + ci) % 2, seed + (uint64_t)(t * 1000 + op * 100 + ci));
    if (weftCommDestroy(comm) != weftSuccess && rc == 0)
      rc = rank_fail(ctx, "destroy: %s", weftGetLastError(nullptr));
    return rc;
  }, opts);
  for (int r = 0; r < c.nranks; r++) EXPECT_EQ(status[r], 0) << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(Ucx, UcxAllReduce,
                         testing::Values(UcxCase{2, 1024, 2, kTcp, true},
                                         UcxCase{3, 4096, 4, kTcp, false},
                                         UcxCase{4, 65536, 8, kTcp, true},
                                         UcxCase{2, 4096, 3, kShm, false},
                                         UcxCase{3, 65536, 4, kShm, true}),
                         case_name);

// Large buffers with the default slots: the path real jobs take.
TEST(UcxAllReduceLarge, DefaultSlotsEightMillionFloats) {
  SKIP_WITHOUT_UCX();
  const uint64_t seed = test_seed();
  for (const char *tls : {kTcp, kShm}) {
    RunOptions opts;
    opts.timeout_s = 240;
    opts.env = {{"WEFT_TRANSPORT", "ucx"}, {"UCX_TLS", tls}, {"WEFT_ALGO", "^bulk"},
                {"WEFT_TIMEOUT", "120"}};
    auto status = run_ranks(2, [&](const RankCtx &ctx) {
      weftComm_t comm;
      if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
        return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
      int rc = check_allreduce(ctx, comm, weftFloat32, weftSum, 8u << 20, false, seed);
      if (rc == 0)
        rc = check_allreduce(ctx, comm, weftFloat32, weftMax, (8u << 20) + 13, true, seed + 1);
      weftCommDestroy(comm);
      return rc;
    }, opts);
    EXPECT_EQ(status[0], 0) << tls;
    EXPECT_EQ(status[1], 0) << tls;
  }
}

// Without WEFT_TRANSPORT, ranks on different hosts get UCX ahead of sockets
// (its proxy thread runs, no socket proxy does); on one host they keep shm.
TEST(UcxSelect, ChosenBetweenHostsBeforeSockets) {
  SKIP_WITHOUT_UCX();
  RunOptions opts;
  opts.env = {{"WEFT_TRANSPORT", ""}, {"UCX_TLS", kTcp}, {"WEFT_TIMEOUT", "30"}};  // "": unset
  for (bool own_hosts : {false, true}) {
    opts.host_of = own_hosts ? one_host_per_rank("ucx-test-host") : nullptr;
    auto status = run_ranks(3, [&](const RankCtx &ctx) {
      weftComm_t comm;
      if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
        return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
      int ucx = count_threads_named("weft-ucx"), sock = count_threads_named("weft-sock");
      int rc = check_allreduce(ctx, comm, weftFloat64, weftSum, 5003, false, 11);
      weftCommDestroy(comm);
      if (rc == 0 && (ucx != (own_hosts ? 1 : 0) || sock != 0))
        rc = rank_fail(ctx, "%d ucx and %d socket proxy threads, want %d and 0", ucx, sock,
                       own_hosts ? 1 : 0);
      return rc;
    }, opts);
    for (int r = 0; r < 3; r++) EXPECT_EQ(status[r], 0) << "own hosts " << own_hosts;
  }
}

// Turned off, misconfigured, or given transports UCX does not have: init
// fails on every rank with a message that says why.
TEST(UcxSelect, DisabledOrMisconfiguredFailsInit) {
  SKIP_WITHOUT_UCX();
  struct Bad {
    std::vector<std::pair<std::string, std::string>> env;
    const char *expect;  // in the message
  };
  const Bad bad[] = {{{{"WEFT_UCX_DISABLE", "1"}}, "no transport"},
                     {{{"UCX_TLS", "no-such-transport"}}, "UCX"},
                     {{{"UCX_TLS", "tcp"}, {"UCX_NET_DEVICES", "no-such-nic"}}, "UCX"}};
  for (const Bad &b : bad) {
    RunOptions opts;
    opts.timeout_s = 60;
    opts.allow_warnings = true;  // the failure is logged on the way out
    opts.env = {{"WEFT_TRANSPORT", "ucx"}, {"WEFT_TIMEOUT", "10"}};
    opts.env.insert(opts.env.end(), b.env.begin(), b.env.end());
    auto status = run_ranks(2, [&](const RankCtx &ctx) {
      weftComm_t comm;
      if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) == weftSuccess)
        return rank_fail(ctx, "init succeeded with %s=%s", b.env[0].first.c_str(),
                         b.env[0].second.c_str());
      std::string msg = weftGetLastError(nullptr);
      if (msg.find(b.expect) == std::string::npos &&
          msg.find("could not set up") == std::string::npos)
        return rank_fail(ctx, "unclear message: %s", msg.c_str());
      return 0;
    }, opts);
    for (int r = 0; r < 2; r++) EXPECT_EQ(status[r], 0) << b.env[0].first << "=" << b.env[0].second;
  }
}

struct Call {
  weftComm_t comm;
  std::vector<float> *buf;
  weftResult_t res;
  double seconds;  // how long the last call took
  int ncalls;
};

void *allreduce_stream(void *p) {
  Call *c = (Call *)p;
  double start = now_s();
  do {
    double t0 = now_s();
    c->res = weftAllReduce(c->buf->data(), c->buf->data(), c->buf->size(), weftFloat32,
                           weftSum, c->comm, nullptr);
    c->seconds = now_s() - t0;
    c->ncalls++;
  } while (c->res == weftSuccess && now_s() - start < 30);
  return nullptr;
}

// Aborts comm after its peer died: 0, or the rank's failure where it took
// longer than 1.5 s.
int abort_at_once(const RankCtx &ctx, weftComm_t comm) {
  const double t0 = now_s();
  weftCommAbort(comm);
  if (now_s() - t0 > 1.5)
    return rank_fail(ctx, "the abort took %.1f s after the peer died", now_s() - t0);
  return 0;
}

// Ranks on their own "hosts" run all-reduces back to back over UCX's TCP
// (and on one host over its shared-memory transports) and one is SIGKILLed:
// every other rank gets weftRemoteError well inside WEFT_TIMEOUT (the
// endpoint fails, then poison messages go around the ring), and its abort
// returns at once (over shared memory, which raises no error for a dead
// peer, the endpoints' flush and close waited 2 s each: 10 s and more).
TEST(UcxFailure, RankKilledMidStream) {
  SKIP_WITHOUT_UCX();
  const int timeout_s = 30;
  for (const char *tls : {kTcp, kShm})
  for (int nranks : {2, 4}) {
    RunOptions opts;
    opts.timeout_s = 90;
    opts.allow_warnings = true;
    opts.env = {{"WEFT_TRANSPORT", "ucx"},
                {"UCX_TLS", tls},
                {"WEFT_TIMEOUT", std::to_string(timeout_s)},
                {"WEFT_ALGO", "^bulk"},
                {"WEFT_SLOT_BYTES", "4096"}};
    if (tls == kTcp) opts.host_of = one_host_per_rank("ucx-test-host");
    auto status = run_ranks(nranks, [&](const RankCtx &ctx) {
      weftComm_t comm;
      if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
        return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
      std::vector<float> buf(1 << 16, 1.0f);
      Call call{comm, &buf, weftSuccess, 0, 0};
      pthread_t tid;
      pthread_create(&tid, nullptr, allreduce_stream, &call);
      if (ctx.rank == ctx.nranks - 1) {
        usleep(300000);  // well into the stream of collectives
        raise(SIGKILL);
      }
      pthread_join(tid, nullptr);
      if (call.res != weftRemoteError)
        return rank_fail(ctx, "got %s, want weftRemoteError", weftGetErrorString(call.res));
      std::string msg = weftGetLastError(comm);
      if (call.seconds > timeout_s / 3.0)
        return rank_fail(ctx, "error took %.1f s, WEFT_TIMEOUT is %d s: %s", call.seconds,
                         timeout_s, msg.c_str());
      if (msg.find("rank ") == std::string::npos)
        return rank_fail(ctx, "message does not name a peer: %s", msg.c_str());
      printf("rank %d: error in call %d after %.3f s: %s\n", ctx.rank, call.ncalls, call.seconds,
             msg.c_str());
      return abort_at_once(ctx, comm);
    }, opts);
    for (int r = 0; r < nranks - 1; r++)
      EXPECT_EQ(status[r], 0) << tls << ", " << nranks << " ranks, rank " << r;
    EXPECT_EQ(status[nranks - 1], 128 + SIGKILL);
  }
}

// Over UCX's shared-memory transports (which raise no error for a dead
// peer), 4 MiB sends and receives around a ring, one rank SIGKILLed: the
// other's call fails naming it, and its abort returns at once (flushing and
// closing each endpoint to the dead peer waited 2 s each: 12 s).
TEST(UcxFailure, AbortAfterAPeerDiedMidSend) {
  SKIP_WITHOUT_UCX();
  RunOptions opts;
  opts.timeout_s = 90;
  opts.allow_warnings = true;
  opts.env = {{"WEFT_TRANSPORT", "ucx"}, {"UCX_TLS", kShm}, {"WEFT_TIMEOUT", "10"}};
  auto status = run_ranks(2, [&](const RankCtx &ctx) {
    weftComm_t comm;
    if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
      return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
    std::vector<float> sb(1 << 20, 1.0f), rb(1 << 20);
    const double start = now_s();
    weftResult_t res = weftSuccess;
    while (res == weftSuccess && now_s() - start < 30) {
      if (ctx.rank == 1 && now_s() - start > 0.3) raise(SIGKILL);
      weftGroupStart();
      weftSend(sb.data(), sb.size(), weftFloat32, 1 - ctx.rank, comm, nullptr);
      weftRecv(rb.data(), rb.size(), weftFloat32, 1 - ctx.rank, comm, nullptr);
      res = weftGroupEnd();
    }
    if (res != weftRemoteError)
      return rank_fail(ctx, "got %s, want weftRemoteError", weftGetErrorString(res));
    return abort_at_once(ctx, comm);
  }, opts);
  EXPECT_EQ(status[0], 0);
  EXPECT_EQ(status[1], 128 + SIGKILL);
}

// Every rank leaves the communicator idle for three times WEFT_TIMEOUT
// between all-reduces: the proxies' heartbeats keep each connection alive
// (silence that long would fail it), and the all-reduces after are correct.
TEST(UcxLiveness, IdleLongerThanTheTimeoutIsNotADeadPeer) {
  SKIP_WITHOUT_UCX();
  const int timeout_s = 1;
  const uint64_t seed = test_seed();
  for (const char *tls : {kTcp, kShm}) {
    for (int nranks : {2, 3}) {
      RunOptions opts;
      opts.timeout_s = 60;
      opts.env = {{"WEFT_TRANSPORT", "ucx"}, {"UCX_TLS", tls},
                  {"WEFT_TIMEOUT", std::to_string(timeout_s)}, {"WEFT_SLOT_BYTES", "4096"}};
      opts.host_of = one_host_per_rank("ucx-idle-host");
      auto status = run_ranks(nranks, [&](const RankCtx &ctx) {
        weftComm_t comm;
        if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
          return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
        for (int round = 0; round < 2; round++) {
          if (check_allreduce(ctx, comm, weftFloat32, weftSum, 5001, false, seed + round) != 0)
            return rank_fail(ctx, "all-reduce %d (after %d s idle)", round,
                             round * 3 * timeout_s);
          if (round == 0) sleep(3 * timeout_s);
        }
        return weftCommDestroy(comm) == weftSuccess ? 0 : rank_fail(ctx, "destroy");
      }, opts);
      for (int r = 0; r < nranks; r++)
        EXPECT_EQ(status[r], 0) << (tls == kTcp ? "tcp" : "shm") << ", " << nranks
                                << " ranks, rank " << r;
    }
  }
}

// Ids for each cycle, published by rank 0 in memory shared by the forked ranks.
struct IdBoard {
  uint32_t ready[64];
  weftUniqueId ids[64];
};

// A send the peer never receives is dropped by destroy: the sender's close
// waits for UCX to take its slots, never for credits the peer will not send.
TEST(UcxLifecycle, DestroyLeavesUnreceivedSendBehind) {
  SKIP_WITHOUT_UCX();
  RunOptions opts;
  opts.timeout_s = 60;
  opts.env = {{"WEFT_TRANSPORT", "ucx"}, {"UCX_TLS", kTcp}, {"WEFT_TIMEOUT", "30"}};
  auto *done = (uint32_t *)mmap(nullptr, sizeof(uint32_t), PROT_READ | PROT_WRITE,
                                MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(done, MAP_FAILED);
  *done = 0;
  opts.host_of = one_host_per_rank("ucx-test-host");
  auto status = run_ranks(2, [&](const RankCtx &ctx) {
    weftComm_t comm;
    if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
      return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
    std::vector<float> buf(1000, 1.5f);
    weftResult_t res = ctx.rank == 0  // connects rank 0 to rank 1
                           ? weftSend(buf.data(), buf.size(), weftFloat32, 1, comm, nullptr)
                           : weftRecv(buf.data(), buf.size(), weftFloat32, 0, comm, nullptr);
    if (res != weftSuccess) return rank_fail(ctx, "first message: %s", weftGetLastError(comm));
    if (ctx.rank == 0 &&
        weftSend(buf.data(), buf.size(), weftFloat32, 1, comm, nullptr) != weftSuccess)
      return rank_fail(ctx, "second send: %s", weftGetLastError(comm));
    if (ctx.rank == 1) {  // stays, without receiving, until rank 0 is through (or 20 s)
      double t0 = now_s();
      while (!__atomic_load_n(done, __ATOMIC_ACQUIRE) && now_s() - t0 < 20) usleep(1000);
      weftCommDestroy(comm);
      return 0;
    }
    double t0 = now_s();
    weftCommDestroy(comm);
    double took = now_s() - t0;
    __atomic_store_n(done, 1u, __ATOMIC_RELEASE);
    if (took > 10) return rank_fail(ctx, "destroy took %.1f s", took);
    return 0;
  }, opts);
  for (int r = 0; r < 2; r++) EXPECT_EQ(status[r], 0) << "rank " << r;
  munmap(done, sizeof *done);
}

// Init / all-reduce / destroy cycles: each destroy stops the proxy thread
// (the worker goes with the last connection), and the next init makes a new one.
TEST(UcxLifecycle, ProxyStopsAfterEveryDestroy) {
  SKIP_WITHOUT_UCX();
  const int ncycles = 6;
  auto *board = (IdBoard *)mmap(nullptr, sizeof(IdBoard), PROT_READ | PROT_WRITE,
                                MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(board, MAP_FAILED);
  memset(board, 0, sizeof *board);
  RunOptions opts;
  opts.timeout_s = 120;
  opts.env = {{"WEFT_TRANSPORT", "ucx"}, {"UCX_TLS", kTcp}, {"WEFT_TIMEOUT", "30"}};
  auto status = run_ranks(3, [&](const RankCtx &ctx) {
    for (int cycle = 0; cycle < ncycles; cycle++) {
      weftUniqueId id = ctx.id;
      if (cycle > 0) {  // a fresh rendezvous per cycle, from rank 0
        if (ctx.rank == 0) {
          if (weftGetUniqueId(&board->ids[cycle]) != weftSuccess)
            return rank_fail(ctx, "unique id: %s", weftGetLastError(nullptr));
          __atomic_store_n(&board->ready[cycle], 1u, __ATOMIC_RELEASE);
        }
        double t0 = now_s();
        while (!__atomic_load_n(&board->ready[cycle], __ATOMIC_ACQUIRE))
          if (now_s() - t0 > 30) return rank_fail(ctx, "no id for cycle %d", cycle);
          else usleep(1000);
        id = board->ids[cycle];
      }
      weftComm_t comm;
      if (weftCommInitRank(&comm, ctx.nranks, id, ctx.rank) != weftSuccess)
        return rank_fail(ctx, "cycle %d init: %s", cycle, weftGetLastError(nullptr));
      int proxies = count_threads_named("weft-ucx");
      int rc = check_allreduce(ctx, comm, weftFloat32, weftSum, 3001, cycle % 2, cycle);
      if (weftCommDestroy(comm) != weftSuccess)
        return rank_fail(ctx, "cycle %d destroy: %s", cycle, weftGetLastError(nullptr));
      if (rc != 0) return rc;
      if (proxies != 1) return rank_fail(ctx, "cycle %d: %d proxy threads, want 1", cycle, proxies);
      int left = count_threads_named("weft-ucx");
      for (int i = 0; i < 100 && left != 0; i++) {
        usleep(10000);
        left = count_threads_named("weft-ucx");
      }
      if (left != 0) return rank_fail(ctx, "cycle %d: %d proxy threads after destroy", cycle, left);
    }
    return 0;
  }, opts);
  for (int r = 0; r < 3; r++) EXPECT_EQ(status[r], 0) << "rank " << r;
  munmap(board, sizeof *board);
}

}  // namespace
