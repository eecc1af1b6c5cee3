// Pre-multiply-sum ops: each rank's input times its own scalar, summed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "coll_ref.h"
#include "collectives/reduce/reduce_ops.h"
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

// A narrow floating type: its largest finite value and its unit roundoff.
struct Narrow {
  weftDataType_t t;
  double max, u;
};
const Narrow kNarrow[] = {{weftFloat16, 65504, 0x1p-11},
                          {weftFloat8e4m3, 448, 0x1p-4},
                          {weftFloat8e5m2, 57344, 0x1p-3}};

double narrow_get(weftDataType_t t, const std::vector<uint8_t> &b, size_t i) {
  if (t == weftFloat16) {
    uint16_t h;
    std::memcpy(&h, &b[2 * i], 2);
    return weft_f16_to_f32(h);
  }
  return t == weftFloat8e4m3 ? weft_e4m3_to_f32(b[i]) : weft_e5m2_to_f32(b[i]);
}
void narrow_set(weftDataType_t t, std::vector<uint8_t> &b, size_t i, double v) {
  if (t == weftFloat16) {
    const uint16_t h = weft_f32_to_f16((float)v);
    std::memcpy(&b[2 * i], &h, 2);
  } else {
    b[i] = t == weftFloat8e4m3 ? weft_f32_to_e4m3((float)v) : weft_f32_to_e5m2((float)v);
  }
}

// Avg of the narrow floating types over inputs between half the type's
// largest value and it, whose sum overflows: each rank's input is scaled
// by 1/n before the sum (NCCL's avg of floats), so that the mean comes out
// finite and within docs/api.md's bound ((n + 3) roundings of the mean),
// for all-reduce (out of place and in place), reduce-scatter and reduce,
// of count elements (per rank).
int check_avg_narrow(const RankCtx &ctx, weftComm_t comm, const Narrow &ty, size_t count) {
  const int n = ctx.nranks, me = ctx.rank;
  const size_t esize = weftTypeSize(ty.t);
  auto input = [&](std::vector<uint8_t> &b, int r, size_t i) {
    narrow_set(ty.t, b, i, ty.max * (0.5 + 0.5 * (double)((i * 7 + (size_t)r * 13) % 17) / 16));
  };
  std::vector<std::vector<uint8_t>> in(n, std::vector<uint8_t>(count * n * esize));
  for (int r = 0; r < n; r++)
    for (size_t i = 0; i < count * n; i++) input(in[r], r, i);
  auto want = [&](size_t i) {
    double acc = 0;
    for (int r = 0; r < n; r++) acc += narrow_get(ty.t, in[r], i);
    return acc / n;
  };
  auto check = [&](const char *what, const std::vector<uint8_t> &out, size_t from, size_t m) {
    for (size_t i = 0; i < m; i++) {
      const double got = narrow_get(ty.t, out, i), w = want(from + i);
      if (!std::isfinite(got) || std::fabs(got - w) > (n + 3) * ty.u * w)
        return rank_fail(ctx, "%s %s avg element %zu: got %g want %g", type_name(ty.t), what,
                         from + i, got, w);
    }
    return 0;
  };
  const std::vector<uint8_t> &send = in[me];
  std::vector<uint8_t> out(count * n * esize, 0xff);
  if (weftAllReduce(send.data(), out.data(), count, ty.t, weftAvg, comm, nullptr) != weftSuccess)
    return rank_fail(ctx, "allreduce: %s", weftGetLastError(comm));
  if (int rc = check("allreduce", out, 0, count)) return rc;
  if (std::memcmp(send.data(), in[me].data(), send.size()) != 0)
    return rank_fail(ctx, "allreduce changed its input");
  std::vector<uint8_t> inplace = send;
  if (weftAllReduce(inplace.data(), inplace.data(), count, ty.t, weftAvg, comm, nullptr) !=
      weftSuccess)
    return rank_fail(ctx, "allreduce in place: %s", weftGetLastError(comm));
  if (int rc = check("allreduce in place", inplace, 0, count)) return rc;
  std::fill(out.begin(), out.end(), 0xff);
  if (weftReduceScatter(send.data(), out.data(), count, ty.t, weftAvg, comm, nullptr) !=
      weftSuccess)
    return rank_fail(ctx, "reducescatter: %s", weftGetLastError(comm));
  if (int rc = check("reducescatter", out, (size_t)me * count, count)) return rc;
  std::fill(out.begin(), out.end(), 0xff);
  if (weftReduce(send.data(), out.data(), count, ty.t, weftAvg, n - 1, comm, nullptr) !=
      weftSuccess)
    return rank_fail(ctx, "reduce: %s", weftGetLastError(comm));
  if (me == n - 1)
    if (int rc = check("reduce", out, 0, count)) return rc;
  return 0;
}

