// What the weftCommSplit and WEFT_CHECK tests (test_split.cc, test_signature.cc)
// share: the options of their communicators, a runner, and checks that a
// communicator has the shape and computes what its members say.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "harness.h"

namespace weft_test {

// Options shared by the multi-rank tests: small slots and two channels, so
// that the split communicators (which inherit them) run several chunks.
inline RunOptions small_slots(std::vector<std::pair<std::string, std::string>> extra = {}) {
  RunOptions opts;
  opts.timeout_s = 120;
  opts.env = {{"WEFT_SLOT_BYTES", "256"}, {"WEFT_NSLOTS", "2"}, {"WEFT_NCHANNELS", "2"},
              {"WEFT_TIMEOUT", "30"}};
  for (auto &kv : extra) opts.env.push_back(kv);
  return opts;
}

// Runs body on every rank of a fresh communicator; expects every rank to pass.
inline void run_comm(int nranks, const RunOptions &opts,
              const std::function<int(const RankCtx &, weftComm_t &)> &body) {
  auto status = run_ranks(nranks, [&](const RankCtx &ctx) {
    weftComm_t comm;
    if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
      return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
    int rc = body(ctx, comm);
    if (comm != nullptr) weftCommDestroy(comm);  // the body sets it NULL if it destroyed it
    return rc;
  }, opts);
  for (int r = 0; r < nranks; r++) EXPECT_EQ(status[r], 0) << "rank " << r;
}

inline bool contains(const char *text, const std::string &needle) {
  return std::string(text).find(needle) != std::string::npos;
}

// comm has the size, and this rank the new rank, that members (old ranks in
// new-rank order) say.
inline int expect_shape(const RankCtx &ctx, weftComm_t comm, const std::vector<int> &members,
                 const char *label) {
  int size = -1, rank = -1;
  FAIL_IF(comm == nullptr, "%s: no communicator", label);
  FAIL_IF(weftCommCount(comm, &size) != weftSuccess, "%s: count: %s", label,
          weftGetLastError(comm));
  FAIL_IF(weftCommUserRank(comm, &rank) != weftSuccess, "%s: rank: %s", label,
          weftGetLastError(comm));
  int want_rank = -1;
  for (size_t i = 0; i < members.size(); i++)
    if (members[i] == ctx.rank) want_rank = (int)i;
  FAIL_IF(size != (int)members.size(), "%s: size %d, want %zu", label, size, members.size());
  FAIL_IF(rank != want_rank, "%s: rank %d, want %d", label, rank, want_rank);
  return 0;
}

// An all-reduce whose every element depends on who took part: rank r (of the
// parent) adds (r + 1) * (i + 1) at element i.
inline int expect_allreduce(const RankCtx &ctx, weftComm_t comm, const std::vector<int> &members,
                     const char *label) {
  const size_t count = 1009;
  std::vector<int32_t> buf(count), out(count, -7);
  for (size_t i = 0; i < count; i++) buf[i] = (ctx.rank + 1) * (int32_t)(i + 1);
  weftResult_t res = weftAllReduce(buf.data(), out.data(), count, weftInt32, weftSum, comm, nullptr);
  FAIL_IF(res != weftSuccess, "%s: all-reduce: %s", label, weftGetLastError(comm));
  int32_t weight = 0;
  for (int m : members) weight += m + 1;
  for (size_t i = 0; i < count; i++)
    FAIL_IF(out[i] != weight * (int32_t)(i + 1), "%s: all-reduce element %zu is %d, want %d",
            label, i, out[i], weight * (int32_t)(i + 1));
  return 0;
}

// An all-gather of each rank's parent rank (and two values made from it):
// the blocks must come back in the new ranks' order.
inline int expect_allgather(const RankCtx &ctx, weftComm_t comm, const std::vector<int> &members,
                     const char *label) {
  const int32_t mine[3] = {ctx.rank, ctx.rank * 10 + 1, ctx.rank * 100 + 2};
  std::vector<int32_t> out(3 * members.size() + 1, -7);
  weftResult_t res = weftAllGather(mine, out.data(), 3, weftInt32, comm, nullptr);
  FAIL_IF(res != weftSuccess, "%s: all-gather: %s", label, weftGetLastError(comm));
  for (size_t j = 0; j < members.size(); j++) {
    const int m = members[j];
    FAIL_IF(out[3 * j] != m || out[3 * j + 1] != m * 10 + 1 || out[3 * j + 2] != m * 100 + 2,
            "%s: all-gather block %zu holds rank %d's data, want rank %d's", label, j,
            out[3 * j], m);
  }
  FAIL_IF(out.back() != -7, "%s: all-gather wrote past the end", label);
  return 0;
}

inline int expect_works(const RankCtx &ctx, weftComm_t comm, const std::vector<int> &members,
                 const char *label) {
  TRY_RC(expect_shape(ctx, comm, members, label));
  TRY_RC(expect_allreduce(ctx, comm, members, label));
  TRY_RC(expect_allgather(ctx, comm, members, label));
  return 0;
}

}  // namespace weft_test
