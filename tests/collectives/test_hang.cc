// A hang named: a rank that stops calling collectives (asleep, or killed) in
// a 4-rank job. The others' errors name it, the collective and its sequence
// number; every rank that lived dumped its trace into WEFT_TRACE_DIR as JSON
// that parses (checked with Python's json module, a parser that is not
// weft's); weftTraceDiagnose, which weft-info --trace prints, names the same
// rank from the dumps alone. And the trace itself: weftCommTraceDump's JSON
// holds each call's numbers, sizes, types and states.
#include <gtest/gtest.h>

#include <dirent.h>
#include <dlfcn.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "hang_ranks.h"
#include "harness.h"

extern "C" {
#include "collectives/core/hang.h"
#include "collectives/core/plan.h"
#include "collectives/core/trace.h"
}

using namespace weft_test;

// The process's connect, which dies at its die_at_connect-th TCP connect
// once that is set (a rank killed in the middle of setting up its
// connections; the UDP sockets that find a route are not counted).
static int die_at_connect = 0;
extern "C" int connect(int fd, const struct sockaddr *addr, socklen_t len) {
  static int (*real)(int, const struct sockaddr *, socklen_t) =
      (int (*)(int, const struct sockaddr *, socklen_t))dlsym(RTLD_NEXT, "connect");
  int type = 0;
  socklen_t tlen = sizeof type;
  if (die_at_connect > 0 && addr->sa_family != AF_UNIX &&
      getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tlen) == 0 && type == SOCK_STREAM &&
      --die_at_connect == 0)
    raise(SIGKILL);
  return real(fd, addr, len);
}

namespace {

constexpr int kRanks = 4;
constexpr int kBefore = 3;  // all-reduces every rank completes first
constexpr int kTimeoutS = kHangTimeoutS;

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

// build/tools/weft-info, from this suite's build/tests/test_hang; "" when absent.
std::string weft_info_path() {
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return "";
  self[n] = '\0';
  std::string dir(self);
  dir = dir.substr(0, dir.rfind('/'));
  std::string tool = dir.substr(0, dir.rfind('/')) + "/tools/weft-info";
  return access(tool.c_str(), X_OK) == 0 ? tool : "";
}

std::string run_output(const std::string &cmd) {
  std::string out;
  FILE *p = popen(cmd.c_str(), "r");
  if (p == nullptr) return out;
  char buf[4096];
  size_t got;
  while ((got = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, got);
  pclose(p);
  return out;
}

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
    // its own wait timed out, or a peer's a moment earlier broke the comm
    FAIL_IF(msg.find("timed out after") == std::string::npos &&
                msg.find("failed after") == std::string::npos,
            "not a timeout: %s", msg.c_str());
    FAIL_IF(took < kTimeoutS - 0.5, "failed after %.2f s, before WEFT_TIMEOUT", took);
    FAIL_IF(msg.find("rank 3 never called it (its last: AllReduce #3, completed") ==
                std::string::npos,
            "rank 3 and its last call not named: %s", msg.c_str());
  }
  FAIL_IF(msg.find("ranks 0-2 wait on rank 3") == std::string::npos,
          "the waiting ranks not named: %s", msg.c_str());
  weftCommAbort(comm);
  return 0;
}

// check: with WEFT_CHECK=1, whose signature exchange is the waiting ranks'
// first wait (they are in the call from it, not before it).
void hang_test(bool killed, bool check = false) {
  const std::string dir = make_dir(killed ? "hang_killed" : "hang_sleep");
  ASSERT_FALSE(dir.empty());
  RunOptions opts;
  opts.timeout_s = 60;
  opts.env = {{"WEFT_TIMEOUT", std::to_string(kTimeoutS)}, {"WEFT_TRACE_DIR", dir}};
  if (check) opts.env.push_back({"WEFT_CHECK", "1"});
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
  // the verdict's own line (the dumps' error texts follow it), where a
  // waiting rank's failure (weftRemoteError) read back from its dump as
  // success had it "failed it (no error)"
  const std::string first = verdict.substr(0, verdict.find("(abort dump)"));
  EXPECT_NE(first.find("ranks 0-2 wait on rank 3"), std::string::npos) << verdict;
  EXPECT_EQ(first.find("failed it"), std::string::npos) << verdict;
  // the tool prints the same (build/tools/weft-info, next to this suite's folder)
  const std::string tool = weft_info_path();
  if (tool.empty()) {
    printf("no weft-info next to this suite: the tool itself is not run\n");
  } else {
    const std::string printed = run_output(tool + " --trace " + dir);
    EXPECT_NE(printed.find(verdict.substr(0, verdict.find('\n', verdict.find('\n') + 1))),
              std::string::npos)
        << "weft-info --trace printed:\n" << printed;
  }
  remove_dir(dir);
}

TEST(Hang, SleepingRankNamed) { hang_test(false); }

