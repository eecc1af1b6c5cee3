// The socket transport (TCP, forced with WEFT_TRANSPORT=socket or chosen
// between hosts): all-reduce over it against a reference, small slots and
// several sockets per connection, an idle proxy that costs no core and is
// kicked by the next operation, a peer killed mid-stream, and no threads or
// file descriptors left behind by many init/destroy cycles.
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

extern "C" {
#include "collectives/api/config.h"
#include "collectives/core/comm.h"
#include "collectives/core/params.h"
#include "transport/proxy.h"
#include "transport/base/wait.h"
}

using namespace weft_test;

namespace {

// Makes this rank look like it runs on a host of its own, so that shm cannot
// connect it and no wait watches a peer's pid: only the sockets carry data
// and news of failures, as between hosts.
// Entries of a /proc directory (threads or fds), less "." and "..".
int count_entries(const char *dir) {
  int n = 0;
  DIR *d = opendir(dir);
  if (d == nullptr) return -1;
  while (dirent *e = readdir(d))
    if (e->d_name[0] != '.') n++;
  closedir(d);
  return n - (strcmp(dir, "/proc/self/fd") == 0);  // the DIR's own fd
}

struct SocketCase {
  int nranks;
  int slot_nbytes;  // small slots: many slots per call, parts of a few lines per socket
  int nslots;
  int nsocks;       // WEFT_SOCKET_NSOCKS
  bool own_hosts;   // every rank pretends to be on a host of its own
};

std::string case_name(const testing::TestParamInfo<SocketCase> &info) {
  const SocketCase &c = info.param;
  return "ranks" + std::to_string(c.nranks) + "_slot" + std::to_string(c.slot_nbytes) + "x" +
         std::to_string(c.nslots) + "_socks" + std::to_string(c.nsocks) +
         (c.own_hosts ? "_hosts" : "");
}

class SocketAllReduce : public testing::TestWithParam<SocketCase> {};

// Every datatype x op x count x placement over the socket transport.
TEST_P(SocketAllReduce, EveryTypeOpCountPlacement) {
  const SocketCase c = GetParam();
  const uint64_t seed = test_seed();
  RunOptions opts;
  opts.timeout_s = 400;
  opts.env = {{"WEFT_TRANSPORT", "socket"},
              {"WEFT_SLOT_BYTES", std::to_string(c.slot_nbytes)},
              {"WEFT_NSLOTS", std::to_string(c.nslots)},
              {"WEFT_SOCKET_NSOCKS", std::to_string(c.nsocks)},
              {"WEFT_TIMEOUT", "60"}};
  if (c.own_hosts) opts.host_of = one_host_per_rank("socket-test-host");
  auto status = run_ranks(c.nranks, [&](const RankCtx &ctx) {
    weftComm_t comm;
    if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
      return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
    const size_t counts[] = {0, 1, 1009, 40009};
    int rc = 0;
    for (int t = 0; t < weftNumTypes && rc == 0; t++)
      for (int op = 0; op < weftNumOps && rc == 0; op++)
        for (size_t ci = 0; ci < sizeof counts / sizeof counts[0] && rc == 0; ci++)
          for (int in_place = 0; in_place < 2 && rc == 0; in_place++)
            rc = check_allreduce(ctx, comm, (weftDataType_t)t, (weftRedOp_t)op, counts[ci], in_place,
                           seed + (uint64_t)(t * 1000 + op * 100 + ci * 10 + in_place));
    if (weftCommDestroy(comm) != weftSuccess && rc == 0)
      rc = rank_fail(ctx, "destroy: %s", weftGetLastError(nullptr));
    return rc;
  }, opts);
  for (int r = 0; r < c.nranks; r++) EXPECT_EQ(status[r], 0) << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(Socket, SocketAllReduce,
                         testing::Values(SocketCase{2, 256, 2, 1, false},
                                         SocketCase{2, 4096, 4, 3, false},
                                         SocketCase{3, 256, 3, 3, false},
                                         SocketCase{3, 4096, 2, 1, true},
                                         SocketCase{5, 256, 4, 1, false},
                                         SocketCase{5, 4096, 3, 3, true}),
                         case_name);

// Large buffers with the default slots and sockets: the path real jobs take.
TEST(SocketAllReduceLarge, DefaultSlotsEightMillionFloats) {
  const uint64_t seed = test_seed();
  RunOptions opts;
  opts.timeout_s = 240;
  opts.env = {{"WEFT_TRANSPORT", "socket"}, {"WEFT_TIMEOUT", "120"}};
  auto status = run_ranks(2, [&](const RankCtx &ctx) {
    weftComm_t comm;
    if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
      return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
    int rc = check_allreduce(ctx, comm, weftFloat32, weftSum, 8u << 20, false, seed);
    if (rc == 0) rc = check_allreduce(ctx, comm, weftFloat32, weftMax, (8u << 20) + 13, true, seed + 1);
    weftCommDestroy(comm);
    return rc;
  }, opts);
  EXPECT_EQ(status[0], 0);
  EXPECT_EQ(status[1], 0);
}

// Without WEFT_TRANSPORT (and with UCX off), ranks on different hosts get the
// socket transport (shm cannot connect them: a proxy thread runs); on one host
// they keep shm.
TEST(SocketSelect, ChosenBetweenHostsOnly) {
  RunOptions opts;
  opts.env = {{"WEFT_TRANSPORT", ""}, {"WEFT_TIMEOUT", "30"},  // "": unset
              {"WEFT_UCX_DISABLE", "1"}};  // UCX comes first between hosts when built in
  for (bool own_hosts : {false, true}) {
    opts.host_of = own_hosts ? one_host_per_rank("socket-test-host") : nullptr;
    auto status = run_ranks(3, [&](const RankCtx &ctx) {
      weftComm_t comm;
      if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
        return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
      int proxies = count_threads_named("weft-sock");
      int rc = check_allreduce(ctx, comm, weftFloat64, weftSum, 5003, false, 11);
      weftCommDestroy(comm);
      if (rc == 0 && proxies != (own_hosts ? 1 : 0))
        rc = rank_fail(ctx, "%d socket proxy threads, want %d", proxies, own_hosts ? 1 : 0);
      return rc;
    }, opts);
    for (int r = 0; r < 3; r++) EXPECT_EQ(status[r], 0) << "own hosts " << own_hosts;
  }
}

// WEFT_SOCKET_DISABLE turns the transport off: forced, nothing connects.
TEST(SocketSelect, DisabledOrMisconfiguredFailsInit) {
  const std::vector<std::pair<std::string, std::string>> bad[] = {
      {{"WEFT_SOCKET_DISABLE", "1"}}, {{"WEFT_SOCKET_NSOCKS", "9"}},
      {{"WEFT_SOCKET_NSOCKS", "0"}}, {{"WEFT_SOCKET_NTHREADS", "0"}}};
  for (const auto &env : bad) {
    RunOptions opts;
    opts.timeout_s = 30;
    opts.env = {{"WEFT_TRANSPORT", "socket"}, {"WEFT_TIMEOUT", "10"}};
    opts.env.insert(opts.env.end(), env.begin(), env.end());
    auto status = run_ranks(2, [&](const RankCtx &ctx) {
      weftComm_t comm;
      if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) == weftSuccess)
        return rank_fail(ctx, "init succeeded with %s=%s", env[0].first.c_str(),
                         env[0].second.c_str());
      std::string msg = weftGetLastError(nullptr);
      if (msg.find("no transport") == std::string::npos &&
          msg.find("could not set up") == std::string::npos &&
          msg.find(env[0].first) == std::string::npos)
        return rank_fail(ctx, "unclear message: %s", msg.c_str());
      return 0;
    }, opts);
    for (int r = 0; r < 2; r++) EXPECT_EQ(status[r], 0) << env[0].first << "=" << env[0].second;
  }
}

