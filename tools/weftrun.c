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
 * processes that ranks leave behind are reaped here and killed at the end.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "weft.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

enum {
  RUN_MAX_RANKS = 4096,
  RUN_LINE_MAX_NBYTES = 65536,  /* longer lines are broken here */
  RUN_DRAIN_MAX_READS = 64,     /* reads per stream when its rank exits */
  RUN_FINAL_GRACE_MS = 2000,    /* after SIGKILL, wait this long for EOFs */
  RUN_EXIT_USAGE = 2,
  RUN_EXIT_EXEC = 127,
  RUN_OWN_VARS = 11,            /* variables weftrun sets for every rank */
};

static const int run_forwarded_signals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};
#define RUN_NFORWARDED ((int)(sizeof run_forwarded_signals / sizeof run_forwarded_signals[0]))

struct run_stream {
  int fd;        /* non-blocking read end of the rank's pipe; -1 after EOF */
  int dest_fd;   /* weftrun's 1 or 2 */
  char *buf;     /* the partial line read so far */
  size_t len;
  size_t cap;
};

struct run_rank {
  pid_t pid;     /* also its process group; 0 when not launched */
  bool reaped;
  struct run_stream out;
  struct run_stream err;
};

struct run_job {
  int nranks;
  bool prefix;
  int prefix_width;          /* digits of nranks-1 */
  char **argv;               /* PROGRAM ARGS..., NULL-terminated */
  char *exec_path;           /* PROGRAM resolved on PATH */
  char **sh_argv;            /* "sh exec_path ARGS..." for scripts without #! */
  char **x_vars;             /* -x NAME=VALUE, later ones win */
  int n_x_vars;
  char unique_id_hex[2 * WEFT_UNIQUE_ID_BYTES + 1];
  int master_port;
  int64_t kill_timeout_ms;
  struct run_rank *ranks;
  int nlaunched;
  int nlive;                 /* launched and not reaped */
  bool children_left;        /* waitpid saw unreaped descendants */
  int fail_rank;             /* first rank that failed, or -1 */
  int fail_status;           /* weftrun's exit status for that failure */
  int signal_received;       /* first forwarded signal, or 0 */
  int64_t kill_deadline_ms;  /* SIGKILL everything then; 0 = not tearing down */
  int64_t final_deadline_ms; /* stop waiting then; 0 = not yet */
  char *out;                 /* prefixed lines waiting for one write */
  size_t out_len;
  size_t out_cap;
  bool dest_closed[3];       /* weftrun's stdout/stderr reader went away */
};

static int sig_pipe[2] = {-1, -1};
static volatile sig_atomic_t sig_stop_launch;

/* --- Small helpers ------------------------------------------------------ */

static void run_die_oom(void)
{
  fprintf(stderr, "weftrun: out of memory\n");
  exit(1);
}

static void *run_xmalloc(size_t nbytes)
{
  void *p = malloc(nbytes ? nbytes : 1);
  if (!p)
    run_die_oom();
  return p;
}

static char *run_printf(const char *fmt, ...)
{
  va_list ap;
  char *s;
  va_start(ap, fmt);
  int rc = vasprintf(&s, fmt, ap);
  va_end(ap);
  if (rc < 0)
    run_die_oom();
  return s;
}

static int64_t run_now_ms(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static const char *run_signal_name(int signo, char *buf, size_t nbytes)
{
  static const struct {
    int signo;
    const char *name;
  } names[] = {
      {SIGHUP, "SIGHUP"},   {SIGINT, "SIGINT"},   {SIGQUIT, "SIGQUIT"}, {SIGILL, "SIGILL"},
      {SIGTRAP, "SIGTRAP"}, {SIGABRT, "SIGABRT"}, {SIGBUS, "SIGBUS"},   {SIGFPE, "SIGFPE"},
      {SIGKILL, "SIGKILL"}, {SIGUSR1, "SIGUSR1"}, {SIGSEGV, "SIGSEGV"}, {SIGUSR2, "SIGUSR2"},
      {SIGPIPE, "SIGPIPE"}, {SIGALRM, "SIGALRM"}, {SIGTERM, "SIGTERM"}, {SIGXCPU, "SIGXCPU"},
      {SIGXFSZ, "SIGXFSZ"}, {SIGSYS, "SIGSYS"},
  };
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (names[i].signo == signo)
      return names[i].name;
  snprintf(buf, nbytes, "%d", signo);
  return buf;
}

/* Writes all of buf to fd. When fd's reader has gone away (EPIPE), output for
 * fd is dropped and the ranks' pipes to it are closed on their next read. */
static void run_write_all(struct run_job *job, int fd, const char *buf, size_t nbytes)
{
  if (job->dest_closed[fd])
    return;
  while (nbytes > 0) {
    ssize_t n = write(fd, buf, nbytes);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && errno == EAGAIN) {
      struct pollfd p = {.fd = fd, .events = POLLOUT};
      poll(&p, 1, 100);
      continue;
    }
    if (n < 0) {
      job->dest_closed[fd] = true;
      return;
    }
    buf += n;
    nbytes -= (size_t)n;
  }
}

