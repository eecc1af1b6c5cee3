/*
 * weftrun: the local launcher.
 *
 *   weftrun [-n N] [--no-prefix] [-x NAME=VALUE]... [--] PROGRAM [ARGS...]
 *
 * Starts N ranks of PROGRAM on this host with the environment that
 * weftCommInitFromEnv reads (weft's and torchrun's variables), serves their
 * rendezvous from a weftGetUniqueId thread, prefixes their output lines with
 * the rank, forwards signals, and tears the whole job down when one rank fails.
 *
 * Each rank runs in its own process group, so a signal reaches it once: from
 * weftrun, not also from the terminal. weftrun is a child subreaper, so
 * processes that ranks leave behind become its children, which it kills
 * (by pid, in whatever group or session they are) and reaps at the end.
 *
 * This file parses the arguments and sets up;
 * weftrun_job.h says where the rest lives.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "weftrun_job.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <sched.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <math.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

/* --- Arguments and environment ------------------------------------------ */

static void run_usage(FILE *f)
{
  fprintf(f,
          "usage: weftrun [-n N] [--no-prefix] [--bind-to share|core|none] [-x NAME=VALUE]...\n"
          "               [--] PROGRAM [ARGS...]\n"
          "\n"
          "Runs N ranks of PROGRAM on this host, connected through a rendezvous that\n"
          "weftrun serves. Each rank gets WEFT_RANK, WEFT_NRANKS, WEFT_LOCAL_RANK,\n"
          "WEFT_LOCAL_SIZE, WEFT_UNIQUE_ID and torchrun's RANK, WORLD_SIZE, LOCAL_RANK,\n"
          "LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT. The rendezvous and the ranks'\n"
          "listeners take loopback connections only (WEFT_SOCKET_IFNAME is set to the\n"
          "loopback interface unless set), and WEFT_SECRET is random per job unless\n"
          "set. Rank 0 reads weftrun's stdin when it is not a terminal; other ranks\n"
          "read /dev/null.\n"
          "\n"
          "options:\n"
          "  -n N, -np N    number of ranks (default 1; also -nN, -npN)\n"
          "  -x NAME=VALUE  set NAME in every rank's environment (-x NAME copies\n"
          "                 weftrun's own value)\n"
          "  --no-prefix    print the ranks' output as it comes, without the \"[rank] \"\n"
          "                 prefix (with it, a line is printed at its end, '\\n' or '\\r',\n"
          "                 or in part when it has waited 0.2 s)\n"
          "  --bind-to share|core|none\n"
          "                 share: pin each rank to an equal contiguous slice of the C\n"
          "                 CPUs weftrun may use, C/N of them (rounded down, at least 1;\n"
          "                 all C for one rank); core: pin rank r to the r-th of those\n"
          "                 CPUs; none: do not pin. Default: share when the ranks fit\n"
          "                 on those CPUs, none when they do not or when\n"
          "                 WEFT_TRANSPORT=socket; more ranks than CPUs are never\n"
          "                 pinned\n"
          "  -h, --help     print this help\n"
          "  -V, --version  print weft's version\n"
          "\n"
          "When a rank fails, the others have WEFTRUN_FAIL_GRACE seconds (default 1) to\n"
          "end by themselves (ranks in a collective with it fail at once, print why and\n"
          "write their traces), then get SIGTERM, then SIGKILL after\n"
          "WEFTRUN_KILL_TIMEOUT seconds (default 5), and weftrun exits with the failed\n"
          "rank's status (128+N for signal N). SIGINT, SIGTERM, SIGHUP and SIGQUIT are\n"
          "forwarded to every rank and end the job the same way, a second one with\n"
          "SIGKILL at once; weftrun then exits with 128+N. SIGUSR1, SIGUSR2, SIGALRM and\n"
          "SIGCONT are forwarded and the job goes on; SIGTSTP stops the ranks (with\n"
          "SIGSTOP) and weftrun. Signals ignored when weftrun starts (nohup's SIGHUP) stay\n"
          "ignored, by weftrun and the ranks. Processes that ranks leave behind are killed\n"
          "at the end (not those of a weftrun killed with SIGKILL: only its ranks then get\n"
          "SIGKILL). weftrun exits with 127 when PROGRAM is not found, 126 when it cannot\n"
          "be run, and 1 when writing its own output failed (other than a closed pipe).\n"
          "\n"
          "The rendezvous waits for the ranks as long as they run: weftrun serves one\n"
          "weftCommInitFromEnv per rank; more communicators come from weftCommSplit. A\n"
          "rank that ends before it joins (with any status: one that exits 0 without\n"
          "calling weft too) fails the others' weftCommInitFromEnv at once, naming it.\n"
          "The process weftrun starts is the rank, as with mpirun: a wrapper that starts\n"
          "the program in the background and exits ends the rank (setsid does, each rank\n"
          "leading its process group: use setsid -w); exec the program, or wait for it.\n");
}

