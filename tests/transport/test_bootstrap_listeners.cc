// The bootstrap's root and listeners: strangers and idle connections cannot
// stall them or learn anything from them, the root within its file
// descriptors, and communicators made and destroyed without using up the
// host's ports (launcher environments: test_bootstrap.cc).
#include <gtest/gtest.h>

#include <fcntl.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <climits>
#include <cstring>
#include <string>
#include <vector>

#include "bootstrap_probe.h"
#include "harness.h"

extern "C" {
#include "collectives/api/comm_lifecycle.h"
#include "transport/bootstrap/bootstrap.h"
#include "transport/base/sock.h"
#include "transport/base/wait.h"
}

using namespace weft_test;

namespace {

// On 2 ranks: an all-reduce of ones must give 2 on comm, which is then
// destroyed. Returns 0, or a failure code naming what.
int sum_two_and_destroy(const RankCtx &ctx, weftComm_t comm, const char *what) {
  float x = 1, y = 0;
  if (weftAllReduce(&x, &y, 1, weftFloat32, weftSum, comm, nullptr) != weftSuccess || y != 2)
    return rank_fail(ctx, "%s", what);
  weftCommDestroy(comm);
  return 0;
}

// Checks comm's rank and size against ctx and an all-reduce of rank
// A stranger that connects to the root and sends junk is dropped; the real
// ranks still form the job.
TEST(Root, DropsStrangers) {
  RunOptions opts;
  opts.allow_warnings = true;
  opts.env = {{"WEFT_TIMEOUT", "20"}};
  auto status = run_ranks(2, [](const RankCtx &ctx) {
    if (ctx.rank == 0) {
      struct bootstrap_id b;
      memcpy(&b, ctx.id.internal, sizeof b);
      for (int i = 0; i < 3; i++) {
        int fd = socket(b.root.sa.sa_family, SOCK_STREAM, 0);
        if (connect(fd, &b.root.sa, sizeof b.root) != 0) return rank_fail(ctx, "connect to root");
        char junk[600];
        memset(junk, i, sizeof junk);
        if (write(fd, junk, i == 0 ? 3 : sizeof junk) < 0) return rank_fail(ctx, "write");
        close(fd);
      }
    }
    weftComm_t comm;
    if (weftCommInitRank(&comm, 2, ctx.id, ctx.rank) != weftSuccess)
      return rank_fail(ctx, "init after strangers: %s", weftGetLastError(nullptr));
    return sum_two_and_destroy(ctx, comm, "allreduce after strangers");
  }, opts);
  EXPECT_EQ(status[0], 0);
  EXPECT_EQ(status[1], 0);
}

// Reads what the other end sends for up to `seconds` or until it closes;
// returns the byte count, *closed telling whether it closed.
ssize_t bytes_received(int fd, double seconds, bool *closed) {
  ssize_t total = 0;
  double end = now_s() + seconds;
  *closed = false;
  while (now_s() < end) {
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    char buf[4096];
    ssize_t n = read(fd, buf, sizeof buf);
    if (n <= 0) {
      *closed = true;
      return total;
    }
    total += n;
  }
  return total;
}

// Seconds a 4-rank init (and one all-reduce) takes, with `silent` connections
// to the root held open by rank 0 the whole time; -1 when a rank failed.
double timed_init(int silent) {
  RunOptions opts;
  opts.allow_warnings = true;
  opts.env = {{"WEFT_TIMEOUT", "30"}};
  double start = now_s();
  auto status = run_ranks(4, [&](const RankCtx &ctx) {
    std::vector<int> fds;
    if (ctx.rank == 0) {
      struct bootstrap_id b;
      memcpy(&b, ctx.id.internal, sizeof b);
      for (int i = 0; i < silent; i++) {
        int fd = silent_connection(b.root);
        if (fd < 0) return rank_fail(ctx, "connect to the root");
        fds.push_back(fd);
      }
    }
    weftComm_t comm;
    if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
      return rank_fail(ctx, "init beside %d silent connections: %s", silent,
                       weftGetLastError(nullptr));
    int x = 1, y = 0;
    if (weftAllReduce(&x, &y, 1, weftInt32, weftSum, comm, nullptr) != weftSuccess || y != 4)
      return rank_fail(ctx, "allreduce");
    weftCommDestroy(comm);
    for (int fd : fds) close(fd);
    return 0;
  }, opts);
  double took = now_s() - start;
  for (int s : status)
    if (s != 0) return -1;
  return took;
}

// Connections that connect and say nothing hold no one up: the root serves
// every connection at once.
TEST(Root, SilentConnectionsDoNotDelayInit) {
  double base = timed_init(0);
  double with_silent = timed_init(3);
  ASSERT_GE(base, 0);
  ASSERT_GE(with_silent, 0) << "init failed beside 3 silent connections";
  printf("4-rank init: %.3f s alone, %.3f s beside 3 silent connections\n", base, with_silent);
  EXPECT_LT(with_silent - base, 1.0);
}

// A client that does not know the secret is sent nothing, not even a refusal,
// by the root or by a rank's listener; the job forms regardless.
TEST(Root, NoSecretGetsNothing) {
  RunOptions opts;
  opts.allow_warnings = true;
  opts.env = {{"WEFT_TIMEOUT", "20"}};
  auto status = run_ranks(2, [](const RankCtx &ctx) {
    struct bootstrap_id b;
    memcpy(&b, ctx.id.internal, sizeof b);
    if (ctx.rank == 1) {
      // a well-formed hello of rank 1 (the real rank 1's place) with a wrong secret
      struct {
        uint32_t magic, version;
        uint8_t secret[BOOTSTRAP_SECRET_BYTES];
        int32_t rank, nranks;
        struct peer_info info;
      } h;
      memset(&h, 0, sizeof h);
      h.magic = b.magic;
      h.version = 2;
      memcpy(h.secret, b.secret, sizeof h.secret);
      h.secret[7] ^= 1;
      h.rank = 1;
      h.nranks = 2;
      int fd = silent_connection(b.root);
      if (fd < 0 || write(fd, &h, sizeof h) != (ssize_t)sizeof h)
        return rank_fail(ctx, "connect to the root");
      bool closed;
      ssize_t n = bytes_received(fd, 3, &closed);
      close(fd);
      if (n != 0 || !closed)
        return rank_fail(ctx, "root sent %zd bytes to a wrong secret%s", n,
                         closed ? "" : " and kept the connection");
    }
    weftComm_t comm;
    if (weftCommInitRank(&comm, 2, ctx.id, ctx.rank) != weftSuccess)
      return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
    // the same at the other rank's listener, with a point-to-point header
    const peer_info &peer = comm->peers[1 - ctx.rank];
    struct {
      uint32_t magic;
      int32_t from;
      uint32_t tag, nbytes;
      uint8_t secret[BOOTSTRAP_SECRET_BYTES];
    } ph = {0x77667470u, ctx.rank, 1, 0, {}};
    int fd = silent_connection(peer.listen_addr);
    if (fd < 0 || write(fd, &ph, sizeof ph) != (ssize_t)sizeof ph)
      return rank_fail(ctx, "connect to rank %d's listener", 1 - ctx.rank);
    bool closed;  // served only while the rank waits for a message: it may stay open
    ssize_t n = bytes_received(fd, 0.5, &closed);
    close(fd);
    if (n != 0) return rank_fail(ctx, "listener sent %zd bytes to a wrong secret", n);
    return sum_two_and_destroy(ctx, comm, "allreduce");
  }, opts);
  EXPECT_EQ(status[0], 0);
  EXPECT_EQ(status[1], 0);
}

// Idle connections to a running job's listeners do not hold up the
// point-to-point set-up that goes through those listeners.
TEST(Listener, IdleConnectionsDoNotBreakP2pSetup) {
  RunOptions opts;
  opts.allow_warnings = true;
  opts.env = {{"WEFT_TIMEOUT", "30"}};
  const int nranks = 3;
  auto status = run_ranks(nranks, [](const RankCtx &ctx) {
    weftComm_t comm;
    if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
      return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
    std::vector<int> fds;
    for (int p = 0; p < ctx.nranks; p++)
      for (int i = 0; i < 5 && p != ctx.rank; i++) {
        int fd = silent_connection(comm->peers[p].listen_addr);
        if (fd < 0) return rank_fail(ctx, "connect to rank %d's listener", p);
        fds.push_back(fd);
      }
    int bar = 0;  // every rank's idle connections are in before the set-up
    if (weftAllReduce(&bar, &bar, 1, weftInt32, weftSum, comm, nullptr) != weftSuccess)
      return rank_fail(ctx, "barrier");
    // every pair exchanges, in both directions: set-up of all p2p connections
    const size_t count = 1000;
    std::vector<int32_t> out(count), in(count * ctx.nranks, -1);
    for (size_t i = 0; i < count; i++) out[i] = ctx.rank * 100000 + (int)i;
    double start = now_s();
    weftGroupStart();
    for (int p = 0; p < ctx.nranks; p++) {
      if (p == ctx.rank) continue;
      weftSend(out.data(), count, weftInt32, p, comm, nullptr);
      weftRecv(in.data() + count * p, count, weftInt32, p, comm, nullptr);
    }
    if (weftGroupEnd() != weftSuccess)
      return rank_fail(ctx, "p2p beside idle connections: %s", weftGetLastError(comm));
    double took = now_s() - start;
    for (int p = 0; p < ctx.nranks; p++)
      for (size_t i = 0; i < count && p != ctx.rank; i++)
        if (in[count * p + i] != p * 100000 + (int)i) return rank_fail(ctx, "wrong data from %d", p);
    // well under one hello deadline (5 s): nothing waited for a silent peer
    if (took > 3.0) return rank_fail(ctx, "p2p set-up took %.2f s", took);
    weftCommDestroy(comm);
    for (int fd : fds) close(fd);
    return 0;
  }, opts);
  for (int r = 0; r < nranks; r++) EXPECT_EQ(status[r], 0) << "rank " << r;
}

// A listener's unproven connections, served as bootstrap's listeners are:
// SOCK_HELLOS_MAX idle connections taken in, then one more that writes its
// 8-byte hello at once. hellos_fill leaves hs full and *lfd listening.
size_t eight_bytes(const uint8_t *, size_t, void *) { return 8; }

struct HelloServe {
  int fd = -1;
  uint8_t buf[SOCK_HELLO_MAX_NBYTES];
  size_t got = 0;
};

weftResult_t hellos_serve(struct sock_hellos *hs, int lfd, double seconds, HelloServe *out) {
  return sock_hellos_next(hs, lfd, 20000000000ull, eight_bytes, nullptr,
                          clock_ns() + (uint64_t)(seconds * 1e9), nullptr, &out->fd, out->buf,
                          &out->got);
}

void hellos_fill(struct sock_hellos *hs, int *lfd, union weft_sockaddr *bound,
                 std::vector<int> *idle) {
  union weft_sockaddr any;
  ASSERT_EQ(sock_resolve("127.0.0.1", 0, &any), weftSuccess);
  ASSERT_EQ(sock_listen(&any, lfd, bound), weftSuccess);
  for (int i = 0; i < SOCK_HELLOS_MAX; i++) {
    int fd = silent_connection(*bound);
    ASSERT_GE(fd, 0);
    idle->push_back(fd);
  }
  HelloServe none;
  ASSERT_EQ(hellos_serve(hs, *lfd, 0.3, &none), weftInProgress);
  ASSERT_EQ(hs->n, SOCK_HELLOS_MAX);
}

// Idle connections that have just connected may be peers between their
// connect and their first write (a loaded machine deschedules them): a full
// listener lets none of them go for the one more that comes; it waits in the
// backlog, and an idle one's hello is taken when it writes (a reset here
// failed a 32-rank set-up in a loaded run). Past SOCK_HELLO_GRACE_NS the
// oldest idle one goes, so strangers cannot hold the listener.
TEST(Listener, FullListenerKeepsYoungIdleConnections) {
  struct sock_hellos *hs = (struct sock_hellos *)calloc(1, sizeof *hs);
  int lfd = -1;
  union weft_sockaddr bound;
  std::vector<int> idle;
  hellos_fill(hs, &lfd, &bound, &idle);
  int late = silent_connection(bound);
  ASSERT_GE(late, 0);
  ASSERT_EQ(write(late, "latelate", 8), 8);
  HelloServe got;
  EXPECT_EQ(hellos_serve(hs, lfd, 0.3, &got), weftInProgress)
      << "a young idle connection was let go for a later one";
  ASSERT_EQ(write(idle[0], "first!!!", 8), 8);
  ASSERT_EQ(hellos_serve(hs, lfd, 2, &got), weftSuccess);
  EXPECT_EQ(std::string((char *)got.buf, got.got), "first!!!");
  close(got.fd);
  sock_hellos_close(hs);
  close(lfd);
  for (int fd : idle) close(fd);
  close(late);
  idle.clear();

  memset(hs, 0, sizeof *hs);
  hellos_fill(hs, &lfd, &bound, &idle);
  usleep(SOCK_HELLO_GRACE_NS / 1000 + 100000);
  late = silent_connection(bound);
  ASSERT_GE(late, 0);
  ASSERT_EQ(write(late, "latelate", 8), 8);
  ASSERT_EQ(hellos_serve(hs, lfd, 2, &got), weftSuccess);
  EXPECT_EQ(std::string((char *)got.buf, got.got), "latelate");
  close(got.fd);
  bool closed;
  bytes_received(idle[0], 0.5, &closed);
  EXPECT_TRUE(closed) << "the oldest idle connection, past its grace, was kept";
  sock_hellos_close(hs);
  close(lfd);
  for (int fd : idle) close(fd);
  close(late);
  free(hs);
}

// A connection taken in whose hello (and message) arrived while nobody
// served the listener is read, not reset, when the listener is served after
// its deadline: two peers' hellos taken in by one serve, which returns the
// first; the second is read past the deadline (a reset lost a peer's
// set-up message on a loaded machine, and the next message of its tag was
// taken for it). A silent one past its deadline still goes.
TEST(Listener, HelloThatArrivedIsReadPastItsDeadline) {
  struct sock_hellos *hs = (struct sock_hellos *)calloc(1, sizeof *hs);
  union weft_sockaddr any, bound;
  int lfd = -1;
  ASSERT_EQ(sock_resolve("127.0.0.1", 0, &any), weftSuccess);
  ASSERT_EQ(sock_listen(&any, &lfd, &bound), weftSuccess);
  int a = silent_connection(bound), b = silent_connection(bound), quiet = silent_connection(bound);
  ASSERT_GE(a, 0);
  ASSERT_GE(b, 0);
  ASSERT_GE(quiet, 0);
  ASSERT_EQ(write(a, "first!!!", 8), 8);
  ASSERT_EQ(write(b, "second!!", 8), 8);
  const uint64_t deadline_ns = 100000000ull; /* 100 ms */
  HelloServe got;
  ASSERT_EQ(sock_hellos_next(hs, lfd, deadline_ns, eight_bytes, nullptr, clock_ns() + 2000000000ull,
                             nullptr, &got.fd, got.buf, &got.got),
            weftSuccess);
  EXPECT_EQ(std::string((char *)got.buf, got.got), "first!!!");
  close(got.fd);
  ASSERT_EQ(hs->n, 2) << "the second hello and the silent connection are taken in";
  usleep(300000); /* past their deadlines, nobody serving */
  got = HelloServe();
  ASSERT_EQ(sock_hellos_next(hs, lfd, deadline_ns, eight_bytes, nullptr, clock_ns() + 500000000ull,
                             nullptr, &got.fd, got.buf, &got.got),
            weftSuccess)
      << "a hello that had arrived was dropped at its deadline";
  EXPECT_EQ(std::string((char *)got.buf, got.got), "second!!");
  close(got.fd);
  EXPECT_EQ(hs->n, 0) << "the silent connection past its deadline was kept";
  bool closed;
  bytes_received(quiet, 0.5, &closed);
  EXPECT_TRUE(closed) << "the silent connection past its deadline was not let go";
  sock_hellos_close(hs);
  close(lfd);
  close(a);
  close(b);
  close(quiet);
  free(hs);
}

int sh_quiet(const std::string &cmd) { return system((cmd + " >/dev/null 2>&1").c_str()); }

// TCP sockets in TIME_WAIT in this process's network namespace.
int time_wait_count() {
  int n = 0;
  for (const char *path : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    FILE *f = fopen(path, "r");
    if (f == nullptr) continue;
    char line[512];
    while (fgets(line, sizeof line, f) != nullptr) {
      unsigned st = 0;
      if (sscanf(line, " %*d: %*s %*s %x", &st) == 1 && st == 0x06) n++;
    }
    fclose(f);
  }
  return n;
}

// Communicators made and destroyed over and over (a split, a point-to-point
// exchange on it, destroy) must not use up the host's ports: what lingers in
// TIME_WAIT must not block the next connections and listeners. Run in a
// network namespace of its own whose ephemeral range is 400 ports, so a
// bounded loop of 600 cycles would exhaust it if each cycle held one.
TEST(Ports, SplitAndP2pChurnDoesNotExhaustPorts) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to create a network namespace";
  if (sh_quiet("command -v ip") != 0) GTEST_SKIP() << "needs the ip tool (iproute2)";
  const std::string ns = "weft-ports-" + std::to_string(getpid() % 100000);
  if (sh_quiet("ip netns add " + ns) != 0 ||
      sh_quiet("ip netns exec " + ns + " ip link set lo up") != 0 ||
      sh_quiet("ip netns exec " + ns +
               " sh -c 'echo 40000 40399 >/proc/sys/net/ipv4/ip_local_port_range'") != 0) {
    sh_quiet("ip netns del " + ns);
    GTEST_SKIP() << "could not create a network namespace with a small port range";
  }
  const int cycles = 600;
  RunOptions opts;
  opts.timeout_s = 240;
  opts.netns = {ns, ns};
  opts.env = {{"WEFT_TIMEOUT", "20"}};
  double start = now_s();
  auto status = run_ranks(2, [&](const RankCtx &ctx) {
    weftComm_t comm;
    if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
      return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
    for (int c = 0; c < cycles; c++) {
      weftComm_t sub;
      if (weftCommSplit(comm, 0, ctx.rank, &sub, nullptr) != weftSuccess)
        return rank_fail(ctx, "cycle %d: split: %s (%d in TIME_WAIT)", c,
                         weftGetLastError(comm), time_wait_count());
      int out = c * 10 + ctx.rank, in = -1, peer = 1 - ctx.rank;
      weftGroupStart();
      weftSend(&out, 1, weftInt32, peer, sub, nullptr);
      weftRecv(&in, 1, weftInt32, peer, sub, nullptr);
      if (weftGroupEnd() != weftSuccess)
        return rank_fail(ctx, "cycle %d: p2p: %s (%d in TIME_WAIT)", c, weftGetLastError(sub),
                         time_wait_count());
      if (in != c * 10 + peer) return rank_fail(ctx, "cycle %d: got %d", c, in);
      if (weftCommDestroy(sub) != weftSuccess) return rank_fail(ctx, "cycle %d: destroy", c);
    }
    if (ctx.rank == 0) printf("%d sockets in TIME_WAIT after %d cycles\n", time_wait_count(), cycles);
    weftCommDestroy(comm);
    return 0;
  }, opts);
  double took = now_s() - start;
  sh_quiet("ip netns del " + ns);
  printf("%d split + p2p cycles in %.1f s\n", cycles, took);
  EXPECT_EQ(status[0], 0);
  EXPECT_EQ(status[1], 0);
}