/* --- Output ------------------------------------------------------------- */

static void run_out_append(struct run_job *job, const char *data, size_t nbytes)
{
  if (job->out_len + nbytes > job->out_cap) {
    size_t cap = job->out_cap ? job->out_cap : 4096;
    while (cap < job->out_len + nbytes)
      cap *= 2;
    char *p = realloc(job->out, cap);
    if (!p)
      run_die_oom();
    job->out = p;
    job->out_cap = cap;
  }
  memcpy(job->out + job->out_len, data, nbytes);
  job->out_len += nbytes;
}

static void run_emit_line(struct run_job *job, int rank, const char *line, size_t nbytes)
{
  if (job->prefix) {
    char prefix[32];
    int n = snprintf(prefix, sizeof prefix, "[%*d] ", job->prefix_width, rank);
    run_out_append(job, prefix, (size_t)n);
  }
  run_out_append(job, line, nbytes);
  run_out_append(job, "\n", 1);
}

static void run_out_flush(struct run_job *job, int fd)
{
  run_write_all(job, fd, job->out, job->out_len);
  job->out_len = 0;
}

static void run_stream_close(struct run_job *job, int rank, struct run_stream *s)
{
  if (s->len > 0) {
    run_emit_line(job, rank, s->buf, s->len);
    run_out_flush(job, s->dest_fd);
    s->len = 0;
  }
  if (s->fd >= 0)
    close(s->fd);
  s->fd = -1;
}

/* Reads up to max_reads times from s, emitting every complete line; stops
 * early when the pipe is empty. Closes s at EOF, flushing a partial line. */
static void run_stream_read(struct run_job *job, int rank, struct run_stream *s, int max_reads)
{
  for (int i = 0; i < max_reads && s->fd >= 0; i++) {
    if (job->dest_closed[s->dest_fd]) {
      /* nobody reads weftrun's side: close the rank's, as a shell pipeline would */
      close(s->fd);
      s->fd = -1;
      s->len = 0;
      return;
    }
    if (s->len == s->cap) {
      if (s->cap == RUN_LINE_MAX_NBYTES) {
        /* a line too long to hold: break it here */
        run_emit_line(job, rank, s->buf, s->len);
        run_out_flush(job, s->dest_fd);
        s->len = 0;
      } else {
        size_t cap = s->cap ? 2 * s->cap : 4096;
        char *p = realloc(s->buf, cap);
        if (!p)
          run_die_oom();
        s->buf = p;
        s->cap = cap;
      }
    }
    ssize_t n = read(s->fd, s->buf + s->len, s->cap - s->len);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && errno == EAGAIN)
      return;
    if (n <= 0) {
      run_stream_close(job, rank, s);
      return;
    }
    size_t start = 0;
    size_t end = s->len + (size_t)n;
    for (size_t j = s->len; j < end; j++) {
      if (s->buf[j] == '\n') {
        run_emit_line(job, rank, s->buf + start, j - start);
        start = j + 1;
      }
    }
    memmove(s->buf, s->buf + start, end - start);
    s->len = end - start;
    run_out_flush(job, s->dest_fd);
  }
}

/* --- Arguments and environment ------------------------------------------ */

