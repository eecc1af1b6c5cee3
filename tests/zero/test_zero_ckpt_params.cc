// What a checkpoint records of the model beyond its layers (from format 4): each
// parameter's layer, size and weight decay, and the hyperparameters of the
// save. A load into a model whose parameters are cut differently within
// layers of the same sizes (5 against 2 + 3) is refused on every rank,
// naming the first parameter that differs, and leaves the context as it
// was; other hyperparameters and weight decays load (a resumed run may
// change them); a format 3 manifest, without these lines, still loads; and
// parameter lines that do not add up are refused.
#include <gtest/gtest.h>

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "harness.h"
#include "weft_zero.h"
#include "zero_ckpt_model.h"
#include "zero_ranks.h"

using namespace weft_test;

namespace {

// Parameter sizes by layer, and each parameter's weight decay (empty: the
// configuration's).
struct Model {
  std::vector<std::vector<size_t>> layers;
  std::vector<double> decays;
};

const Model kSaved = {{{5}, {7}, {3}}, {0.1, 0.0, 0.1}};

size_t model_psi(const Model &m) {
  size_t n = 0;
  for (const auto &l : m.layers)
    for (size_t c : l) n += c;
  return n;
}

// A context of m: values from a generator every rank shares (the same
// element sequence whatever the cut), the parameters' decays set.
int make_model(const RankCtx &ctx, weftComm_t comm, const weftZeroConfig_t &cfg, const Model &m,
               weftZero_t *out) {
  FAIL_IF(weftZeroCreate(out, comm, &cfg) != weftSuccess, "create: %s", weftZeroLastError());
  Rng rng(test_seed() + 5);
  size_t k = 0;
  for (size_t l = 0; l < m.layers.size(); l++)
    for (size_t count : m.layers[l]) {
      std::vector<float> init(count);
      for (float &v : init) v = (float)(rng.uniform() - 0.5);
      int id;
      FAIL_IF(weftZeroAddParam(*out, (int)l, count, init.data(), &id) != weftSuccess, "add: %s",
              weftZeroLastError());
      if (k < m.decays.size())
        FAIL_IF(weftZeroSetParamWeightDecay(*out, id, m.decays[k]) != weftSuccess, "decay: %s",
                weftZeroLastError());
      k++;
    }
  FAIL_IF(weftZeroFinalize(*out) != weftSuccess, "finalize: %s", weftZeroLastError());
  return 0;
}

// Steps with seeded gradients, the same on every rank.
int train(const RankCtx &ctx, weftZero_t z, const Model &m, int steps) {
  Rng rng(test_seed() ^ 0xdeca);
  for (int s = 0; s < steps; s++) {
    int id = 0;
    for (size_t l = 0; l < m.layers.size(); l++) {
      for (size_t count : m.layers[l]) {
        void *g;
        FAIL_IF(weftZeroGrad(z, id++, &g) != weftSuccess, "grad: %s", weftZeroLastError());
        std::vector<float> grad(count);
        for (float &v : grad) v = (float)(rng.uniform() - 0.5);
        weftZeroAccumulate(g, weftFloat32, grad.data(), grad.size());
      }
      FAIL_IF(weftZeroGradReady(z, (int)l, nullptr) != weftSuccess, "ready: %s",
              weftZeroLastError());
    }
    FAIL_IF(weftZeroStep(z, nullptr, nullptr) != weftSuccess, "step: %s", weftZeroLastError());
  }
  return 0;
}

weftZeroConfig_t saver_config(int stage) {
  weftZeroConfig_t cfg;
  weftZeroConfigDefaults(&cfg);
  cfg.stage = stage;
  cfg.weightDecay = 0.1;
  cfg.beta2 = 0.99;
  cfg.maxGradNorm = 1.0;
  return cfg;
}

// kSaved after two steps on 2 ranks at stage 1, the rate set to 0.002
// before the save, into dir; its parameters into *params.
void save_model(const std::string &dir, std::vector<float> *params) {
  const std::string path = dir + ".params";
  auto status = run_ranks(2, [&](const RankCtx &ctx) {
    weftComm_t comm;
    weftZero_t z;
    TRY_RC(init(ctx, &comm));
    TRY_RC(make_model(ctx, comm, saver_config(1), kSaved, &z));
    TRY_RC(train(ctx, z, kSaved, 2));
    FAIL_IF(weftZeroSetLr(z, 0.002) != weftSuccess, "lr: %s", weftZeroLastError());
    std::vector<float> p(model_psi(kSaved));
    FAIL_IF(weftZeroGetParams(z, p.data(), nullptr) != weftSuccess, "get: %s",
            weftZeroLastError());
    FAIL_IF(weftZeroSave(z, dir.c_str(), nullptr) != weftSuccess, "save: %s",
            weftZeroLastError());
    if (ctx.rank == 0) spit(path, std::string((const char *)p.data(), p.size() * sizeof(float)));
    weftZeroDestroy(z);
    weftCommDestroy(comm);
    return 0;
  });
  for (int s : status) ASSERT_EQ(s, 0);
  const std::string raw = slurp(path);
  params->resize(raw.size() / sizeof(float));
  memcpy(params->data(), raw.data(), raw.size());
  unlink(path.c_str());
}

std::vector<std::string> lines_of(const std::string &text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  return lines;
}

// Loads dir into model m on n ranks at stage: with needle, every rank must
// refuse (weftInvalidUsage) naming it and keep its parameters and step
// count; without, every rank must load `want` bit for bit at step 2.
void expect_load(const std::string &dir, int n, int stage, const Model &m,
                 const weftZeroConfig_t &cfg_in, const char *needle,
                 const std::vector<float> &want) {
  auto status = run_ranks(n, [&](const RankCtx &ctx) {
    weftComm_t comm;
    weftZero_t z;
    TRY_RC(init(ctx, &comm));
    weftZeroConfig_t cfg = cfg_in;
    cfg.stage = stage;
    TRY_RC(make_model(ctx, comm, cfg, m, &z));
    std::vector<float> before(model_psi(m)), after(model_psi(m));
    FAIL_IF(weftZeroGetParams(z, before.data(), nullptr) != weftSuccess, "get");
    const weftResult_t res = weftZeroLoad(z, dir.c_str(), nullptr);
    const std::string msg = weftZeroLastError();
    FAIL_IF(weftZeroGetParams(z, after.data(), nullptr) != weftSuccess, "get after");
    if (needle != nullptr) {
      FAIL_IF(res != weftInvalidUsage || msg.find(needle) == std::string::npos,
              "%d ranks, stage %d: want a refusal naming \"%s\", got %s: %s", n, stage, needle,
              weftGetErrorString(res), msg.c_str());
      FAIL_IF(before != after || weftZeroStepCount(z) != 0, "a refused load changed the context");
      if (ctx.rank == 0 && n == 2) printf("refused: %s\n", msg.c_str());
    } else {
      FAIL_IF(res != weftSuccess, "%d ranks, stage %d: load: %s", n, stage, msg.c_str());
      FAIL_IF(after != want || weftZeroStepCount(z) != 2,
              "%d ranks, stage %d: the loaded parameters or step differ", n, stage);
    }
    weftZeroDestroy(z);
    weftCommDestroy(comm);
    return 0;
  }, [] {
    RunOptions o;
    o.allow_warnings = true;
    return o;
  }());
  for (int r = 0; r < n; r++) EXPECT_EQ(status[r], 0) << n << " ranks, rank " << r;
}

class ZeroCkptParams : public testing::Test {
 protected:
  void SetUp() override {
    root_ = temp_dir("params");
    ASSERT_FALSE(root_.empty());
    dir_ = root_ + "/ckpt";
    save_model(dir_, &saved_);
    ASSERT_EQ(saved_.size(), model_psi(kSaved));
    ver_ = dir_ + "/step-2";
  }
  void TearDown() override { sh("rm -rf " + root_); }
  std::string root_, dir_, ver_;
  std::vector<float> saved_;
};

// The manifest records every parameter and the hyperparameters of the save
// (the rate weftZeroSetLr set last).
TEST_F(ZeroCkptParams, ManifestRecordsParametersAndHyperparameters) {
  const std::vector<std::string> lines = lines_of(slurp(ver_ + "/manifest"));
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines[0], "weft-zero-checkpoint 5");
  for (const char *want :
       {"lr 0.002", "beta1 0.90000000000000002", "beta2 0.98999999999999999",
        "eps 1e-08", "momentum 0.90000000000000002", "weight_decay 0.10000000000000001",
        "max_grad_norm 1", "accum_steps 1", "layers 3", "params 3",
        "param 0 0 5 0.10000000000000001", "param 1 1 7 0", "param 2 2 3 0.10000000000000001"}) {
    bool found = false;
    for (const std::string &l : lines) found = found || l == want;
    EXPECT_TRUE(found) << "no line \"" << want << "\" in the manifest";
  }
}

