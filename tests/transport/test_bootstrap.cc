// Bootstrap from launcher environments, and listeners that strangers cannot
// stall or learn anything from.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "harness.h"

extern "C" {
#include "collectives/api/comm_lifecycle.h"
#include "transport/bootstrap/bootstrap.h"
#include "transport/base/log.h"
#include "transport/base/sock.h"
#include "transport/base/wait.h"
}

using namespace weft_test;

namespace {

// A port that was free a moment ago on loopback.
int free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, (sockaddr *)&a, sizeof a);
  socklen_t len = sizeof a;
  getsockname(fd, (sockaddr *)&a, &len);
  close(fd);
  return ntohs(a.sin_port);
}

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
    return join_and_check(ctx);
  });
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
    return n == 1 ? 0 : rank_fail(ctx, "size %d", n);
  }, opts);
  EXPECT_EQ(status[0], 0);
}

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

// Opens a TCP connection to addr that never says anything; -1 on failure.
int silent_connection(const union weft_sockaddr &addr) {
  int fd = socket(addr.sa.sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  socklen_t len = addr.sa.sa_family == AF_INET6 ? sizeof addr.in6 : sizeof addr.in;
  if (fd >= 0 && connect(fd, &addr.sa, len) == 0) return fd;
  if (fd >= 0) close(fd);
  return -1;
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

}  // namespace
