// All-gather, reduce-scatter, broadcast and reduce over forked ranks: every
// datatype (and op), odd counts, in-place and out-of-place, every root.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "coll_ref.h"
#include "harness.h"

using namespace weft_test;

namespace {

struct CollCase {
  int nranks;
  int nchannels;
  int slot_nbytes;
  int nslots;
};

std::string case_name(const testing::TestParamInfo<CollCase> &info) {
  const CollCase &c = info.param;
  return "ranks" + std::to_string(c.nranks) + "_ch" + std::to_string(c.nchannels) + "_slot" +
         std::to_string(c.slot_nbytes) + "x" + std::to_string(c.nslots);
}

const size_t kCounts[] = {0, 1, 3, 1009, 4099};
const uint8_t kPoison = 0xa5;

struct Ctx {
  const RankCtx &rank;
  weftComm_t comm;
  uint64_t seed;
};

// Bytes past `used` in out must still be poison.
bool tail_poisoned(const std::vector<uint8_t> &out, size_t used) {
  for (size_t i = used; i < out.size(); i++)
    if (out[i] != kPoison) return false;
  return true;
}

int check_allgather(const Ctx &x, weftDataType_t t, size_t count, bool in_place) {
  const int n = x.rank.nranks, me = x.rank.rank;
  const size_t es = weftTypeSize(t), block = count * es;
  std::vector<std::vector<uint8_t>> in;
  for (int r = 0; r < n; r++) in.push_back(make_input(t, weftSum, count, x.seed, r));
  std::vector<uint8_t> out(n * block + 64, kPoison);
  if (in_place) memcpy(out.data() + me * block, in[me].data(), block);
  const void *src = in_place ? out.data() + me * block : in[me].data();
  weftResult_t res = weftAllGather(src, out.data(), count, t, x.comm, nullptr);
  FAIL_IF_RANK(x.rank, res != weftSuccess, "allgather %s %zu: %s", type_name(t), count,
               weftGetLastError(x.comm));
  for (int r = 0; r < n; r++)
    FAIL_IF_RANK(x.rank, memcmp(out.data() + r * block, in[r].data(), block) != 0,
                 "allgather %s count %zu %s: block of rank %d differs", type_name(t), count,
                 in_place ? "in-place" : "out-of-place", r);
  FAIL_IF_RANK(x.rank, !tail_poisoned(out, n * block), "allgather wrote past the end");
  return 0;
}

int check_reducescatter(const Ctx &x, weftDataType_t t, weftRedOp_t op, size_t count,
                        bool in_place) {
  const int n = x.rank.nranks, me = x.rank.rank;
  const size_t es = weftTypeSize(t), block = count * es;
  std::vector<std::vector<uint8_t>> in;
  for (int r = 0; r < n; r++) in.push_back(make_input(t, op, count * n, x.seed, r));
  std::vector<uint8_t> send = in[me];
  std::vector<uint8_t> out(block + 64, kPoison);
  const void *src = send.data();
  void *dst = out.data();
  if (in_place) dst = send.data() + me * block;
  weftResult_t res = weftReduceScatter(src, dst, count, t, op, x.comm, nullptr);
  FAIL_IF_RANK(x.rank, res != weftSuccess, "reducescatter %s %s %zu: %s", type_name(t), op_name(op),
               count, weftGetLastError(x.comm));
  std::vector<std::vector<uint8_t>> mine;  // every rank's block for us
  for (int r = 0; r < n; r++)
    mine.emplace_back(in[r].begin() + me * block, in[r].begin() + (me + 1) * block);
  std::string why;
  FAIL_IF_RANK(x.rank, !check_reduction(t, op, mine, dst, count, &why),
               "reducescatter %s %s count %zu %s: %s", type_name(t), op_name(op), count,
               in_place ? "in-place" : "out-of-place", why.c_str());
  if (!in_place) {
    FAIL_IF_RANK(x.rank, !tail_poisoned(out, block), "reducescatter wrote past the end");
    FAIL_IF_RANK(x.rank, send != in[me], "reducescatter modified sendbuff");
  }
  return 0;
}

int check_broadcast(const Ctx &x, weftDataType_t t, size_t count, int root, bool in_place) {
  const int me = x.rank.rank;
  const size_t block = count * weftTypeSize(t);
  std::vector<uint8_t> data = make_input(t, weftSum, count, x.seed, root);
  std::vector<uint8_t> out(block + 64, kPoison);
  std::vector<uint8_t> send = data;
  const void *src = me == root ? send.data() : nullptr;  // non-roots pass no input
  if (in_place && me == root) {
    memcpy(out.data(), data.data(), block);
    src = out.data();
  }
  weftResult_t res = weftBroadcast(src, out.data(), count, t, root, x.comm, nullptr);
  FAIL_IF_RANK(x.rank, res != weftSuccess, "broadcast %s %zu root %d: %s", type_name(t), count,
               root, weftGetLastError(x.comm));
  FAIL_IF_RANK(x.rank, memcmp(out.data(), data.data(), block) != 0,
               "broadcast %s count %zu root %d %s: wrong data", type_name(t), count, root,
               in_place ? "in-place" : "out-of-place");
  FAIL_IF_RANK(x.rank, !tail_poisoned(out, block), "broadcast wrote past the end");
  return 0;
}

int check_reduce(const Ctx &x, weftDataType_t t, weftRedOp_t op, size_t count, int root,
                 bool in_place) {
  const int n = x.rank.nranks, me = x.rank.rank;
  const size_t block = count * weftTypeSize(t);
  std::vector<std::vector<uint8_t>> in;
  for (int r = 0; r < n; r++) in.push_back(make_input(t, op, count, x.seed, r));
  std::vector<uint8_t> out(block + 64, kPoison);
  if (in_place) memcpy(out.data(), in[me].data(), block);
  const void *src = in_place ? out.data() : in[me].data();
  void *dst = me == root || in_place ? out.data() : nullptr;  // non-roots pass no output
  weftResult_t res = weftReduce(src, dst, count, t, op, root, x.comm, nullptr);
  FAIL_IF_RANK(x.rank, res != weftSuccess, "reduce %s %s %zu root %d: %s", type_name(t),
               op_name(op), count, root, weftGetLastError(x.comm));
  if (me == root) {
    std::string why;
    FAIL_IF_RANK(x.rank, !check_reduction(t, op, in, out.data(), count, &why),
                 "reduce %s %s count %zu root %d %s: %s", type_name(t), op_name(op), count, root,
                 in_place ? "in-place" : "out-of-place", why.c_str());
  } else if (!in_place) {
    FAIL_IF_RANK(x.rank, !tail_poisoned(out, 0), "reduce wrote on a non-root rank");
  }
  FAIL_IF_RANK(x.rank, !tail_poisoned(out, block), "reduce wrote past the end");
  return 0;
}

class Collectives : public testing::TestWithParam<CollCase> {
 protected:
  // Runs body on every rank of a fresh communicator configured by the case.
  void run(const std::function<int(const Ctx &)> &body) {
    const CollCase c = GetParam();
    RunOptions opts;
    opts.timeout_s = 240;
    opts.env = {{"WEFT_NCHANNELS", std::to_string(c.nchannels)},
                {"WEFT_SLOT_BYTES", std::to_string(c.slot_nbytes)},
                {"WEFT_NSLOTS", std::to_string(c.nslots)},
                {"WEFT_TIMEOUT", "60"}};
    const uint64_t seed = test_seed();
    auto status = run_ranks(c.nranks, [&](const RankCtx &rank) {
      weftComm_t comm;
      if (weftCommInitRank(&comm, rank.nranks, rank.id, rank.rank) != weftSuccess)
        return rank_fail(rank, "init: %s", weftGetLastError(nullptr));
      int rc = body(Ctx{rank, comm, seed});
      weftCommDestroy(comm);
      return rc;
    }, opts);
    for (int r = 0; r < c.nranks; r++) EXPECT_EQ(status[r], 0) << "rank " << r;
  }
};

TEST_P(Collectives, AllGatherEveryTypeCountPlacement) {
  run([](const Ctx &x) {
    for (int t = 0; t < weftNumTypes; t++)
      for (size_t count : kCounts)
        for (int ip = 0; ip < 2; ip++)
          if (int rc = check_allgather(x, (weftDataType_t)t, count, ip)) return rc;
    return 0;
  });
}

// Above 5 ranks, TypeOpPairs' sample of the datatype x op pairs.
TEST_P(Collectives, ReduceScatterEveryTypeOpCountPlacement) {
  const TypeOpPairs pairs(test_seed(), GetParam().nranks, 5);
  printf("%s\n", pairs.describe().c_str());
  run([&pairs](const Ctx &x) {
    for (int t = 0; t < weftNumTypes; t++)
      for (int op = 0; op < weftNumOps; op++)
        for (size_t count : kCounts)
          if (pairs(t, op))
          for (int ip = 0; ip < 2; ip++)
            if (int rc = check_reducescatter(x, (weftDataType_t)t, (weftRedOp_t)op, count, ip))
              return rc;
    return 0;
  });
}

// Every root; types and counts cycle with the root so each meets each.
TEST_P(Collectives, BroadcastEveryRootTypeCountPlacement) {
  run([](const Ctx &x) {
    for (int root = 0; root < x.rank.nranks; root++)
      for (int t = 0; t < weftNumTypes; t++)
        for (size_t ci = 0; ci < 5; ci++)
          for (int ip = 0; ip < 2; ip++)
            if (int rc = check_broadcast(x, (weftDataType_t)t, kCounts[ci], root, ip)) return rc;
    return 0;
  });
}

TEST_P(Collectives, ReduceEveryRootTypeOpCountPlacement) {
  run([](const Ctx &x) {
    for (int root = 0; root < x.rank.nranks; root++)
      for (int t = 0; t < weftNumTypes; t++)
        for (int op = 0; op < weftNumOps; op++)
          for (int ip = 0; ip < 2; ip++) {
            size_t count = kCounts[(root + t + op + ip) % 5];
            if (int rc = check_reduce(x, (weftDataType_t)t, (weftRedOp_t)op, count, root, ip))
              return rc;
          }
    return 0;
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, Collectives,
                         testing::Values(CollCase{1, 1, 256, 4}, CollCase{2, 1, 256, 4},
                                         CollCase{3, 2, 192, 2}, CollCase{4, 1, 128, 3},
                                         CollCase{5, 2, 320, 2}, CollCase{7, 1, 256, 2},
                                         CollCase{8, 3, 512, 4}, CollCase{2, 1, 131072, 8}),
                         case_name);

// Argument rules particular to these collectives.
TEST(CollectiveArgs, RootsAndBuffers) {
  weftUniqueId id;
  ASSERT_EQ(weftGetUniqueId(&id), weftSuccess);
  weftComm_t comm;
  ASSERT_EQ(weftCommInitRank(&comm, 1, id, 0), weftSuccess);
  float a[8] = {0}, b[8] = {0};
  EXPECT_EQ(weftBroadcast(a, b, 8, weftFloat32, 1, comm, nullptr), weftInvalidArgument);
  EXPECT_NE(std::string(weftGetLastError(comm)).find("root 1 out of range"), std::string::npos);
  EXPECT_EQ(weftReduce(a, b, 8, weftFloat32, weftSum, -1, comm, nullptr), weftInvalidArgument);
  EXPECT_EQ(weftReduce(a, b, 8, weftFloat32, (weftRedOp_t)9, 0, comm, nullptr),
            weftInvalidArgument);
  EXPECT_EQ(weftReduceScatter(a, b, 8, weftFloat32, (weftRedOp_t)9, comm, nullptr),
            weftInvalidArgument);
  EXPECT_EQ(weftAllGather(a, a + 1, 4, weftFloat32, comm, nullptr), weftInvalidArgument);
  EXPECT_EQ(weftAllGather(nullptr, b, 4, weftFloat32, comm, nullptr), weftInvalidArgument);
  EXPECT_EQ(weftBcast(a, 8, weftFloat32, 0, comm, nullptr), weftSuccess);
  EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
}

}  // namespace