// --- the root's file descriptors ------------------------------------------

// A job of nranks processes whose unique id (so its root, which holds a
// connection per rank until all have joined) comes from a process whose
// RLIMIT_NOFILE is lowered to soft and hard. Returns each rank's init error,
// "" where it joined; "no result" where a rank said nothing.
std::vector<std::string> join_under_root_limit(int nranks, rlim_t soft, rlim_t hard) {
  struct Result {
    int rank;
    char text[1000];
  };
  static_assert(sizeof(Result) <= PIPE_BUF, "a result is written at once");
  int results[2], ids[2];
  if (pipe2(results, O_CLOEXEC) != 0 || pipe2(ids, O_CLOEXEC) != 0) return {};
  fflush(stdout);
  fflush(stderr);
  pid_t id_proc = fork();
  if (id_proc == 0) {
    setenv("WEFT_TIMEOUT", "20", 1);
    alarm(60);
    close(results[0]);
    for (int rank = 0; rank < nranks; rank++) {
      if (fork() != 0) continue;
      alarm(60);
      close(ids[1]);
      weftUniqueId id;
      Result res{rank, {0}};
      int ok = read(ids[0], &id, sizeof id) == (ssize_t)sizeof id;  // one id in one read
      weftComm_t comm;
      if (!ok) snprintf(res.text, sizeof res.text, "no id");
      else if (weftCommInitRank(&comm, nranks, id, rank) != weftSuccess)
        snprintf(res.text, sizeof res.text, "%s", weftGetLastError(nullptr));
      if (write(results[1], &res, sizeof res) != (ssize_t)sizeof res) _exit(1);
      if (ok && res.text[0] == '\0') weftCommDestroy(comm);
      _exit(0);
    }
    close(results[1]);
    close(ids[0]);
    struct rlimit low = {soft, hard};  // the ranks keep theirs
    if (setrlimit(RLIMIT_NOFILE, &low) != 0) _exit(2);
    weftUniqueId id;
    if (weftGetUniqueId(&id) != weftSuccess) _exit(3);
    for (int rank = 0; rank < nranks; rank++)
      if (write(ids[1], &id, sizeof id) != (ssize_t)sizeof id) _exit(4);
    close(ids[1]);
    while (wait(nullptr) > 0) {
    }
    _exit(0);
  }
  close(results[1]);
  close(ids[0]);
  close(ids[1]);
  std::vector<std::string> texts(nranks, "no result");
  Result res;
  while (read(results[0], &res, sizeof res) == (ssize_t)sizeof res)
    if (res.rank >= 0 && res.rank < nranks) texts[res.rank] = res.text;
  close(results[0]);
  int ws = 0;
  waitpid(id_proc, &ws, 0);
  EXPECT_TRUE(WIFEXITED(ws) && WEXITSTATUS(ws) == 0) << "the id's process: " << ws;
  return texts;
}

