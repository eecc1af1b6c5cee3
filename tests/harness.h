// Multi-process test harness: forks ranks, hands them a unique id, and fails
// (instead of hanging) when a rank does not finish in time.
#ifndef WEFT_TESTS_HARNESS_H
#define WEFT_TESTS_HARNESS_H

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "weft.h"

namespace weft_test {

// What a rank's body sees.
struct RankCtx {
  int rank;
  int nranks;
  weftUniqueId id;
};

// A rank's body returns 0 on success; anything else is a failure code. It
// runs in a forked child, after env (NAME, VALUE) pairs are set.
using RankFn = std::function<int(const RankCtx &)>;
using EnvList = std::vector<std::pair<std::string, std::string>>;

// The environment is set in RunOptions, before the rank's process has a
// second thread, never from a rank's body: rank 0's bootstrap root thread
// (and, after init, proxy and worker threads) may call getenv meanwhile,
// which setenv can pull the environment from under (a SIGSEGV in getenv).
struct RunOptions {
  int timeout_s = 60;  // the watchdog: ranks still running then are killed
  EnvList env;
  std::vector<std::string> env_unset;  // names unset, after env is set
  // one rank's own variables (set after env; unset: none)
  std::function<EnvList(int rank)> env_of;
  // false: no unique id (ctx.id zeroed), so that no rank process has a
  // second thread before its body (tests that rendezvous by the environment)
  bool unique_id = true;
  bool allow_warnings = false;  // otherwise a logged warning fails the rank
  // network namespace (a name under /var/run/netns) each rank enters first;
  // empty or missing entries stay in the test's namespace
  std::vector<std::string> netns;
  // each rank's emulated host (its WEFT_HOSTID), set before rank 0 starts
  // the bootstrap's root thread: a setenv in the rank's body could race that
  // thread's getenv. Unset: every rank on the real host.
  std::function<std::string(int rank)> host_of;
};

// host_of for one emulated host per rank: prefix-<rank>.
std::function<std::string(int rank)> one_host_per_rank(const std::string &prefix);

// Exit status per rank: 0 ok, 1..125 the body's code, 200 the watchdog
// killed it, 201 a logged warning, 128+sig killed by a signal.
std::vector<int> run_ranks(int nranks, const RankFn &fn, const RunOptions &opts = {});

// Prints a failure message from inside a rank (stderr) and returns 1.
int rank_fail(const RankCtx &ctx, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

// In a rank's body (or a helper returning its code): when cond holds, prints
// the printf-style message naming the rank (rank_fail) and returns 1. The
// rank is the RankCtx named ctx in scope; FAIL_IF_RANK names it.
#define FAIL_IF(cond, ...) FAIL_IF_RANK(ctx, cond, __VA_ARGS__)
#define FAIL_IF_RANK(rank_ctx, cond, ...)                             \
  do {                                                                \
    if (cond) return ::weft_test::rank_fail((rank_ctx), __VA_ARGS__); \
  } while (0)
// Returns call's failure code (a rank body's or a helper's) when not 0.
#define TRY_RC(call)                  \
  do {                                \
    if (int rc_ = (call)) return rc_; \
  } while (0)

// The seed for random data: WEFT_TEST_SEED, else a fixed default; printed once.
uint64_t test_seed();

// Monotonic clock, in seconds.
double now_s();

// A TCP port that was free a moment ago on loopback.
int free_port();

// Runs one test of this binary, the DISABLED_ one test_name names
// ("Suite.DISABLED_Body"), in a process of its own (where nothing ran
// before it), under env ("VAR=value ...", may be empty) and timeout_s, with
// no shard of a sharded run's; its output in *out. True when it ran and passed.
bool run_test_alone(const std::string &test_name, const std::string &env, int timeout_s,
                    std::string *out);

// The ids of this process's threads whose name starts with prefix (proxy
// threads are named); false when /proc cannot be read.
bool threads_named(const char *prefix, std::vector<pid_t> *tids);
// How many there are, or -1 when /proc cannot be read.
int count_threads_named(const char *prefix);

// setenv (value non-NULL) or unsetenv for a process that has no other
// thread: returns false, printing why and changing nothing, when it has.
// For tests outside run_ranks; ranks set theirs in RunOptions.
bool env_set_alone(const char *name, const char *value);

// Gives up CAP_SYS_PTRACE in this process (root has it), so that ptrace
// rules apply to its cross-memory reads of other ranks.
void drop_ptrace_capability();

// Splitmix64: small, fast, reproducible.
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed) {}
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double uniform() { return (double)(next() >> 11) * 0x1.0p-53; }  // [0, 1)
};

// The datatype x op pairs a case runs: every pair up to full_up_to ranks;
// above that (seconds per case when many ranks share 2 cores) every datatype
// and every op still run, on the pairs (t, t mod ops) and a seeded third of
// the others. describe() lists the pairs taken, so a run can be repeated.
class TypeOpPairs {
 public:
  TypeOpPairs(uint64_t seed, int nranks, int full_up_to);
  bool operator()(int t, int op) const { return on_[t][op]; }
  bool sampled() const { return sampled_; }
  std::string describe() const;

 private:
  bool on_[weftNumTypes][weftNumOps];
  bool sampled_;
};

}  // namespace weft_test

#endif