static void run_usage_error(const char *fmt, ...)
{
  va_list ap;
  fprintf(stderr, "weftrun: ");
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fprintf(stderr, "\nusage: weftrun [-n N] [--no-prefix] [-x NAME=VALUE]... "
                  "[--bind-to share|core|none] [--] PROGRAM [ARGS...]  (weftrun --help for "
                  "more)\n");
  exit(RUN_EXIT_USAGE);
}

static int run_parse_nranks(const char *s)
{
  char *end;
  errno = 0;
  long n = strtol(s, &end, 10);
  if (errno || end == s || *end || n < 1 || n > RUN_MAX_RANKS)
    run_usage_error("invalid number of ranks '%s' (must be 1 to %d)", s, RUN_MAX_RANKS);
  return (int)n;
}

static char *run_parse_x_var(const char *s)
{
  const char *eq = strchr(s, '=');
  size_t name_len = eq ? (size_t)(eq - s) : strlen(s);
  if (name_len == 0)
    run_usage_error("-x needs NAME=VALUE, got '%s'", s);
  if (eq)
    return run_printf("%s", s);
  const char *value = getenv(s);
  if (!value)
    run_usage_error("-x %s: %s is not set in weftrun's environment", s, s);
  return run_printf("%s=%s", s, value);
}

static void run_parse_args(struct run_job *job, int argc, char **argv)
{
  job->nranks = 1;
  job->prefix = true;
  job->bind = RUN_BIND_AUTO;
  job->x_vars = run_xmalloc((size_t)argc * sizeof(char *));
  int i = 1;
  while (i < argc) {
    const char *a = argv[i];
    if (strcmp(a, "--") == 0) {
      i++;
      break;
    }
    if (a[0] != '-')
      break;
    if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
      run_usage(stdout);
      exit(0);
    } else if (strcmp(a, "--version") == 0 || strcmp(a, "-V") == 0) {
      int v = 0;
      weftGetVersion(&v);
      printf("weftrun (weft %d.%d.%d)\n", v / 10000, v / 100 % 100, v % 100);
      exit(0);
    } else if (strcmp(a, "--no-prefix") == 0) {
      job->prefix = false;
      i++;
    } else if (strcmp(a, "-n") == 0 || strcmp(a, "-np") == 0) {
      if (i + 1 >= argc)
        run_usage_error("%s needs a number", a);
      job->nranks = run_parse_nranks(argv[i + 1]);
      i += 2;
    } else if (strncmp(a, "-n", 2) == 0 && isdigit((unsigned char)a[2])) {
      job->nranks = run_parse_nranks(a + 2);
      i++;
    } else if (strncmp(a, "-np", 3) == 0 && isdigit((unsigned char)a[3])) {
      job->nranks = run_parse_nranks(a + 3);
      i++;
    } else if (strcmp(a, "--bind-to") == 0) {
      if (i + 1 >= argc)
        run_usage_error("--bind-to needs share, core or none");
      if (strcmp(argv[i + 1], "share") == 0)
        job->bind = RUN_BIND_SHARE;
      else if (strcmp(argv[i + 1], "core") == 0)
        job->bind = RUN_BIND_CORE;
      else if (strcmp(argv[i + 1], "none") == 0)
        job->bind = RUN_BIND_NONE;
      else
        run_usage_error("--bind-to %s: use share, core or none", argv[i + 1]);
      i += 2;
    } else if (strcmp(a, "-x") == 0) {
      if (i + 1 >= argc)
        run_usage_error("-x needs NAME=VALUE");
      job->x_vars[job->n_x_vars++] = run_parse_x_var(argv[i + 1]);
      i += 2;
    } else {
      run_usage_error("unknown option '%s'", a);
    }
  }
  if (i >= argc)
    run_usage_error("missing program to run");
  job->argv = argv + i;
  job->prefix_width = 1;
  for (int n = job->nranks - 1; n >= 10; n /= 10)
    job->prefix_width++;
}