// A file named as a dump whose rank count no communicator has (2^31 - 1,
// above the most one holds) is skipped as no trace, saying so, not judged
// as a job of that many ranks (which printed nothing and succeeded).
TEST(Hang, DumpOfImpossibleRankCountSkipped) {
  const std::string dir = make_dir("impossible");
  ASSERT_FALSE(dir.empty());
  const std::string entry =
      "{\"record_id\": 1, \"collective_seq_id\": 1, \"p2p_seq_id\": 0, \"kind\": "
      "\"AllReduce\", \"count\": 4, \"datatype\": \"float32\", \"op\": \"sum\", \"state\": "
      "\"started\", \"time_created_ns\": 1, \"time_discovered_started_ns\": 1}";
  FILE *f = fopen((dir + "/weft_trace_00000000000000aa_rank0.json").c_str(), "w");
  ASSERT_NE(f, nullptr);
  fprintf(f, "{\"version\": \"1\", \"job\": \"00000000000000aa\", \"rank\": 0, "
             "\"nranks\": 2147483647, \"reason\": \"failure\", \"dump_time_ns\": 2, "
             "\"error\": \"\", \"entries\": [%s]}\n", entry.c_str());
  fclose(f);
  const std::string verdict = diagnose(dir);
  printf("weftTraceDiagnose:\n%s", verdict.c_str());
  EXPECT_NE(verdict.find("not a weft trace, skipped"), std::string::npos) << verdict;
  EXPECT_EQ(verdict.find("2147483647 ranks"), std::string::npos) << verdict;
  remove_dir(dir);
}

// The same under WEFT_CHECK=1: the ranks waiting in the signature exchange
// are in the call, and only the sleeping rank is named as never calling it
// (a waiting rank was named so before, its trace not holding the call yet).
TEST(Hang, SleepingRankNamedUnderCheck) { hang_test(false, true); }

// A mismatch found on the data path (a count, a kind) is dumped by every
// rank, the ranks that found it and the ones that failed after them, and
// the verdict on the dumps is the mismatch (it said before that the ranks
// that found it, which wrote nothing, had died). Each refusal names the
// call by its number, the kind's too.
TEST(Hang, MismatchesDumpedAndJudged) {
  struct Case {
    const char *name, *differs;
    std::function<weftResult_t(weftComm_t, int, std::vector<float> &)> call;
  };
  const Case cases[] = {
      {"count", "count differs",
       [](weftComm_t comm, int rank, std::vector<float> &buf) {
         return weftAllGather(buf.data(), buf.data() + 2048, rank == 1 ? 512 : 256, weftFloat32,
                              comm, nullptr);
       }},
      {"kind", "collective differs",
       [](weftComm_t comm, int rank, std::vector<float> &buf) {
         return rank == 1 ? weftBroadcast(buf.data(), buf.data(), 1024, weftFloat32, 0, comm,
                                          nullptr)
                          : weftAllReduce(buf.data(), buf.data(), 1024, weftFloat32, weftSum,
                                          comm, nullptr);
       }},
  };
  for (const Case &k : cases) {
    const std::string dir = make_dir(k.name);
    ASSERT_FALSE(dir.empty());
    RunOptions opts;
    opts.timeout_s = 60;
    opts.env = {{"WEFT_TIMEOUT", std::to_string(kTimeoutS)}, {"WEFT_TRACE_DIR", dir}};
    auto status = run_ranks(3, [&](const RankCtx &ctx) {
      weftComm_t comm;
      if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
        return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
      std::vector<float> buf(4096, 1.0f);
      if (weftAllReduce(buf.data(), buf.data(), 16, weftFloat32, weftSum, comm, nullptr) !=
          weftSuccess)
        return rank_fail(ctx, "all-reduce #1: %s", weftGetLastError(comm));
      const weftResult_t res = k.call(comm, ctx.rank, buf);
      const std::string msg = weftGetLastError(comm);
      printf("%s, rank %d: %s: %s\n", k.name, ctx.rank, weftGetErrorString(res), msg.c_str());
      FAIL_IF(res != weftInvalidUsage && res != weftRemoteError, "got %s",
              weftGetErrorString(res));
      FAIL_IF(msg.find(k.differs) == std::string::npos, "the mismatch is not named: %s",
              msg.c_str());
      FAIL_IF(res == weftInvalidUsage && msg.find(" #2") == std::string::npos,
              "the refusal does not number the call: %s", msg.c_str());
      weftCommDestroy(comm);  // no dump of its own: the failure's stays
      return 0;
    }, opts);
    for (int r = 0; r < 3; r++) EXPECT_EQ(status[r], 0) << k.name << ", rank " << r;
    EXPECT_EQ(dump_files(dir).size(), 3u) << k.name << ": dumps in " << dir;
    const std::string verdict = diagnose(dir);
    printf("weftTraceDiagnose (%s):\n%s", k.name, verdict.c_str());
    const std::string first = verdict.substr(0, verdict.find("(failure dump)"));
    EXPECT_NE(first.find(k.differs), std::string::npos) << verdict;
    EXPECT_EQ(verdict.find("left no trace"), std::string::npos) << verdict;
    remove_dir(dir);
  }
}

