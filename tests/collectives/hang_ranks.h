// What the hang and mismatch tests share: a rank's comm opened with one
// all-reduce done on it (the calls that follow are #2 and later).
#ifndef WEFT_TESTS_HANG_RANKS_H
#define WEFT_TESTS_HANG_RANKS_H

#include <vector>

#include "harness.h"

namespace weft_test {

// the timeout (WEFT_TIMEOUT, seconds) the tests of a stall run under
constexpr int kHangTimeoutS = 3;

// Makes the rank's comm and runs one all-reduce of buf on it together (the
// calls below are #2 and later); 0, or rank_fail's status.
inline int open_after_one(const RankCtx &ctx, weftComm_t *comm, std::vector<float> &buf) {
  if (weftCommInitRank(comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
    return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
  if (weftAllReduce(buf.data(), buf.data(), buf.size(), weftFloat32, weftSum, *comm, nullptr) !=
      weftSuccess)
    return rank_fail(ctx, "all-reduce: %s", weftGetLastError(*comm));
  return 0;
}

}  // namespace weft_test

#endif