/* Finds PROGRAM as execvp would, on the PATH the ranks will have; sets
 * job->exec_path, or returns an errno. */
static int run_resolve_program(struct run_job *job)
{
  const char *prog = job->argv[0];
  if (prog[0] == '\0')
    return ENOENT;
  if (strchr(prog, '/')) {
    job->exec_path = run_printf("%s", prog);
    return 0;
  }
  const char *path = getenv("PATH");
  for (int x = job->n_x_vars - 1; x >= 0; x--) {
    if (strncmp(job->x_vars[x], "PATH=", 5) == 0) {
      path = job->x_vars[x] + 5;
      break;
    }
  }
  if (!path)
    path = "/bin:/usr/bin";
  int err = ENOENT;
  for (const char *dir = path;; dir++) {
    const char *colon = strchrnul(dir, ':');
    int dir_len = (int)(colon - dir);
    char *candidate = dir_len ? run_printf("%.*s/%s", dir_len, dir, prog) : run_printf("%s", prog);
    struct stat st;
    if (stat(candidate, &st) == 0 && S_ISREG(st.st_mode)) {
      if (access(candidate, X_OK) == 0) {
        job->exec_path = candidate;
        return 0;
      }
      err = EACCES;
    }
    free(candidate);
    dir = colon;
    if (*dir == '\0')
      break;
  }
  return err;
}

/* --- Set-up ------------------------------------------------------------- */

/* Opens /dev/null on any of 0, 1, 2 that is closed, so pipes never land there. */
static void run_fds_sanitize(void)
{
  for (int fd = 0; fd < 3; fd++) {
    if (fcntl(fd, F_GETFD) < 0 && errno == EBADF) {
      int n = open("/dev/null", O_RDWR);
      if (n < 0)
        exit(1);
    }
  }
}

/* Seconds from the environment variable name (default_ms when unset), in ms. */
static int64_t run_env_seconds_ms(const char *name, int64_t default_ms)
{
  const char *s = getenv(name);
  if (!s || !*s)
    return default_ms;
  char *end;
  double seconds = strtod(s, &end);
  if (*end || !isfinite(seconds) || seconds < 0 || seconds > 1e6) {
    fprintf(stderr, "weftrun: %s must be a number of seconds, got '%s'\n", name, s);
    exit(RUN_EXIT_USAGE);
  }
  return (int64_t)(seconds * 1000);
}

/* Every rank runs on this host: the rendezvous and the ranks' listeners take
 * loopback connections only (WEFT_SOCKET_IFNAME, unless the caller chose an
 * interface), and WEFT_SECRET is random per job, for ranks that rendezvous
 * at an address (WEFT_COMM_ID) rather than through WEFT_UNIQUE_ID, whose
 * secret is random already. Set in weftrun's environment, which the ranks
 * inherit. Returns -1 with errno set on failure. */
static int run_env_local_job(void)
{
  if (getenv("WEFT_SOCKET_IFNAME") == NULL) {
    struct ifaddrs *ifs = NULL;
    if (getifaddrs(&ifs) != 0)
      return -1;
    const char *lo = NULL;
    for (struct ifaddrs *i = ifs; i != NULL && lo == NULL; i = i->ifa_next)
      if (i->ifa_addr != NULL && i->ifa_addr->sa_family == AF_INET &&
          (i->ifa_flags & IFF_LOOPBACK) && (i->ifa_flags & IFF_UP))
        lo = i->ifa_name;
    /* "=" matches the name exactly: a bare name is a prefix (lo would
     * also take lowpan0) */
    char exact[IFNAMSIZ + 2];
    snprintf(exact, sizeof exact, "=%s", lo != NULL ? lo : "");
    int rc = lo != NULL ? setenv("WEFT_SOCKET_IFNAME", exact, 1) : 0;
    freeifaddrs(ifs);
    if (rc != 0)
      return -1;
  }
  if (getenv("WEFT_SECRET") == NULL) {
    unsigned char raw[16];
    char text[2 * sizeof raw + 1];
    if (getrandom(raw, sizeof raw, 0) != (ssize_t)sizeof raw)
      return -1;
    for (size_t i = 0; i < sizeof raw; i++)
      snprintf(text + 2 * i, 3, "%02x", raw[i]);
    if (setenv("WEFT_SECRET", text, 1) != 0)
      return -1;
  }
  return 0;
}