// Two runs of one job at a fixed rendezvous (WEFT_COMM_ID and WEFT_SECRET:
// the same secret each time) dump into one WEFT_TRACE_DIR: the first run's
// four ranks abort (four dumps), then the second run's rank 3 dies before
// its fourth all-reduce. The verdict on the second run names rank 3 as
// leaving no trace, not the first run's rank 3 file, which is judged as a
// job of its own.
TEST(Hang, FormerRunsTracesJudgedApart) {
  const std::string dir = make_dir("hang_runs");
  ASSERT_FALSE(dir.empty());
  RunOptions opts;
  opts.timeout_s = 60;
  opts.unique_id = false;
  opts.env = {{"WEFT_TIMEOUT", std::to_string(kTimeoutS)}, {"WEFT_TRACE_DIR", dir},
              {"WEFT_COMM_ID", "127.0.0.1:" + std::to_string(free_port())},
              {"WEFT_SECRET", "the-same-every-run"}, {"WEFT_NRANKS", std::to_string(kRanks)}};
  opts.env_of = [](int rank) { return EnvList{{"WEFT_RANK", std::to_string(rank)}}; };
  for (int run = 0; run < 2; run++) {
    auto status = run_ranks(kRanks, [&](const RankCtx &ctx) {
      weftComm_t comm;
      if (weftCommInitFromEnv(&comm, nullptr) != weftSuccess)
        return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
      std::vector<float> buf(1024, 1.0f);
      for (int i = 0; i < (run == 0 ? 1 : kBefore + 1); i++) {
        if (run == 1 && i == kBefore && ctx.rank == kRanks - 1) raise(SIGKILL);
        if (weftAllReduce(buf.data(), buf.data(), buf.size(), weftFloat32, weftSum, comm,
                          nullptr) != weftSuccess)
          break;  // the second run's fourth, on ranks 0-2
      }
      weftCommAbort(comm);  // dumps
      return 0;
    }, opts);
    for (int r = 0; r < kRanks; r++)
      EXPECT_EQ(status[r], run == 1 && r == kRanks - 1 ? 128 + SIGKILL : 0)
          << "run " << run << ", rank " << r;
  }
  EXPECT_EQ(dump_files(dir).size(), 7u) << "the first run's 4 dumps and the second's 3";
  const std::string verdict = diagnose(dir);
  printf("weftTraceDiagnose:\n%s", verdict.c_str());
  EXPECT_NE(verdict.find("AllReduce #4 (1024 float32 sum) did not complete"), std::string::npos)
      << verdict;
  EXPECT_NE(verdict.find("rank 3 left no trace"), std::string::npos) << verdict;
  remove_dir(dir);
}

TEST(Hang, KilledRankNamed) { hang_test(true); }

}  // namespace

