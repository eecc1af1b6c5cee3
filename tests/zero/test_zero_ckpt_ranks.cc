// Checkpoints on ranks that fail or disagree: a read or an installation
// failing on one rank after the checks, and a sync failing on one rank before
// the first agreement, fail every rank and leave every context as it was;
// ranks reading different checkpoints refuse; a save removes only what it
// supersedes and refuses before any write; a write-back failing after the
// installation refuses steps until a load (damaged checkpoints:
// test_zero_ckpt.cc).
#include <gtest/gtest.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "harness.h"
#include "weft_zero.h"
#include "zero_ckpt_model.h"
#include "zero_ranks.h"
extern "C" {
#include "zero/zero_internal.h"  // zero_ops_host, to fail one rank's read
#include "zero/zero_test_hooks.h"  // zero_test_save_crash_rank
}

using namespace weft_test;

namespace {

// A load that fails on one rank after every rank checked the checkpoint,
// through a table with the device path's copies on the last rank: a read
// (its first copy truncates its own shard, which no other rank reads), or
// the installation (the copy into moment1 fails, after the master weights
// went in). Every rank fails, and every context is as it was: gradients
// accumulated before the attempt and the state give the step that follows
// without it, bit for bit.
enum class Attempt { kNone, kReadFails, kInstallFails };
std::string truncate_path;
weftResult_t copy_truncating(void *dst, const void *src, size_t n, weftStream_t s) {
  if (!truncate_path.empty() && truncate(truncate_path.c_str(), 100) == 0) truncate_path.clear();
  return zero_ops_host.copy(dst, src, n, s);
}
void *fail_dst;  // the copy into it fails, once
weftResult_t copy_failing_into(void *dst, const void *src, size_t n, weftStream_t s) {
  if (dst != nullptr && dst == fail_dst) {
    fail_dst = nullptr;
    return weftUnhandledCudaError;
  }
  return zero_ops_host.copy(dst, src, n, s);
}

std::string failed_load_run(int nranks, int stage, Attempt attempt, const std::string &dir) {
  std::string out = dir + (attempt != Attempt::kNone ? ".tried" : ".plain");
  auto status = run_ranks(nranks, [&](const RankCtx &ctx) {
    weftComm_t comm;
    weftZero_t z;
    if (int rc = init(ctx, &comm)) return rc;
    if (int rc = make_ctx(ctx, comm, stage, 0, 99, &z)) return rc;
    if (int rc = train_two_steps(ctx, z, 99)) return rc;
    FAIL_IF(weftZeroSave(z, dir.c_str(), nullptr) != weftSuccess, "save: %s", weftZeroLastError());
    if (int rc = train_two_steps(ctx, z, 5)) return rc;
    for (size_t l = 0; l < kLayers.size(); l++) {  // a gradient waiting for the next step
      void *g;
      std::vector<float> grad(kLayers[l], 0.125f * (float)(l + 1));
      FAIL_IF(weftZeroGrad(z, (int)l, &g) != weftSuccess, "grad: %s", weftZeroLastError());
      weftZeroAccumulate(g, weftFloat32, grad.data(), grad.size());
    }
    static struct zero_ops hooked = zero_ops_host;
    hooked.device = 1;
    hooked.copy = attempt == Attempt::kReadFails ? copy_truncating : copy_failing_into;
    if (const int last = ctx.nranks - 1; attempt != Attempt::kNone) {
      char path[64];
      snprintf(path, sizeof path, "/step-2/rank-%05d.bin", ctx.rank);
      if (ctx.rank == last) {
        z->ops = &hooked;
        if (attempt == Attempt::kReadFails) truncate_path = dir + path;
        else fail_dst = z->moment1;
      }
      weftResult_t res = weftZeroLoad(z, dir.c_str(), nullptr);
      z->ops = &zero_ops_host;
      FAIL_IF(ctx.rank == last && attempt == Attempt::kReadFails &&
                  (res != weftSystemError || !truncate_path.empty() ||
                   strstr(weftZeroLastError(), "short or unreadable") == nullptr),
              "the failing rank: %d, %s", res, weftZeroLastError());
      FAIL_IF(ctx.rank == last && attempt == Attempt::kInstallFails &&
                  (res != weftUnhandledCudaError || fail_dst != nullptr),
              "the failing rank: %d, %s", res, weftZeroLastError());
      FAIL_IF(weftZeroStepCount(z) != 4, "the step count changed to %ld", weftZeroStepCount(z));
      FAIL_IF(ctx.rank != last && res != weftRemoteError, "load: %d, %s", res,
              weftZeroLastError());
    }
    for (size_t l = 0; l < kLayers.size(); l++)
      FAIL_IF(weftZeroGradReady(z, (int)l, nullptr) != weftSuccess, "ready: %s",
              weftZeroLastError());
    std::vector<float> p(psi());
    FAIL_IF(weftZeroStep(z, nullptr, nullptr) != weftSuccess ||
                weftZeroGetParams(z, p.data(), nullptr) != weftSuccess,
            "step: %s", weftZeroLastError());
    spit(out + "." + std::to_string(ctx.rank), std::string((char *)p.data(), p.size() * 4));
    weftZeroDestroy(z);
    weftCommDestroy(comm);
    return 0;
  });
  std::string all;
  for (int r = 0; r < nranks; r++) {
    EXPECT_EQ(status[r], 0) << "rank " << r;
    all += slurp(out + "." + std::to_string(r));
    unlink((out + "." + std::to_string(r)).c_str());
  }
  sh("rm -rf " + dir);
  return all;
}
// Each of 2 and 3 ranks, stages 1 and 3: after the failed attempt every
// rank's next step gives what it gives with no attempt before it.
void expect_attempt_changes_nothing(Attempt attempt, const char *dir_name) {
  for (int n : {2, 3})
    for (int stage : {1, 3}) {
      SCOPED_TRACE(std::to_string(n) + " ranks, stage " + std::to_string(stage));
      std::string dir = temp_dir(dir_name);
      std::string want = failed_load_run(n, stage, Attempt::kNone, dir);
      std::string got = failed_load_run(n, stage, attempt, dir);
      EXPECT_EQ(want.size(), n * psi() * sizeof(float));
      EXPECT_TRUE(got == want) << "a failed load changed a context";
    }
}

TEST(ZeroCkptFailedRead, EveryRankKeepsItsContext) {
  expect_attempt_changes_nothing(Attempt::kReadFails, "failed-read");
}

TEST(ZeroCkptFailedInstall, EveryRankPutsItsStateBack) {
  expect_attempt_changes_nothing(Attempt::kInstallFails, "failed-install");
}

// A failure of one rank before the first agreement (its stream's sync) is
// that rank's part of it: save and load fail on every rank at once (the
// others weftRemoteError), and the next save and load on the same
// communicator succeed; had the rank returned early, its peers would be
// left in the agreement's all-reduce and the calls would pair up wrongly.
int sync_fails;  // sync calls to fail
weftResult_t sync_failing(weftStream_t stream, weftComm_t comm, const char *what) {
  if (sync_fails > 0) {
    sync_fails--;
    return weftUnhandledCudaError;
  }
  return zero_ops_host.sync(stream, comm, what);
}

TEST(ZeroCkptLocalFailure, EveryRankEntersTheAgreement) {
  std::string dir = temp_dir("local-failure");
  RunOptions o;
  o.env = {{"WEFT_TIMEOUT", "10"}};
  o.timeout_s = 40;
  o.allow_warnings = true;
  double t0 = now_s();
  auto status = run_ranks(3, [&](const RankCtx &ctx) {
    weftComm_t comm;
    weftZero_t z;
    if (int rc = init(ctx, &comm)) return rc;
    if (int rc = make_ctx(ctx, comm, 2, 0, 11, &z)) return rc;
    if (int rc = train_two_steps(ctx, z, 11)) return rc;
    static struct zero_ops hooked = zero_ops_host;
    hooked.sync = sync_failing;
    const bool failing = ctx.rank == 1;
    const weftResult_t want = failing ? weftUnhandledCudaError : weftRemoteError;
    if (failing) z->ops = &hooked, sync_fails = 1;
    weftResult_t res = weftZeroSave(z, dir.c_str(), nullptr);
    FAIL_IF(res != want, "the save with a failed sync: %d, %s", res, weftZeroLastError());
    FAIL_IF(weftZeroSave(z, dir.c_str(), nullptr) != weftSuccess, "the next save: %s",
            weftZeroLastError());
    if (int rc = train_two_steps(ctx, z, 12)) return rc;
    if (failing) sync_fails = 1;
    res = weftZeroLoad(z, dir.c_str(), nullptr);
    FAIL_IF(res != want, "the load with a failed sync: %d, %s", res, weftZeroLastError());
    FAIL_IF(weftZeroStepCount(z) != 4, "a refused load changed the step to %ld",
            weftZeroStepCount(z));
    FAIL_IF(weftZeroLoad(z, dir.c_str(), nullptr) != weftSuccess, "the next load: %s",
            weftZeroLastError());
    FAIL_IF(weftZeroStepCount(z) != 2, "the load gave step %ld", weftZeroStepCount(z));
    z->ops = &zero_ops_host;
    weftZeroDestroy(z);
    weftCommDestroy(comm);
    return 0;
  }, o);
  for (int r = 0; r < 3; r++) EXPECT_EQ(status[r], 0) << "rank " << r;
  EXPECT_LT(now_s() - t0, 8.0) << "a rank waited for the timeout";
  sh("rm -rf " + dir);
}

// The state of a checkpoint directory as rank 0 sees it after a save.
bool exists(const std::string &path) { return access(path.c_str(), F_OK) == 0; }
std::string latest_of(const std::string &dir) { return slurp(dir + "/LATEST"); }

// A save removes only what it supersedes: the same run's checkpoints at
// lower steps. A run started afresh in the directory of an earlier run
// keeps that run's checkpoint of a higher step, a directory it cannot read
// and a leftover of an interrupted save it cannot attribute; its own step-1
// goes once its step-3 is in. A save that would replace the earlier run's
// step-2 is refused, before anything is written and leaving no step-2.tmp,
// as is a save of the step LATEST names (rank 1 would exit halfway through
// its shard if it wrote one).
TEST(ZeroCkptPrune, OnlyWhatTheSaveSupersedes) {
  std::string dir = temp_dir("prune");
  auto status = run_ranks(2, [&](const RankCtx &ctx) {
    weftComm_t comm;
    weftZero_t z;
    if (int rc = init(ctx, &comm)) return rc;
    if (int rc = make_ctx(ctx, comm, 1, 0, 21, &z)) return rc;
    if (int rc = train_steps(ctx, z, 21, 2)) return rc;
    FAIL_IF(weftZeroSave(z, dir.c_str(), nullptr) != weftSuccess, "run A's save: %s",
            weftZeroLastError());
    FAIL_IF(weftZeroSave(z, dir.c_str(), nullptr) == weftSuccess, "step 2 saved twice");
    FAIL_IF(ctx.rank == 0 && strstr(weftZeroLastError(), "already holds") == nullptr,
            "the second save of step 2: %s", weftZeroLastError());
    weftZeroDestroy(z);
    if (ctx.rank == 0) {
      sh("mkdir " + dir + "/step-0 " + dir + "/step-0.tmp");  // unreadable: no manifest, no shard
      spit(dir + "/step-0/manifest", "not a manifest\n");
    }
    // run B, from scratch in the same directory
    if (int rc = make_ctx(ctx, comm, 1, 0, 22, &z)) return rc;
    if (int rc = train_steps(ctx, z, 22, 1)) return rc;
    FAIL_IF(weftZeroSave(z, dir.c_str(), nullptr) != weftSuccess, "run B's save of step 1: %s",
            weftZeroLastError());
    FAIL_IF(ctx.rank == 0 && (!exists(dir + "/step-2/manifest") || !exists(dir + "/step-1") ||
                              latest_of(dir) != "step-1\n"),
            "after run B's step 1, LATEST %s, step-2 %d", latest_of(dir).c_str(),
            exists(dir + "/step-2/manifest"));
    if (int rc = train_steps(ctx, z, 23, 1)) return rc;
    zero_test_save_crash_rank = 1;  // from here a shard written is a failure
    weftResult_t res = weftZeroSave(z, dir.c_str(), nullptr);
    FAIL_IF(res != (ctx.rank == 0 ? weftInvalidUsage : weftRemoteError), "run B's step 2: %d",
            res);
    FAIL_IF(ctx.rank == 0 && strstr(weftZeroLastError(), "another run") == nullptr,
            "run B's step 2: %s", weftZeroLastError());
    FAIL_IF(ctx.rank == 0 && exists(dir + "/step-2.tmp"), "the refused save left step-2.tmp");
    zero_test_save_crash_rank = -1;
    if (int rc = train_steps(ctx, z, 24, 1)) return rc;
    FAIL_IF(weftZeroSave(z, dir.c_str(), nullptr) != weftSuccess, "run B's save of step 3: %s",
            weftZeroLastError());
    FAIL_IF(ctx.rank == 0 && (exists(dir + "/step-1") || !exists(dir + "/step-2/manifest") ||
                              !exists(dir + "/step-0") || !exists(dir + "/step-0.tmp") ||
                              latest_of(dir) != "step-3\n"),
            "after run B's step 3: step-1 %d, step-2 %d, step-0 %d, step-0.tmp %d, LATEST %s",
            exists(dir + "/step-1"), exists(dir + "/step-2/manifest"), exists(dir + "/step-0"),
            exists(dir + "/step-0.tmp"), latest_of(dir).c_str());
    zero_test_save_crash_rank = 1;
    FAIL_IF(weftZeroSave(z, dir.c_str(), nullptr) == weftSuccess, "step 3 saved twice");
    FAIL_IF(ctx.rank == 0 && exists(dir + "/step-3.tmp"), "the refused save left step-3.tmp");
    zero_test_save_crash_rank = -1;
    weftZeroDestroy(z);
    weftCommDestroy(comm);
    return 0;
  }, [] {
    RunOptions o;
    o.allow_warnings = true;
    return o;
  }());
  for (int r = 0; r < 2; r++) EXPECT_EQ(status[r], 0) << "rank " << r;
  sh("rm -rf " + dir);
}

// Ranks that read different checkpoints (another step, another run of the
// same step, the same step's manifest edited and re-checksummed) refuse on
// every rank with a message naming the difference, and keep their contexts.
TEST(ZeroCkptLoad, RanksReadingDifferentCheckpointsRefuse) {
  std::string root = temp_dir("mixed");
  const std::string a = root + "/a", b = root + "/b", c = root + "/c", e = root + "/e";
  auto status = run_ranks(2, [&](const RankCtx &ctx) {
    weftComm_t comm;
    weftZero_t z, other;
    if (int rc = init(ctx, &comm)) return rc;
    if (int rc = make_ctx(ctx, comm, 1, 0, 31, &z)) return rc;
    if (int rc = make_ctx(ctx, comm, 1, 0, 32, &other)) return rc;
    if (int rc = train_steps(ctx, z, 31, 2)) return rc;
    if (int rc = train_steps(ctx, other, 32, 2)) return rc;
    FAIL_IF(weftZeroSave(z, a.c_str(), nullptr) != weftSuccess ||
                weftZeroSave(other, c.c_str(), nullptr) != weftSuccess,
            "save: %s", weftZeroLastError());
    if (int rc = train_steps(ctx, z, 33, 1)) return rc;
    FAIL_IF(weftZeroSave(z, b.c_str(), nullptr) != weftSuccess, "save: %s", weftZeroLastError());
    weftZeroDestroy(z);
    weftZeroDestroy(other);
    if (ctx.rank == 0) {
      sh("cp -a " + a + " " + e);
      resign(e + "/step-2", 2, [](std::vector<std::string> &lines) {
        for (std::string &l : lines)
          if (l.rfind("good_steps ", 0) == 0) l = "good_steps 1";
      });
    }
    struct Case {
      std::string rank1_dir;
      const char *needle;
    };
    for (const Case &k : {Case{b, "different checkpoints"}, Case{c, "different runs"},
                          Case{e, "different manifests"}}) {
      if (int rc = make_ctx(ctx, comm, 2, 0, 777, &z)) return rc;
      std::vector<float> before(psi()), after(psi());
      FAIL_IF(weftZeroGetParams(z, before.data(), nullptr) != weftSuccess, "get");
      weftResult_t res = weftZeroLoad(z, (ctx.rank == 0 ? a : k.rank1_dir).c_str(), nullptr);
      FAIL_IF(res != weftInvalidUsage || strstr(weftZeroLastError(), k.needle) == nullptr,
              "loading %s beside a: %d, %s", k.rank1_dir.c_str(), res, weftZeroLastError());
      printf("refused: %s\n", weftZeroLastError());
      FAIL_IF(weftZeroGetParams(z, after.data(), nullptr) != weftSuccess, "get");
      FAIL_IF(before != after || weftZeroStepCount(z) != 0, "a refused load changed the context");
      weftZeroDestroy(z);
    }
    weftCommDestroy(comm);
    return 0;
  });
  for (int r = 0; r < 2; r++) EXPECT_EQ(status[r], 0) << "rank " << r;
  sh("rm -rf " + root);
}

// Writing the parameters back failing on every rank after a load installed
// the checkpoint's state (the table's store, which comes before stages 1-2's
// all-gather, so that no rank enters it): the parameters are partly the old
// ones, so the load breaks the context: steps and marking gradients ready are
// refused, naming it, until a load succeeds; then training goes on.
int store_fails;  // store calls to fail
weftResult_t store_failing(const float *src, weftDataType_t type, void *dst, size_t count,
                           weftStream_t stream) {
  if (store_fails > 0) {
    store_fails--;
    return weftSystemError;
  }
  return zero_ops_host.store(src, type, dst, count, stream);
}

// A step and a gradient marked ready are both refused (weftInvalidUsage),
// saying why (needle).
int steps_refused(const RankCtx &ctx, weftZero_t z, const char *needle) {
  for (int k = 0; k < 2; k++) {
    weftResult_t res =
        k == 0 ? weftZeroStep(z, nullptr, nullptr) : weftZeroGradReady(z, 0, nullptr);
    std::string why = weftZeroLastError();
    FAIL_IF(res != weftInvalidUsage || why.find(needle) == std::string::npos, "%s: %d, %s",
            k == 0 ? "a step" : "marking ready", res, why.c_str());
  }
  return 0;
}

TEST(ZeroCkptFailedWriteBack, RefusesStepsUntilALoad) {
  for (int stage : {1, 2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    std::string dir = temp_dir("failed-write-back");
    auto status = run_ranks(2, [&](const RankCtx &ctx) {
      weftComm_t comm;
      weftZero_t z;
      if (int rc = init(ctx, &comm)) return rc;
      if (int rc = make_ctx(ctx, comm, stage, 0, 7, &z)) return rc;
      if (int rc = train_two_steps(ctx, z, 7)) return rc;
      FAIL_IF(weftZeroSave(z, dir.c_str(), nullptr) != weftSuccess, "save: %s",
              weftZeroLastError());
      if (int rc = train_two_steps(ctx, z, 8)) return rc;
      static struct zero_ops hooked = zero_ops_host;
      hooked.store = store_failing;
      z->ops = &hooked;
      store_fails = 1;
      weftResult_t res = weftZeroLoad(z, dir.c_str(), nullptr);
      std::string why = weftZeroLastError();
      z->ops = &zero_ops_host;
      FAIL_IF(res != weftSystemError || store_fails != 0 ||
                  why.find("writing back the parameters of") == std::string::npos ||
                  why.find("the training state is incomplete") == std::string::npos,
              "the load: %d, %s", res, why.c_str());
      FAIL_IF(weftZeroStepCount(z) != 2, "the step count is %ld", weftZeroStepCount(z));
      if (int rc = steps_refused(ctx, z, "incomplete since writing back the parameters of"))
        return rc;
      FAIL_IF(weftZeroLoad(z, dir.c_str(), nullptr) != weftSuccess, "load again: %s",
              weftZeroLastError());
      if (int rc = train_two_steps(ctx, z, 9)) return rc;
      weftZeroDestroy(z);
      weftCommDestroy(comm);
      return 0;
    });
    for (int r = 0; r < 2; r++) EXPECT_EQ(status[r], 0) << "rank " << r;
    sh("rm -rf " + dir);
  }
}

// The same at weftZeroFinalize: its write-back of the initial parameters
// failing on every rank leaves them unwritten (stages 1-2: ungathered), so
// the context refuses steps until a load; loading a checkpoint of the same
// layers makes it sound.
TEST(ZeroCkptFailedWriteBack, AtFinalizeRefusesStepsUntilALoad) {
  for (int stage : {1, 2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    std::string dir = temp_dir("failed-finalize");
    auto status = run_ranks(2, [&](const RankCtx &ctx) {
      weftComm_t comm;
      weftZero_t saved, z;
      if (int rc = init(ctx, &comm)) return rc;
      if (int rc = make_ctx(ctx, comm, stage, 0, 7, &saved)) return rc;
      FAIL_IF(weftZeroSave(saved, dir.c_str(), nullptr) != weftSuccess, "save: %s",
              weftZeroLastError());
      weftZeroDestroy(saved);
      weftZeroConfig_t cfg;
      weftZeroConfigDefaults(&cfg);
      cfg.stage = stage;
      FAIL_IF(weftZeroCreate(&z, comm, &cfg) != weftSuccess, "create: %s", weftZeroLastError());
      for (size_t l = 0; l < kLayers.size(); l++) {
        std::vector<float> init(kLayers[l], 0.5f);
        int id;
        FAIL_IF(weftZeroAddParam(z, (int)l, init.size(), init.data(), &id) != weftSuccess,
                "add: %s", weftZeroLastError());
      }
      static struct zero_ops hooked = zero_ops_host;
      hooked.store = store_failing;
      z->ops = &hooked;
      store_fails = 1;
      weftResult_t res = weftZeroFinalize(z);
      std::string why = weftZeroLastError();
      z->ops = &zero_ops_host;
      FAIL_IF(res != weftSystemError || store_fails != 0 ||
                  why.find("writing back the initial parameters") == std::string::npos,
              "finalize: %d, %s", res, why.c_str());
      if (int rc = steps_refused(ctx, z, "incomplete since writing back the initial parameters"))
        return rc;
      FAIL_IF(weftZeroLoad(z, dir.c_str(), nullptr) != weftSuccess, "load: %s",
              weftZeroLastError());
      if (int rc = train_two_steps(ctx, z, 9)) return rc;
      weftZeroDestroy(z);
      weftCommDestroy(comm);
      return 0;
    });
    for (int r = 0; r < 2; r++) EXPECT_EQ(status[r], 0) << "rank " << r;
    sh("rm -rf " + dir);
  }
}

}  // namespace
