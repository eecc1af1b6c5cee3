#include "harness.h"

#include <dirent.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <linux/capability.h>
#include <sched.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <fstream>

extern "C" {
#include "collectives/api/config.h"
#include "collectives/core/params.h"
#include "transport/base/log.h"
}

namespace weft_test {

static int warnings_seen;

static void count_warnings(int level, const char *line, void *) {
  if (level == LOG_WARN) {
    warnings_seen++;
    fprintf(stderr, "unexpected warning: %s\n", line);
  } else {
    fprintf(stderr, "%s\n", line);
  }
}

static int child_main(int rank, int nranks, int id_fd_read, const std::vector<int> &id_fds_write,
                      const RankFn &fn, const RunOptions &opts) {
  alarm((unsigned)opts.timeout_s + 5);  // backup for the parent's watchdog
  if (rank < (int)opts.netns.size() && !opts.netns[rank].empty()) {
    std::string path = "/var/run/netns/" + opts.netns[rank];
    int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0 || setns(fd, CLONE_NEWNET) != 0) {
      fprintf(stderr, "rank %d: cannot enter network namespace %s: %m\n", rank, path.c_str());
      return 1;
    }
    close(fd);
  }
  // the only thread yet: rank 0 starts the bootstrap's root thread below
  for (const auto &kv : opts.env) setenv(kv.first.c_str(), kv.second.c_str(), 1);
  for (const auto &name : opts.env_unset) unsetenv(name.c_str());
  if (opts.env_of)
    for (const auto &kv : opts.env_of(rank)) setenv(kv.first.c_str(), kv.second.c_str(), 1);
  if (opts.host_of) setenv("WEFT_HOSTID", opts.host_of(rank).c_str(), 1);
  weft_params_reset();
  if (!opts.allow_warnings) weft_log_set_sink(count_warnings, nullptr);
  RankCtx ctx{rank, nranks, {}};
  if (opts.unique_id && rank == 0) {
    if (weftGetUniqueId(&ctx.id) != weftSuccess) {
      fprintf(stderr, "rank 0: weftGetUniqueId failed: %s\n", weftGetLastError(nullptr));
      return 1;
    }
    for (int fd : id_fds_write)
      if (write(fd, &ctx.id, sizeof ctx.id) != (ssize_t)sizeof ctx.id) return 1;
  } else if (opts.unique_id) {
    size_t got = 0;
    while (got < sizeof ctx.id) {
      ssize_t n = read(id_fd_read, (char *)&ctx.id + got, sizeof ctx.id - got);
      if (n <= 0) return 1;
      got += (size_t)n;
    }
  }
  int rc = fn(ctx);
  if (rc == 0 && warnings_seen > 0) return 201;
  return rc;
}

std::function<std::string(int rank)> one_host_per_rank(const std::string &prefix) {
  return [prefix](int rank) { return prefix + "-" + std::to_string(rank); };
}

std::vector<int> run_ranks(int nranks, const RankFn &fn, const RunOptions &opts) {
  std::vector<int> rfd(nranks, -1), wfd(nranks, -1);
  for (int r = 1; r < nranks; r++) {
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) abort();
    rfd[r] = p[0];
    wfd[r] = p[1];
  }
  fflush(stdout);
  fflush(stderr);
  std::vector<pid_t> pids(nranks, -1);
  for (int r = 0; r < nranks; r++) {
    pid_t pid = fork();
    if (pid == 0) {
      std::vector<int> writers;
      if (r == 0)
        for (int q = 1; q < nranks; q++) writers.push_back(wfd[q]);
      int rc = child_main(r, nranks, rfd[r], writers, fn, opts);
      fflush(stdout);
      fflush(stderr);
      _exit(rc);
    }
    pids[r] = pid;
  }
  for (int r = 1; r < nranks; r++) {
    close(rfd[r]);
    close(wfd[r]);
  }
  std::vector<int> status(nranks, -1);
  struct timespec start;
  clock_gettime(CLOCK_MONOTONIC, &start);
  int left = nranks;
  while (left > 0) {
    /* only the ranks: a test's other children (a link cutter) are its own to reap */
    int reaped = 0;
    for (int r = 0; r < nranks; r++) {
      int ws;
      if (pids[r] <= 0 || waitpid(pids[r], &ws, WNOHANG) != pids[r]) continue;
      status[r] = WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
      pids[r] = -1;
      left--;
      reaped = 1;
    }
    if (reaped) continue;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (now.tv_sec - start.tv_sec > opts.timeout_s) {
      for (int r = 0; r < nranks; r++)
        if (pids[r] > 0) {
          fprintf(stderr, "watchdog: rank %d still running after %d s; killing it\n", r,
                  opts.timeout_s);
          kill(pids[r], SIGKILL);
          waitpid(pids[r], nullptr, 0);
          status[r] = 200;
          pids[r] = -1;
          left--;
        }
      break;
    }
    struct timespec ts = {0, 2000000};
    nanosleep(&ts, nullptr);
  }
  return status;
}