// Layers of the same sizes, cut into other parameters: refused on 1, 2 and
// 3 ranks at every stage, naming the first parameter that differs; the
// model as saved loads.
TEST_F(ZeroCkptParams, BoundariesThatDifferAreRefused) {
  weftZeroConfig_t cfg = saver_config(0);
  const Model split_first = {{{2, 3}, {7}, {3}}, {}};
  const Model split_second = {{{5}, {4, 3}, {3}}, {}};
  const Model merged = {{{5}, {7}, {1, 1, 1}}, {}};
  for (int n : {1, 2, 3}) {
    const int stage = n == 1 ? 0 : n == 2 ? 3 : 2;
    expect_load(dir_, n, stage, split_first, cfg,
                "parameter 0 is layer 0, count 5 in the checkpoint; layer 0, count 2 in this "
                "model", {});
    expect_load(dir_, n, stage, split_second, cfg,
                "parameter 1 is layer 1, count 7 in the checkpoint; layer 1, count 4 in this "
                "model", {});
    expect_load(dir_, n, stage, merged, cfg,
                "parameter 2 is layer 2, count 3 in the checkpoint; layer 2, count 1 in this "
                "model (3 parameters in the checkpoint, 5 in this model)", {});
    expect_load(dir_, n, stage, kSaved, cfg, nullptr, saved_);
  }
}