static void run_usage(FILE *f)
{
  fprintf(f,
          "usage: weftrun [-n N] [--no-prefix] [-x NAME=VALUE]... [--] PROGRAM [ARGS...]\n"
          "\n"
          "Runs N ranks of PROGRAM on this host, connected through a rendezvous that\n"
          "weftrun serves. Each rank gets WEFT_RANK, WEFT_NRANKS, WEFT_LOCAL_RANK,\n"
          "WEFT_LOCAL_SIZE, WEFT_UNIQUE_ID and torchrun's RANK, WORLD_SIZE, LOCAL_RANK,\n"
          "LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT. Rank 0 reads weftrun's stdin when\n"
          "it is not a terminal; other ranks read /dev/null.\n"
          "\n"
          "options:\n"
          "  -n N, -np N    number of ranks (default 1)\n"
          "  -x NAME=VALUE  set NAME in every rank's environment (-x NAME copies\n"
          "                 weftrun's own value)\n"
          "  --no-prefix    print the ranks' lines without the \"[rank] \" prefix\n"
          "  -h, --help     print this help\n"
          "\n"
          "When a rank fails, the others get SIGTERM, then SIGKILL after\n"
          "WEFTRUN_KILL_TIMEOUT seconds (default 5), and weftrun exits with the failed\n"
          "rank's status (128+N for signal N). SIGINT, SIGTERM, SIGHUP and SIGQUIT are\n"
          "forwarded to every rank.\n");
}

static void run_usage_error(const char *fmt, ...)
{
  va_list ap;
  fprintf(stderr, "weftrun: ");
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fprintf(stderr, "\nusage: weftrun [-n N] [--no-prefix] [-x NAME=VALUE]... [--] PROGRAM "
                  "[ARGS...]  (weftrun --help for more)\n");
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

/* Length of the NAME in "NAME=VALUE". */
static size_t run_env_name_len(const char *entry)
{
  const char *eq = strchr(entry, '=');
  return eq ? (size_t)(eq - entry) : strlen(entry);
}

static bool run_env_named_in(const char *entry, char *const *set, int n)
{
  size_t len = run_env_name_len(entry);
  for (int i = 0; i < n; i++)
    if (run_env_name_len(set[i]) == len && strncmp(entry, set[i], len) == 0)
      return true;
  return false;
}

/* Rank's environment: weftrun's own minus overridden names, then weftrun's
 * variables, then -x ones (which win). own[] receives strings to free. */
static char **run_env_build(const struct run_job *job, int rank, char *own[RUN_OWN_VARS])
{
  int i = 0;
  own[i++] = run_printf("WEFT_RANK=%d", rank);
  own[i++] = run_printf("WEFT_NRANKS=%d", job->nranks);
  own[i++] = run_printf("WEFT_LOCAL_RANK=%d", rank);
  own[i++] = run_printf("WEFT_LOCAL_SIZE=%d", job->nranks);
  own[i++] = run_printf("WEFT_UNIQUE_ID=%s", job->unique_id_hex);
  own[i++] = run_printf("RANK=%d", rank);
  own[i++] = run_printf("WORLD_SIZE=%d", job->nranks);
  own[i++] = run_printf("LOCAL_RANK=%d", rank);
  own[i++] = run_printf("LOCAL_WORLD_SIZE=%d", job->nranks);
  own[i++] = run_printf("MASTER_ADDR=127.0.0.1");
  own[i++] = run_printf("MASTER_PORT=%d", job->master_port);

  int n_inherited = 0;
  while (environ[n_inherited])
    n_inherited++;
  char **envp = run_xmalloc((size_t)(n_inherited + RUN_OWN_VARS + job->n_x_vars + 1) *
                            sizeof(char *));
  int k = 0;
  for (int e = 0; e < n_inherited; e++)
    if (!run_env_named_in(environ[e], own, RUN_OWN_VARS) &&
        !run_env_named_in(environ[e], job->x_vars, job->n_x_vars))
      envp[k++] = environ[e];
  for (int o = 0; o < RUN_OWN_VARS; o++)
    if (!run_env_named_in(own[o], job->x_vars, job->n_x_vars))
      envp[k++] = own[o];
  for (int x = 0; x < job->n_x_vars; x++)
    if (!run_env_named_in(job->x_vars[x], job->x_vars + x + 1, job->n_x_vars - x - 1))
      envp[k++] = job->x_vars[x];
  envp[k] = NULL;
  return envp;
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

/* --- Launching ---------------------------------------------------------- */

static void run_signal_all(struct run_job *job, int signo)
{
  /* a rank's group may outlive the rank: its leftovers get the signal too */
  for (int r = 0; r < job->nlaunched; r++)
    kill(-job->ranks[r].pid, signo);
}

static void run_teardown(struct run_job *job, int signo)
{
  run_signal_all(job, signo);
  if (job->kill_deadline_ms == 0)
    job->kill_deadline_ms = run_now_ms() + job->kill_timeout_ms;
}

static void run_close_fds_from(int lowest_fd, int except_fd)
{
#ifdef SYS_close_range
  if (except_fd > lowest_fd)
    syscall(SYS_close_range, (unsigned)lowest_fd, (unsigned)except_fd - 1, 0u);
  syscall(SYS_close_range, (unsigned)except_fd + 1, ~0u, 0u);
#else
  (void)lowest_fd;
  (void)except_fd;
#endif
}

/* The child between fork and exec: async-signal-safe calls only. Failures
 * are sent to the parent as an errno on exec_fd. */
static void run_child(const struct run_job *job, pid_t parent, int stdin_fd, int out_fd,
                      int err_fd, int exec_fd, char **envp)
{
  struct sigaction dfl = {.sa_handler = SIG_DFL};
  for (int i = 0; i < RUN_NFORWARDED; i++)
    sigaction(run_forwarded_signals[i], &dfl, NULL);
  sigaction(SIGCHLD, &dfl, NULL);
  sigaction(SIGPIPE, &dfl, NULL);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);

  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent)
    _exit(RUN_EXIT_EXEC); /* weftrun died before the death signal was armed */
  setpgid(0, 0);

  int err = 0;
  if ((stdin_fd >= 0 && dup2(stdin_fd, 0) < 0) || dup2(out_fd, 1) < 0 || dup2(err_fd, 2) < 0) {
    err = errno;
  } else {
    /* drop weftrun's descriptors (rendezvous sockets included) */
    run_close_fds_from(3, exec_fd);
    execve(job->exec_path, job->argv, envp);
    err = errno;
    if (err == ENOEXEC) {
      execve("/bin/sh", job->sh_argv, envp);
      err = errno;
    }
  }
  ssize_t n = write(exec_fd, &err, sizeof err);
  (void)n;
  _exit(RUN_EXIT_EXEC);
}