namespace {

// weftCommTraceDump: the calls with their numbers (collectives and
// point-to-point apart), sizes, types, ops, roots, peers and states, in order.
TEST(Hang, TraceDumpHoldsTheCalls) {
  RunOptions opts;
  opts.env = {{"WEFT_TRACE_ENTRIES", "8"}};
  auto status = run_ranks(2, [&](const RankCtx &ctx) {
    weftComm_t comm;
    if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
      return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
    std::vector<int32_t> buf(64, ctx.rank);
    std::vector<int32_t> out(128);
    // 11 calls: the ring of 8 keeps the last 8 (record ids 4 to 11)
    for (int i = 0; i < 6; i++)
      FAIL_IF(weftAllReduce(buf.data(), buf.data(), 64, weftInt32, weftMax, comm, nullptr) !=
                  weftSuccess, "all-reduce: %s", weftGetLastError(comm));
    FAIL_IF(weftBroadcast(buf.data(), buf.data(), 5, weftInt32, 1, comm, nullptr) != weftSuccess,
            "broadcast: %s", weftGetLastError(comm));
    FAIL_IF(weftAllGather(buf.data(), out.data(), 64, weftInt32, comm, nullptr) != weftSuccess,
            "all-gather: %s", weftGetLastError(comm));
    weftGroupStart();
    weftSend(buf.data(), 3, weftInt32, 1 - ctx.rank, comm, nullptr);
    weftRecv(out.data(), 3, weftInt32, 1 - ctx.rank, comm, nullptr);
    FAIL_IF(weftGroupEnd() != weftSuccess, "send/recv: %s", weftGetLastError(comm));
    // the last call, recorded as it ran (hang_watch_record), dumped with nothing after it
    FAIL_IF(weftAllReduce(buf.data(), buf.data(), 64, weftInt32, weftMax, comm, nullptr) !=
                weftSuccess, "all-reduce: %s", weftGetLastError(comm));
    char path[64];
    snprintf(path, sizeof path, "/tmp/weft_trace_dump_%d_%d.json", (int)getppid(), ctx.rank);
    FILE *f = fopen(path, "w");
    FAIL_IF(f == nullptr, "cannot write %s", path);
    weftResult_t res = weftCommTraceDump(comm, f);
    fclose(f);
    FAIL_IF(res != weftSuccess, "weftCommTraceDump: %s", weftGetLastError(nullptr));
    const char *check =
        "import json,sys\n"
        "d=json.load(open(sys.argv[1]))\n"
        "e=d[\"entries\"]\n"
        "assert d[\"entries_max\"]==8 and d[\"reason\"]==\"request\", d\n"
        "assert [x[\"record_id\"] for x in e]==list(range(4,12)), e\n"
        "assert [x[\"collective_seq_id\"] for x in e]==[4,5,6,7,8,0,0,9], e\n"
        "assert [x[\"p2p_seq_id\"] for x in e]==[0]*5+[1,2,0], e\n"
        "assert all(x[\"state\"]==\"completed\" for x in e), e\n"
        "assert all(\"result\" not in x for x in e), e\n"
        "assert e[0][\"profiling_name\"]==\"weft:all_reduce\" and e[0][\"op\"]==\"max\", e[0]\n"
        "assert e[0][\"input_dtypes\"]==[\"int32\"] and e[0][\"output_sizes\"]==[[64]], e[0]\n"
        "assert e[3][\"kind\"]==\"Broadcast\" and e[3][\"root\"]==1 and e[3][\"count\"]==5, e[3]\n"
        "assert e[4][\"kind\"]==\"AllGather\" and e[4][\"output_sizes\"]==[[128]], e[4]\n"
        "peer=1-d[\"rank\"]\n"
        "assert e[5][\"kind\"]==\"Send\" and e[5][\"peer\"]==peer and e[5][\"output_sizes\"]==[], e[5]\n"
        "assert e[6][\"kind\"]==\"Recv\" and e[6][\"peer\"]==peer and e[6][\"input_sizes\"]==[], e[6]\n"
        "assert e[7][\"kind\"]==\"AllReduce\" and e[7][\"count\"]==64, e[7]\n"
        "t=[(x[\"time_created_ns\"],x[\"time_discovered_started_ns\"],x[\"time_discovered_completed_ns\"]) for x in e]\n"
        "assert all(0<a<=b<=c for a,b,c in t) and all(t[i][2]<=t[i+1][1] for i in range(4)), t\n";
    int rc = python_check(path, check);
    unlink(path);
    if (rc < 0) printf("no python3: the dump's JSON is not checked\n");
    FAIL_IF(rc > 0, "the dump does not hold the calls (see above)");
    weftCommDestroy(comm);
    return 0;
  }, opts);
  EXPECT_EQ(status[0], 0);
  EXPECT_EQ(status[1], 0);
}

}  // namespace

namespace {

// WEFT_TRACE_SIGNAL: the signal makes every communicator of the process
// dump its trace into WEFT_TRACE_DIR (from weft's thread), and the program
// goes on.
TEST(Hang, SignalDumps) {
  const std::string dir = make_dir("hang_signal");
  ASSERT_FALSE(dir.empty());
  RunOptions opts;
  opts.env = {{"WEFT_TRACE_DIR", dir}, {"WEFT_TRACE_SIGNAL", "USR1"}};
  auto status = run_ranks(2, [&](const RankCtx &ctx) {
    weftComm_t comm;
    if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
      return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
    float x[8] = {1};
    FAIL_IF(weftAllReduce(x, x, 8, weftFloat32, weftSum, comm, nullptr) != weftSuccess,
            "all-reduce: %s", weftGetLastError(comm));
    if (ctx.rank == 0) kill(getpid(), SIGUSR1);
    // the dump is written by another thread: wait for it (bounded)
    char path[512];
    bool seen = false;
    for (int i = 0; i < 500 && !seen; i++) {
      for (const auto &f : dump_files(dir))
        seen = seen || f.find("_rank0.json") != std::string::npos;
      if (!seen) usleep(10000);
    }
    snprintf(path, sizeof path, "%s", dir.c_str());
    FAIL_IF(ctx.rank == 0 && !seen, "no dump in %s after the signal", path);
    FAIL_IF(weftAllReduce(x, x, 8, weftFloat32, weftSum, comm, nullptr) != weftSuccess,
            "all-reduce after the signal: %s", weftGetLastError(comm));
    weftCommDestroy(comm);
    return 0;
  }, opts);
  EXPECT_EQ(status[0], 0);
  EXPECT_EQ(status[1], 0);
  auto files = dump_files(dir);
  ASSERT_EQ(files.size(), 1u) << "only rank 0 had the signal";
  int rc = python_check(files[0],
                        "import json,sys\n"
                        "d=json.load(open(sys.argv[1]))\n"
                        "assert d[\"reason\"]==\"signal\" and d[\"rank\"]==0, d\n"
                        "assert d[\"entries\"][0][\"state\"]==\"completed\", d\n");
  if (rc < 0) printf("no python3: the dump's JSON is not checked\n");
  EXPECT_LE(rc, 0) << files[0];
  remove_dir(dir);
}

}  // namespace

