// Randomized kills: 30 seeded trials, each a job of 2-8 forked ranks over shm,
// socket or UCX, one rank SIGKILLed somewhere from before its init to the
// middle of a collective. Every survivor must return an error within 1 s of
// the kill (0 hangs), results before the kill must be right, and no /dev/shm
// segment of the job may outlive it.
//
// Where a kill lands:
//   before-init  rank 0 published the unique id (its process serves the
//                bootstrap root) and dies before calling init; the others
//                are joining. (A rank that never joined cannot be told from
//                a slow one but by the timeout, so only the root's host
//                dies this early.)
//   in-init      a random time after the victim entered weftCommInitRank.
//   idle         after init, before the first collective.
//   collective   a random time after the victim entered its n-th all-reduce.
// WEFT_KILL_SEED repeats one run; WEFT_KILL_TRIALS changes the count. Each
// failing trial is printed with its seed, shape, phase and what went wrong.
#include <gtest/gtest.h>
#include <dirent.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tests/harness.h"
#include "weft.h"
#include "weft_build_config.h"

namespace {

using weft_test::Rng;

constexpr int kMaxRanks = 8;
constexpr double kErrorWithinS = 1.0;
constexpr int kRankTimeoutS = 5;     // WEFT_TIMEOUT in the ranks: a miss ends there
constexpr double kHangS = 12.0;      // a rank still running then is a hang
constexpr double kCollectiveCapS = 8; // survivors stop calling after this long

enum Phase { kBeforeInit, kInInit, kIdle, kCollective, kNumPhases };
const char *const kPhaseNames[] = {"before-init", "in-init", "idle", "collective"};
enum Transport { kShm, kSocket, kUcx, kNumTransports };
const char *const kTransportNames[] = {"shm", "socket", "ucx"};

// What each rank reports, in memory shared with the test.
struct RankState {
  volatile int step;          // 0 started, 1 in init, 2 init done, 3+n in all-reduce n
  volatile int result;        // 0 running, 1 error returned, 2 wrong data, 3 no error by the cap
  volatile int64_t error_ns;  // CLOCK_MONOTONIC when the failing call returned
  volatile int calls_ok;
  char error[256];
};
struct Shared {
  volatile int id_ready;
  weftUniqueId id;
  RankState ranks[kMaxRanks];
};

int64_t mono_ns() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

void rank_error(RankState *st, int result, const char *what) {
  st->error_ns = mono_ns();
  snprintf(st->error, sizeof st->error, "%s", what);
  __atomic_store_n(&st->result, result, __ATOMIC_RELEASE);
}

// A rank: joins, then all-reduces int32 data of varying odd sizes (checking
// every result) until a call fails or the cap passes.
int rank_main(Shared *sh, int rank, int nranks, uint64_t seed, int sleep_before_init_ms) {
  RankState *st = &sh->ranks[rank];
  if (rank == 0) {
    if (weftGetUniqueId(&sh->id) != weftSuccess) {
      rank_error(st, 1, weftGetLastError(nullptr));
      return 1;
    }
    __atomic_store_n(&sh->id_ready, 1, __ATOMIC_RELEASE);
  } else {
    while (!__atomic_load_n(&sh->id_ready, __ATOMIC_ACQUIRE)) usleep(100);
  }
  if (sleep_before_init_ms > 0) usleep(sleep_before_init_ms * 1000);
  st->step = 1;
  weftComm_t comm;
  weftResult_t res = weftCommInitRank(&comm, nranks, sh->id, rank);
  if (res != weftSuccess) {
    rank_error(st, 1, weftGetLastError(nullptr));
    return 0;
  }
  st->step = 2;
  Rng rng(seed * 7919 + 17);  // the same sizes on every rank
  std::vector<int32_t> buf;
  int64_t t0 = mono_ns();
  for (int call = 0;; call++) {
    if ((double)(mono_ns() - t0) / 1e9 > kCollectiveCapS) {
      rank_error(st, 3, "no error by the cap");
      break;
    }
    size_t count = 1 + rng.next() % 70000;
    buf.resize(count);
    for (size_t i = 0; i < count; i++) buf[i] = (int32_t)(rank + 1 + (int)(i % 1000) + call);
    st->step = 3 + call;
    res = weftAllReduce(buf.data(), buf.data(), count, weftInt32, weftSum, comm, nullptr);
    if (res != weftSuccess) {
      char text[256];
      snprintf(text, sizeof text, "call %d: %s: %s", call, weftGetErrorString(res),
               weftGetLastError(comm));
      rank_error(st, 1, text);
      break;
    }
    for (size_t i = 0; i < count; i++) {
      int64_t want = (int64_t)nranks * (1 + (int)(i % 1000) + call) + nranks * (nranks - 1) / 2;
      if (buf[i] != (int32_t)want) {
        char text[256];
        snprintf(text, sizeof text, "call %d: element %zu is %d, expected %" PRId64, call, i,
                 buf[i], want);
        rank_error(st, 2, text);
        return 0;
      }
    }
    st->calls_ok = call + 1;
  }
  weftCommAbort(comm);
  return 0;
}

// /dev/shm entries whose name holds one of pids (segments are named
// /weft-<pid>-...).
std::vector<std::string> shm_segments_of(const std::vector<pid_t> &pids) {
  std::vector<std::string> found;
  DIR *d = opendir("/dev/shm");
  if (d == nullptr) return found;
  struct dirent *e;
  while ((e = readdir(d)) != nullptr) {
    std::string name = e->d_name;
    if (name.find("weft") == std::string::npos) continue;
    for (pid_t p : pids) {
      std::string tag = "-" + std::to_string(p) + "-";
      if (name.find(tag) != std::string::npos) found.push_back(name);
    }
  }
  closedir(d);
  return found;
}

struct Trial {
  int index;
  uint64_t seed;
  int nranks, victim;
  Phase phase;
  Transport transport;
  int delay_us;
};

struct Outcome {
  int survivors = 0, ok = 0, slow = 0, hung = 0, wrong = 0, no_error = 0;
  double worst_s = 0;
  std::vector<double> latencies;
  int leaked = 0;
  std::string report;
};

// Runs one trial; fills out (its report names what failed).
void run_trial(const Trial &t, Outcome *out) {
  Shared *sh = (Shared *)mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE,
                              MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(sh, MAP_FAILED);
  memset(sh, 0, sizeof *sh);
  fflush(stdout);
  fflush(stderr);
  std::vector<pid_t> pids(t.nranks);
  for (int r = 0; r < t.nranks; r++) {
    pid_t pid = fork();
    if (pid == 0) {
      setenv("WEFT_TIMEOUT", std::to_string(kRankTimeoutS).c_str(), 1);
      setenv("WEFT_DEBUG", "NONE", 1);  // survivors' warnings about the dead peer are expected
      if (t.transport != kShm) setenv("WEFT_TRANSPORT", kTransportNames[t.transport], 1);
      if (t.transport == kUcx) setenv("UCX_TLS", "tcp", 1);
      // before-init: the victim (rank 0) waits so the kill lands before its init
      int sleep_ms = t.phase == kBeforeInit && r == t.victim ? 1000 : 0;
      _exit(rank_main(sh, r, t.nranks, t.seed, sleep_ms));
    }
    pids[r] = pid;
  }
  // wait for the victim to reach the phase, then kill it after the delay
  RankState *v = &sh->ranks[t.victim];
  int want_step = t.phase == kBeforeInit ? -1 : t.phase == kInInit ? 1 : t.phase == kIdle ? 2 : 3 + 2;
  int64_t wait_start = mono_ns();
  while (mono_ns() - wait_start < (int64_t)20e9) {
    if (t.phase == kBeforeInit ? __atomic_load_n(&sh->id_ready, __ATOMIC_ACQUIRE) != 0
                               : v->step >= want_step || v->result != 0)
      break;
    usleep(50);
  }
  usleep(t.delay_us);
  int victim_step = v->step;
  int64_t kill_ns = mono_ns();
  kill(pids[t.victim], SIGKILL);
  waitpid(pids[t.victim], nullptr, 0);
  // survivors: error within 1 s; anything running at kHangS is a hang
  std::vector<int> done(t.nranks, 0), how(t.nranks, 0);
  done[t.victim] = 1;
  int left = t.nranks - 1;
  char line[512];
  while (left > 0) {
    int ws;
    pid_t p = waitpid(-1, &ws, WNOHANG);
    for (int r = 0; p > 0 && r < t.nranks; r++)
      if (pids[r] == p && !done[r]) done[r] = 1, how[r] = ws, left--;
    if (p > 0) continue;
    if ((double)(mono_ns() - kill_ns) / 1e9 > kHangS) {
      for (int r = 0; r < t.nranks; r++)
        if (!done[r]) {
          kill(pids[r], SIGKILL);
          waitpid(pids[r], nullptr, 0);
          done[r] = 2;
        }
      left = 0;
      break;
    }
    usleep(1000);
  }
  std::string details;
  for (int r = 0; r < t.nranks; r++) {
    if (r == t.victim) continue;
    out->survivors++;
    RankState *st = &sh->ranks[r];
    double after = (double)(st->error_ns - kill_ns) / 1e9;
    if (done[r] == 2) {
      out->hung++;
      snprintf(line, sizeof line, "    rank %d HUNG (step %d, still running %.0f s after the kill)\n",
               r, st->step, kHangS);
    } else if (st->result == 2) {
      out->wrong++;
      snprintf(line, sizeof line, "    rank %d WRONG DATA: %s\n", r, st->error);
    } else if (st->result != 1) {
      out->no_error++;
      char ended[64];
      if (WIFSIGNALED(how[r]))
        snprintf(ended, sizeof ended, "killed by signal %d", WTERMSIG(how[r]));
      else
        snprintf(ended, sizeof ended, "exit status %d", WEXITSTATUS(how[r]));
      snprintf(line, sizeof line, "    rank %d returned NO ERROR (result %d, %d calls, %s, step %d)\n",
               r, st->result, st->calls_ok, ended, st->step);
    } else {
      out->latencies.push_back(after);
      out->worst_s = std::max(out->worst_s, after);
      if (after > kErrorWithinS) {
        out->slow++;
        snprintf(line, sizeof line, "    rank %d SLOW: error %.2f s after the kill: %s\n", r, after,
                 st->error);
      } else {
        out->ok++;
        line[0] = '\0';
      }
    }
    details += line;
  }
  // the job is gone: none of its segments may remain
  std::vector<std::string> left_over = shm_segments_of(pids);
  out->leaked = (int)left_over.size();
  for (const auto &name : left_over) {
    details += "    LEAKED /dev/shm/" + name + "\n";
    std::string path = "/dev/shm/" + name;
    unlink(path.c_str());  // so later trials and runs start clean
  }
  snprintf(line, sizeof line,
           "trial %2d seed %" PRIu64 ": %d ranks over %s, rank %d killed %s (step %d, +%d us): "
           "%d/%d survivors erred within %.0f s (worst %.3f s)%s\n",
           t.index, t.seed, t.nranks, kTransportNames[t.transport], t.victim,
           kPhaseNames[t.phase], victim_step, t.delay_us, out->ok, out->survivors, kErrorWithinS,
           out->worst_s, out->leaked ? ", segments leaked" : "");
  out->report = line + details;
  munmap(sh, sizeof *sh);
}

// WEFT_KILL_TRANSPORT (shm, socket, ucx), WEFT_KILL_PHASE (a phase's name)
// and WEFT_KILL_NRANKS keep only the trials of that shape; the draws stay
// the run seed's, so the same WEFT_KILL_SEED and shape repeat the same trials.
bool shape_wanted(const Trial &t) {
  const char *transport = getenv("WEFT_KILL_TRANSPORT");
  const char *phase = getenv("WEFT_KILL_PHASE");
  const char *nranks = getenv("WEFT_KILL_NRANKS");
  return (transport == nullptr || strcmp(transport, kTransportNames[t.transport]) == 0) &&
         (phase == nullptr || strcmp(phase, kPhaseNames[t.phase]) == 0) &&
         (nranks == nullptr || atoi(nranks) == t.nranks);
}

TEST(Kill, RandomRanksPhasesTransports) {
  uint64_t seed = getenv("WEFT_KILL_SEED") ? strtoull(getenv("WEFT_KILL_SEED"), nullptr, 0)
                                           : (uint64_t)time(nullptr);
  int trials = getenv("WEFT_KILL_TRIALS") ? atoi(getenv("WEFT_KILL_TRIALS")) : 30;
  printf("kill test: seed %" PRIu64 " (WEFT_KILL_SEED=%" PRIu64 " repeats it), %d trials\n", seed,
         seed, trials);
  Rng rng(seed);
  int ntransports = WEFT_HAVE_UCX ? 3 : 2;
  if (!WEFT_HAVE_UCX) printf("kill test: weft was built without UCX: shm and socket only\n");
  int bad_trials = 0, total_survivors = 0, total_ok = 0, hangs = 0, leaks = 0;
  int bad_by_phase[kNumPhases] = {0}, by_phase[kNumPhases] = {0};
  std::vector<double> all;
  // trials run; with a shape asked for, draws that miss it are skipped
  for (int i = 0, run = 0; run < trials && i < 1000 * trials; i++) {
    Trial t;
    t.index = i;
    t.seed = rng.next();
    t.nranks = 2 + (int)(rng.next() % (kMaxRanks - 1));
    t.transport = (Transport)(rng.next() % ntransports);
    t.phase = (Phase)(rng.next() % kNumPhases);
    t.victim = t.phase == kBeforeInit ? 0 : (int)(rng.next() % t.nranks);
    t.delay_us = t.phase == kInInit ? (int)(rng.next() % 200000)
                 : t.phase == kCollective ? (int)(rng.next() % 3000)
                                          : (int)(rng.next() % 500);
    if (t.phase == kBeforeInit) t.delay_us = 50000 + (int)(rng.next() % 100000);
    if (!shape_wanted(t)) continue;
    run++;
    Outcome o;
    run_trial(t, &o);
    fputs(o.report.c_str(), stdout);
    fflush(stdout);
    by_phase[t.phase]++;
    bool bad = o.ok != o.survivors || o.leaked > 0;
    bad_trials += bad;
    bad_by_phase[t.phase] += bad;
    total_survivors += o.survivors;
    total_ok += o.ok;
    hangs += o.hung;
    leaks += o.leaked;
    all.insert(all.end(), o.latencies.begin(), o.latencies.end());
  }
  std::sort(all.begin(), all.end());
  double median = all.empty() ? 0 : all[all.size() / 2];
  double worst = all.empty() ? 0 : all.back();
  printf("kill test: %d/%d survivors erred within %.0f s, %d hung, %d segment(s) leaked; error "
         "latency median %.3f s, worst %.3f s\n",
         total_ok, total_survivors, kErrorWithinS, hangs, leaks, median, worst);
  for (int p = 0; p < kNumPhases; p++)
    printf("kill test: %-11s %d of %d trials failed\n", kPhaseNames[p], bad_by_phase[p],
           by_phase[p]);
  EXPECT_EQ(bad_trials, 0) << "seed " << seed << ": see the trials above";
  EXPECT_EQ(hangs, 0);
  EXPECT_EQ(leaks, 0);
}

}  // namespace
