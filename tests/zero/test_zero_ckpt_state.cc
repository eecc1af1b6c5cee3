// A checkpoint's client state (weftZeroSaveWithState, weftZeroLoadedState):
// random bytes of 0, 1, 4097 and 1 MiB + 5 bytes saved on 1, 2 and 3 ranks
// come back on every rank of another rank count, next to the model state;
// a state file flipped, cut short, lengthened, emptied, deleted or made a
// device, and manifest state lines that do not hold, fail the load on every
// rank naming what broke, the context (its parameters, step and loaded
// state) as it was; a checkpoint of weftZeroSave, or of format 4, has none;
// rank 0's state over the bound, or NULL with bytes, is refused on every
// rank before anything is written, while the other ranks' arguments are
// ignored; consolidation does not read the state.
#include <gtest/gtest.h>

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "harness.h"
#include "weft_zero.h"
#include "zero_ckpt_model.h"
#include "zero_ranks.h"

using namespace weft_test;

namespace {

const char kStateFile[] = "/client-state.bin";

std::string random_bytes(size_t nbytes, uint64_t seed) {
  Rng rng(seed);
  std::string s(nbytes, '\0');
  for (size_t i = 0; i < nbytes; i += 8) {
    const uint64_t v = rng.next();
    memcpy(&s[i], &v, nbytes - i < 8 ? nbytes - i : 8);
  }
  return s;
}

RunOptions warnings_allowed() {
  RunOptions o;
  o.allow_warnings = true;
  return o;
}

// The model of zero_ckpt_model.h after two steps on n ranks at stage 1,
// saved into dir: with state, rank 0 gives it to weftZeroSaveWithState and
// the other ranks NULL with more bytes than the bound (ignored); without,
// weftZeroSave. Rank 0's parameters go to params_out.
void save_on(const std::string &dir, int n, const std::string *state,
             std::vector<float> *params_out) {
  const std::string path = dir + ".params";
  auto status = run_ranks(n, [&](const RankCtx &ctx) {
    weftComm_t comm;
    weftZero_t z;
    TRY_RC(init(ctx, &comm));
    TRY_RC(make_ctx(ctx, comm, 1, 0, test_seed(), &z));
    TRY_RC(train_two_steps(ctx, z, test_seed()));
    std::vector<float> p(psi());
    FAIL_IF(weftZeroGetParams(z, p.data(), nullptr) != weftSuccess, "get: %s",
            weftZeroLastError());
    weftResult_t res;
    if (state == nullptr) res = weftZeroSave(z, dir.c_str(), nullptr);
    else if (ctx.rank == 0)
      res = weftZeroSaveWithState(z, dir.c_str(), state->data(), state->size(), nullptr);
    else
      res = weftZeroSaveWithState(z, dir.c_str(), nullptr, WEFT_ZERO_STATE_MAX_NBYTES + 1,
                                  nullptr);
    FAIL_IF(res != weftSuccess, "save: %s", weftZeroLastError());
    if (ctx.rank == 0) spit(path, std::string((const char *)p.data(), p.size() * sizeof(float)));
    weftZeroDestroy(z);
    weftCommDestroy(comm);
    return 0;
  });
  for (int r = 0; r < n; r++) ASSERT_EQ(status[r], 0) << "saving on " << n << " ranks, rank " << r;
  const std::string raw = slurp(path);
  params_out->resize(raw.size() / sizeof(float));
  memcpy(params_out->data(), raw.data(), raw.size());
  unlink(path.c_str());
}

// In a rank: the loaded state is want (empty: none, NULL).
int expect_state(const RankCtx &ctx, weftZero_t z, const std::string &want, const char *when) {
  const void *got = nullptr;
  size_t nbytes = 12345;
  FAIL_IF(weftZeroLoadedState(z, &got, &nbytes) != weftSuccess, "%s: loaded state: %s", when,
          weftZeroLastError());
  FAIL_IF(nbytes != want.size(), "%s: %zu bytes of state, want %zu", when, nbytes, want.size());
  FAIL_IF(want.empty() && got != nullptr, "%s: no state, but not NULL", when);
  FAIL_IF(!want.empty() && (got == nullptr || memcmp(got, want.data(), nbytes) != 0),
          "%s: the state's bytes differ", when);
  return 0;
}

std::string state_line(const std::string &state) {
  char line[64];
  snprintf(line, sizeof line, "\nstate %zu %08x\n", state.size(),
           state.empty() ? 0u : crc32c_ref(0, state.data(), state.size()));
  return line;
}

// Saved on one rank count, loaded on another: the bytes, on every rank,
// beside the model state saved with them.
TEST(ZeroCkptState, RoundTripsToAnotherRankCount) {
  struct Ranks {
    int save, load, load_stage;
  };
  const Ranks ranks[] = {{1, 3, 3}, {2, 1, 0}, {3, 2, 2}};
  const size_t sizes[] = {0, 1, 4097, (1u << 20) + 5};
  const std::string root = temp_dir("state");
  ASSERT_FALSE(root.empty());
  for (const Ranks &rk : ranks)
    for (size_t nbytes : sizes) {
      SCOPED_TRACE("saved on " + std::to_string(rk.save) + " ranks, loaded on " +
                   std::to_string(rk.load) + ", " + std::to_string(nbytes) + " bytes");
      const std::string dir = root + "/" + std::to_string(rk.save) + "-" + std::to_string(nbytes);
      const std::string state = random_bytes(nbytes, test_seed() + nbytes);
      std::vector<float> saved;
      save_on(dir, rk.save, &state, &saved);
      const std::string ver = dir + "/step-2";
      EXPECT_NE(slurp(ver + "/manifest").find(state_line(state)), std::string::npos);
      if (nbytes > 0) EXPECT_TRUE(slurp(ver + kStateFile) == state);
      else EXPECT_NE(access((ver + kStateFile).c_str(), F_OK), 0) << "an empty state's file";
      auto status = run_ranks(rk.load, [&](const RankCtx &ctx) {
        weftComm_t comm;
        weftZero_t z;
        TRY_RC(init(ctx, &comm));
        TRY_RC(make_ctx(ctx, comm, rk.load_stage, 0, 777, &z));
        TRY_RC(expect_state(ctx, z, "", "before any load"));
        FAIL_IF(weftZeroLoad(z, dir.c_str(), nullptr) != weftSuccess, "load: %s",
                weftZeroLastError());
        TRY_RC(expect_state(ctx, z, state, "after the load"));
        std::vector<float> p(psi());
        FAIL_IF(weftZeroGetParams(z, p.data(), nullptr) != weftSuccess, "get");
        FAIL_IF(p != saved || weftZeroStepCount(z) != 2, "the model state differs");
        weftZeroDestroy(z);
        weftCommDestroy(comm);
        return 0;
      });
      for (int r = 0; r < rk.load; r++) EXPECT_EQ(status[r], 0) << "rank " << r;
    }
  sh("rm -rf " + root);
}

// weftZeroSave writes no state (its manifest's line says 0, no file), and a
// load of it replaces the state of an earlier load with none; a format 4
// manifest (no state line) loads without one too.
TEST(ZeroCkptState, WeftZeroSaveAndFormatFourHaveNone) {
  const std::string root = temp_dir("nostate");
  ASSERT_FALSE(root.empty());
  const std::string with = root + "/with", without = root + "/without", four = root + "/four";
  const std::string state = random_bytes(777, test_seed());
  std::vector<float> saved;
  save_on(with, 2, &state, &saved);
  save_on(without, 2, nullptr, &saved);
  const std::string manifest = slurp(without + "/step-2/manifest");
  EXPECT_EQ(manifest.rfind("weft-zero-checkpoint 5\n", 0), 0u) << manifest.substr(0, 40);
  EXPECT_NE(manifest.find("\nstate 0 00000000\n"), std::string::npos);
  EXPECT_NE(access((without + "/step-2" + kStateFile).c_str(), F_OK), 0);
  sh("cp -r " + with + " " + four);
  resign(four + "/step-2", 2, [](std::vector<std::string> &lines) {
    lines[0] = "weft-zero-checkpoint 4";
    for (size_t i = 0; i < lines.size(); i++)
      if (lines[i].rfind("state ", 0) == 0) lines.erase(lines.begin() + (long)i--);
  });
  auto status = run_ranks(3, [&](const RankCtx &ctx) {
    weftComm_t comm;
    weftZero_t z;
    TRY_RC(init(ctx, &comm));
    TRY_RC(make_ctx(ctx, comm, 2, 0, 777, &z));
    for (const std::string *dir : {&with, &without, &with, &four}) {
      FAIL_IF(weftZeroLoad(z, dir->c_str(), nullptr) != weftSuccess, "load %s: %s",
              dir->c_str(), weftZeroLastError());
      TRY_RC(expect_state(ctx, z, dir == &with ? state : "", dir->c_str()));
      std::vector<float> p(psi());
      FAIL_IF(weftZeroGetParams(z, p.data(), nullptr) != weftSuccess, "get");
      FAIL_IF(p != saved || weftZeroStepCount(z) != 2, "%s: the model state differs",
              dir->c_str());
    }
    weftZeroDestroy(z);
    weftCommDestroy(comm);
    return 0;
  });
  for (int r = 0; r < 3; r++) EXPECT_EQ(status[r], 0) << "rank " << r;
  sh("rm -rf " + root);
}

class ZeroCkptStateDamage : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = new std::string(temp_dir("statedamage"));
    ASSERT_FALSE(root_->empty());
    state_ = new std::string(random_bytes(3001, test_seed() + 3));
    std::vector<float> saved;
    save_on(*root_ + "/pristine", 2, state_, &saved);
  }
  static void TearDownTestSuite() {
    sh("rm -rf " + *root_);
    delete root_;
    delete state_;
  }
  void SetUp() override {
    bad_ = *root_ + "/bad";
    sh("rm -rf " + bad_ + " && cp -r " + *root_ + "/pristine " + bad_);
    ver_ = bad_ + "/step-2";
  }

  // On 3 ranks at stage 3: the pristine checkpoint loads, one step is taken,
  // then the damaged one is refused with code and needle on every rank, and
  // the parameters, step and loaded state are those before it.
  void expect_refused(weftResult_t code, const std::string &needle) {
    const std::string pristine = *root_ + "/pristine", bad = bad_, state = *state_;
    auto status = run_ranks(3, [&](const RankCtx &ctx) {
      weftComm_t comm;
      weftZero_t z;
      TRY_RC(init(ctx, &comm));
      TRY_RC(make_ctx(ctx, comm, 3, 0, 777, &z));
      FAIL_IF(weftZeroLoad(z, pristine.c_str(), nullptr) != weftSuccess, "load: %s",
              weftZeroLastError());
      TRY_RC(train_steps(ctx, z, 99, 1));
      std::vector<float> before(psi()), after(psi());
      FAIL_IF(weftZeroGetParams(z, before.data(), nullptr) != weftSuccess, "get");
      const weftResult_t res = weftZeroLoad(z, bad.c_str(), nullptr);
      const std::string msg = weftZeroLastError();
      FAIL_IF(res != code || msg.find(needle) == std::string::npos,
              "want %s naming \"%s\", got %s: %s", weftGetErrorString(code), needle.c_str(),
              weftGetErrorString(res), msg.c_str());
      if (ctx.rank == 0) printf("refused: %s\n", msg.c_str());
      FAIL_IF(weftZeroGetParams(z, after.data(), nullptr) != weftSuccess, "get after");
      FAIL_IF(before != after || weftZeroStepCount(z) != 3, "a refused load changed the model");
      TRY_RC(expect_state(ctx, z, state, "after the refused load"));
      weftZeroDestroy(z);
      weftCommDestroy(comm);
      return 0;
    }, warnings_allowed());
    for (int r = 0; r < 3; r++) EXPECT_EQ(status[r], 0) << "rank " << r;
  }

  void edit_state_line(const std::string &line) {
    resign(ver_, 2, [&](std::vector<std::string> &lines) {
      for (size_t i = 0; i < lines.size(); i++)
        if (lines[i].rfind("state ", 0) == 0) {
          if (line.empty()) lines.erase(lines.begin() + (long)i--);
          else lines[i] = line;
        }
    });
  }

  static std::string *root_, *state_;
  std::string bad_, ver_;
};