double cpu_s() {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// An idle connection costs no core: the proxy sleeps in poll() between
// checks instead of spinning, and still wakes for the next collective.
TEST(SocketProxy, IdleCostsNoCore) {
  RunOptions opts;
  opts.env = {{"WEFT_TRANSPORT", "socket"}, {"WEFT_TIMEOUT", "30"}};
  auto status = run_ranks(2, [&](const RankCtx &ctx) {
    weftComm_t comm;
    if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
      return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
    int rc = check_allreduce(ctx, comm, weftFloat32, weftSum, 100003, false, 5);
    double cpu0 = cpu_s();
    usleep(1000000);
    double idle_cpu = cpu_s() - cpu0;
    if (rc == 0) rc = check_allreduce(ctx, comm, weftInt32, weftMin, 1001, true, 6);
    weftCommDestroy(comm);
    if (rc == 0 && idle_cpu > 0.05)
      rc = rank_fail(ctx, "%.3f s of CPU in 1 s of idling", idle_cpu);
    return rc;
  }, opts);
  EXPECT_EQ(status[0], 0);
  EXPECT_EQ(status[1], 0);
}

// The proxy that sleeps while its connection idles is kicked when the next
// operation begins (WEFT_PROXY_KICK_US): its window starts at that call, so
// the rank's first slots do not wait out the sleep (docs/perf.md has the
// times). With WEFT_PROXY_KICK_US=0 nothing kicks it.
TEST(SocketProxy, AnOperationKicksTheSleepingProxy) {
  for (const char *kick_us : {"100", "0"}) {
    RunOptions opts;
    opts.env = {{"WEFT_TRANSPORT", "socket"}, {"WEFT_TIMEOUT", "30"},
                {"WEFT_PROXY_KICK_US", kick_us}};
    auto status = run_ranks(2, [&](const RankCtx &ctx) {
      weftComm_t comm;
      if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
        return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
      int rc = check_allreduce(ctx, comm, weftFloat32, weftSum, 1001, false, 7);
      const weft_conn &c = comm->channels[0].send;
      if (rc == 0 && (c.transport == nullptr || std::string(c.transport->name) != "socket"))
        rc = rank_fail(ctx, "the ring does not go over a socket");
      // each end of the ring's connections on a proxy: the calls kick them
      if (rc == 0 && !transport_kicks_matter())
        rc = rank_fail(ctx, "%u connections to kick with the ring on sockets",
                       __atomic_load_n(&transport_kickable_conns, __ATOMIC_RELAXED));
      proxy *p = rc == 0 ? static_cast<const proxy_conn *>(c.priv)->proxy : nullptr;
      if (rc == 0) {
        usleep(100000);  // idle: the proxy sleeps
        uint64_t sleeps0 = __atomic_load_n(&p->sleeps, __ATOMIC_RELAXED);
        uint64_t before = clock_ns();
        usleep(20000);
        if (__atomic_load_n(&p->sleeps, __ATOMIC_RELAXED) == sleeps0)
          rc = rank_fail(ctx, "the idle proxy did not sleep");
        if (rc == 0) rc = check_allreduce(ctx, comm, weftInt32, weftMax, 7, true, 8);
        uint64_t until = __atomic_load_n(&p->busy_until_ns, __ATOMIC_RELAXED);
        bool kicked = until >= before + 100000;
        if (rc == 0 && kicked != (std::string(kick_us) != "0"))
          rc = rank_fail(ctx, "WEFT_PROXY_KICK_US=%s: the proxy's window ends %lld us after the "
                         "call began", kick_us, (long long)(until - before) / 1000);
      }
      weftCommDestroy(comm);
      // none left once the comm is gone: calls on shared memory kick nothing
      if (rc == 0 && transport_kicks_matter())
        rc = rank_fail(ctx, "%u connections to kick after the comm was destroyed",
                       __atomic_load_n(&transport_kickable_conns, __ATOMIC_RELAXED));
      return rc;
    }, opts);
    EXPECT_EQ(status[0], 0) << "WEFT_PROXY_KICK_US=" << kick_us;
    EXPECT_EQ(status[1], 0) << "WEFT_PROXY_KICK_US=" << kick_us;
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

// Ranks run all-reduces back to back and one is SIGKILLed. Every other rank
// gets weftRemoteError well inside WEFT_TIMEOUT: on other "hosts" only the
// sockets can tell them (EOF, then poison passed around the ring).
TEST(SocketFailure, RankKilledMidStream) {
  const int timeout_s = 30;
  struct Variant {
    int nranks;
    bool own_hosts;
  };
  for (Variant v : {Variant{2, true}, Variant{4, true}, Variant{3, false}}) {
    RunOptions opts;
    opts.timeout_s = 90;
    opts.env = {{"WEFT_TRANSPORT", "socket"},
                {"WEFT_TIMEOUT", std::to_string(timeout_s)},
                {"WEFT_SLOT_BYTES", "4096"}};
    if (v.own_hosts) opts.host_of = one_host_per_rank("socket-test-host");
    auto status = run_ranks(v.nranks, [&](const RankCtx &ctx) {
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
      if (msg.find("timed out") != std::string::npos || msg.find("rank ") == std::string::npos)
        return rank_fail(ctx, "message does not name a failed peer: %s", msg.c_str());
      weftResult_t async = weftSuccess;
      weftCommGetAsyncError(comm, &async);
      if (async != weftRemoteError) return rank_fail(ctx, "async error not set");
      printf("rank %d: error in call %d after %.3f s: %s\n", ctx.rank, call.ncalls, call.seconds,
             msg.c_str());
      weftCommAbort(comm);
      return 0;
    }, opts);
    for (int r = 0; r < v.nranks - 1; r++)
      EXPECT_EQ(status[r], 0) << v.nranks << " ranks, own hosts " << v.own_hosts << ", rank " << r;
    EXPECT_EQ(status[v.nranks - 1], 128 + SIGKILL);
  }
}

// Waits (up to 5 s) until only the calling thread is left: the bootstrap
// root's detached thread ends shortly after every rank joined.
bool settle_to_one_thread() {
  for (int i = 0; i < 500 && count_entries("/proc/self/task") != 1; i++) usleep(10000);
  return count_entries("/proc/self/task") == 1;
}

// Ids for each cycle, published by rank 0 in memory shared by the forked ranks.
struct IdBoard {
  uint32_t ready[64];
  weftUniqueId ids[64];
};

// Many init / all-reduce / destroy cycles: each destroy stops the proxy
// threads it started, and nothing (thread, fd) is left at the end.
TEST(SocketLifecycle, NoThreadsOrFdsLeftAfterCycles) {
  const int ncycles = 24;
  auto *board = (IdBoard *)mmap(nullptr, sizeof(IdBoard), PROT_READ | PROT_WRITE,
                                MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(board, MAP_FAILED);
  memset(board, 0, sizeof *board);
  RunOptions opts;
  opts.timeout_s = 120;
  opts.env = {{"WEFT_TRANSPORT", "socket"}, {"WEFT_TIMEOUT", "30"},
              {"WEFT_SOCKET_NTHREADS", "2"}, {"WEFT_SOCKET_NSOCKS", "3"}};
  auto status = run_ranks(3, [&](const RankCtx &ctx) {
    int base_fds = -1;
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
      // one send and one receive end: one on each of the two proxy threads
      int proxies = count_threads_named("weft-sock");
      int rc = check_allreduce(ctx, comm, weftFloat32, weftSum, 3001, cycle % 2, cycle);
      if (weftCommDestroy(comm) != weftSuccess)
        return rank_fail(ctx, "cycle %d destroy: %s", cycle, weftGetLastError(nullptr));
      if (rc != 0) return rc;
      if (proxies != 2) return rank_fail(ctx, "cycle %d: %d proxy threads, want 2", cycle, proxies);
      // joined threads leave /proc a moment after pthread_join returns
      int left = count_threads_named("weft-sock");
      for (int i = 0; i < 100 && left != 0; i++) {
        usleep(10000);
        left = count_threads_named("weft-sock");
      }
      if (left != 0) return rank_fail(ctx, "cycle %d: %d proxy threads after destroy", cycle, left);
      if (cycle == 0) {
        if (!settle_to_one_thread())
          return rank_fail(ctx, "%d threads after the first cycle",
                           count_entries("/proc/self/task"));
        base_fds = count_entries("/proc/self/fd");
      }
    }
    if (!settle_to_one_thread())
      return rank_fail(ctx, "%d threads left after %d cycles", count_entries("/proc/self/task"),
                       ncycles);
    int fds = count_entries("/proc/self/fd");
    if (fds != base_fds)
      return rank_fail(ctx, "%d fds after %d cycles, %d after the first", fds, ncycles, base_fds);
    if (ctx.rank == 0) printf("%d cycles: 1 thread and %d fds left, as after the first\n", ncycles, fds);
    return 0;
  }, opts);
  for (int r = 0; r < 3; r++) EXPECT_EQ(status[r], 0) << "rank " << r;
  munmap(board, sizeof *board);
}

}  // namespace