namespace {


// Two ranks each send the other 16 MiB before receiving (a deadlock of
// blocking sends), time out, then make an all-reduce the broken comm refuses
// as it is made. The dumps' verdict judges the sends (before, it judged the
// refused all-reduce, "ranks 0,1 are in it"; with no all-reduce after, it
// said every collective completed).
TEST(Hang, SendDeadlockJudgedFromTheDumps) {
  const std::string dir = make_dir("send_deadlock");
  ASSERT_FALSE(dir.empty());
  RunOptions opts;
  opts.timeout_s = 60;
  opts.env = {{"WEFT_TIMEOUT", std::to_string(kTimeoutS)}, {"WEFT_TRACE_DIR", dir}};
  opts.allow_warnings = true;
  auto status = run_ranks(2, [&](const RankCtx &ctx) {
    weftComm_t comm;
    std::vector<float> buf(4 << 20, 1.0f), got(4 << 20), small(16, 1.0f);
    if (int rc = open_after_one(ctx, &comm, small)) return rc;
    weftResult_t res = weftSend(buf.data(), buf.size(), weftFloat32, 1 - ctx.rank, comm, nullptr);
    FAIL_IF(res == weftSuccess, "the send completed without its receiver");
    res = weftAllReduce(small.data(), small.data(), small.size(), weftFloat32, weftSum, comm,
                        nullptr);
    FAIL_IF(res == weftSuccess, "the broken comm ran an all-reduce");
    weftCommAbort(comm);
    return 0;
  }, opts);
  for (int r = 0; r < 2; r++) EXPECT_EQ(status[r], 0) << "rank " << r;
  const std::string verdict = diagnose(dir);
  printf("weftTraceDiagnose:\n%s", verdict.c_str());
  EXPECT_NE(verdict.find("s Send #1 (4194304 float32 to rank "), std::string::npos) << verdict;
  EXPECT_NE(verdict.find("did not complete: rank "), std::string::npos) << verdict;
  EXPECT_EQ(verdict.find("AllReduce #2"), std::string::npos) << verdict;
  remove_dir(dir);
}

// A host stream's receive (the PyTorch backend's path) from a rank that
// never sends: its timeout is named as a collective's is, with the peer and
// what the peer did last, and the trace marks the receive failed.
TEST(Hang, StreamReceiveNamesThePeer) {
  RunOptions opts;
  opts.timeout_s = 60;
  opts.env = {{"WEFT_TIMEOUT", std::to_string(kTimeoutS)}};
  auto status = run_ranks(2, [&](const RankCtx &ctx) {
    weftComm_t comm;
    std::vector<float> buf(256, 1.0f);
    if (int rc = open_after_one(ctx, &comm, buf)) return rc;
    if (ctx.rank == 1) {
      sleep(kTimeoutS + 2);  // answers questions, sends nothing
      weftCommAbort(comm);
      return 0;
    }
    weftStream_t stream;
    FAIL_IF(weftStreamCreate(&stream) != weftSuccess, "stream: %s", weftGetLastError(nullptr));
    FAIL_IF(weftRecv(buf.data(), buf.size(), weftFloat32, 1, comm, stream) != weftSuccess,
            "queueing the receive: %s", weftGetLastError(comm));
    const double t0 = now_s();
    weftResult_t res = weftStreamSynchronize(stream);
    const double took = now_s() - t0;
    const std::string msg = weftGetLastError(comm);
    printf("rank 0: %s after %.2f s: %s\n", weftGetErrorString(res), took, msg.c_str());
    FAIL_IF(res != weftRemoteError, "got %s, want weftRemoteError", weftGetErrorString(res));
    FAIL_IF(msg.find("Recv #1 (256 float32 from rank 1) timed out after") == std::string::npos,
            "the receive and its timeout not named: %s", msg.c_str());
    FAIL_IF(msg.find("rank 1 is idle, its last: AllReduce #1, completed") == std::string::npos,
            "the peer and its last call not named: %s", msg.c_str());
    FAIL_IF(took > kTimeoutS + 1.5, "took %.2f s", took);
    weftStreamDestroy(stream);
    weftCommAbort(comm);
    return 0;
  }, opts);
  EXPECT_EQ(status[0], 0);
  EXPECT_EQ(status[1], 0);
}

// Rank 0 queues on a host stream a receive nobody sends, then an
// all-reduce; rank 1 calls only the all-reduce. It times out naming rank 0
// as the one that has it queued, behind the receive and its peer (before,
// rank 0 counted as "in it": no culprit). Two ranks: with a third, whichever
// of the two waiting ranks asked second could find the all-reduce running
// on rank 0, whose receive the first one's failure had ended.
TEST(Hang, CallQueuedBehindAStuckOneNamed) {
  RunOptions opts;
  opts.timeout_s = 60;
  opts.env = {{"WEFT_TIMEOUT", std::to_string(kTimeoutS)}};
  opts.allow_warnings = true;
  auto status = run_ranks(2, [&](const RankCtx &ctx) {
    weftComm_t comm;
    std::vector<float> buf(256, 1.0f), got(256);
    if (int rc = open_after_one(ctx, &comm, buf)) return rc;
    if (ctx.rank == 0) {
      // a second after the others: its receive times out a second after
      // their all-reduce, so that their question finds the all-reduce
      // still queued here (not refused by the comm the receive broke)
      sleep(1);
      weftStream_t stream;
      FAIL_IF(weftStreamCreate(&stream) != weftSuccess, "stream: %s", weftGetLastError(nullptr));
      FAIL_IF(weftRecv(got.data(), got.size(), weftFloat32, 1, comm, stream) != weftSuccess ||
                  weftAllReduce(buf.data(), buf.data(), buf.size(), weftFloat32, weftSum, comm,
                                stream) != weftSuccess,
              "queueing: %s", weftGetLastError(comm));
      weftResult_t res = weftStreamSynchronize(stream);
      FAIL_IF(res == weftSuccess, "the receive nobody sent completed");
      sleep(2); // answering the others' questions
      weftStreamDestroy(stream);
      weftCommAbort(comm);
      return 0;
    }
    const double t0 = now_s();
    weftResult_t res =
        weftAllReduce(buf.data(), buf.data(), buf.size(), weftFloat32, weftSum, comm, nullptr);
    const double took = now_s() - t0;
    const std::string msg = weftGetLastError(comm);
    printf("rank %d: %s after %.2f s: %s\n", ctx.rank, weftGetErrorString(res), took,
           msg.c_str());
    FAIL_IF(res != weftRemoteError, "got %s, want weftRemoteError", weftGetErrorString(res));
    FAIL_IF(msg.find("rank 0 has it queued behind Recv #1 from rank 1") == std::string::npos,
            "rank 0 and what holds its call not named: %s", msg.c_str());
    FAIL_IF(took > kTimeoutS + 1.5, "took %.2f s", took);
    sleep(2);
    weftCommAbort(comm);
    return 0;
  }, opts);
  for (size_t r = 0; r < status.size(); r++) EXPECT_EQ(status[r], 0) << "rank " << r;
}


// A rank on another host (WEFT_HOSTID: its pid cannot be watched) that dies
// while setting up its first collective's connections: the others wait for
// its bootstrap messages, stall, ask where the ranks are, and find nothing
// listening where it answered (asked twice): the call fails naming it dead
// within a second or two, not at WEFT_TIMEOUT.
TEST(Hang, DeadRankOnAnotherHostNamedBeforeTheTimeout) {
  const int timeout_s = 20;
  RunOptions opts;
  opts.timeout_s = 60;
  // sockets between the hosts (UCX, where built in, notices the loss itself)
  opts.env = {{"WEFT_TIMEOUT", std::to_string(timeout_s)}, {"WEFT_TRANSPORT", "socket"}};
  opts.env_of = [](int rank) { return EnvList{{"WEFT_HOSTID", "host" + std::to_string(rank)}}; };
  auto status = run_ranks(2, [&](const RankCtx &ctx) {
    weftComm_t comm;
    if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
      return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
    if (ctx.rank == 1) die_at_connect = 1;  // setting up the all-reduce's connections
    std::vector<float> buf(1 << 20, 1.0f);
    const double t0 = now_s();
    weftResult_t res =
        weftAllReduce(buf.data(), buf.data(), buf.size(), weftFloat32, weftSum, comm, nullptr);
    const double took = now_s() - t0;
    const std::string msg = weftGetLastError(comm);
    printf("rank %d: %s after %.2f s: %s\n", ctx.rank, weftGetErrorString(res), took, msg.c_str());
    FAIL_IF(res != weftRemoteError, "got %s", weftGetErrorString(res));
    FAIL_IF(msg.find("rank 1 is dead") == std::string::npos, "rank 1 not named dead: %s",
            msg.c_str());
    FAIL_IF(took > timeout_s / 2, "took %.2f s of a %d s timeout", took, timeout_s);
    weftCommAbort(comm);
    return 0;
  }, opts);
  EXPECT_EQ(status[0], 0);
  EXPECT_EQ(status[1], 128 + SIGKILL);
}

// The same during init: a rank on another host that dies as it connects to
// its next rank in the bootstrap ring (its second connect; the first joined
// the root) never connects to the rank after it, which finds nothing
// listening at its address any more and fails naming it within a second or
// two, not at WEFT_TIMEOUT.
TEST(Hang, RankOnAnotherHostDeadBeforeTheRingNamed) {
  const int timeout_s = 20;
  RunOptions opts;
  opts.timeout_s = 60;
  opts.env = {{"WEFT_TIMEOUT", std::to_string(timeout_s)}, {"WEFT_TRANSPORT", "socket"}};
  opts.env_of = [](int rank) { return EnvList{{"WEFT_HOSTID", "host" + std::to_string(rank)}}; };
  auto status = run_ranks(2, [&](const RankCtx &ctx) {
    if (ctx.rank == 1) die_at_connect = 2;
    weftComm_t comm;
    const double t0 = now_s();
    weftResult_t res = weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank);
    const double took = now_s() - t0;
    const std::string msg = weftGetLastError(nullptr);
    printf("rank %d: %s after %.2f s: %s\n", ctx.rank, weftGetErrorString(res), took, msg.c_str());
    FAIL_IF(res != weftRemoteError, "got %s", weftGetErrorString(res));
    FAIL_IF(msg.find("rank 1 is gone") == std::string::npos, "rank 1 not named: %s", msg.c_str());
    FAIL_IF(took > timeout_s / 2, "took %.2f s of a %d s timeout", took, timeout_s);
    return 0;
  }, opts);
  EXPECT_EQ(status[0], 0);
  EXPECT_EQ(status[1], 128 + SIGKILL);
}

