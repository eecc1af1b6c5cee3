// Helpers of the ZeRO suites on real ranks: a rank's communicator (the API
// suites test_zero_api.cc and test_zero_accum.cc, and the checkpoint suites
// test_zero_ckpt.cc and test_zero_ckpt_ranks.cc) and a context of given layer
// sizes (the API suites); a run at one and at two ranks in a temporary
// directory, and RES_TRY (the failure suites).
#ifndef WEFT_TEST_ZERO_RANKS_H
#define WEFT_TEST_ZERO_RANKS_H

#include <gtest/gtest.h>
#include <stdlib.h>

#include <string>
#include <vector>

#include "harness.h"
#include "weft_zero.h"

// Returns call's failure, as zero/'s own WEFT_TRY.
#define RES_TRY(call)                     \
  do {                                    \
    weftResult_t res_ = (call);           \
    if (res_ != weftSuccess) return res_; \
  } while (0)

namespace weft_test {

inline int init(const RankCtx &ctx, weftComm_t *comm) {
  if (weftCommInitRank(comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
    return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
  return 0;
}

// A context with the given layer sizes (one parameter per entry of each
// layer), initialised from a seeded generator that every rank shares.
inline int make_ctx(const RankCtx &ctx, weftComm_t comm, weftZeroConfig_t cfg,
                    const std::vector<std::vector<size_t>> &layers, weftZero_t *out,
                    std::vector<int> *ids = nullptr, std::vector<float> *values = nullptr) {
  if (weftZeroCreate(out, comm, &cfg) != weftSuccess)
    return rank_fail(ctx, "create: %s", weftZeroLastError());
  Rng rng(test_seed() + 99);
  for (size_t l = 0; l < layers.size(); l++)
    for (size_t count : layers[l]) {
      std::vector<float> init(count);
      for (float &v : init) v = (float)(rng.uniform() - 0.5);
      int id;
      if (weftZeroAddParam(*out, (int)l, count, init.data(), &id) != weftSuccess)
        return rank_fail(ctx, "add: %s", weftZeroLastError());
      if (ids) ids->push_back(id);
      if (values) values->insert(values->end(), init.begin(), init.end());
    }
  if (weftZeroFinalize(*out) != weftSuccess)
    return rank_fail(ctx, "finalize: %s", weftZeroLastError());
  return 0;
}

// rank_fn(ctx, dir) on 1 rank, then on 2, each run with a fresh directory
// /tmp/weft_zero_<tag>_XXXXXX (removed after); every rank must return 0.
template <typename Fn>
void on_one_and_two_ranks_with_dir(const char *tag, Fn rank_fn) {
  for (int n : {1, 2}) {
    std::string templ = std::string("/tmp/weft_zero_") + tag + "_XXXXXX";
    ASSERT_NE(mkdtemp(&templ[0]), nullptr);
    const char *dir = templ.c_str();
    auto status = run_ranks(n, [&](const RankCtx &ctx) { return rank_fn(ctx, dir); });
    for (int r = 0; r < n; r++) EXPECT_EQ(status[r], 0) << "rank " << r << " of " << n;
    EXPECT_EQ(system((std::string("rm -rf ") + dir).c_str()), 0);
  }
}

}  // namespace weft_test

#endif
