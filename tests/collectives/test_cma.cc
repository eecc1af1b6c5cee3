// Single-copy collectives (cross-memory attach) over forked ranks: all-reduce,
// all-gather and reduce-scatter with every datatype and op, odd counts and
// counts of several pieces, in place and out of place; the tuner's choice;
// and the fall-back to the ring when a rank may not be read.
#include <gtest/gtest.h>
#include <linux/capability.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "coll_check.h"
#include "harness.h"
extern "C" {
#include "collectives/comm.h"
#include "collectives/plan.h"
}

using namespace weft_test;

namespace {

const uint8_t kPoison = 0x5a;

#define FAIL_IF(cond, ...)                         \
  do {                                             \
    if (cond) return rank_fail(ctx, __VA_ARGS__); \
  } while (0)

int cma_allgather(const RankCtx &ctx, weftComm_t comm, weftDataType_t t, size_t count,
                  bool in_place, uint64_t seed) {
  const int n = ctx.nranks, me = ctx.rank;
  const size_t block = count * weftTypeSize(t);
  std::vector<std::vector<uint8_t>> in;
  for (int r = 0; r < n; r++) in.push_back(make_input(t, weftSum, count, seed, r));
  std::vector<uint8_t> out(n * block + 64, kPoison);
  if (in_place) memcpy(out.data() + me * block, in[me].data(), block);
  const void *src = in_place ? out.data() + me * block : in[me].data();
  weftResult_t res = weftAllGather(src, out.data(), count, t, comm, nullptr);
  FAIL_IF(res != weftSuccess, "allgather: %s", weftGetLastError(comm));
  for (int r = 0; r < n; r++)
    FAIL_IF(memcmp(out.data() + r * block, in[r].data(), block) != 0,
            "allgather %s count %zu %s: block of rank %d differs", type_name(t), count,
            in_place ? "in place" : "out of place", r);
  for (size_t i = n * block; i < out.size(); i++)
    FAIL_IF(out[i] != kPoison, "allgather wrote past the end");
  return 0;
}

int cma_reducescatter(const RankCtx &ctx, weftComm_t comm, weftDataType_t t, weftRedOp_t op,
                      size_t count, bool in_place, uint64_t seed) {
  const int n = ctx.nranks, me = ctx.rank;
  const size_t block = count * weftTypeSize(t);
  std::vector<std::vector<uint8_t>> in;
  for (int r = 0; r < n; r++) in.push_back(make_input(t, op, count * n, seed, r));
  std::vector<uint8_t> send = in[me], out(block + 64, kPoison);
  void *dst = in_place ? send.data() + me * block : out.data();
  weftResult_t res = weftReduceScatter(send.data(), dst, count, t, op, comm, nullptr);
  FAIL_IF(res != weftSuccess, "reducescatter: %s", weftGetLastError(comm));
  std::vector<std::vector<uint8_t>> mine;
  for (int r = 0; r < n; r++)
    mine.emplace_back(in[r].begin() + me * block, in[r].begin() + (me + 1) * block);
  std::string why;
  FAIL_IF(!check_reduction(t, op, mine, dst, count, &why), "reducescatter %s %s count %zu %s: %s",
          type_name(t), op_name(op), count, in_place ? "in place" : "out of place", why.c_str());
  if (!in_place) {
    FAIL_IF(send != in[me], "reducescatter modified sendbuff");
    for (size_t i = block; i < out.size(); i++)
      FAIL_IF(out[i] != kPoison, "reducescatter wrote past the end");
  }
  return 0;
}

// Every type and op at small odd counts, then counts of several 256 KiB
// pieces for a few types.
int cma_everything(const RankCtx &ctx, weftComm_t comm, uint64_t seed) {
  const size_t small[] = {1, 3, 1009};
  int rc = 0;
  for (int t = 0; t < weftNumTypes && rc == 0; t++)
    for (size_t count : small)
      for (int ip = 0; ip < 2 && rc == 0; ip++) {
        rc = cma_allgather(ctx, comm, (weftDataType_t)t, count, ip, seed + t * 10 + ip);
        for (int op = 0; op < weftNumOps && rc == 0; op++) {
          uint64_t s = seed + t * 1000 + op * 100 + count + ip;
          rc = check_allreduce(ctx, comm, (weftDataType_t)t, (weftRedOp_t)op, count, ip, s);
          if (rc == 0)
            rc = cma_reducescatter(ctx, comm, (weftDataType_t)t, (weftRedOp_t)op, count, ip, s);
        }
      }
  const weftDataType_t large_types[] = {weftFloat32, weftBfloat16, weftInt64};
  for (weftDataType_t t : large_types)
    for (int ip = 0; ip < 2 && rc == 0; ip++) {
      const size_t count = 150001;  // several pieces, not a multiple of anything
      rc = check_allreduce(ctx, comm, t, weftSum, count, ip, seed + 7 + ip);
      if (rc == 0) rc = check_allreduce(ctx, comm, t, weftAvg, count, ip, seed + 9 + ip);
      if (rc == 0) rc = cma_reducescatter(ctx, comm, t, weftMax, count / 3, ip, seed + 11 + ip);
      if (rc == 0) rc = cma_allgather(ctx, comm, t, count / 2, ip, seed + 13 + ip);
    }
  return rc;
}

class Cma : public testing::TestWithParam<int> {};

TEST_P(Cma, EveryCollectiveTypeOpCountPlacement) {
  const int nranks = GetParam();
  const uint64_t seed = test_seed();
  RunOptions opts;
  opts.env = {{"WEFT_ALGO", "cma"}, {"WEFT_TIMEOUT", "60"}};
  auto status = run_ranks(nranks, [&](const RankCtx &ctx) {
    weftComm_t comm;
    if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
      return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
    int rc = cma_everything(ctx, comm, seed);
    if (rc == 0 && ((weftComm *)comm)->cma_state != 1)
      rc = rank_fail(ctx, "cross-memory attach was not used (state %d)",
                     ((weftComm *)comm)->cma_state);
    weftCommDestroy(comm);
    return rc;
  }, opts);
  for (int r = 0; r < nranks; r++) EXPECT_EQ(status[r], 0) << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(Ranks, Cma, testing::Values(2, 3, 4),
                         [](const testing::TestParamInfo<int> &i) {
                           return "ranks" + std::to_string(i.param);
                         });

// The tuner takes cma from WEFT_CMA_MIN_NBYTES up on one host, and never
// where WEFT_ALGO excludes it.
TEST(CmaTuner, PicksFromThresholdUnlessExcluded) {
  for (const char *algo : {"", "^cma"}) {
    RunOptions opts;
    opts.env = {{"WEFT_ALGO", algo}, {"WEFT_CMA_MIN_NBYTES", "1M"}};
    auto status = run_ranks(2, [&](const RankCtx &ctx) {
      weftComm_t comm;
      if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
        return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
      const bool allowed = algo[0] == '\0';
      int rc = 0;
      for (enum coll_kind c : {COLL_ALLREDUCE, COLL_ALLGATHER, COLL_REDUCESCATTER, COLL_BROADCAST})
        for (size_t count : {size_t(1000), size_t(1) << 20}) {
          weft_plan p;
          memset(&p, 0, sizeof p);
          p.coll = c;
          p.count = count;
          p.datatype = weftFloat32;
          p.op = weftSum;
          plan_tune((weftComm *)comm, &p);
          const bool want = allowed && c != COLL_BROADCAST && count > 1000;
          if ((p.algo == ALGO_CMA) != want)
            rc = rank_fail(ctx, "WEFT_ALGO='%s' %s count %zu: algo %s", algo, coll_kind_name(c),
                           count, tuner_algo_name(p.algo));
        }
      weftCommDestroy(comm);
      return rc;
    }, opts);
    for (int r = 0; r < 2; r++) EXPECT_EQ(status[r], 0) << "rank " << r << " WEFT_ALGO=" << algo;
  }
}

// Gives up CAP_SYS_PTRACE (root has it), so that ptrace rules apply to us.
void drop_ptrace_capability() {
  struct __user_cap_header_struct head = {_LINUX_CAPABILITY_VERSION_3, 0};
  struct __user_cap_data_struct data[2];
  if (syscall(SYS_capget, &head, data) != 0) return;
  data[CAP_SYS_PTRACE / 32].effective &= ~(1u << (CAP_SYS_PTRACE % 32));
  syscall(SYS_capset, &head, data);
}

// A rank that may not be read (not dumpable, and readers without
// CAP_SYS_PTRACE: ptrace rules refuse them): every rank agrees to run the
// ring, and the results are still right.
TEST(CmaFallback, UnreadableRankRunsTheRing) {
  const uint64_t seed = test_seed();
  RunOptions opts;
  opts.env = {{"WEFT_ALGO", "cma"}, {"WEFT_TIMEOUT", "60"}};
  auto status = run_ranks(3, [&](const RankCtx &ctx) {
    drop_ptrace_capability();
    if (ctx.rank == 1) prctl(PR_SET_DUMPABLE, 0);
    weftComm_t comm;
    if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
      return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
    int rc = 0;
    for (int ip = 0; ip < 2 && rc == 0; ip++) {
      rc = check_allreduce(ctx, comm, weftFloat32, weftSum, 100003, ip, seed + ip);
      if (rc == 0) rc = cma_allgather(ctx, comm, weftInt32, 5001, ip, seed + 2 + ip);
      if (rc == 0) rc = cma_reducescatter(ctx, comm, weftFloat64, weftMin, 777, ip, seed + 4 + ip);
    }
    if (rc == 0 && ((weftComm *)comm)->cma_state != -1)
      rc = rank_fail(ctx, "cma state %d, want -1 (refused)", ((weftComm *)comm)->cma_state);
    weftCommDestroy(comm);
    return rc;
  }, opts);
  for (int r = 0; r < 3; r++) EXPECT_EQ(status[r], 0) << "rank " << r;
}

}  // namespace