// The id's process starts with a soft limit of 16 descriptors, under what a
// root for 24 ranks holds: it raises its soft limit toward the hard one,
// and every rank joins (before, ranks failed with "the root gave up" or
// "the unique id's secret is not the root's").
TEST(RootDescriptors, SoftLimitIsRaised) {
  struct rlimit rl;
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &rl), 0);
  if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < 256)
    GTEST_SKIP() << "the hard RLIMIT_NOFILE is " << rl.rlim_max << ", under 256";
  const int nranks = 24;
  auto texts = join_under_root_limit(nranks, 16, rl.rlim_max);
  ASSERT_EQ((int)texts.size(), nranks);
  for (int r = 0; r < nranks; r++) EXPECT_EQ(texts[r], "") << "rank " << r;
}

// The id's process has a hard limit of 16 descriptors: every rank must learn
// that the root is out of them, with the numbers, instead of a dropped
// connection read as a wrong secret or a root that gave up.
TEST(RootDescriptors, HardLimitIsToldToEveryRank) {
  const int nranks = 24;
  auto texts = join_under_root_limit(nranks, 16, 16);
  ASSERT_EQ((int)texts.size(), nranks);
  for (int r = 0; r < nranks; r++) {
    EXPECT_NE(texts[r].find("is out of file descriptors: 24 ranks need "), std::string::npos)
        << "rank " << r << ": " << texts[r];
    EXPECT_NE(texts[r].find("RLIMIT_NOFILE is 16 (hard limit 16)"), std::string::npos)
        << "rank " << r << ": " << texts[r];
  }
  printf("rank 0: %s\n", texts[0].c_str());
}

}  // namespace