TEST(Avg, NarrowFloatsScaleEachInputBeforeTheSum) {
  const char *const algos[] = {"", "ring", "tree", "rd", "direct", "cma", "bulk"};
  for (int nranks : {2, 3, 4})
    for (const char *algo : algos)
      for (const char *proto : {"simple", "ll"}) {
        if (algo[0] == '\0' && std::strcmp(proto, "ll") == 0) continue;
        RunOptions opts;
        opts.env = {{"WEFT_ALGO", algo}, {"WEFT_PROTO", algo[0] ? proto : ""}};
        auto status = run_ranks(nranks, [](const RankCtx &ctx) {
          weftComm_t comm;
          if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
            return rank_fail(ctx, "init");
          for (const Narrow &ty : kNarrow)
            for (size_t count : {1031, 65537})  // the small and the large messages' paths
              if (int rc = check_avg_narrow(ctx, comm, ty, count)) return rc;
          weftCommDestroy(comm);
          return 0;
        }, opts);
        for (int r = 0; r < nranks; r++)
          EXPECT_EQ(status[r], 0) << nranks << " ranks, WEFT_ALGO=" << algo
                                  << " WEFT_PROTO=" << proto << ", rank " << r;
      }
}

// A narrow type's avg runs as a sum of scaled input, but is compared as an
// avg: a rank that calls a sum where the others call avg is named.
TEST(Avg, NarrowAvgAgainstSumIsAMismatch) {
  for (int nranks : {2, 3}) {
    auto status = run_ranks(nranks, [](const RankCtx &ctx) {
      weftComm_t comm;
      if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
        return rank_fail(ctx, "init");
      std::vector<uint16_t> buf(4096, 0x3c00);  // float16 1.0
      const weftRedOp_t op = ctx.rank == 0 ? weftSum : weftAvg;
      const weftResult_t res =
          weftAllReduce(buf.data(), buf.data(), buf.size(), weftFloat16, op, comm, nullptr);
      const std::string err = weftGetLastError(comm);
      // the ranks that compared fail with weftInvalidUsage; one that waited on
      // a rank that failed, with weftRemoteError: both name the op
      if (res != weftInvalidUsage && res != weftRemoteError)
        return rank_fail(ctx, "result %d: %s", (int)res, err.c_str());
      if (err.find("op differs: rank 0 has sum") == std::string::npos)
        return rank_fail(ctx, "error names no op: %s", err.c_str());
      weftCommDestroy(comm);
      return 0;
    });
    for (int r = 0; r < nranks; r++) EXPECT_EQ(status[r], 0) << nranks << " ranks, rank " << r;
  }
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

// An op may be destroyed as soon as the call that uses it returns (NCCL's
// rule; PyTorch destroys each op right after its call): inside a group,
// before weftGroupEnd runs the calls, and with its slot taken at once by an
// op of another scale, each call still scales by its own op's scalar.
TEST(PreMulSum, DestroyedOnceItsCallReturnsStillScales) {
  auto status = run_ranks(2, [](const RankCtx &ctx) {
    weftComm_t comm;
    if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
      return rank_fail(ctx, "init");
    const float scales[2] = {3, 5};
    std::vector<float> send(1000);
    std::vector<float> out[2] = {std::vector<float>(1000, -1), std::vector<float>(1000, -1)};
    for (int i = 0; i < 1000; i++) send[i] = (float)(i % 97) + ctx.rank;
    FAIL_IF(weftGroupStart() != weftSuccess, "group start");
    weftRedOp_t ops[2];
    for (int k = 0; k < 2; k++) {
      float scalar = scales[k]; /* immediate: read by create, gone after */
      FAIL_IF(weftRedOpCreatePreMulSum(&ops[k], &scalar, weftFloat32, weftScalarHostImmediate,
                                       comm) != weftSuccess, "create %d", k);
      FAIL_IF(weftAllReduce(send.data(), out[k].data(), 1000, weftFloat32, ops[k], comm,
                            nullptr) != weftSuccess,
              "allreduce %d queued: %s", k, weftGetLastError(comm));
      FAIL_IF(weftRedOpDestroy(ops[k], comm) != weftSuccess, "destroy %d", k);
    }
    FAIL_IF(ops[0] != ops[1], "the second op did not take the first one's slot (%d, %d)",
            (int)ops[0], (int)ops[1]);
    FAIL_IF(weftGroupEnd() != weftSuccess, "group end: %s", weftGetLastError(comm));
    for (int k = 0; k < 2; k++)
      for (int i = 0; i < 1000; i++) {
        float want = scales[k] * ((float)(i % 97) + 0) + scales[k] * ((float)(i % 97) + 1);
        FAIL_IF(out[k][i] != want, "op %d element %d: %g, want %g", k, i, out[k][i], want);
      }
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