// A group of a send that completes and a receive from a rank that never
// sends: the timeout names the receive and that rank (the call whose wait
// timed out), not the group's first call and its peer.
TEST(Hang, GroupedReceiveNamesItsPeer) {
  RunOptions opts;
  opts.timeout_s = 60;
  opts.env = {{"WEFT_TIMEOUT", std::to_string(kTimeoutS)}};
  auto status = run_ranks(3, [&](const RankCtx &ctx) {
    weftComm_t comm;
    std::vector<float> buf(64, 1.0f), in(64, 0.0f);
    if (int rc = open_after_one(ctx, &comm, buf)) return rc;
    if (ctx.rank == 1) {
      FAIL_IF(weftRecv(in.data(), in.size(), weftFloat32, 0, comm, nullptr) != weftSuccess,
              "receive from rank 0: %s", weftGetLastError(comm));
    }
    if (ctx.rank != 0) {
      sleep(kTimeoutS + 2);  // answers questions; rank 2 sends nothing
      weftCommAbort(comm);
      return 0;
    }
    FAIL_IF(weftGroupStart() != weftSuccess, "group start");
    weftSend(buf.data(), buf.size(), weftFloat32, 1, comm, nullptr);
    weftRecv(in.data(), in.size(), weftFloat32, 2, comm, nullptr);
    const double t0 = now_s();
    weftResult_t res = weftGroupEnd();
    const double took = now_s() - t0;
    const std::string msg = weftGetLastError(comm);
    printf("rank 0: %s after %.2f s: %s\n", weftGetErrorString(res), took, msg.c_str());
    FAIL_IF(res != weftRemoteError, "got %s, want weftRemoteError", weftGetErrorString(res));
    FAIL_IF(msg.find("(64 float32 from rank 2) timed out after") == std::string::npos,
            "the receive from rank 2 not named as what timed out: %s", msg.c_str());
    FAIL_IF(msg.find("rank 2 is idle") == std::string::npos,
            "rank 2 not named as the idle peer: %s", msg.c_str());
    FAIL_IF(took > kTimeoutS + 1.5, "took %.2f s", took);
    weftCommAbort(comm);
    return 0;
  }, opts);
  for (size_t r = 0; r < status.size(); r++) EXPECT_EQ(status[r], 0) << "rank " << r;
}

