// A hang named: a rank that stops calling collectives (asleep, or killed) in
// a 4-rank job. The others' errors name it, the collective and its sequence
// number; every rank that lived dumped its trace into WEFT_TRACE_DIR as JSON
// that parses (checked with Python's json module, a parser that is not
// weft's); weftTraceDiagnose, which weft-info --trace prints, names the same
// rank from the dumps alone. And the trace itself: weftCommTraceDump's JSON
// holds each call's numbers, sizes, types and states.
#include <gtest/gtest.h>

#include <dirent.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "harness.h"

using namespace weft_test;

namespace {

constexpr int kRanks = 4;
constexpr int kBefore = 3;  // all-reduces every rank completes first
constexpr int kTimeoutS = 3;

// A fresh directory for one test's dumps.
std::string make_dir(const char *name) {
  char tmpl[256];
  snprintf(tmpl, sizeof tmpl, "/tmp/weft_%s_XXXXXX", name);
  const char *d = mkdtemp(tmpl);
  return d != nullptr ? d : "";
}

void remove_dir(const std::string &dir) {
  DIR *dp = opendir(dir.c_str());
  if (dp == nullptr) return;
  while (struct dirent *e = readdir(dp))
    if (e->d_name[0] != '.') unlink((dir + "/" + e->d_name).c_str());
  closedir(dp);
  rmdir(dir.c_str());
}

std::vector<std::string> dump_files(const std::string &dir) {
  std::vector<std::string> files;
  DIR *dp = opendir(dir.c_str());
  if (dp == nullptr) return files;
  while (struct dirent *e = readdir(dp))
    if (strncmp(e->d_name, "weft_trace_", 11) == 0) files.push_back(dir + "/" + e->d_name);
  closedir(dp);
  return files;
}

// Python's json module reads file and the script checks it (exit status 0);
// -1 when there is no python3.
int python_check(const std::string &file, const std::string &script) {
  if (system("python3 -c 'import json' >/dev/null 2>&1") != 0) return -1;
  std::string cmd = "python3 -c '" + script + "' '" + file + "'";
  return WEXITSTATUS(system(cmd.c_str()));
}

// What a living rank's dump must hold: the job's shape, the kBefore
// completed all-reduces, and the (kBefore+1)-th failed.
const char *kDumpCheck =
    "import json,sys\n"
    "d=json.load(open(sys.argv[1]))\n"
    "assert d[\"nranks\"]==4 and 0<=d[\"rank\"]<4, d\n"
    "e=[x for x in d[\"entries\"] if x[\"kind\"]==\"AllReduce\"]\n"
    "done=[x[\"collective_seq_id\"] for x in e if x[\"state\"]==\"completed\"]\n"
    "assert done[:3]==[1,2,3], done\n"
    "assert all(x[\"input_sizes\"]==[[1024]] and x[\"input_dtypes\"]==[\"float32\"] for x in e)\n"
    "bad=[x for x in e if x[\"collective_seq_id\"]==4]\n"
    "assert d[\"rank\"]==3 or (bad and bad[0][\"state\"]==\"failed\"), bad\n"
    "assert d[\"rank\"]!=3 or not bad, bad\n";

std::string diagnose(const std::string &dir) {
  char *text = nullptr;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  weftResult_t res = weftTraceDiagnose(dir.c_str(), f);
  fclose(f);
  std::string out = text != nullptr ? text : "";
  free(text);
  if (res != weftSuccess) out += std::string("[weftTraceDiagnose: ") + weftGetLastError(nullptr) + "]";
  return out;
}

// The body of both tests: rank 3 completes kBefore all-reduces, then
// `stop` (sleeps past the others' timeout, or dies); the others call one
// more and must fail naming rank 3 and the number kBefore+1.
int hang_rank(const RankCtx &ctx, bool killed) {
  weftComm_t comm;
  if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
    return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
  std::vector<float> buf(1024, 1.0f);
  for (int i = 0; i < kBefore; i++)
    if (weftAllReduce(buf.data(), buf.data(), buf.size(), weftFloat32, weftSum, comm, nullptr) !=
        weftSuccess)
      return rank_fail(ctx, "all-reduce %d: %s", i + 1, weftGetLastError(comm));
  if (ctx.rank == kRanks - 1) {
    if (killed) raise(SIGKILL);
    sleep(kTimeoutS + 3);  // alive, answering questions, but not calling
    weftCommAbort(comm);   // dumps its trace (reason "abort")
    return 0;
  }
  const double t0 = now_s();
  weftResult_t res =
      weftAllReduce(buf.data(), buf.data(), buf.size(), weftFloat32, weftSum, comm, nullptr);
  const double took = now_s() - t0;
  const std::string msg = weftGetLastError(comm);
  printf("rank %d: %s after %.2f s: %s\n", ctx.rank, weftGetErrorString(res), took, msg.c_str());
  FAIL_IF(res != weftRemoteError, "got %s, want weftRemoteError", weftGetErrorString(res));
  FAIL_IF(msg.find("AllReduce #4 (1024 float32 sum)") == std::string::npos,
          "error does not name the call: %s", msg.c_str());
  if (killed) {
    FAIL_IF(msg.find("rank 3 is dead") == std::string::npos, "rank 3 not named dead: %s",
            msg.c_str());
    FAIL_IF(took > kTimeoutS, "took %.2f s, beyond WEFT_TIMEOUT", took);
  } else {
    FAIL_IF(msg.find("timed out after") == std::string::npos, "not a timeout: %s", msg.c_str());
    FAIL_IF(msg.find("rank 3 never called it (its last: AllReduce #3, completed") ==
                std::string::npos,
            "rank 3 and its last call not named: %s", msg.c_str());
  }
  FAIL_IF(msg.find("ranks 0-2 wait on rank 3") == std::string::npos,
          "the waiting ranks not named: %s", msg.c_str());
  weftCommAbort(comm);
  return 0;
}

void hang_test(bool killed) {
  const std::string dir = make_dir(killed ? "hang_killed" : "hang_sleep");
  ASSERT_FALSE(dir.empty());
  RunOptions opts;
  opts.timeout_s = 60;
  opts.env = {{"WEFT_TIMEOUT", std::to_string(kTimeoutS)}, {"WEFT_TRACE_DIR", dir}};
  auto status = run_ranks(kRanks, [&](const RankCtx &ctx) { return hang_rank(ctx, killed); }, opts);
  for (int r = 0; r < kRanks - 1; r++) EXPECT_EQ(status[r], 0) << "rank " << r;
  EXPECT_EQ(status[kRanks - 1], killed ? 128 + SIGKILL : 0);

  auto files = dump_files(dir);
  EXPECT_EQ(files.size(), killed ? 3u : 4u) << "dumps in " << dir;
  for (const auto &f : files) {
    int rc = python_check(f, kDumpCheck);
    if (rc < 0) {
      printf("no python3: the dumps' JSON is not checked by a second parser\n");
      break;
    }
    EXPECT_EQ(rc, 0) << f << " does not parse, or lacks the calls";
  }
  const std::string verdict = diagnose(dir);
  printf("weftTraceDiagnose:\n%s", verdict.c_str());
  EXPECT_NE(verdict.find("AllReduce #4 (1024 float32 sum) did not complete"), std::string::npos)
      << verdict;
  if (killed) {
    EXPECT_NE(verdict.find("rank 3 left no trace"), std::string::npos) << verdict;
  } else {
    EXPECT_NE(verdict.find("rank 3 never called it (its last: AllReduce #3, completed"),
              std::string::npos)
        << verdict;
  }
  EXPECT_NE(verdict.find("ranks 0-2 wait on rank 3"), std::string::npos) << verdict;
  remove_dir(dir);
}

TEST(Hang, SleepingRankNamed) { hang_test(false); }

TEST(Hang, KilledRankNamed) { hang_test(true); }

}  // namespace
