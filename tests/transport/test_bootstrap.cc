// Bootstrap from launcher environments: weft's, torchrun's, Open MPI's and
// Slurm's variables, the unique id in hex, a real torchrun, bad variables and
// different secrets refused, every listener on loopback for a loopback
// rendezvous; and ranks in pid namespaces of their own, as containers start
// them. The root and the listeners against strangers and the host's limits:
// test_bootstrap_listeners.cc.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "bootstrap_probe.h"
#include "harness.h"

extern "C" {
#include "collectives/api/comm_lifecycle.h"
#include "collectives/core/comm.h"
#include "transport/bootstrap/bootstrap.h"
#include "transport/bootstrap/wire.h"
#include "transport/base/log.h"
#include "transport/base/sock.h"
}

using namespace weft_test;

namespace {

// numbers; destroys comm.
int check_and_destroy(const RankCtx &ctx, weftComm_t comm) {
  int rank = -1, nranks = -1;
  weftCommUserRank(comm, &rank);
  weftCommCount(comm, &nranks);
  if (rank != ctx.rank || nranks != ctx.nranks)
    return rank_fail(ctx, "env gave rank %d of %d", rank, nranks);
  int64_t mine = rank + 1, sum = 0;
  if (weftAllReduce(&mine, &sum, 1, weftInt64, weftSum, comm, nullptr) != weftSuccess)
    return rank_fail(ctx, "allreduce: %s", weftGetLastError(comm));
  if (sum != (int64_t)nranks * (nranks + 1) / 2) return rank_fail(ctx, "sum %lld", (long long)sum);
  weftCommDestroy(comm);
  return 0;
}

// Joins by the launcher's variables (set in RunOptions before the process
// had a thread) and checks the communicator.
int join_and_check(const RankCtx &ctx) {
  weftComm_t comm;
  if (weftCommInitFromEnv(&comm, nullptr) != weftSuccess)
    return rank_fail(ctx, "init from env: %s", weftGetLastError(nullptr));
  return check_and_destroy(ctx, comm);
}

struct Launcher {
  const char *name;
  const char *rank_var, *size_var;
  bool torch_address;  // MASTER_ADDR/MASTER_PORT, else WEFT_COMM_ID
};

class FromEnv : public testing::TestWithParam<Launcher> {};

TEST_P(FromEnv, JoinsAndReduces) {
  const Launcher l = GetParam();
  const int nranks = 3;
  const int port = free_port();
  RunOptions opts;
  opts.timeout_s = 60;
  opts.unique_id = false;
  opts.env = {{"WEFT_TIMEOUT", "20"}, {l.size_var, std::to_string(nranks)}};
  if (l.torch_address) {
    opts.env.push_back({"MASTER_ADDR", "127.0.0.1"});
    opts.env.push_back({"MASTER_PORT", std::to_string(port)});
  } else {
    opts.env.push_back({"WEFT_COMM_ID", "127.0.0.1:" + std::to_string(port)});
  }
  opts.env_of = [&](int rank) { return EnvList{{l.rank_var, std::to_string(rank)}}; };
  auto status = run_ranks(nranks, join_and_check, opts);
  for (int r = 0; r < nranks; r++) EXPECT_EQ(status[r], 0) << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(Launchers, FromEnv,
                         testing::Values(Launcher{"weft", "WEFT_RANK", "WEFT_NRANKS", false},
                                         Launcher{"torchrun", "RANK", "WORLD_SIZE", true},
                                         Launcher{"openmpi", "OMPI_COMM_WORLD_RANK",
                                                  "OMPI_COMM_WORLD_SIZE", false},
                                         Launcher{"slurm", "SLURM_PROCID", "SLURM_NTASKS", true}),
                         [](const testing::TestParamInfo<Launcher> &i) { return std::string(i.param.name); });

// The unique id travels as hex in WEFT_UNIQUE_ID (how weftrun hands it out).
// Rank 0 holds the id's root thread and joins by the id itself; ranks 1 and
// 2, whose processes have no other thread until they join, set the variable.
TEST(FromEnvUniqueId, HexId) {
  RunOptions opts;
  opts.allow_warnings = true;  // the second use's
  auto status = run_ranks(3, [](const RankCtx &ctx) {
    weftComm_t comm;
    if (ctx.rank == 0) {
      if (weftCommInitRank(&comm, ctx.nranks, ctx.id, 0) != weftSuccess)
        return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
      return check_and_destroy(ctx, comm);
    }
    static const char *hex = "0123456789abcdef";
    std::string s;
    for (size_t i = 0; i < sizeof ctx.id.internal; i++) {
      unsigned char b = (unsigned char)ctx.id.internal[i];
      s += hex[b >> 4];
      s += hex[b & 15];
    }
    FAIL_IF(!env_set_alone("WEFT_RANK", std::to_string(ctx.rank).c_str()) ||
                !env_set_alone("WEFT_NRANKS", "3") || !env_set_alone("WEFT_UNIQUE_ID", s.c_str()),
            "setting the launcher's variables");
    if (int rc = join_and_check(ctx)) return rc;
    // the id's root admitted each rank once: a second init from it fails,
    // and says why (stderr, where the warning goes, read back from a file)
    char path[] = "/tmp/weft_second_init_XXXXXX";
    const int fd = mkstemp(path);
    FAIL_IF(fd < 0, "mkstemp");
    fflush(stderr);
    const int saved = dup(2);
    dup2(fd, 2);
    weftResult_t res = weftCommInitFromEnv(&comm, nullptr);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    std::string err(4096, '\0');
    const ssize_t n = pread(fd, &err[0], err.size(), 0);
    err.resize(n > 0 ? (size_t)n : 0);
    close(fd);
    unlink(path);
    FAIL_IF(res == weftSuccess, "a second init from the same id succeeded");
    FAIL_IF(err.find("WEFT_UNIQUE_ID is used a second time") == std::string::npos,
            "no word of the second use: %s", err.c_str());
    return 0;
  }, opts);
  for (int r = 0; r < 3; r++) EXPECT_EQ(status[r], 0) << "rank " << r;
}

// Different WEFT_SECRETs: the ranks cannot form a job.
TEST(FromEnvSecret, DifferentSecretsAreRefused) {
  const int port = free_port();
  RunOptions opts;
  opts.allow_warnings = true;
  opts.unique_id = false;
  opts.env = {{"WEFT_TIMEOUT", "3"}, {"WEFT_NRANKS", "2"},
              {"WEFT_COMM_ID", "127.0.0.1:" + std::to_string(port)}};
  opts.env_of = [](int rank) {
    return EnvList{{"WEFT_RANK", std::to_string(rank)},
                   {"WEFT_SECRET", rank == 0 ? "alpha" : "beta"}};
  };
  auto status = run_ranks(2, [&](const RankCtx &ctx) {
    weftComm_t comm;
    weftResult_t res = weftCommInitFromEnv(&comm, nullptr);
    return res == weftSuccess ? rank_fail(ctx, "joined with a wrong secret") : 0;
  }, opts);
  EXPECT_EQ(status[0], 0);
  EXPECT_EQ(status[1], 0);
}

// Rank 1 at a fixed address whose rank 0 never starts: every attempt is
// refused until WEFT_TIMEOUT, and the error says so and names rank 0's part,
// not a timeout and a firewall (an attempt started past the deadline once
// reported no answer).
TEST(FromEnvErrors, RootThatNeverStartsIsRefusedNotTimedOut) {
  const int port = free_port();
  RunOptions opts;
  opts.unique_id = false;
  opts.env = {{"WEFT_TIMEOUT", "2"}, {"WEFT_NRANKS", "2"}, {"WEFT_RANK", "1"},
              {"WEFT_COMM_ID", "127.0.0.1:" + std::to_string(port)}};
  auto status = run_ranks(1, [](const RankCtx &ctx) {
    weftComm_t comm;
    const double t0 = now_s();
    weftResult_t res = weftCommInitFromEnv(&comm, nullptr);
    const double took = now_s() - t0;
    const std::string msg = weftGetLastError(nullptr);
    printf("after %.2f s: %s\n", took, msg.c_str());
    FAIL_IF(res != weftRemoteError, "got %s", weftGetErrorString(res));
    FAIL_IF(msg.find("Connection refused") == std::string::npos ||
                msg.find("rank 0 starts the root") == std::string::npos ||
                msg.find("firewall") != std::string::npos,
            "not said to be refused: %s", msg.c_str());
    FAIL_IF(took < 1.5 || took > 5, "took %.2f s for a 2 s timeout", took);
    return 0;
  }, opts);
  EXPECT_EQ(status[0], 0);
}

// Ranks 0 and 1 of 3 at a fixed address, rank 2 never joining: at the
// timeout the root (rank 0's) tells both which rank did not join.
TEST(FromEnvErrors, RankThatNeverJoinsIsNamed) {
  const int port = free_port();
  RunOptions opts;
  opts.unique_id = false;
  opts.allow_warnings = true;  // the root's "2 of 3 ranks joined"
  opts.env = {{"WEFT_TIMEOUT", "2"}, {"WEFT_NRANKS", "3"},
              {"WEFT_COMM_ID", "127.0.0.1:" + std::to_string(port)}};
  opts.env_of = [](int rank) { return EnvList{{"WEFT_RANK", std::to_string(rank)}}; };
  auto status = run_ranks(3, [](const RankCtx &ctx) {
    if (ctx.rank == 2) return 0;
    weftComm_t comm;
    weftResult_t res = weftCommInitFromEnv(&comm, nullptr);
    const std::string msg = weftGetLastError(nullptr);
    printf("rank %d: %s\n", ctx.rank, msg.c_str());
    FAIL_IF(res != weftRemoteError, "got %s", weftGetErrorString(res));
    FAIL_IF(msg.find("2 of 3 ranks joined; rank 2 never joined") == std::string::npos,
            "the missing rank not named: %s", msg.c_str());
    return 0;
  }, opts);
  for (int r = 0; r < 3; r++) EXPECT_EQ(status[r], 0) << "rank " << r;
}

// The variables change between the calls: the process has no other thread
// (no unique id, so no root thread; env_set_alone checks).
TEST(FromEnvErrors, BadVariables) {
  RunOptions opts;
  opts.unique_id = false;
  auto status = run_ranks(1, [](const RankCtx &ctx) {
    weftComm_t comm;
    FAIL_IF(!env_set_alone("WEFT_RANK", "3") || !env_set_alone("WEFT_NRANKS", "2"), "setenv");
    if (weftCommInitFromEnv(&comm, nullptr) != weftInvalidArgument)
      return rank_fail(ctx, "rank >= size accepted");
    FAIL_IF(!env_set_alone("WEFT_RANK", "1") || !env_set_alone("WEFT_UNIQUE_ID", nullptr) ||
                !env_set_alone("WEFT_COMM_ID", nullptr) || !env_set_alone("MASTER_ADDR", nullptr),
            "setenv");
    if (weftCommInitFromEnv(&comm, nullptr) != weftInvalidArgument ||
        std::string(weftGetLastError(nullptr)).find("no rendezvous address") == std::string::npos)
      return rank_fail(ctx, "missing address accepted: %s", weftGetLastError(nullptr));
    FAIL_IF(!env_set_alone("WEFT_COMM_ID", "nocolon"), "setenv");
    if (weftCommInitFromEnv(&comm, nullptr) != weftInvalidArgument)
      return rank_fail(ctx, "bad WEFT_COMM_ID accepted");
    // no launcher at all: a job of one
    FAIL_IF(!env_set_alone("WEFT_RANK", nullptr) || !env_set_alone("WEFT_NRANKS", nullptr) ||
                !env_set_alone("WEFT_COMM_ID", nullptr),
            "setenv");
    if (weftCommInitFromEnv(&comm, nullptr) != weftSuccess)
      return rank_fail(ctx, "single rank: %s", weftGetLastError(nullptr));
    int n = 0;
    weftCommCount(comm, &n);
    weftCommDestroy(comm);
    FAIL_IF(n != 1, "size %d", n);
    // a Slurm batch script's own process: SLURM_PROCID=0 without SLURM_NTASKS
    // (no --ntasks) is a job of one, not a bad pair of variables
    FAIL_IF(!env_set_alone("SLURM_PROCID", "0") || !env_set_alone("SLURM_JOB_ID", "5"), "setenv");
    if (weftCommInitFromEnv(&comm, nullptr) != weftSuccess)
      return rank_fail(ctx, "SLURM_PROCID alone: %s", weftGetLastError(nullptr));
    weftCommCount(comm, &n);
    weftCommDestroy(comm);
    FAIL_IF(n != 1, "size %d", n);
    // a rank above 0 without a size is no batch script: still refused
    FAIL_IF(!env_set_alone("SLURM_PROCID", "3"), "setenv");
    if (weftCommInitFromEnv(&comm, nullptr) != weftInvalidArgument ||
        std::string(weftGetLastError(nullptr)).find("not a valid rank and size") == std::string::npos)
      return rank_fail(ctx, "SLURM_PROCID=3 alone: %s", weftGetLastError(nullptr));
    return 0;
  }, opts);
  EXPECT_EQ(status[0], 0);
}

// A non-loopback IPv4 address of this host, or "" when it has none.
std::string non_loopback_ipv4() {
  struct ifaddrs *ifs = nullptr;
  std::string found;
  if (getifaddrs(&ifs) != 0) return found;
  for (struct ifaddrs *i = ifs; i != nullptr && found.empty(); i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    if ((i->ifa_flags & IFF_LOOPBACK) || !(i->ifa_flags & IFF_UP)) continue;
    char buf[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &((sockaddr_in *)i->ifa_addr)->sin_addr, buf, sizeof buf);
    found = buf;
  }
  freeifaddrs(ifs);
  return found;
}

// WEFT_COMM_ID=127.0.0.1:port: the root and every rank's listener take
// loopback connections only.
TEST(FromEnvBind, LoopbackRendezvousListensOnLoopback) {
  const int port = free_port();
  const std::string outside = non_loopback_ipv4();
  RunOptions opts;
  opts.unique_id = false;
  opts.env = {{"WEFT_TIMEOUT", "20"}, {"WEFT_NRANKS", "2"},
              {"WEFT_COMM_ID", "127.0.0.1:" + std::to_string(port)}};
  opts.env_of = [](int rank) { return EnvList{{"WEFT_RANK", std::to_string(rank)}}; };
  auto status = run_ranks(2, [&](const RankCtx &ctx) {
    if (ctx.rank == 0 && !outside.empty()) {
      // the root is up before rank 1 can join; it must not answer outside loopback
      struct bootstrap_env env;
      if (bootstrap_env_read(&env) != weftSuccess || bootstrap_env_rendezvous(&env) != weftSuccess)
        return rank_fail(ctx, "rendezvous: %s", weftGetLastError(nullptr));
      union weft_sockaddr a;
      if (sock_resolve(outside.c_str(), port, &a) != weftSuccess) return rank_fail(ctx, "resolve");
      int fd = silent_connection(a);
      if (fd >= 0) return rank_fail(ctx, "the root answers on %s", outside.c_str());
      weftComm_t comm;
      if (comm_init(&comm, 2, &env.id, 0, nullptr, -1) != weftSuccess)
        return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
      for (int r = 0; r < 2; r++)
        if (!sock_addr_is_loopback(&comm->peers[r].listen_addr))
          return rank_fail(ctx, "rank %d listens outside loopback", r);
      weftCommDestroy(comm);
      return 0;
    }
    weftComm_t comm;
    if (weftCommInitFromEnv(&comm, nullptr) != weftSuccess)
      return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
    for (int r = 0; r < 2; r++)
      if (!sock_addr_is_loopback(&comm->peers[r].listen_addr))
        return rank_fail(ctx, "rank %d listens outside loopback", r);
    weftCommDestroy(comm);
    return 0;
  }, opts);
  EXPECT_EQ(status[0], 0);
  EXPECT_EQ(status[1], 0);
  if (outside.empty()) printf("no non-loopback address here: only the listeners were checked\n");
}

// --- ranks in pid namespaces of their own ---------------------------------
// (one container per rank sharing the host's network, as `docker run
// --net=host` makes them: a peer's pid means nothing in the other's namespace)

// Writes text to a /proc file of this process; false when it cannot.
bool write_proc(const char *path, const std::string &text) {
  int fd = open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  bool ok = write(fd, text.data(), text.size()) == (ssize_t)text.size();
  close(fd);
  return ok;
}

int pidns_warnings;
void pidns_count_warnings(int level, const char *line, void *) {
  if (level == LOG_WARN) pidns_warnings++;
  fprintf(stderr, "%s%s\n", level == LOG_WARN ? "unexpected warning: " : "", line);
}

// Runs body in a child started in a new user and pid namespace, as
// `unshare -Urpf` does (the child is pid 1 there, its uid and gid mapped to
// this process's), and returns the child's code; -1, with *why set, when the
// namespaces cannot be made. This process must have one thread. The child's
// warnings fail it (201), as run_ranks's do.
int run_in_own_pid_namespace(const std::function<int()> &body, std::string *why) {
  const uid_t uid = geteuid();
  const gid_t gid = getegid();
  if (unshare(CLONE_NEWUSER | CLONE_NEWPID) != 0) {
    *why = std::string("unshare(CLONE_NEWUSER | CLONE_NEWPID): ") + strerror(errno);
    return -1;
  }
  write_proc("/proc/self/setgroups", "deny");
  if (!write_proc("/proc/self/uid_map", std::to_string(uid) + " " + std::to_string(uid) + " 1") ||
      !write_proc("/proc/self/gid_map", std::to_string(gid) + " " + std::to_string(gid) + " 1")) {
    *why = std::string("mapping the uid and gid into a user namespace: ") + strerror(errno);
    return -1;
  }
  fflush(stdout);
  fflush(stderr);
  pid_t child = fork();
  if (child < 0) {
    *why = std::string("fork into the pid namespace: ") + strerror(errno);
    return -1;
  }
  if (child == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // the watchdog's kill of the rank reaches it
    weft_log_set_sink(pidns_count_warnings, nullptr);
    int rc = getpid() == 1 ? body() : 2;
    if (rc == 0 && pidns_warnings > 0) rc = 201;
    fflush(stdout);
    fflush(stderr);
    _exit(rc);
  }
  int ws = 0;
  if (waitpid(child, &ws, 0) != child) return 1;
  return WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
}

// Why a rank could not be started in a pid namespace of its own, or "".
std::string pid_namespace_unavailable() {
  int p[2];
  if (pipe2(p, O_CLOEXEC) != 0) return "pipe failed";
  fflush(stdout);
  fflush(stderr);
  pid_t probe = fork();
  if (probe == 0) {
    close(p[0]);
    std::string why;
    int rc = run_in_own_pid_namespace([] { return 0; }, &why);
    if (rc != 0 && why.empty()) why = "the child in the pid namespace exited with " + std::to_string(rc);
    if (write(p[1], why.data(), why.size()) < 0) _exit(1);
    _exit(0);
  }
  close(p[1]);
  std::string why;
  char buf[256];
  ssize_t n;
  while ((n = read(p[0], buf, sizeof buf)) > 0) why.append(buf, (size_t)n);
  close(p[0]);
  waitpid(probe, nullptr, 0);
  return why;
}

// Rank 1 of 3 lives in a pid namespace of its own, on the host's network and
// /dev/shm; rank 0 starts its all-reduces late, so that the others wait on
// it. Each all-reduce must give the sum: no rank may take a live peer for
// dead because the peer's pid is not its process in the waiter's namespace
// (rank 1 waited on "rank 0 (pid N) died" when it watched the pids).
TEST(PidNamespace, RankInAnotherNamespaceIsNotTakenForDead) {
  const std::string why = pid_namespace_unavailable();
  if (!why.empty()) GTEST_SKIP() << "cannot start a rank in a pid namespace of its own: " << why;
  RunOptions opts;
  opts.timeout_s = 90;
  opts.env = {{"WEFT_TIMEOUT", "30"}};
  auto body = [](const RankCtx &ctx) {
    weftComm_t comm;
    FAIL_IF(weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess, "init: %s",
            weftGetLastError(nullptr));
    // a single element, then several chunks
    for (size_t count : {(size_t)1, (size_t)300000}) {
      if (ctx.rank == 0) usleep(1500000);  // the others wait on rank 0 meanwhile
      std::vector<float> x(count, (float)(ctx.rank + 1)), y(count, 0);
      FAIL_IF(weftAllReduce(x.data(), y.data(), count, weftFloat32, weftSum, comm, nullptr) !=
                  weftSuccess,
              "all-reduce of %zu: %s", count, weftGetLastError(comm));
      for (size_t i = 0; i < count; i++)
        FAIL_IF(y[i] != 6, "all-reduce of %zu: element %zu is %g, not 6", count, i, y[i]);
    }
    weftCommDestroy(comm);
    return 0;
  };
  auto status = run_ranks(3, [&](const RankCtx &ctx) {
    if (ctx.rank != 1) return body(ctx);
    std::string failed;
    int rc = run_in_own_pid_namespace([&] { return body(ctx); }, &failed);
    FAIL_IF(rc < 0, "%s", failed.c_str());
    return rc;
  }, opts);
  for (int r = 0; r < 3; r++) EXPECT_EQ(status[r], 0) << "rank " << r;
}

// Rank 1 of 2, in a pid namespace of its own, exits in the middle of the job
// while rank 0 waits on it in an all-reduce: rank 0 must report it within
// seconds, from the connection that closed, although no pid of its namespace
// can tell (rank 1's pid, 1, names a live process here).
TEST(PidNamespace, DeathInAnotherNamespaceIsReported) {
  const std::string why = pid_namespace_unavailable();
  if (!why.empty()) GTEST_SKIP() << "cannot start a rank in a pid namespace of its own: " << why;
  RunOptions opts;
  opts.timeout_s = 90;
  opts.env = {{"WEFT_TIMEOUT", "40"}};
  opts.allow_warnings = true;  // the survivor's failure may be logged
  auto status = run_ranks(2, [&](const RankCtx &ctx) {
    auto body = [&]() {
      weftComm_t comm;
      FAIL_IF(weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess, "init: %s",
              weftGetLastError(nullptr));
      float x = 1, y = 0;
      FAIL_IF(weftAllReduce(&x, &y, 1, weftFloat32, weftSum, comm, nullptr) != weftSuccess ||
                  y != 2,
              "first all-reduce: %s", weftGetLastError(comm));
      if (ctx.rank == 1) {
        usleep(500000);  // rank 0 is waiting in the second by now
        _exit(0);        // dies: no destroy, no goodbye
      }
      double start = now_s();
      weftResult_t res = weftAllReduce(&x, &y, 1, weftFloat32, weftSum, comm, nullptr);
      double took = now_s() - start;
      std::string text = weftGetLastError(comm);
      printf("rank 0: the all-reduce ended after %.1f s: %s\n", took, text.c_str());
      FAIL_IF(res == weftSuccess, "the all-reduce with a dead rank succeeded");
      FAIL_IF(took > 15, "the death was reported after %.1f s, not by the closed connection", took);
      FAIL_IF(text.find("rank 1") == std::string::npos, "the error does not name rank 1: %s",
              text.c_str());
      weftCommDestroy(comm);
      return 0;
    };
    if (ctx.rank != 1) return body();
    std::string failed;
    int rc = run_in_own_pid_namespace(body, &failed);
    FAIL_IF(rc < 0, "%s", failed.c_str());
    return rc;
  }, opts);
  EXPECT_EQ(status[0], 0);
  EXPECT_EQ(status[1], 0);
}

// --- under a real torchrun ----------------------------------------------

// What each torchrun worker runs (this binary, started by Torchrun.*): two
// communicators in a row from torchrun's environment, each checked with an
// all-reduce. Disabled: it runs only when started that way.
TEST(Torchrun, DISABLED_Worker) {
  for (int round = 0; round < 2; round++) {
    weftComm_t comm;
    ASSERT_EQ(weftCommInitFromEnv(&comm, nullptr), weftSuccess) << weftGetLastError(nullptr);
    int rank = -1, nranks = -1;
    weftCommUserRank(comm, &rank);
    weftCommCount(comm, &nranks);
    EXPECT_EQ(rank, atoi(getenv("RANK")));
    EXPECT_EQ(nranks, atoi(getenv("WORLD_SIZE")));
    int64_t mine = rank + 1, sum = 0;
    ASSERT_EQ(weftAllReduce(&mine, &sum, 1, weftInt64, weftSum, comm, nullptr), weftSuccess);
    EXPECT_EQ(sum, (int64_t)nranks * (nranks + 1) / 2);
    weftCommDestroy(comm);
    printf("torchrun worker: rank %d of %d, round %d ok\n", rank, nranks, round);
  }
}

// torchrun's agent holds MASTER_PORT with its store; weftCommInitFromEnv
// passes its unique id through that store instead of binding the port.
TEST(Torchrun, InitFromEnv) {
  const std::string torchrun = std::string(WEFT_SOURCE_ROOT) + "/.venv-torch/bin/torchrun";
  if (access(torchrun.c_str(), X_OK) != 0)
    GTEST_SKIP() << "no torchrun at " << torchrun
                 << " (WEFT_SETUP_TORCH=1 tools/scripts/setup.sh creates .venv-torch)";
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  ASSERT_GT(n, 0);
  self[n] = '\0';
  // 3 ranks (an odd count, past a pair); each torchrun start imports torch,
  // which takes seconds on a busy machine
  for (int nranks : {3}) {
    char out[] = "/tmp/weft-torchrun-XXXXXX";
    int fd = mkstemp(out);
    ASSERT_GE(fd, 0);
    close(fd);
    // the workers run the one test they are given: a sharded run's GTEST_* must not
    // reach them (the sanitizer run shards its suites)
    std::string cmd = "env -u GTEST_SHARD_INDEX -u GTEST_TOTAL_SHARDS -u GTEST_SHARD_STATUS_FILE "
                      "WEFT_TIMEOUT=30 timeout 180 " + torchrun + " --standalone --nproc-per-node " +
                      std::to_string(nranks) + " --no-python " + self +
                      " --gtest_filter=Torchrun.DISABLED_Worker --gtest_also_run_disabled_tests"
                      " >" + out + " 2>&1";
    double start = now_s();
    int rc = system(cmd.c_str());
    double took = now_s() - start;
    std::string text;
    if (FILE *f = fopen(out, "r")) {
      char line[1024];
      while (fgets(line, sizeof line, f) != nullptr) text += line;
      fclose(f);
    }
    unlink(out);
    int ok = 0;
    for (size_t at = 0; (at = text.find("round 1 ok", at)) != std::string::npos; at++) ok++;
    EXPECT_EQ(rc, 0) << "torchrun with " << nranks << " ranks:\n" << text;
    EXPECT_EQ(ok, nranks) << text;
    printf("torchrun, %d ranks: %.1f s (python start-up included)\n", nranks, took);
  }
}

// A stall's question reaches every rank that answers though one rank's
// host does not (its address leads nowhere: a host gone from the network):
// the connections are made at once, so the silent one does not use up the
// time of those after it (asked one after another, rank 2 went unasked and
// was taken for silent too).
TEST(AskAll, AHostThatDoesNotAnswerLeavesTheOthersTheirTime) {
  RunOptions opts;
  opts.allow_warnings = true;
  auto status = run_ranks(3, [](const RankCtx &ctx) {
    weftComm_t comm;
    if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
      return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
    int rc = 0;
    if (ctx.rank == 0) {
      // rank 1's question listener, as seen from here: an address that
      // answers nothing
      union weft_sockaddr nowhere;
      std::vector<int> held;
      if (!silent_listener(&nowhere, &held)) return rank_fail(ctx, "no silent listener");
      comm->bs->query_addrs[1] = nowhere;
      char replies[3][512];
      size_t got[3];
      enum bootstrap_ask_outcome outcome[3];
      char why[256];
      const double t0 = now_s();
      bootstrap_ask_all(comm->bs, 1500000000ull, replies, sizeof replies[0], got, outcome, why,
                        sizeof why);
      const double took = now_s() - t0;
      printf("asked in %.2f s: rank 1 %d, rank 2 %d\n", took, (int)outcome[1], (int)outcome[2]);
      if (outcome[2] != BOOTSTRAP_ASK_ANSWERED)
        rc = rank_fail(ctx, "rank 2 went unanswered (outcome %d) behind rank 1's silence",
                       (int)outcome[2]);
      else if (outcome[1] == BOOTSTRAP_ASK_ANSWERED)
        rc = rank_fail(ctx, "an address that leads nowhere answered");
      else if (took > 5)
        rc = rank_fail(ctx, "the question took %.1f s, well past its 1.5 s", took);
      for (int fd : held) close(fd);
    }
    // rank 0 asks while the others wait here
    float x = 1;
    if (weftAllReduce(&x, &x, 1, weftFloat32, weftSum, comm, nullptr) != weftSuccess || x != 3)
      rc = rc ? rc : rank_fail(ctx, "all-reduce after the question: %s", weftGetLastError(comm));
    weftCommDestroy(comm);
    return rc;
  }, opts);
  for (int s : status) EXPECT_EQ(s, 0);
}

}  // namespace

// A launcher that serves the rendezvous watches its ranks' processes
// (weftUniqueIdWatchRank): one that ends before it joins, even with status 0
// (it never called weft), fails the others' init at once naming it, not at
// their timeout (20 s here). An id this process does not serve is refused.
TEST(RootWatch, RankThatEndsBeforeJoiningIsNamedAtOnce) {
  weftUniqueId id;
  ASSERT_EQ(weftGetUniqueId(&id), weftSuccess) << weftGetLastError(nullptr);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(0);
  ASSERT_EQ(weftUniqueIdWatchRank(&id, 1, (int)child), weftSuccess) << weftGetLastError(nullptr);
  int wstatus = 0;
  ASSERT_EQ(waitpid(child, &wstatus, 0), child);
  weftConfig_t cfg = WEFT_CONFIG_INITIALIZER;
  cfg.timeoutMs = 20000;
  weftComm_t comm = nullptr;
  const double t0 = now_s();
  const weftResult_t res = weftCommInitRankConfig(&comm, 2, id, 0, &cfg);
  const std::string msg = weftGetLastError(nullptr);
  EXPECT_EQ(res, weftRemoteError) << msg;
  EXPECT_LT(now_s() - t0, 5.0) << msg;
  EXPECT_NE(msg.find("rank 1 left (exited, failed or died) before all 2 ranks joined"),
            std::string::npos)
      << msg;
  if (res == weftSuccess) weftCommDestroy(comm);

  weftUniqueId stranger;
  memset(&stranger, 0, sizeof stranger);
  EXPECT_EQ(weftUniqueIdWatchRank(&stranger, 1, (int)getpid()), weftInvalidArgument);
  EXPECT_NE(std::string(weftGetLastError(nullptr)).find("not served by this process"),
            std::string::npos)
      << weftGetLastError(nullptr);
  EXPECT_EQ(weftUniqueIdWatchRank(nullptr, 1, (int)getpid()), weftInvalidArgument);
  weftUniqueId fresh;
  ASSERT_EQ(weftGetUniqueId(&fresh), weftSuccess);
  EXPECT_EQ(weftUniqueIdWatchRank(&fresh, -1, (int)getpid()), weftInvalidArgument);
}