// CPU seconds the thread tid of this process has used (user and system),
// or -1 when /proc cannot tell.
double thread_cpu_s(pid_t tid) {
  char path[64];
  snprintf(path, sizeof path, "/proc/self/task/%d/stat", (int)tid);
  FILE *f = fopen(path, "r");
  if (f == nullptr) return -1;
  char line[1024];
  const bool got = fgets(line, sizeof line, f) != nullptr;
  fclose(f);
  const char *p = got ? strrchr(line, ')') : nullptr;  // the name may hold spaces
  unsigned long utime = 0, stime = 0;
  if (p == nullptr ||
      sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &utime, &stime) != 2)
    return -1;
  return (double)(utime + stime) / (double)sysconf(_SC_CLK_TCK);
}

// Rank 0 of 4 runs out of file descriptors (its RLIMIT_NOFILE lowered to
// the lowest free one) before an all-reduce that rank 3 never calls. Its
// questions to the others cannot even be made: its error must not call the
// live ranks dead (it said "ranks 1-3 are dead"), and must say that it
// could not ask them, and why. The others' questions to rank 0 wait in its
// query listener's backlog meanwhile: its query thread must not spin on the
// accept that fails (it took a core).
TEST(Hang, OutOfDescriptorsCallsNoOneDead) {
  RunOptions opts;
  opts.timeout_s = 60;
  opts.env = {{"WEFT_TIMEOUT", std::to_string(kTimeoutS)}};
  opts.allow_warnings = true;  // rank 0 warns that it cannot answer
  auto status = run_ranks(4, [&](const RankCtx &ctx) {
    weftComm_t comm;
    std::vector<float> buf(1024, 1.0f);
    if (int rc = open_after_one(ctx, &comm, buf)) return rc;
    if (ctx.rank == 3) {
      sleep(kTimeoutS + 3);  // alive, answering questions, but not calling
      weftCommAbort(comm);
      return 0;
    }
    if (ctx.rank != 0) {
      weftAllReduce(buf.data(), buf.data(), buf.size(), weftFloat32, weftSum, comm, nullptr);
      weftCommAbort(comm);
      return 0;
    }
    std::vector<pid_t> query;
    FAIL_IF(!threads_named("weft-query", &query) || query.size() != 1,
            "%zu query threads, want 1", query.size());
    const double cpu0 = thread_cpu_s(query[0]);
    struct rlimit was;
    getrlimit(RLIMIT_NOFILE, &was);
    const int lowest_free = dup(0);
    FAIL_IF(lowest_free < 0, "dup: %m");
    close(lowest_free);
    struct rlimit none = {(rlim_t)lowest_free, was.rlim_max};
    FAIL_IF(setrlimit(RLIMIT_NOFILE, &none) != 0, "setrlimit: %m");
    const double t0 = now_s();
    weftResult_t res =
        weftAllReduce(buf.data(), buf.data(), buf.size(), weftFloat32, weftSum, comm, nullptr);
    const double took = now_s() - t0;
    setrlimit(RLIMIT_NOFILE, &was);  // /proc is read with a descriptor
    const double cpu1 = thread_cpu_s(query[0]);
    FAIL_IF(cpu0 < 0 || cpu1 < 0, "the query thread's CPU time cannot be read");
    const double spent = cpu1 - cpu0;
    const std::string msg = weftGetLastError(comm);
    printf("rank 0: %s after %.2f s: %s\n", weftGetErrorString(res), took, msg.c_str());
    printf("rank 0: its query thread used %.2f s of CPU meanwhile\n", spent);
    FAIL_IF(res != weftRemoteError, "got %s, want weftRemoteError", weftGetErrorString(res));
    FAIL_IF(msg.find("AllReduce #2 (1024 float32 sum)") == std::string::npos,
            "error does not name the call: %s", msg.c_str());
    FAIL_IF(msg.find("dead") != std::string::npos, "live ranks called dead: %s", msg.c_str());
    FAIL_IF(msg.find("rank 0 could not ask ranks 1-3 where they are (") == std::string::npos ||
                msg.find(strerror(EMFILE)) == std::string::npos,
            "the questions not made, and why, not said: %s", msg.c_str());
    FAIL_IF(spent > 0.5, "the query thread spun: %.2f s of CPU in %.2f s", spent, took);
    weftCommAbort(comm);
    return 0;
  }, opts);
  for (size_t r = 0; r < status.size(); r++) EXPECT_EQ(status[r], 0) << "rank " << r;
}

