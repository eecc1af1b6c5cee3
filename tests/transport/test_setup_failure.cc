// A rank that dies while communicators are being set up: the others get an
// error within a second, not at the timeout, and no shared-memory segment of
// the dead rank is left behind.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "harness.h"
#include "weft_build_config.h"

extern "C" {
#include "collectives/api/config.h"
#include "collectives/core/params.h"
#include "transport/base/log.h"
#include "transport/base/sock.h"
#include "transport/base/wait.h"
}

using namespace weft_test;

namespace {

// Names in /dev/shm that the process with this pid created.
int segments_of(pid_t pid) {
  std::string prefix = "weft-" + std::to_string(pid) + "-";
  int n = 0;
  DIR *d = opendir("/dev/shm");
  if (d == nullptr) return 0;
  while (dirent *e = readdir(d))
    if (strncmp(e->d_name, prefix.c_str(), prefix.size()) == 0) n++;
  closedir(d);
  return n;
}

// Where the victim dies: on the first log line (at TRACE) containing
// `marker`, during init or, with after_init, during the point-to-point
// set-up that follows it. With at_the_end, it dies as its init ends (after
// its peers may have finished theirs): a survivor errs in its init or in the
// point-to-point set-up after it.
struct KillPoint {
  const char *name;
  const char *marker;
  bool after_init;
  const char *transport;  // WEFT_TRANSPORT, or nullptr for the default (shm)
  bool at_the_end = false;
};

// Shared between the test and its ranks (an anonymous shared mapping made
// before the fork).
struct Shared {
  volatile int64_t kill_ns;   // when the victim killed itself
  volatile int32_t victim_pid;
  volatile int64_t error_ns[16];  // when each survivor's call failed
};

Shared *shared_page() {
  static Shared *page = nullptr;
  if (page == nullptr)
    page = (Shared *)mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE,
                          MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  return page;
}

const char *kill_marker;

void kill_at_marker(int, const char *line, void *) {
  if (kill_marker == nullptr || strstr(line, kill_marker) == nullptr) return;
  Shared *sh = shared_page();
  sh->victim_pid = getpid();
  sh->kill_ns = (int64_t)clock_ns();
  kill(getpid(), SIGKILL);
}

class SetupKill : public testing::TestWithParam<KillPoint> {};

TEST_P(SetupKill, OthersErrorWithinASecondAndNoSegmentLeaks) {
  const KillPoint kp = GetParam();
  if (kp.transport != nullptr && strcmp(kp.transport, "ucx") == 0 && !WEFT_HAVE_UCX)
    GTEST_SKIP() << "weft was built without UCX (libucx-dev)";
  for (int nranks : {3, 4}) {
    Shared *sh = shared_page();
    ASSERT_NE(sh, MAP_FAILED);
    memset((void *)sh, 0, sizeof *sh);
    const int victim = nranks - 1;  // rank 0 holds the root
    RunOptions opts;
    opts.allow_warnings = true;
    opts.timeout_s = 60;
    opts.env = {{"WEFT_TIMEOUT", "10"}};
    if (kp.transport != nullptr) opts.env.push_back({"WEFT_TRANSPORT", kp.transport});
    // the victim traces what it does: the kill comes at a marker's line
    opts.env_of = [&](int rank) {
      return rank == victim ? EnvList{{"WEFT_DEBUG", "TRACE"},
                                      {"WEFT_DEBUG_SUBSYS", "INIT,BOOTSTRAP,SHM,NET"}}
                            : EnvList{};
    };
    auto status = run_ranks(nranks, [&](const RankCtx &ctx) {
      if (ctx.rank == victim) {
        weft_log_set_sink(kill_at_marker, nullptr);
        if (!kp.after_init || kp.at_the_end) kill_marker = kp.marker;
      }
      weftComm_t comm;
      weftResult_t res = weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank);
      if (!kp.after_init || (kp.at_the_end && res != weftSuccess)) {
        sh->error_ns[ctx.rank] = (int64_t)clock_ns();
        if (ctx.rank == victim) return rank_fail(ctx, "the victim lived on");
        if (res == weftSuccess) return rank_fail(ctx, "init succeeded without rank %d", victim);
        if (sh->error_ns[ctx.rank] - sh->kill_ns > 1000000000)
          fprintf(stderr, "rank %d: late error: %s\n", ctx.rank, weftGetLastError(nullptr));
        return 0;
      }
      if (res != weftSuccess) return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
      if (ctx.rank == victim) kill_marker = kp.marker;
      // everyone sends to and receives from everyone: set-up of p2p connections
      std::vector<int> out(64, ctx.rank), in(64 * ctx.nranks);
      weftGroupStart();
      for (int p = 0; p < ctx.nranks; p++) {
        if (p == ctx.rank) continue;
        weftSend(out.data(), 64, weftInt32, p, comm, nullptr);
        weftRecv(in.data() + 64 * p, 64, weftInt32, p, comm, nullptr);
      }
      res = weftGroupEnd();
      sh->error_ns[ctx.rank] = (int64_t)clock_ns();
      if (ctx.rank == victim) return rank_fail(ctx, "the victim lived on");
      // only the victim's direct peers must fail; every rank here is one
      if (res == weftSuccess) return rank_fail(ctx, "p2p with a dead rank succeeded");
      if (sh->error_ns[ctx.rank] - sh->kill_ns > 1000000000)
        fprintf(stderr, "rank %d: late error: %s\n", ctx.rank, weftGetLastError(comm));
      weftCommAbort(comm);
      return 0;
    }, opts);
    EXPECT_EQ(status[victim], 128 + SIGKILL) << kp.name << ": the victim did not die there";
    ASSERT_NE(sh->kill_ns, 0) << kp.name;
    for (int r = 0; r < nranks; r++) {
      if (r == victim) continue;
      EXPECT_EQ(status[r], 0) << kp.name << ", " << nranks << " ranks: rank " << r;
      double after = (double)(sh->error_ns[r] - sh->kill_ns) / 1e9;
      EXPECT_LT(after, 1.0) << kp.name << ", " << nranks << " ranks: rank " << r
                            << " learnt of the death after " << after << " s";
    }
    EXPECT_EQ(segments_of(sh->victim_pid), 0)
        << kp.name << ": segments of the dead rank (pid " << sh->victim_pid << ") left";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Points, SetupKill,
    testing::Values(KillPoint{"before_joining", "joining the root", false, nullptr},
                    KillPoint{"admitted", "admitted by the root", false, nullptr},
                    KillPoint{"all_joined", "ranks joined", false, nullptr},
                    KillPoint{"ring_ready", "bootstrap ring ready", false, nullptr},
                    KillPoint{"shm_segment", "created /weft-", false, nullptr},
                    KillPoint{"socket_listen", "listening on", false, "socket"},
                    KillPoint{"p2p_shm_segment", "created /weft-", true, nullptr},
                    KillPoint{"p2p_socket_listen", "listening on", true, "socket"},
                    KillPoint{"init_ready", " ready: ", true, nullptr, true},
                    KillPoint{"init_ready_ucx", " ready: ", true, "ucx", true}),
    [](const testing::TestParamInfo<KillPoint> &i) { return std::string(i.param.name); });

// A listener that was up and is gone refuses at once; the set-up connect
// says so instead of retrying until the deadline.
TEST(SetupConnect, RefusedFromAGonePeerIsNotRetried) {
  union weft_sockaddr a;
  memset(&a, 0, sizeof a);
  a.in.sin_family = AF_INET;
  a.in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int fd;
  ASSERT_EQ(sock_listen(&a, &fd, &a), weftSuccess);
  close(fd);  // the port is closed now: connections are refused
  double start = now_s();
  int out = -1;
  EXPECT_EQ(sock_connect_peer(&a, clock_ns() + 20000000000ull, nullptr, &out), weftRemoteError);
  EXPECT_LT(now_s() - start, 0.5);
}

// A connect or accept that waits on a local peer ends as soon as the peer's
// process is gone.
TEST(SetupConnect, AcceptWatchesThePeersPid) {
  union weft_sockaddr a;
  memset(&a, 0, sizeof a);
  a.in.sin_family = AF_INET;
  a.in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int fd;
  ASSERT_EQ(sock_listen(&a, &fd, &a), weftSuccess);
  pid_t child = fork();
  if (child == 0) {
    usleep(100000);
    _exit(0);  // dies without connecting
  }
  struct weft_wait w;
  wait_begin(&w, 20000000000ull, nullptr, nullptr, child, 1, "accept a connection from");
  double start = now_s();
  int out = -1;
  EXPECT_EQ(sock_accept(fd, clock_ns() + 20000000000ull, &w, &out), weftRemoteError);
  double took = now_s() - start;
  EXPECT_LT(took, 1.0);
  waitpid(child, nullptr, 0);
  close(fd);
}

}  // namespace