std::string *ZeroCkptStateDamage::root_, *ZeroCkptStateDamage::state_;

TEST_F(ZeroCkptStateDamage, FlippedByte) {
  std::string s = *state_;
  s[1234] ^= 0x10;
  spit(ver_ + kStateFile, s);
  expect_refused(weftInvalidUsage, std::string(kStateFile + 1) + " is damaged: its checksum is");
}

TEST_F(ZeroCkptStateDamage, Truncated) {
  spit(ver_ + kStateFile, state_->substr(0, 3000));
  expect_refused(weftInvalidUsage, std::string(kStateFile + 1) +
                                       " is 3000 bytes, the manifest's client state 3001");
}

TEST_F(ZeroCkptStateDamage, Lengthened) {
  spit(ver_ + kStateFile, *state_ + "x");
  expect_refused(weftInvalidUsage, std::string(kStateFile + 1) + " is 3002 bytes");
}

TEST_F(ZeroCkptStateDamage, Emptied) {
  spit(ver_ + kStateFile, "");
  expect_refused(weftInvalidUsage, std::string(kStateFile + 1) + " is 0 bytes");
}

TEST_F(ZeroCkptStateDamage, Deleted) {
  ASSERT_EQ(unlink((ver_ + kStateFile).c_str()), 0);
  expect_refused(weftSystemError, std::string("cannot open ") + ver_ + kStateFile);
}