// A send's verdict names its peer's state, and where the failure came from
// elsewhere (the peer's own peer died, and the news went around the ring),
// the ranks that are dead or silent too: a rank two steps from a dead one
// learnt only that its peer failed.
TEST(HangVerdict, ASendNamesDeadRanksBeyondItsPeer) {
  const int64_t now = 100000000000ll;
  auto call = [&](int32_t coll, int32_t peer, int32_t state, uint64_t seq) {
    trace_call c{};
    c.id = c.seq = seq;
    c.count = 16;
    c.coll = coll;
    c.datatype = weftFloat32;
    c.root = peer;
    c.state = state;
    c.waiting_on = -1;
    c.nranks = 4;
    c.t_created_ns = now - 1000000000ll;
    return c;
  };
  // rank 1 sends to rank 2, which is in its receive from rank 1; rank 0 is
  // dead, rank 3 silent
  trace_call r1[1] = {call(COLL_SEND, 2, TRACE_STARTED, 7)};
  trace_call r2[1] = {call(COLL_RECV, 1, TRACE_STARTED, 7)};
  hang_view views[4] = {};
  views[0].status = HANG_GONE;
  views[1] = hang_view{HANG_ANSWERED, r1, 1, now, 0};
  views[2] = hang_view{HANG_ANSWERED, r2, 1, now, 0};
  views[3].status = HANG_SILENT;
  char text[1024];
  ASSERT_EQ(hang_verdict(&r1[0], "failed", views, 4, text, sizeof text), weftSuccess);
  const std::string v = text;
  EXPECT_NE(v.find("rank 2 is in"), std::string::npos) << v;
  EXPECT_NE(v.find("elsewhere, dead: rank 0"), std::string::npos) << v;
  EXPECT_NE(v.find("elsewhere, silent: rank 3"), std::string::npos) << v;
  // where nothing else is wrong, nothing more is said
  views[0] = hang_view{HANG_ANSWERED, r1, 0, now, 0};
  views[3] = hang_view{HANG_ANSWERED, r1, 0, now, 0};
  ASSERT_EQ(hang_verdict(&r1[0], "failed", views, 4, text, sizeof text), weftSuccess);
  EXPECT_EQ(std::string(text).find("elsewhere"), std::string::npos) << text;
}

}  // namespace
