// All-reduce over forked ranks and shared memory: every datatype and op, odd
// counts, many chunks, in-place and out-of-place, against a reference.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "coll_ref.h"
#include "harness.h"

using namespace weft_test;

namespace {

struct AllReduceCase {
  int nranks;
  int nchannels;
  int slot_nbytes;  // small slots reach the multi-chunk and multi-loop paths
  int nslots;
};

std::string case_name(const testing::TestParamInfo<AllReduceCase> &info) {
  const AllReduceCase &c = info.param;
  return "ranks" + std::to_string(c.nranks) + "_ch" + std::to_string(c.nchannels) + "_slot" +
         std::to_string(c.slot_nbytes) + "x" + std::to_string(c.nslots);
}

class AllReduce : public testing::TestWithParam<AllReduceCase> {};

// The cross product: every datatype x op x count x placement (above 5 ranks,
// TypeOpPairs' sample of the datatype x op pairs). Counts: 0, 1, fewer than the
// ranks, a prime, and primes spanning many slots and loops.
TEST_P(AllReduce, EveryTypeOpCountPlacement) {
  const AllReduceCase c = GetParam();
  const uint64_t seed = test_seed();
  const TypeOpPairs pairs(seed, c.nranks, 5);
  printf("%s\n", pairs.describe().c_str());
  RunOptions opts;
  opts.timeout_s = 240;
  opts.env = {{"WEFT_NCHANNELS", std::to_string(c.nchannels)},
              {"WEFT_SLOT_BYTES", std::to_string(c.slot_nbytes)},
              {"WEFT_NSLOTS", std::to_string(c.nslots)},
              {"WEFT_TIMEOUT", "60"}};
  auto status = run_ranks(c.nranks, [&](const RankCtx &ctx) {
    weftComm_t comm;
    if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
      return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
    const size_t counts[] = {0, 1, 3, 1009, 4099};
    int rc = 0;
    for (int t = 0; t < weftNumTypes && rc == 0; t++)
      for (int op = 0; op < weftNumOps && rc == 0; op++)
        for (size_t ci = 0; pairs(t, op) && ci < sizeof counts / sizeof counts[0] && rc == 0; ci++)
          for (int in_place = 0; in_place < 2 && rc == 0; in_place++)
            rc = check_allreduce(ctx, comm, (weftDataType_t)t, (weftRedOp_t)op, counts[ci], in_place,
                           seed + (uint64_t)(t * 1000 + op * 100 + ci * 10 + in_place));
    weftCommDestroy(comm);
    return rc;
  }, opts);
  for (int r = 0; r < c.nranks; r++) EXPECT_EQ(status[r], 0) << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(Ranks, AllReduce,
                         testing::Values(AllReduceCase{1, 1, 256, 4}, AllReduceCase{2, 1, 256, 4},
                                         AllReduceCase{3, 1, 192, 2}, AllReduceCase{4, 2, 256, 4},
                                         AllReduceCase{5, 1, 320, 3}, AllReduceCase{8, 1, 512, 4},
                                         AllReduceCase{2, 1, 131072, 8},
                                         AllReduceCase{3, 3, 64, 2}, AllReduceCase{6, 2, 128, 2},
                                         AllReduceCase{7, 1, 192, 3}, AllReduceCase{16, 2, 256, 2}),
                         case_name);

// Large buffers with the default slots: the path real jobs take.
TEST(AllReduceLarge, DefaultSlotsFloatAndBf16) {
  const uint64_t seed = test_seed();
  RunOptions opts;
  opts.timeout_s = 120;
  for (int nranks : {2, 3}) {
    auto status = run_ranks(nranks, [&](const RankCtx &ctx) {
      weftComm_t comm;
      if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
        return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
      int rc = check_allreduce(ctx, comm, weftFloat32, weftSum, (3 << 20) + 17, false, seed);
      if (rc == 0) rc = check_allreduce(ctx, comm, weftBfloat16, weftAvg, (1 << 20) + 3, true, seed);
      if (rc == 0) rc = check_allreduce(ctx, comm, weftInt64, weftMax, 700001, false, seed);
      weftCommDestroy(comm);
      return rc;
    }, opts);
    for (int r = 0; r < nranks; r++) EXPECT_EQ(status[r], 0) << nranks << " ranks, rank " << r;
  }
}

// Several ranks in one process: CommInitAll plus a group drives them all.
TEST(AllReduceInitAll, GroupOverThreads) {
  const int n = 4;
  const size_t count = 10007;
  weftComm_t comms[n];
  ASSERT_EQ(weftCommInitAll(comms, n, nullptr), weftSuccess) << weftGetLastError(nullptr);
  std::string why;
  EXPECT_TRUE(weft_test::group_allreduce_check(comms, n, count, 7, &why)) << why;
  for (int r = 0; r < n; r++) {
    int rank = -1, nranks = -1, dev = 0;
    EXPECT_EQ(weftCommUserRank(comms[r], &rank), weftSuccess);
    EXPECT_EQ(weftCommCount(comms[r], &nranks), weftSuccess);
    EXPECT_EQ(weftCommCuDevice(comms[r], &dev), weftSuccess);
    EXPECT_EQ(rank, r);
    EXPECT_EQ(nranks, n);
    EXPECT_EQ(dev, -1);
  }
  for (int r = 0; r < n; r++) {
    EXPECT_EQ(weftCommFinalize(comms[r]), weftSuccess);
    EXPECT_EQ(weftCommDestroy(comms[r]), weftSuccess);
  }
}

}  // namespace