// Another rate, betas, eps, clipping, micro-steps and weight decays (the
// configuration's and each parameter's): the checkpoint loads.
TEST_F(ZeroCkptParams, OtherHyperparametersLoad) {
  weftZeroConfig_t cfg;
  weftZeroConfigDefaults(&cfg);
  cfg.lr = 5e-3;
  cfg.beta1 = 0.8;
  cfg.beta2 = 0.95;
  cfg.eps = 1e-6;
  cfg.weightDecay = 0.0;
  cfg.maxGradNorm = 0.0;
  cfg.accumSteps = 2;
  const Model other_decays = {kSaved.layers, {0.0, 0.3, 0.0}};
  expect_load(dir_, 2, 2, other_decays, cfg, nullptr, saved_);
  expect_load(dir_, 3, 1, kSaved, cfg, nullptr, saved_);
}

// A format 3 manifest, written out here from the saved one's run and
// shards: it loads bit for bit, and (recording no parameters) into a model
// cut otherwise too.
TEST_F(ZeroCkptParams, FormatThreeLoads) {
  const std::vector<std::string> four = lines_of(slurp(ver_ + "/manifest"));
  auto value = [&](const char *key) {
    for (const std::string &l : four)
      if (l.rfind(std::string(key) + " ", 0) == 0) return l.substr(strlen(key) + 1);
    ADD_FAILURE() << "no " << key << " line";
    return std::string();
  };
  std::string text = "weft-zero-checkpoint 3\nrun " + value("run") +
                     "\nnranks 2\nstage 1\noptimizer adamw\nstep 2\nloss_scale 1\n"
                     "loss_scaled 0\nupdates 2\ngood_steps 0\nlayers 3\n"
                     "layer 0 5\nlayer 1 7\nlayer 2 3\n";
  for (const std::string &l : four)
    if (l.rfind("shard ", 0) == 0) text += l + "\n";
  char last[32];
  snprintf(last, sizeof last, "crc32c %08x\n", crc32c_ref(0, text.data(), text.size()));
  // the same as the saved manifest without the lines of formats 4 and 5
  std::string stripped;
  for (const std::string &l : four)
    if (!format4_only(l) && l.rfind("crc32c ", 0) != 0)
      stripped += (l == four[0] ? std::string("weft-zero-checkpoint 3") : l) + "\n";
  EXPECT_EQ(stripped, text);
  spit(ver_ + "/manifest", text + last);
  weftZeroConfig_t cfg = saver_config(0);
  expect_load(dir_, 2, 3, kSaved, cfg, nullptr, saved_);
  expect_load(dir_, 1, 0, {{{2, 3}, {7}, {3}}, {}}, cfg, nullptr, saved_);
  std::string out = root_ + "/full.bin";
  EXPECT_EQ(weftZeroConsolidate(dir_.c_str(), out.c_str()), weftSuccess) << weftZeroLastError();
}