/* A TCP port that was free on 127.0.0.1 a moment ago, for MASTER_PORT. */
static int run_free_port(void)
{
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return -1;
  struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = 0};
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  int port = -1;
  if (bind(fd, (struct sockaddr *)&addr, sizeof addr) == 0 &&
      getsockname(fd, (struct sockaddr *)&addr, &len) == 0)
    port = ntohs(addr.sin_port);
  close(fd);
  return port;
}

/* Whether the ranks will run with WEFT_TRANSPORT=socket (from -x, later
 * ones winning, else weftrun's environment): their proxy threads need CPUs
 * of their own, which pinned ranks could leave them too few of. */
static bool run_ranks_use_sockets(const struct run_job *job)
{
  const char *name = "WEFT_TRANSPORT=";
  const char *value = getenv("WEFT_TRANSPORT");
  for (int x = 0; x < job->n_x_vars; x++)
    if (strncmp(job->x_vars[x], name, strlen(name)) == 0)
      value = job->x_vars[x] + strlen(name);
  return value != NULL && strcasecmp(value, "socket") == 0;
}

/* The CPUs weftrun may run on, and whether ranks get pinned to them: by
 * default each to its share of them, when each rank can have a CPU of its
 * own (and no proxy threads of the socket transport need one too). */
static void run_bind_plan(struct run_job *job)
{
  cpu_set_t set;
  job->ncpus = 0;
  if (sched_getaffinity(0, sizeof set, &set) != 0)
    return;
  job->cpus = run_xmalloc((size_t)CPU_SETSIZE * sizeof(int));
  for (int c = 0; c < CPU_SETSIZE; c++)
    if (CPU_ISSET(c, &set))
      job->cpus[job->ncpus++] = c;
  if (job->bind == RUN_BIND_AUTO)
    job->bind = job->nranks <= job->ncpus && !run_ranks_use_sockets(job) ? RUN_BIND_SHARE
                                                                          : RUN_BIND_NONE;
  if (job->bind != RUN_BIND_NONE && job->nranks > job->ncpus) {
    /* two ranks pinned to one CPU would spin against each other while
     * another CPU idles: more ranks than CPUs float (as mpirun's
     * --oversubscribe leaves them unbound) */
    fprintf(stderr, "weftrun: --bind-to %s: %d ranks on %d CPUs: the ranks are not pinned\n",
            job->bind == RUN_BIND_CORE ? "core" : "share", job->nranks, job->ncpus);
    job->bind = RUN_BIND_NONE;
  }
}

/* weftrun holds two pipes per rank, and the rendezvous one connection per
 * rank until all have joined: the soft RLIMIT_NOFILE is raised toward the
 * hard one when that needs more (as mpirun does). The ranks get the limit
 * weftrun found, which programs that use select() rely on. */
static void run_nofile_raise(struct run_job *job)
{
  if (getrlimit(RLIMIT_NOFILE, &job->nofile) != 0) {
    job->nofile = (struct rlimit){RLIM_INFINITY, RLIM_INFINITY};
    return;
  }
  rlim_t need = 3 * (rlim_t)job->nranks + 64;
  if (job->nofile.rlim_cur == RLIM_INFINITY || job->nofile.rlim_cur >= need)
    return;
  struct rlimit raised = job->nofile;
  raised.rlim_cur = job->nofile.rlim_max != RLIM_INFINITY && job->nofile.rlim_max < need
                        ? job->nofile.rlim_max
                        : need;
  setrlimit(RLIMIT_NOFILE, &raised); /* best effort: a launch that runs out says so */
}

static void run_job_free(struct run_job *job)
{
  free(job->cpus);
  for (int r = 0; r < job->nranks && job->ranks; r++) {
    free(job->ranks[r].out.buf);
    free(job->ranks[r].err.buf);
  }
  free(job->ranks);
  free(job->signalled);
  free(job->out);
  for (int x = 0; x < job->n_x_vars; x++)
    free(job->x_vars[x]);
  free(job->x_vars);
  free(job->sh_argv);
  free(job->exec_path);
}

