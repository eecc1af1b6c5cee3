// Helpers of the ZeRO suites on real ranks: a rank's communicator (the API
// suites test_zero_api.cc and test_zero_accum.cc, and the checkpoint suites
// test_zero_ckpt.cc and test_zero_ckpt_ranks.cc) and a context of given layer
// sizes (the API suites).
#ifndef WEFT_TEST_ZERO_RANKS_H
#define WEFT_TEST_ZERO_RANKS_H

#include <vector>

#include "harness.h"
#include "weft_zero.h"

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

}  // namespace weft_test

#endif