// Parameter lines that contradict the layers, re-signed, are refused when
// the manifest is read (by consolidation here, which has no model).
TEST_F(ZeroCkptParams, ParameterLinesThatDoNotAddUpAreRefused) {
  const std::string pristine = slurp(ver_ + "/manifest");
  struct Edit {
    const char *from, *to, *needle;
  };
  const Edit edits[] = {
      {"param 1 1 7 0", "param 1 1 6 0", "layer 1's parameters make 6 elements, the layer 7"},
      {"param 1 1 7 0", "param 1 1 8 0", "parameter 1 (8 elements) overfills layer 1"},
      {"param 2 2 3 0.10000000000000001", "param 2 2 2 0.10000000000000001",
       "its parameters do not fill its 3 layers"},
      {"param 1 1 7 0", "param 1 2 7 0", "parameter 1 is in layer 2 after one of layer 0"},
      {"param 1 1 7 0", "param 1 1 7 -1", "parameter 1 is missing or malformed"},
      {"param 1 1 7 0", "param 1 1 7 nan", "parameter 1 is missing or malformed"},
      {"param 1 1 7 0", "param 1 1 7 ", "parameter 1 is missing or malformed"},
      {"param 1 1 7 0", "param 7 1 7 0", "parameter 1 is missing or malformed"},
      {"params 3", "params 2", "2 parameters cannot fill 3 layers"},
      {"params 3", "params 4", "parameter 3 is missing or malformed"},
      {"params 3", "params 99999999", "99999999 parameters do not fit its"},
      {"lr 0.002", "lr 0.002x", "the hyperparameter lines are malformed"},
      {"accum_steps 1", "accum_steps 0", "the hyperparameter lines are malformed"},
  };
  const std::string out = root_ + "/full.bin";
  for (const Edit &e : edits) {
    spit(ver_ + "/manifest", pristine);
    bool edited = false;
    resign(ver_, 2, [&](std::vector<std::string> &lines) {
      for (std::string &l : lines)
        if (l == e.from) l = e.to, edited = true;
    });
    ASSERT_TRUE(edited) << "no line " << e.from;
    EXPECT_NE(weftZeroConsolidate(dir_.c_str(), out.c_str()), weftSuccess) << e.to;
    EXPECT_NE(std::string(weftZeroLastError()).find(e.needle), std::string::npos)
        << e.to << ": " << weftZeroLastError();
    EXPECT_NE(access(out.c_str(), F_OK), 0);
  }
  // the pristine manifest, re-signed as it was, consolidates
  spit(ver_ + "/manifest", pristine);
  resign(ver_, 2);
  EXPECT_EQ(slurp(ver_ + "/manifest"), pristine);
  EXPECT_EQ(weftZeroConsolidate(dir_.c_str(), out.c_str()), weftSuccess) << weftZeroLastError();
}

}  // namespace