int rank_fail(const RankCtx &ctx, const char *fmt, ...) {
  char buf[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  fprintf(stderr, "rank %d/%d: %s\n", ctx.rank, ctx.nranks, buf);
  return 1;
}

uint64_t test_seed() {
  static uint64_t seed = 0;
  static bool printed = false;
  if (!printed) {
    const char *s = getenv("WEFT_TEST_SEED");
    seed = s ? strtoull(s, nullptr, 0) : 20261122ull;
    printf("random seed %llu (set WEFT_TEST_SEED to change)\n", (unsigned long long)seed);
    printed = true;
  }
  return seed;
}

TypeOpPairs::TypeOpPairs(uint64_t seed, int nranks, int full_up_to)
    : sampled_(nranks > full_up_to) {
  Rng pick(seed ^ 0x5a17ull);
  for (int t = 0; t < weftNumTypes; t++)
    for (int op = 0; op < weftNumOps; op++) {
      const bool third = pick.next() % 3 == 0;  // drawn for every pair: the same stream always
      on_[t][op] = !sampled_ || op == t % weftNumOps || third;
    }
}

std::string TypeOpPairs::describe() const {
  std::string s = sampled_ ? "datatype/op pairs:" : "every datatype/op pair";
  for (int t = 0; sampled_ && t < weftNumTypes; t++)
    for (int op = 0; op < weftNumOps; op++)
      if (on_[t][op]) s += " " + std::to_string(t) + "/" + std::to_string(op);
  return s;
}

int free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, (sockaddr *)&a, sizeof a);
  socklen_t len = sizeof a;
  getsockname(fd, (sockaddr *)&a, &len);
  close(fd);
  return ntohs(a.sin_port);
}

double now_s() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

bool run_test_alone(const std::string &test_name, const std::string &env, int timeout_s,
                    std::string *out) {
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return false;
  self[n] = '\0';
  const std::string cmd = "env -u GTEST_SHARD_INDEX -u GTEST_TOTAL_SHARDS -u GTEST_SHARD_STATUS_FILE " +
                          env + " timeout " + std::to_string(timeout_s) + " '" + self +
                          "' --gtest_also_run_disabled_tests --gtest_filter=" + test_name + " 2>&1";
  FILE *p = popen(cmd.c_str(), "r");
  if (p == nullptr) return false;
  out->clear();
  char buf[4096];
  size_t got;
  while ((got = fread(buf, 1, sizeof buf, p)) > 0) out->append(buf, got);
  const int status = pclose(p);
  return status == 0 && out->find("[  PASSED  ] 1 test") != std::string::npos;
}

bool threads_named(const char *prefix, std::vector<pid_t> *tids) {
  tids->clear();
  DIR *d = opendir("/proc/self/task");
  if (d == nullptr) return false;
  while (dirent *e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream f(std::string("/proc/self/task/") + e->d_name + "/comm");
    std::string name;
    std::getline(f, name);
    if (name.rfind(prefix, 0) == 0) tids->push_back((pid_t)atoi(e->d_name));
  }
  closedir(d);
  return true;
}

int count_threads_named(const char *prefix) {
  std::vector<pid_t> tids;
  return threads_named(prefix, &tids) ? (int)tids.size() : -1;
}

bool env_set_alone(const char *name, const char *value) {
  // a thread on its way out (the bootstrap root's, detached, ends once it
  // has told every rank of the others, which a loaded machine may delay
  // past the comm's init) is given up to 2 s to go
  int nthreads = count_threads_named("");
  for (int i = 0; i < 200 && nthreads != 1; i++) {
    usleep(10000);
    nthreads = count_threads_named("");
  }
  if (nthreads != 1) {
    fprintf(stderr, "setting %s with %d threads in the process: getenv may race it\n", name,
            nthreads);
    return false;
  }
  if (value != nullptr) setenv(name, value, 1);
  else unsetenv(name);
  return true;
}

void drop_ptrace_capability() {
  struct __user_cap_header_struct head = {_LINUX_CAPABILITY_VERSION_3, 0};
  struct __user_cap_data_struct data[2];
  if (syscall(SYS_capget, &head, data) != 0) return;
  data[CAP_SYS_PTRACE / 32].effective &= ~(1u << (CAP_SYS_PTRACE % 32));
  syscall(SYS_capset, &head, data);
}

}  // namespace weft_test