int main(int argc, char **argv)
{
  run_fds_sanitize();
  struct run_job job = {.fail_rank = -1, .wake_fd = -1};
  int status = 1;
  run_parse_args(&job, argc, argv);
  run_bind_plan(&job);
  run_nofile_raise(&job);
  job.kill_timeout_ms = run_env_seconds_ms("WEFTRUN_KILL_TIMEOUT", 5000);
  job.fail_grace_ms = run_env_seconds_ms("WEFTRUN_FAIL_GRACE", 1000);

  int err = run_resolve_program(&job);
  if (err) {
    fprintf(stderr, "weftrun: cannot run %s: %s\n", job.argv[0], strerror(err));
    status = err == ENOENT ? RUN_EXIT_EXEC : RUN_EXIT_NOEXEC;
    goto free_job;
  }
  /* one file behind both (a terminal, 2>&1): one line open at a time */
  struct stat st1, st2;
  job.same_output = fstat(1, &st1) == 0 && fstat(2, &st2) == 0 && st1.st_dev == st2.st_dev &&
                    st1.st_ino == st2.st_ino;
  int nargs = 0;
  while (job.argv[nargs])
    nargs++;
  job.sh_argv = run_xmalloc((size_t)(nargs + 2) * sizeof(char *));
  job.sh_argv[0] = "sh";
  job.sh_argv[1] = job.exec_path;
  for (int i = 1; i <= nargs; i++)
    job.sh_argv[i + 1] = job.argv[i];

  job.master_port = run_free_port();
  if (job.master_port < 0) {
    fprintf(stderr, "weftrun: cannot find a free port on 127.0.0.1: %s\n", strerror(errno));
    status = 1;
    goto free_job;
  }
  int devnull_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (devnull_fd < 0) {
    perror("weftrun: /dev/null");
    status = 1;
    goto free_job;
  }
  run_signals_install(&job);
  /* leftovers of ranks are reparented here, to be reaped and killed */
  prctl(PR_SET_CHILD_SUBREAPER, 1);

  if (run_env_local_job() != 0) {
    fprintf(stderr, "weftrun: cannot set up the job's environment: %s\n", strerror(errno));
    status = 1;
    goto free_job;
  }
  /* The root waits for the ranks without a deadline of its own (WEFT_TIMEOUT=0
   * while it starts, in weftrun's process only): weftrun watches them, and a
   * rank may work as long as it likes before its init, whose own waits keep
   * the job's WEFT_TIMEOUT. The ranks' environment is built later, from the
   * value put back here. */
  char *timeout_saved = getenv("WEFT_TIMEOUT") ? run_printf("%s", getenv("WEFT_TIMEOUT")) : NULL;
  setenv("WEFT_TIMEOUT", "0", 1);
  weftUniqueId id;
  weftResult_t res = weftGetUniqueId(&id);
  if (timeout_saved != NULL)
    setenv("WEFT_TIMEOUT", timeout_saved, 1);
  else
    unsetenv("WEFT_TIMEOUT");
  free(timeout_saved);
  if (res != weftSuccess) {
    const char *detail = weftGetLastError(NULL);
    fprintf(stderr, "weftrun: cannot start the rendezvous: %s%s%s\n", weftGetErrorString(res),
            detail[0] ? ": " : "", detail);
    status = 1;
    goto free_job;
  }
  job.unique_id = id;
  static const char hex[] = "0123456789abcdef";
  for (int i = 0; i < WEFT_UNIQUE_ID_BYTES; i++) {
    unsigned char b = (unsigned char)id.internal[i];
    job.unique_id_hex[2 * i] = hex[b >> 4];
    job.unique_id_hex[2 * i + 1] = hex[b & 15];
  }
  job.unique_id_hex[2 * WEFT_UNIQUE_ID_BYTES] = '\0';

  job.ranks = calloc((size_t)job.nranks, sizeof *job.ranks);
  if (!job.ranks)
    run_die_oom();
  for (int r = 0; r < job.nranks && !sig_stop_launch; r++) {
    int launch_status = run_launch(&job, r, devnull_fd);
    if (launch_status != 0) {
      run_record_failure(&job, r, launch_status);
      run_teardown(&job, SIGTERM);
      break;
    }
  }
  run_supervise(&job);

  status = 0;
  if (job.fail_rank >= 0)
    status = job.fail_status;
  else if (job.signal_received)
    status = 128 + job.signal_received;
  else if (job.dest_errno[1] || job.dest_errno[2])
    status = 1;
free_job:
  run_job_free(&job);
  return status;
}
