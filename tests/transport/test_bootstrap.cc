// Bootstrap from launcher environments, and a root that drops strangers.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "harness.h"

extern "C" {
#include "transport/bootstrap.h"
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

// Each rank sets its launcher's variables, joins, and checks an all-reduce
// of rank numbers.
int join_and_check(const RankCtx &ctx, const std::vector<std::pair<std::string, std::string>> &vars) {
  for (const auto &kv : vars) setenv(kv.first.c_str(), kv.second.c_str(), 1);
  weftComm_t comm;
  if (weftCommInitFromEnv(&comm, nullptr) != weftSuccess)
    return rank_fail(ctx, "init from env: %s", weftGetLastError(nullptr));
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
  opts.env = {{"WEFT_TIMEOUT", "20"}};
  auto status = run_ranks(nranks, [&](const RankCtx &ctx) {
    std::vector<std::pair<std::string, std::string>> vars = {
        {l.rank_var, std::to_string(ctx.rank)}, {l.size_var, std::to_string(ctx.nranks)}};
    if (l.torch_address) {
      vars.push_back({"MASTER_ADDR", "127.0.0.1"});
      vars.push_back({"MASTER_PORT", std::to_string(port)});
    } else {
      vars.push_back({"WEFT_COMM_ID", "127.0.0.1:" + std::to_string(port)});
    }
    return join_and_check(ctx, vars);
  }, opts);
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
TEST(FromEnvUniqueId, HexId) {
  auto status = run_ranks(2, [](const RankCtx &ctx) {
    static const char *hex = "0123456789abcdef";
    std::string s;
    for (size_t i = 0; i < sizeof ctx.id.internal; i++) {
      unsigned char b = (unsigned char)ctx.id.internal[i];
      s += hex[b >> 4];
      s += hex[b & 15];
    }
    return join_and_check(ctx, {{"WEFT_RANK", std::to_string(ctx.rank)},
                                {"WEFT_NRANKS", "2"},
                                {"WEFT_UNIQUE_ID", s}});
  });
  EXPECT_EQ(status[0], 0);
  EXPECT_EQ(status[1], 0);
}

// Different WEFT_SECRETs: the ranks cannot form a job.
TEST(FromEnvSecret, DifferentSecretsAreRefused) {
  const int port = free_port();
  RunOptions opts;
  opts.allow_warnings = true;
  opts.env = {{"WEFT_TIMEOUT", "3"}};
  auto status = run_ranks(2, [&](const RankCtx &ctx) {
    setenv("WEFT_RANK", std::to_string(ctx.rank).c_str(), 1);
    setenv("WEFT_NRANKS", "2", 1);
    setenv("WEFT_COMM_ID", ("127.0.0.1:" + std::to_string(port)).c_str(), 1);
    setenv("WEFT_SECRET", ctx.rank == 0 ? "alpha" : "beta", 1);
    weftComm_t comm;
    weftResult_t res = weftCommInitFromEnv(&comm, nullptr);
    return res == weftSuccess ? rank_fail(ctx, "joined with a wrong secret") : 0;
  }, opts);
  EXPECT_EQ(status[0], 0);
  EXPECT_EQ(status[1], 0);
}

TEST(FromEnvErrors, BadVariables) {
  RunOptions opts;
  auto status = run_ranks(1, [](const RankCtx &ctx) {
    weftComm_t comm;
    setenv("WEFT_RANK", "3", 1);
    setenv("WEFT_NRANKS", "2", 1);
    if (weftCommInitFromEnv(&comm, nullptr) != weftInvalidArgument)
      return rank_fail(ctx, "rank >= size accepted");
    setenv("WEFT_RANK", "1", 1);
    unsetenv("WEFT_UNIQUE_ID");
    unsetenv("WEFT_COMM_ID");
    unsetenv("MASTER_ADDR");
    if (weftCommInitFromEnv(&comm, nullptr) != weftInvalidArgument ||
        std::string(weftGetLastError(nullptr)).find("no rendezvous address") == std::string::npos)
      return rank_fail(ctx, "missing address accepted: %s", weftGetLastError(nullptr));
    setenv("WEFT_COMM_ID", "nocolon", 1);
    if (weftCommInitFromEnv(&comm, nullptr) != weftInvalidArgument)
      return rank_fail(ctx, "bad WEFT_COMM_ID accepted");
    // no launcher at all: a job of one
    unsetenv("WEFT_RANK");
    unsetenv("WEFT_NRANKS");
    unsetenv("WEFT_COMM_ID");
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
    float x = 1, y = 0;
    if (weftAllReduce(&x, &y, 1, weftFloat32, weftSum, comm, nullptr) != weftSuccess || y != 2)
      return rank_fail(ctx, "allreduce after strangers");
    weftCommDestroy(comm);
    return 0;
  }, opts);
  EXPECT_EQ(status[0], 0);
  EXPECT_EQ(status[1], 0);
}

}  // namespace