static void run_set_nonblock(int fd)
{
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

/* Starts rank r. Returns 0, or with a message printed, weftrun's exit status:
 * 127 when PROGRAM could not be executed, 1 when the rank could not start. */
static int run_launch(struct run_job *job, int r, int devnull_fd)
{
  struct run_rank *rank = &job->ranks[r];
  int out_pipe[2], err_pipe[2], exec_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) < 0)
    goto fail;
  if (pipe2(err_pipe, O_CLOEXEC) < 0)
    goto close_out;
  if (pipe2(exec_pipe, O_CLOEXEC) < 0)
    goto close_err;

  /* rank 0 reads weftrun's stdin, unless it is the terminal: ranks are not in
   * the terminal's foreground group and would stop on reading it */
  int stdin_fd = (r == 0 && !isatty(0)) ? -1 : devnull_fd;
  char *own[RUN_OWN_VARS];
  char **envp = run_env_build(job, r, own);
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid == 0)
    run_child(job, parent, stdin_fd, out_pipe[1], err_pipe[1], exec_pipe[1], envp);
  int fork_errno = errno;
  free(envp);
  for (int i = 0; i < RUN_OWN_VARS; i++)
    free(own[i]);
  close(out_pipe[1]);
  close(err_pipe[1]);
  close(exec_pipe[1]);
  if (pid < 0) {
    close(exec_pipe[0]);
    close(err_pipe[0]);
    close(out_pipe[0]);
    errno = fork_errno;
    goto fail;
  }

  setpgid(pid, pid); /* also done by the child; whichever runs first wins */
  rank->pid = pid;
  job->nlaunched++;
  job->nlive++;
  run_set_nonblock(out_pipe[0]);
  run_set_nonblock(err_pipe[0]);
  rank->out = (struct run_stream){.fd = out_pipe[0], .dest_fd = 1};
  rank->err = (struct run_stream){.fd = err_pipe[0], .dest_fd = 2};

  /* EOF: exec succeeded; an errno: it failed */
  int child_errno;
  ssize_t n;
  do {
    n = read(exec_pipe[0], &child_errno, sizeof child_errno);
  } while (n < 0 && errno == EINTR);
  close(exec_pipe[0]);
  if (n == (ssize_t)sizeof child_errno) {
    fprintf(stderr, "weftrun: cannot run %s: %s\n", job->argv[0], strerror(child_errno));
    return RUN_EXIT_EXEC;
  }
  return 0;

close_err:
  close(err_pipe[0]);
  close(err_pipe[1]);
close_out:
  close(out_pipe[0]);
  close(out_pipe[1]);