TEST_F(ZeroCkptStateDamage, ADevice) {
  ASSERT_EQ(unlink((ver_ + kStateFile).c_str()), 0);
  ASSERT_EQ(symlink("/dev/zero", (ver_ + kStateFile).c_str()), 0);
  expect_refused(weftInvalidUsage, std::string(kStateFile + 1) + " is not a regular file");
}

// Manifest lines edited and re-checksummed, as a careless tool would.
TEST_F(ZeroCkptStateDamage, StateLinesThatDoNotHold) {
  edit_state_line("");
  expect_refused(weftInvalidUsage, "the state line is missing or malformed");
  SetUp();
  edit_state_line("state 3001 xyz");
  expect_refused(weftInvalidUsage, "the state line is missing or malformed");
  SetUp();
  edit_state_line("state 3001 -0000001");
  expect_refused(weftInvalidUsage, "the state line is missing or malformed");
  SetUp();
  edit_state_line("state 3000 " + state_line(state_->substr(0, 3000)).substr(12, 8));
  expect_refused(weftInvalidUsage, "client-state.bin is 3001 bytes, the manifest's client "
                                   "state 3000");
  SetUp();
  edit_state_line("state 67108865 00000001");
  expect_refused(weftInvalidUsage, "a client state of 67108865 bytes, more than the 67108864");
  SetUp();
  edit_state_line("state 0 00000001");
  expect_refused(weftInvalidUsage, "an empty client state with checksum 00000001");
}

