// What the ranks of a ZeRO context must agree on, refused on every rank
// where one differs instead of training on silently: the configuration, the
// parameters' sizes and initial values at weftZeroFinalize, the order of a
// step's reductions and its learning rate; and what they may differ in: a
// layer without a gradient on one rank reduces as zeros.
#include <gtest/gtest.h>

#include <string.h>

#include <cmath>

#include <functional>
#include <string>
#include <vector>

#include "harness.h"
#include "weft_zero.h"
#include "zero_ranks.h"

using namespace weft_test;

namespace {

weftZeroConfig_t config(int stage) {
  weftZeroConfig_t cfg;
  weftZeroConfigDefaults(&cfg);
  cfg.stage = stage;
  cfg.bucketBytes = 1; // stage 0: a bucket a layer, so that their order shows
  return cfg;
}

// Registers layers (one parameter each) with values from a generator every
// rank shares; `tweak` may change this rank's sizes or values first.
int add_layers(const RankCtx &ctx, weftZero_t z, std::vector<size_t> sizes,
               const std::function<void(std::vector<size_t> &, std::vector<float> &)> &tweak,
               std::vector<int> *ids) {
  Rng rng(test_seed() + 7);
  std::vector<float> init;
  for (size_t s : sizes)
    for (size_t i = 0; i < s; i++) init.push_back((float)(rng.uniform() - 0.5));
  if (tweak) tweak(sizes, init);
  size_t at = 0;
  for (size_t l = 0; l < sizes.size(); l++) {
    int id;
    if (weftZeroAddParam(z, (int)l, sizes[l], init.data() + at, &id) != weftSuccess)
      return rank_fail(ctx, "add: %s", weftZeroLastError());
    at += sizes[l];
    if (ids) ids->push_back(id);
  }
  return 0;
}

// Each case changes one thing on rank 1 only; every rank's Finalize must
// fail with weftInvalidUsage naming it.
struct FinalizeCase {
  const char *what;
  const char *named;
  std::function<void(weftZeroConfig_t &)> cfg;
  std::function<void(std::vector<size_t> &, std::vector<float> &)> model;
};

const std::vector<FinalizeCase> &finalize_cases() {
  static const std::vector<FinalizeCase> cases = {
      // 7 and 8 elements pad alike on 2 ranks: the collectives' sizes agree
      {"a layer one element longer", "elements",
       nullptr, [](std::vector<size_t> &s, std::vector<float> &v) { s[0]++, v.insert(v.begin(), 0.25f); }},
      {"one initial value", "initial values",
       nullptr, [](std::vector<size_t> &, std::vector<float> &v) { v[3] += 1e-6f; }},
      {"the learning rate", "lr: this rank has",
       [](weftZeroConfig_t &c) { c.lr *= 2; }, nullptr},
      {"the weight decay", "weightDecay",
       [](weftZeroConfig_t &c) { c.weightDecay = 0.1; }, nullptr},
      {"the micro-steps", "accumSteps",
       [](weftZeroConfig_t &c) { c.accumSteps = 2; }, nullptr},
      {"the stage", "stage", [](weftZeroConfig_t &c) { c.stage = (c.stage + 1) % 4; }, nullptr},
  };
  return cases;
}

TEST(ZeroAgree, FinalizeRefusesRanksThatDiffer) {
  for (int n : {2, 3}) {
    auto status = run_ranks(n, [](const RankCtx &ctx) {
      weftComm_t comm;
      if (int rc = init(ctx, &comm)) return rc;
      for (int stage = 0; stage <= 3; stage++)
        for (const FinalizeCase &c : finalize_cases()) {
          weftZeroConfig_t cfg = config(stage);
          if (ctx.rank == 1 && c.cfg) c.cfg(cfg);
          weftZero_t z;
          if (weftZeroCreate(&z, comm, &cfg) != weftSuccess)
            return rank_fail(ctx, "create: %s", weftZeroLastError());
          if (int rc = add_layers(ctx, z, {7, 5, 12}, ctx.rank == 1 ? c.model : nullptr, nullptr))
            return rc;
          weftResult_t res = weftZeroFinalize(z);
          const std::string msg = weftZeroLastError();
          if (ctx.rank == 0 && stage == 0) printf("%s: %s\n", c.what, msg.c_str());
          if (res != weftInvalidUsage || msg.find(c.named) == std::string::npos)
            return rank_fail(ctx, "stage %d, %s on rank 1: %s: %s", stage, c.what,
                             weftGetErrorString(res), msg.c_str());
          weftZeroDestroy(z);
        }
      // the same model on every rank still trains
      weftZeroConfig_t cfg = config(3);
      weftZero_t z;
      if (weftZeroCreate(&z, comm, &cfg) != weftSuccess ||
          add_layers(ctx, z, {7, 5, 12}, nullptr, nullptr) != 0 ||
          weftZeroFinalize(z) != weftSuccess)
        return rank_fail(ctx, "alike: %s", weftZeroLastError());
      weftZeroDestroy(z);
      weftCommDestroy(comm);
      return 0;
    });
    for (size_t r = 0; r < status.size(); r++) EXPECT_EQ(status[r], 0) << n << " ranks, rank " << r;
  }
}

// One micro-step: every layer's gradient is `value`, marked ready in `order`.
int backward(const RankCtx &ctx, weftZero_t z, const std::vector<int> &ids,
             const std::vector<size_t> &sizes, const std::vector<int> &order, float value) {
  for (int l : order) {
    void *g;
    if (weftZeroGrad(z, ids[l], &g) != weftSuccess)
      return rank_fail(ctx, "grad: %s", weftZeroLastError());
    std::vector<float> v(sizes[l], value * (float)(l + 1));
    if (weftZeroAccumulate(g, weftFloat32, v.data(), v.size()) != weftSuccess ||
        weftZeroGradReady(z, l, nullptr) != weftSuccess)
      return rank_fail(ctx, "ready %d: %s", l, weftZeroLastError());
  }
  return 0;
}

// Two layers of one size: a rank that marks them in the other order pairs
// its layer 0 with the others' layer 1. Every rank's step must fail naming
// the order, with the parameters as they were.
TEST(ZeroAgree, StepRefusesReductionsInAnotherOrder) {
  auto status = run_ranks(3, [](const RankCtx &ctx) {
    weftComm_t comm;
    if (int rc = init(ctx, &comm)) return rc;
    const std::vector<size_t> sizes = {6, 6, 6};
    for (int stage = 0; stage <= 3; stage++) {
      weftZeroConfig_t cfg = config(stage);
      weftZero_t z;
      std::vector<int> ids;
      if (weftZeroCreate(&z, comm, &cfg) != weftSuccess || add_layers(ctx, z, sizes, nullptr, &ids))
        return rank_fail(ctx, "create: %s", weftZeroLastError());
      if (weftZeroFinalize(z) != weftSuccess) return rank_fail(ctx, "finalize: %s", weftZeroLastError());
      std::vector<float> before(18), after(18);
      if (weftZeroGetParams(z, before.data(), nullptr) != weftSuccess)
        return rank_fail(ctx, "get: %s", weftZeroLastError());
      // a step in one order on every rank first: it trains
      if (int rc = backward(ctx, z, ids, sizes, {2, 1, 0}, 1.0f)) return rc;
      if (weftZeroStep(z, nullptr, nullptr) != weftSuccess)
        return rank_fail(ctx, "stage %d, step alike: %s", stage, weftZeroLastError());
      if (weftZeroGetParams(z, before.data(), nullptr) != weftSuccess)
        return rank_fail(ctx, "get: %s", weftZeroLastError());
      // then the last rank swaps two layers
      const std::vector<int> order =
          ctx.rank == 2 ? std::vector<int>{1, 2, 0} : std::vector<int>{2, 1, 0};
      if (int rc = backward(ctx, z, ids, sizes, order, 1.0f)) return rc;
      weftResult_t res = weftZeroStep(z, nullptr, nullptr);
      const std::string msg = weftZeroLastError();
      if (ctx.rank == 0 && stage == 1) printf("%s\n", msg.c_str());
      if (res != weftInvalidUsage || msg.find("different orders") == std::string::npos)
        return rank_fail(ctx, "stage %d: swapped layers: %s: %s", stage, weftGetErrorString(res),
                         msg.c_str());
      if (weftZeroGetParams(z, after.data(), nullptr) != weftSuccess)
        return rank_fail(ctx, "get after: %s", weftZeroLastError());
      if (memcmp(before.data(), after.data(), before.size() * sizeof(float)) != 0)
        return rank_fail(ctx, "stage %d: the refused step moved the parameters", stage);
      weftZeroDestroy(z);
    }
    weftCommDestroy(comm);
    return 0;
  });
  for (size_t r = 0; r < status.size(); r++) EXPECT_EQ(status[r], 0) << "rank " << r;
}

// Stage 0 with one bucket: the marks' order within it does not change the
// collectives, and the step goes on.
TEST(ZeroAgree, MarksInOneBucketMayDifferInOrder) {
  auto status = run_ranks(2, [](const RankCtx &ctx) {
    weftComm_t comm;
    if (int rc = init(ctx, &comm)) return rc;
    weftZeroConfig_t cfg = config(0);
    cfg.bucketBytes = 1 << 20;
    weftZero_t z;
    std::vector<int> ids;
    const std::vector<size_t> sizes = {6, 6};
    if (weftZeroCreate(&z, comm, &cfg) != weftSuccess || add_layers(ctx, z, sizes, nullptr, &ids) ||
        weftZeroFinalize(z) != weftSuccess)
      return rank_fail(ctx, "create: %s", weftZeroLastError());
    const std::vector<int> order = ctx.rank ? std::vector<int>{0, 1} : std::vector<int>{1, 0};
    if (int rc = backward(ctx, z, ids, sizes, order, 1.0f)) return rc;
    if (weftZeroStep(z, nullptr, nullptr) != weftSuccess)
      return rank_fail(ctx, "step: %s", weftZeroLastError());
    weftZeroDestroy(z);
    weftCommDestroy(comm);
    return 0;
  });
  for (size_t r = 0; r < status.size(); r++) EXPECT_EQ(status[r], 0) << "rank " << r;
}

// weftZeroSetLr on one rank only: its shard would follow its own rate.
TEST(ZeroAgree, StepRefusesLearningRatesThatDiffer) {
  auto status = run_ranks(3, [](const RankCtx &ctx) {
    weftComm_t comm;
    if (int rc = init(ctx, &comm)) return rc;
    for (int stage : {0, 3}) {
      weftZeroConfig_t cfg = config(stage);
      weftZero_t z;
      std::vector<int> ids;
      const std::vector<size_t> sizes = {5, 9};
      if (weftZeroCreate(&z, comm, &cfg) != weftSuccess ||
          add_layers(ctx, z, sizes, nullptr, &ids) || weftZeroFinalize(z) != weftSuccess)
        return rank_fail(ctx, "create: %s", weftZeroLastError());
      // the middle rank's: a sum alone would not tell 1e-3, 2e-3, 3e-3 from 2e-3 thrice
      if (weftZeroSetLr(z, 1e-3 * (ctx.rank + 1)) != weftSuccess)
        return rank_fail(ctx, "set lr: %s", weftZeroLastError());
      if (int rc = backward(ctx, z, ids, sizes, {1, 0}, 1.0f)) return rc;
      weftResult_t res = weftZeroStep(z, nullptr, nullptr);
      const std::string msg = weftZeroLastError();
      if (res != weftInvalidUsage || msg.find("learning rates differ") == std::string::npos)
        return rank_fail(ctx, "stage %d: %s: %s", stage, weftGetErrorString(res), msg.c_str());
      weftZeroDestroy(z);
    }
    weftCommDestroy(comm);
    return 0;
  });
  for (size_t r = 0; r < status.size(); r++) EXPECT_EQ(status[r], 0) << "rank " << r;
}

// A layer without a gradient in a step on one rank only (an expert that got
// no tokens there): it marks the layer ready without asking for its buffer,
// and the layer reduces as zeros from that rank, the others' gradients
// averaged in, at every stage.
TEST(ZeroAgree, LayerWithoutAGradientOnOneRankReducesAsZeros) {
  auto status = run_ranks(2, [](const RankCtx &ctx) {
    weftComm_t comm;
    if (int rc = init(ctx, &comm)) return rc;
    for (int stage = 0; stage <= 3; stage++) {
      weftZeroConfig_t cfg = config(stage);
      cfg.optimizer = weftZeroSgdMomentum;
      cfg.momentum = 0;
      cfg.lr = 1;
      weftZero_t z;
      std::vector<int> ids;
      const std::vector<size_t> sizes = {8, 8};
      if (weftZeroCreate(&z, comm, &cfg) != weftSuccess ||
          add_layers(ctx, z, sizes, nullptr, &ids) || weftZeroFinalize(z) != weftSuccess)
        return rank_fail(ctx, "create: %s", weftZeroLastError());
      std::vector<float> before(16), after(16);
      if (weftZeroGetParams(z, before.data(), nullptr) != weftSuccess)
        return rank_fail(ctx, "get: %s", weftZeroLastError());
      for (int step = 0; step < 2; step++) {
        // layer 1: gradient 2 on both; layer 0: 4, but none on rank 1 in step 1
        for (int l : {1, 0}) {
          if (l == 0 && ctx.rank == 1 && step == 1) {
            if (weftZeroGradReady(z, l, nullptr) != weftSuccess)
              return rank_fail(ctx, "stage %d: ready without a gradient: %s", stage,
                               weftZeroLastError());
            continue;
          }
          void *g;
          std::vector<float> v(8, l == 0 ? 4.0f : 2.0f);
          if (weftZeroGrad(z, ids[l], &g) != weftSuccess ||
              weftZeroAccumulate(g, weftFloat32, v.data(), v.size()) != weftSuccess ||
              weftZeroGradReady(z, l, nullptr) != weftSuccess)
            return rank_fail(ctx, "stage %d, ready %d: %s", stage, l, weftZeroLastError());
        }
        if (weftZeroStep(z, nullptr, nullptr) != weftSuccess)
          return rank_fail(ctx, "stage %d, step %d: %s", stage, step, weftZeroLastError());
      }
      if (weftZeroGetParams(z, after.data(), nullptr) != weftSuccess)
        return rank_fail(ctx, "get after: %s", weftZeroLastError());
      // SGD at lr 1: layer 0 moves by 4, then 2 (4 and 0 averaged); layer 1 by 2 twice
      for (size_t i = 0; i < 16; i++) {
        const float want = before[i] - (i < 8 ? 6.0f : 4.0f);
        if (std::fabs(after[i] - want) > 1e-5f)
          return rank_fail(ctx, "stage %d: element %zu is %g, want %g", stage, i, after[i], want);
      }
      weftZeroDestroy(z);
    }
    weftCommDestroy(comm);
    return 0;
  });
  for (size_t r = 0; r < status.size(); r++) EXPECT_EQ(status[r], 0) << "rank " << r;
}

// A rank with no parameters beside ranks with some: every rank's Finalize
// fails naming it (the empty rank refused alone before the comparison, and
// the others waited in it until the timeout).
TEST(ZeroAgree, EmptyRankFailsEveryRank) {
  auto status = run_ranks(2, [](const RankCtx &ctx) {
    weftComm_t comm;
    if (int rc = init(ctx, &comm)) return rc;
    weftZeroConfig_t cfg = config(1);
    weftZero_t z;
    if (weftZeroCreate(&z, comm, &cfg) != weftSuccess)
      return rank_fail(ctx, "create: %s", weftZeroLastError());
    if (ctx.rank == 0 && add_layers(ctx, z, {5}, nullptr, nullptr)) return 1;
    weftResult_t res = weftZeroFinalize(z);
    const std::string msg = weftZeroLastError();
    if (res != weftInvalidUsage || msg.find("parameters: this rank has") == std::string::npos)
      return rank_fail(ctx, "%s: %s", weftGetErrorString(res), msg.c_str());
    weftZeroDestroy(z);
    // every rank empty: refused alike, and the context still takes parameters
    if (weftZeroCreate(&z, comm, &cfg) != weftSuccess) return rank_fail(ctx, "create 2");
    if (weftZeroFinalize(z) != weftInvalidUsage ||
        strstr(weftZeroLastError(), "no parameters") == nullptr)
      return rank_fail(ctx, "empty everywhere: %s", weftZeroLastError());
    if (add_layers(ctx, z, {5}, nullptr, nullptr) || weftZeroFinalize(z) != weftSuccess)
      return rank_fail(ctx, "after the empty call: %s", weftZeroLastError());
    weftZeroDestroy(z);
    weftCommDestroy(comm);
    return 0;
  });
  for (size_t r = 0; r < status.size(); r++) EXPECT_EQ(status[r], 0) << "rank " << r;
}

} // namespace