fail:
  fprintf(stderr, "weftrun: cannot launch rank %d: %s\n", r, strerror(errno));
  return 1;
}

/* --- Supervising -------------------------------------------------------- */

static void run_record_failure(struct run_job *job, int r, int status)
{
  if (job->fail_rank >= 0)
    return;
  job->fail_rank = r;
  job->fail_status = status;
}

static void run_rank_exited(struct run_job *job, int r, int wstatus)
{
  struct run_rank *rank = &job->ranks[r];
  rank->reaped = true;
  job->nlive--;
  /* print what it wrote before saying it failed */
  run_stream_read(job, r, &rank->out, RUN_DRAIN_MAX_READS);
  run_stream_read(job, r, &rank->err, RUN_DRAIN_MAX_READS);
  if (WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0)
    return;
  if (job->fail_rank >= 0)
    return; /* only the first failure is news; the rest follow from it */
  if (WIFEXITED(wstatus)) {
    run_record_failure(job, r, WEXITSTATUS(wstatus));
    fprintf(stderr, "weftrun: rank %d exited with status %d\n", r, WEXITSTATUS(wstatus));
  } else {
    char buf[16];
    int signo = WTERMSIG(wstatus);
    run_record_failure(job, r, 128 + signo);
    fprintf(stderr, "weftrun: rank %d killed by signal %s%s\n", r,
            run_signal_name(signo, buf, sizeof buf),
            WCOREDUMP(wstatus) ? " (core dumped)" : "");
  }
  run_teardown(job, SIGTERM);
}

static void run_reap(struct run_job *job)
{
  for (;;) {
    int wstatus;
    pid_t pid = waitpid(-1, &wstatus, WNOHANG);
    if (pid < 0 && errno == EINTR)
      continue;
    if (pid <= 0) {
      job->children_left = (pid == 0);
      return;
    }
    for (int r = 0; r < job->nlaunched; r++) {
      if (job->ranks[r].pid == pid && !job->ranks[r].reaped) {
        run_rank_exited(job, r, wstatus);
        break;
      }
    }
    /* anything else is a leftover descendant, reaped as subreaper */
  }
}

static void run_on_signal(int signo)
{
  int saved_errno = errno;
  unsigned char b = (unsigned char)signo;
  if (signo != SIGCHLD)
    sig_stop_launch = 1;
  ssize_t n = write(sig_pipe[1], &b, 1);
  (void)n;
  errno = saved_errno;
}

static void run_handle_signals(struct run_job *job)
{
  unsigned char sigs[64];
  ssize_t n;
  while ((n = read(sig_pipe[0], sigs, sizeof sigs)) > 0 || (n < 0 && errno == EINTR)) {
    for (ssize_t i = 0; i < n; i++) {
      if (sigs[i] == SIGCHLD)
        continue; /* reaping happens on every turn of the loop */
      if (job->signal_received == 0)
        job->signal_received = sigs[i];
      run_teardown(job, sigs[i]);
    }
  }
}

static bool run_streams_open(const struct run_job *job)
{
  for (int r = 0; r < job->nlaunched; r++)
    if (job->ranks[r].out.fd >= 0 || job->ranks[r].err.fd >= 0)
      return true;
  return false;
}

/* Polls the ranks' pipes and the signal pipe until every rank is reaped, its
 * output drained and its leftovers gone, or the teardown deadlines pass. */