// Consolidation neither reads nor checks the state.
TEST_F(ZeroCkptStateDamage, ConsolidationIgnoresIt) {
  ASSERT_EQ(unlink((ver_ + kStateFile).c_str()), 0);
  const std::string out = bad_ + ".bin";
  EXPECT_EQ(weftZeroConsolidate(bad_.c_str(), out.c_str()), weftSuccess) << weftZeroLastError();
  unlink(out.c_str());
}

// Rank 0's state over the bound, or NULL with bytes: weftInvalidArgument
// there, weftRemoteError elsewhere, nothing written (not even the
// directory); the context saves afterwards. A state of exactly the bound
// saves and loads. NULL arguments of weftZeroLoadedState are refused.
TEST(ZeroCkptState, Refusals) {
  const std::string root = temp_dir("staterefused");
  ASSERT_FALSE(root.empty());
  const std::string dir = root + "/ckpt";
  const std::string big = random_bytes(WEFT_ZERO_STATE_MAX_NBYTES, test_seed() + 9);
  auto status = run_ranks(2, [&](const RankCtx &ctx) {
    weftComm_t comm;
    weftZero_t z;
    TRY_RC(init(ctx, &comm));
    TRY_RC(make_ctx(ctx, comm, 2, 0, 5, &z));
    TRY_RC(train_two_steps(ctx, z, 5));
    const char one = 1;
    struct Refusal {
      const void *state;
      size_t nbytes;
      const char *needle;
    };
    const Refusal refusals[] = {
        {&one, WEFT_ZERO_STATE_MAX_NBYTES + 1, "a client state of 67108865 bytes, more than"},
        {&one, SIZE_MAX, "more than the 67108864 a checkpoint holds"},
        {nullptr, 5, "the client state is NULL, of 5 bytes"}};
    for (const Refusal &r : refusals) {
      const weftResult_t res = ctx.rank == 0
                                   ? weftZeroSaveWithState(z, dir.c_str(), r.state, r.nbytes,
                                                           nullptr)
                                   : weftZeroSaveWithState(z, dir.c_str(), nullptr, 0, nullptr);
      const std::string msg = weftZeroLastError();
      if (ctx.rank == 0)
        FAIL_IF(res != weftInvalidArgument || msg.find(r.needle) == std::string::npos,
                "want weftInvalidArgument naming \"%s\", got %s: %s", r.needle,
                weftGetErrorString(res), msg.c_str());
      else
        FAIL_IF(res != weftRemoteError, "want weftRemoteError, got %s: %s",
                weftGetErrorString(res), msg.c_str());
      FAIL_IF(access(dir.c_str(), F_OK) == 0, "a refused save made %s", dir.c_str());
    }
    const void *got;
    size_t nbytes;
    FAIL_IF(weftZeroLoadedState(z, nullptr, &nbytes) != weftInvalidArgument, "NULL state_out");
    FAIL_IF(weftZeroLoadedState(z, &got, nullptr) != weftInvalidArgument, "NULL nbytes_out");
    FAIL_IF(weftZeroLoadedState(nullptr, &got, &nbytes) != weftInvalidArgument, "NULL zero");
    const weftResult_t res =
        ctx.rank == 0 ? weftZeroSaveWithState(z, dir.c_str(), big.data(), big.size(), nullptr)
                      : weftZeroSaveWithState(z, dir.c_str(), &one, 1, nullptr);
    FAIL_IF(res != weftSuccess, "a save of the bound: %s", weftZeroLastError());
    FAIL_IF(weftZeroLoad(z, dir.c_str(), nullptr) != weftSuccess, "load: %s",
            weftZeroLastError());
    TRY_RC(expect_state(ctx, z, big, "the bound"));
    weftZeroDestroy(z);
    weftCommDestroy(comm);
    return 0;
  }, warnings_allowed());
  for (int r = 0; r < 2; r++) EXPECT_EQ(status[r], 0) << "rank " << r;
  sh("rm -rf " + root);
}

}  // namespace
