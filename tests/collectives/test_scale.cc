// 32 ranks on this machine (many more ranks than cores), on one host and on
// two emulated hosts (WEFT_HOSTID: shm inside a host, sockets between):
// every collective correct, the ring and tree all-reduce both, and the
// communicator's init time printed.
#include <gtest/gtest.h>

#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "coll_ref.h"
#include "harness.h"

extern "C" {
#include "collectives/core/comm.h"
#include "collectives/api/config.h"
#include "collectives/tune/topo_plan.h"
}

using namespace weft_test;

namespace {

struct ScaleCase {
  int nranks;
  int nhosts;
};

std::string case_name(const testing::TestParamInfo<ScaleCase> &info) {
  return "ranks" + std::to_string(info.param.nranks) + "_hosts" +
         std::to_string(info.param.nhosts);
}

#define CHECK_OK(call, ...)                                   \
  do {                                                        \
    if ((call) != weftSuccess) return rank_fail(ctx, __VA_ARGS__); \
  } while (0)

int check_gathers(const RankCtx &ctx, weftComm_t comm, weftDataType_t t, size_t count,
                  uint64_t seed) {
  const int n = ctx.nranks, me = ctx.rank;
  const size_t es = weftTypeSize(t), block = count * es;
  std::vector<std::vector<uint8_t>> in;
  for (int r = 0; r < n; r++) in.push_back(make_input(t, weftSum, count * n, seed, r));
  std::vector<uint8_t> out(block * n + 64, 0xa5);
  std::string why;

  CHECK_OK(weftAllGather(in[me].data(), out.data(), count, t, comm, nullptr), "allgather: %s",
           weftGetLastError(comm));
  for (int r = 0; r < n; r++)
    if (memcmp(out.data() + r * block, in[r].data(), block) != 0)
      return rank_fail(ctx, "allgather %s %zu: block %d wrong", type_name(t), count, r);

  std::vector<std::vector<uint8_t>> mine;
  for (int r = 0; r < n; r++)
    mine.emplace_back(in[r].begin() + me * block, in[r].begin() + (me + 1) * block);
  CHECK_OK(weftReduceScatter(in[me].data(), out.data(), count, t, weftSum, comm, nullptr),
           "reducescatter: %s", weftGetLastError(comm));
  if (!check_reduction(t, weftSum, mine, out.data(), count, &why))
    return rank_fail(ctx, "reducescatter %s %zu: %s", type_name(t), count, why.c_str());

  std::vector<std::vector<uint8_t>> firsts;
  for (int r = 0; r < n; r++) firsts.emplace_back(in[r].begin(), in[r].begin() + block);
  for (int root : {0, n / 2 + 1, n - 1}) {
    CHECK_OK(weftBroadcast(in[me].data(), out.data(), count, t, root, comm, nullptr),
             "broadcast: %s", weftGetLastError(comm));
    if (memcmp(out.data(), in[root].data(), block) != 0)
      return rank_fail(ctx, "broadcast %s %zu root %d wrong", type_name(t), count, root);
    memset(out.data(), 0xa5, out.size());
    CHECK_OK(weftReduce(in[me].data(), out.data(), count, t, weftSum, root, comm, nullptr),
             "reduce: %s", weftGetLastError(comm));
    if (me == root && !check_reduction(t, weftSum, firsts, out.data(), count, &why))
      return rank_fail(ctx, "reduce %s %zu root %d: %s", type_name(t), count, root, why.c_str());
  }

  CHECK_OK(weftAlltoAll(in[me].data(), out.data(), count, t, comm, nullptr), "alltoall: %s",
           weftGetLastError(comm));
  for (int r = 0; r < n; r++)
    if (memcmp(out.data() + r * block, in[r].data() + me * block, block) != 0)
      return rank_fail(ctx, "alltoall %s %zu: block from %d wrong", type_name(t), count, r);
  return 0;
}

// Each rank sends to the ranks 1 and n/2 ahead and receives from those as
// far behind, in one group.
int check_sendrecv(const RankCtx &ctx, weftComm_t comm, size_t count, uint64_t seed) {
  const int n = ctx.nranks, me = ctx.rank;
  const int dist[2] = {1, n / 2};
  std::vector<uint8_t> send[2], recv[2], want[2];
  for (int k = 0; k < 2; k++) {
    send[k] = make_input(weftInt32, weftSum, count, seed + k, me);
    want[k] = make_input(weftInt32, weftSum, count, seed + k, (me - dist[k] + n) % n);
    recv[k].assign(count * 4, 0xa5);
  }
  CHECK_OK(weftGroupStart(), "group start");
  for (int k = 0; k < 2; k++) {
    CHECK_OK(weftSend(send[k].data(), count, weftInt32, (me + dist[k]) % n, comm, nullptr),
             "send: %s", weftGetLastError(comm));
    CHECK_OK(weftRecv(recv[k].data(), count, weftInt32, (me - dist[k] + n) % n, comm, nullptr),
             "recv: %s", weftGetLastError(comm));
  }
  CHECK_OK(weftGroupEnd(), "group end: %s", weftGetLastError(comm));
  for (int k = 0; k < 2; k++)
    if (recv[k] != want[k])
      return rank_fail(ctx, "recv %zu from %d wrong", count, (me - dist[k] + n) % n);
  return 0;
}

// One run of c's ranks, WEFT_ALGO=algo set before they start (a setenv in
// their bodies would race their threads' getenv): init (its time printed),
// the ring's host crossings, then all-reduces under algo, or with algo ""
// (the tuner's choice) the gathers and send/recv.
std::vector<int> run_phase(const ScaleCase &c, const char *algo, uint64_t seed) {
  const std::string job = std::to_string(getpid());
  RunOptions opts;
  opts.timeout_s = 120;
  opts.env = {{"WEFT_TIMEOUT", "60"}, {"WEFT_SLOT_BYTES", "8192"}, {"WEFT_ALGO", algo}};
  // hosts round-robin: the ring must regroup them
  opts.host_of = [&](int rank) { return "scale-" + job + "-" + std::to_string(rank % c.nhosts); };
  return run_ranks(c.nranks, [&](const RankCtx &ctx) {
    weftComm_t comm;
    const double t0 = now_s();
    CHECK_OK(weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank), "init: %s",
             weftGetLastError(nullptr));
    double init_s = now_s() - t0, init_max = 0;
    CHECK_OK(weftAllReduce(&init_s, &init_max, 1, weftFloat64, weftMax, comm, nullptr),
             "allreduce of init times: %s", weftGetLastError(comm));
    if (ctx.rank == 0)
      printf("%d ranks on %d host(s), WEFT_ALGO=%s: init took %.3f s (slowest rank)\n",
             ctx.nranks, c.nhosts, algo, init_max);
    // the ring regrouped the round-robin hosts: it crosses into each host once
    ring_crossings rc;
    ring_count_crossings(comm->peers, ctx.nranks, comm->channels[0].ring, &rc);
    if (rc.hosts != (c.nhosts > 1 ? c.nhosts : 0))
      return rank_fail(ctx, "ring crosses hosts %d times", rc.hosts);
    if (algo[0] != '\0') {
      for (size_t count : {1, 777, 40000}) {
        int rc = check_allreduce(ctx, comm, weftFloat32, weftSum, count, count == 777, seed);
        if (rc == 0) rc = check_allreduce(ctx, comm, weftInt32, weftMax, count, false, seed + 1);
        if (rc != 0) return rank_fail(ctx, "allreduce with %s, count %zu", algo, count);
      }
    } else {
      for (size_t count : {1, 300, 1001}) {
        if (check_gathers(ctx, comm, weftFloat32, count, seed + count) != 0) return 1;
        if (check_sendrecv(ctx, comm, count, seed + count) != 0) return 1;
      }
      if (check_gathers(ctx, comm, weftBfloat16, 129, seed) != 0) return 1;
    }
    CHECK_OK(weftCommDestroy(comm), "destroy");
    return 0;
  }, opts);
}

class Scale : public testing::TestWithParam<ScaleCase> {};

TEST_P(Scale, EveryCollectiveCorrect) {
  const ScaleCase c = GetParam();
  const uint64_t seed = test_seed();
  const double start = now_s();
  for (const char *algo : {"ring", "tree", ""}) {
    std::vector<int> status = run_phase(c, algo, seed);
    for (int r = 0; r < c.nranks; r++)
      EXPECT_EQ(status[r], 0) << "WEFT_ALGO=" << algo << " rank " << r;
  }
  printf("%d ranks on %d host(s): whole run %.1f s\n", c.nranks, c.nhosts, now_s() - start);
}

INSTANTIATE_TEST_SUITE_P(Ranks, Scale, testing::Values(ScaleCase{32, 1}, ScaleCase{32, 2}),
                         case_name);

}  // namespace