static void run_supervise(struct run_job *job)
{
  struct pollfd *pfds = run_xmalloc((size_t)(1 + 2 * job->nranks) * sizeof *pfds);
  struct run_stream **streams = run_xmalloc((size_t)(2 * job->nranks) * sizeof *streams);
  int *stream_rank = run_xmalloc((size_t)(2 * job->nranks) * sizeof *stream_rank);
  for (;;) {
    run_reap(job);
    int64_t now = run_now_ms();
    if (job->nlive == 0 && !run_streams_open(job) && !job->children_left)
      break;
    if (job->final_deadline_ms && now >= job->final_deadline_ms)
      break;
    if (job->nlive == 0 && job->kill_deadline_ms == 0)
      run_teardown(job, SIGTERM); /* the ranks are done; so are their leftovers */
    if (job->kill_deadline_ms && now >= job->kill_deadline_ms && !job->final_deadline_ms) {
      run_signal_all(job, SIGKILL);
      job->final_deadline_ms = now + RUN_FINAL_GRACE_MS;
    }

    int npfds = 0;
    pfds[npfds++] = (struct pollfd){.fd = sig_pipe[0], .events = POLLIN};
    for (int r = 0; r < job->nlaunched; r++) {
      struct run_stream *s[2] = {&job->ranks[r].out, &job->ranks[r].err};
      for (int k = 0; k < 2; k++) {
        if (s[k]->fd < 0)
          continue;
        streams[npfds - 1] = s[k];
        stream_rank[npfds - 1] = r;
        pfds[npfds++] = (struct pollfd){.fd = s[k]->fd, .events = POLLIN};
      }
    }
    int64_t deadline = job->final_deadline_ms ? job->final_deadline_ms : job->kill_deadline_ms;
    int timeout_ms = -1;
    if (deadline)
      timeout_ms = deadline > now ? (int)(deadline - now) : 0;
    /* with nothing to read, leftovers are polled for by waitpid */
    if (npfds == 1 && job->children_left && (timeout_ms < 0 || timeout_ms > 50))
      timeout_ms = 50;
    int rc = poll(pfds, (nfds_t)npfds, timeout_ms);
    if (rc < 0 && errno != EINTR) {
      perror("weftrun: poll");
      exit(1);
    }
    if (rc <= 0)
      continue;
    if (pfds[0].revents)
      run_handle_signals(job);
    for (int i = 1; i < npfds; i++)
      if (pfds[i].revents || job->dest_closed[streams[i - 1]->dest_fd])
        run_stream_read(job, stream_rank[i - 1], streams[i - 1], 1);
  }
  /* give up on holders that outlived SIGKILL, keeping their partial lines */
  for (int r = 0; r < job->nlaunched; r++) {
    run_stream_close(job, r, &job->ranks[r].out);
    run_stream_close(job, r, &job->ranks[r].err);
  }
  free(stream_rank);
  free(streams);
  free(pfds);
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

static int64_t run_kill_timeout_ms(void)
{
  const char *s = getenv("WEFTRUN_KILL_TIMEOUT");
  if (!s || !*s)
    return 5000;
  char *end;
  double seconds = strtod(s, &end);
  if (*end || !isfinite(seconds) || seconds < 0 || seconds > 1e6) {
    fprintf(stderr, "weftrun: WEFTRUN_KILL_TIMEOUT must be a number of seconds, got '%s'\n", s);
    exit(RUN_EXIT_USAGE);
  }
  return (int64_t)(seconds * 1000);
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

static void run_signals_install(void)
{
  if (pipe2(sig_pipe, O_CLOEXEC | O_NONBLOCK) < 0) {
    perror("weftrun: pipe");
    exit(1);
  }
  struct sigaction sa = {.sa_handler = run_on_signal, .sa_flags = SA_RESTART | SA_NOCLDSTOP};
  sigemptyset(&sa.sa_mask);
  for (int i = 0; i < RUN_NFORWARDED; i++)
    sigaction(run_forwarded_signals[i], &sa, NULL);
  sigaction(SIGCHLD, &sa, NULL);
  struct sigaction ign = {.sa_handler = SIG_IGN};
  sigaction(SIGPIPE, &ign, NULL);
}

static void run_job_free(struct run_job *job)
{
  for (int r = 0; r < job->nranks && job->ranks; r++) {
    free(job->ranks[r].out.buf);
    free(job->ranks[r].err.buf);
  }
  free(job->ranks);
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
  struct run_job job = {.fail_rank = -1};
  int status = 1;
  run_parse_args(&job, argc, argv);
  job.kill_timeout_ms = run_kill_timeout_ms();

  int err = run_resolve_program(&job);
  if (err) {
    fprintf(stderr, "weftrun: cannot run %s: %s\n", job.argv[0], strerror(err));
    status = RUN_EXIT_EXEC;
    goto free_job;
  }
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
  run_signals_install();
  /* leftovers of ranks are reparented here, to be reaped and killed */
  prctl(PR_SET_CHILD_SUBREAPER, 1);

  weftUniqueId id;
  weftResult_t res = weftGetUniqueId(&id);
  if (res != weftSuccess) {
    const char *detail = weftGetLastError(NULL);
    fprintf(stderr, "weftrun: cannot start the rendezvous: %s%s%s\n", weftGetErrorString(res),
            detail[0] ? ": " : "", detail);
    status = 1;
    goto free_job;
  }
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
free_job:
  run_job_free(&job);
  return status;
}
