// Pre-multiply-sum ops: each rank's input times its own scalar, summed.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "coll_check.h"
#include "harness.h"

using namespace weft_test;

namespace {

template <typename T>
int check_premul(const RankCtx &ctx, weftComm_t comm, weftDataType_t dt,
                 weftScalarResidence_t residence) {
  const int n = ctx.nranks, me = ctx.rank;
  const size_t count = 2003;
  T scalar = (T)(me + 2);
  weftRedOp_t op;
  if (weftRedOpCreatePreMulSum(&op, &scalar, dt, residence, comm) != weftSuccess)
    return rank_fail(ctx, "create: %s", weftGetLastError(comm));
  if ((int)op < weftNumOps) return rank_fail(ctx, "op %d collides with a built-in op", (int)op);
  if (residence == weftScalarHostImmediate) scalar = (T)99;  // copied at creation: no effect
  auto input = [&](int r, size_t i) { return (T)((int)((i * 7 + r * 3) % 11) - 5); };
  std::vector<T> send(count * n), out(count * n, (T)-1);
  for (size_t i = 0; i < send.size(); i++) send[i] = input(me, i);
  auto want = [&](size_t i) {
    double acc = 0;
    for (int r = 0; r < n; r++) acc += (double)(r + 2) * (double)input(r, i);
    return acc;
  };
  // all-reduce and reduce over the first count elements, reduce-scatter over all
  if (weftAllReduce(send.data(), out.data(), count, dt, op, comm, nullptr) != weftSuccess)
    return rank_fail(ctx, "allreduce: %s", weftGetLastError(comm));
  for (size_t i = 0; i < count; i++)
    if (std::fabs((double)out[i] - want(i)) > 1e-6 * (1 + std::fabs(want(i))))
      return rank_fail(ctx, "allreduce element %zu: got %g want %g", i, (double)out[i], want(i));
  if (weftReduceScatter(send.data(), out.data(), count, dt, op, comm, nullptr) != weftSuccess)
    return rank_fail(ctx, "reducescatter: %s", weftGetLastError(comm));
  for (size_t i = 0; i < count; i++)
    if ((double)out[i] != want(me * count + i))
      return rank_fail(ctx, "reducescatter element %zu: got %g", i, (double)out[i]);
  if (weftReduce(send.data(), out.data(), count, dt, op, n - 1, comm, nullptr) != weftSuccess)
    return rank_fail(ctx, "reduce: %s", weftGetLastError(comm));
  for (size_t i = 0; me == n - 1 && i < count; i++)
    if ((double)out[i] != want(i)) return rank_fail(ctx, "reduce element %zu", i);
  // the op belongs to its datatype, and dies with destroy
  if (weftAllReduce(send.data(), out.data(), 4, weftUint8, op, comm, nullptr) != weftInvalidArgument)
    return rank_fail(ctx, "op accepted with another datatype");
  if (weftRedOpDestroy(op, comm) != weftSuccess) return rank_fail(ctx, "destroy");
  if (weftAllReduce(send.data(), out.data(), 4, dt, op, comm, nullptr) != weftInvalidArgument)
    return rank_fail(ctx, "destroyed op accepted");
  if (weftRedOpDestroy(op, comm) != weftInvalidArgument) return rank_fail(ctx, "double destroy");
  return 0;
}

TEST(PreMulSum, PerRankScalarsEveryResidence) {
  for (int nranks : {1, 3, 4}) {
    RunOptions opts;
    opts.env = {{"WEFT_SLOT_BYTES", "512"}};
    auto status = run_ranks(nranks, [](const RankCtx &ctx) {
      weftComm_t comm;
      if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
        return rank_fail(ctx, "init");
      for (weftScalarResidence_t res : {weftScalarHostImmediate, weftScalarDevice}) {
        if (int rc = check_premul<float>(ctx, comm, weftFloat32, res)) return rc;
        if (int rc = check_premul<double>(ctx, comm, weftFloat64, res)) return rc;
        if (int rc = check_premul<int32_t>(ctx, comm, weftInt32, res)) return rc;
        if (int rc = check_premul<int64_t>(ctx, comm, weftInt64, res)) return rc;
      }
      weftCommDestroy(comm);
      return 0;
    }, opts);
    for (int r = 0; r < nranks; r++) EXPECT_EQ(status[r], 0) << nranks << " ranks, rank " << r;
  }
}

// An op destroyed inside the group that uses it, before weftGroupEnd runs
// the call: the group fails with weftInvalidUsage saying so on every rank,
// not a reduction with a scale that is gone.
TEST(PreMulSum, DestroyedBeforeItsGroupRunsIsAnError) {
  auto status = run_ranks(2, [](const RankCtx &ctx) {
    weftComm_t comm;
    if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
      return rank_fail(ctx, "init");
    float scalar = 3, send[1000], out[1000];
    for (int i = 0; i < 1000; i++) send[i] = (float)i, out[i] = -1;
    weftRedOp_t op;
    FAIL_IF(weftRedOpCreatePreMulSum(&op, &scalar, weftFloat32, weftScalarHostImmediate, comm) !=
                weftSuccess, "create");
    FAIL_IF(weftGroupStart() != weftSuccess, "group start");
    FAIL_IF(weftAllReduce(send, out, 1000, weftFloat32, op, comm, nullptr) != weftSuccess,
            "allreduce queued: %s", weftGetLastError(comm));
    FAIL_IF(weftRedOpDestroy(op, comm) != weftSuccess, "destroy");
    weftResult_t res = weftGroupEnd();
    const std::string msg = weftGetLastError(comm);
    FAIL_IF(res != weftInvalidUsage, "group end gave %d (%s), want weftInvalidUsage", (int)res,
            msg.c_str());
    FAIL_IF(msg.find("destroyed before") == std::string::npos, "message: %s", msg.c_str());
    weftCommDestroy(comm);
    return 0;
  });
  for (int r = 0; r < 2; r++) EXPECT_EQ(status[r], 0) << "rank " << r;
}

TEST(PreMulSum, BadArguments) {
  weftUniqueId id;
  ASSERT_EQ(weftGetUniqueId(&id), weftSuccess);
  weftComm_t comm;
  ASSERT_EQ(weftCommInitRank(&comm, 1, id, 0), weftSuccess);
  float s = 2;
  weftRedOp_t op;
  EXPECT_EQ(weftRedOpCreatePreMulSum(nullptr, &s, weftFloat32, weftScalarHostImmediate, comm),
            weftInvalidArgument);
  EXPECT_EQ(weftRedOpCreatePreMulSum(&op, nullptr, weftFloat32, weftScalarHostImmediate, comm),
            weftInvalidArgument);
  EXPECT_EQ(weftRedOpCreatePreMulSum(&op, &s, (weftDataType_t)40, weftScalarHostImmediate, comm),
            weftInvalidArgument);
  EXPECT_EQ(weftRedOpCreatePreMulSum(&op, &s, weftFloat32, (weftScalarResidence_t)7, comm),
            weftInvalidArgument);
  EXPECT_EQ(weftRedOpDestroy((weftRedOp_t)weftSum, comm), weftInvalidArgument);
  // the table is finite, and says so
  std::vector<weftRedOp_t> ops;
  weftResult_t res;
  while ((res = weftRedOpCreatePreMulSum(&op, &s, weftFloat32, weftScalarHostImmediate, comm)) ==
         weftSuccess)
    ops.push_back(op);
  EXPECT_EQ(res, weftInvalidUsage);
  EXPECT_GE(ops.size(), 16u);
  for (weftRedOp_t o : ops) EXPECT_EQ(weftRedOpDestroy(o, comm), weftSuccess);
  EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
}

}  // namespace
