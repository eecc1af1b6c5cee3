/* weftrun's ranks: launching them, reaping them, forwarding signals to them
 * and tearing the job down when one fails. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "weftrun_job.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Every signal weftrun catches and forwards. The first four end the job
 * (run_signal_ends_job); the next three are passed on to the ranks, which
 * go on; SIGTSTP stops the ranks and weftrun, SIGCONT resumes the ranks. */
static const int run_forwarded_signals[] = {SIGINT,  SIGTERM, SIGHUP,  SIGQUIT, SIGUSR1,
                                            SIGUSR2, SIGALRM, SIGTSTP, SIGCONT};
#define RUN_NFORWARDED ((int)(sizeof run_forwarded_signals / sizeof run_forwarded_signals[0]))

enum { RUN_LEFTOVER_SCAN_MS = 50 }; /* during a teardown, look for new leftovers this often */

static int sig_pipe[2] = {-1, -1};
/* Forwarded signals that weftrun found ignored when it started (nohup's
 * SIGHUP, a shell's SIGINT and SIGQUIT for a command run with '&'): they stay
 * ignored, for weftrun and for the ranks, as they would for any program. */
static bool sig_ignored[RUN_NFORWARDED];
volatile sig_atomic_t sig_stop_launch;

/* --- Small helpers ------------------------------------------------------ */

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

static bool run_signal_ends_job(int signo)
{
  return signo == SIGINT || signo == SIGTERM || signo == SIGHUP || signo == SIGQUIT;
}

/* --- Signalling the job ------------------------------------------------- */

/* Signals the process group of every rank not yet reaped: the rank and what
 * it started there. An unreaped rank's pid, and so its group's id, cannot be
 * reused; a reaped rank's can, so its group is never signalled: what it left
 * behind is reached as a leftover. */
static void run_signal_ranks(const struct run_job *job, int signo)
{
  for (int r = 0; r < job->nlaunched; r++)
    if (!job->ranks[r].reaped)
      kill(-job->ranks[r].pid, signo);
}

static bool run_is_live_rank(const struct run_job *job, pid_t pid)
{
  for (int r = 0; r < job->nlaunched; r++)
    if (job->ranks[r].pid == pid && !job->ranks[r].reaped)
      return true;
  return false;
}

/* Parent of /proc/<name>, or -1. */
static pid_t run_proc_parent(const char *name)
{
  char path[64], buf[512];
  snprintf(path, sizeof path, "/proc/%s/stat", name);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return -1;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0)
    return -1;
  buf[n] = '\0';
  /* "pid (comm) state ppid ...": comm may hold anything, ')' included */
  char *p = strrchr(buf, ')');
  char state;
  int ppid;
  if (p == NULL || sscanf(p + 1, " %c %d", &state, &ppid) != 2)
    return -1;
  return (pid_t)ppid;
}

static bool run_leftover_was_signalled(const struct run_job *job, pid_t pid)
{
  for (int i = 0; i < job->n_signalled; i++)
    if (job->signalled[i] == pid)
      return true;
  return false;
}

/* Signals the leftovers: processes that ranks left behind, which the kernel
 * gave to weftrun, their child subreaper, when their parents died. A child
 * that weftrun has not reaped keeps its pid, so it is signalled by pid. With
 * once, each leftover gets signo at most once (a SIGTERM handler runs once). */
static void run_signal_leftovers(struct run_job *job, int signo, bool once)
{
  DIR *proc = opendir("/proc");
  if (proc == NULL)
    return;
  pid_t self = getpid();
  struct dirent *e;
  while ((e = readdir(proc)) != NULL) {
    if (!isdigit((unsigned char)e->d_name[0]) || run_proc_parent(e->d_name) != self)
      continue;
    pid_t pid = (pid_t)atoi(e->d_name);
    if (run_is_live_rank(job, pid))
      continue; /* signalled with its group */
    if (once) {
      if (run_leftover_was_signalled(job, pid))
        continue;
      if (job->n_signalled == job->cap_signalled) {
        int cap = job->cap_signalled ? 2 * job->cap_signalled : 16;
        pid_t *p = realloc(job->signalled, (size_t)cap * sizeof *p);
        if (p == NULL)
          run_die_oom();
        job->signalled = p;
        job->cap_signalled = cap;
      }
      job->signalled[job->n_signalled++] = pid;
    }
    kill(pid, signo);
  }
  closedir(proc);
  job->leftovers_scanned_ms = run_now_ms();
}

/* A reaped leftover's pid may come back as another leftover. */
static void run_leftover_forget(struct run_job *job, pid_t pid)
{
  for (int i = 0; i < job->n_signalled; i++) {
    if (job->signalled[i] == pid) {
      job->signalled[i] = job->signalled[--job->n_signalled];
      return;
    }
  }
}

void run_teardown(struct run_job *job, int signo)
{
  run_signal_ranks(job, signo);
  run_signal_ranks(job, SIGCONT); /* a rank stopped on the terminal takes it too */
  run_signal_leftovers(job, signo, true);
  if (job->kill_deadline_ms == 0)
    job->kill_deadline_ms = run_now_ms() + job->kill_timeout_ms;
}

/* SIGKILL to everything, and a last short wait for the pipes' EOFs. */
static void run_kill_all(struct run_job *job)
{
  run_signal_ranks(job, SIGKILL);
  run_signal_leftovers(job, SIGKILL, false);
  if (job->kill_deadline_ms == 0)
    job->kill_deadline_ms = run_now_ms();
  if (job->final_deadline_ms == 0)
    job->final_deadline_ms = run_now_ms() + RUN_FINAL_GRACE_MS;
}

/* --- Launching ---------------------------------------------------------- */

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
                      int err_fd, int exec_fd, char **envp, const cpu_set_t *cpus)
{
  struct sigaction dfl = {.sa_handler = SIG_DFL};
  for (int i = 0; i < RUN_NFORWARDED; i++)
    if (!sig_ignored[i])
      sigaction(run_forwarded_signals[i], &dfl, NULL);
  sigaction(SIGCHLD, &dfl, NULL);
  sigaction(SIGPIPE, &dfl, NULL);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);

  setrlimit(RLIMIT_NOFILE, &job->nofile);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent)
    _exit(RUN_EXIT_EXEC); /* weftrun died before the death signal was armed */
  setpgid(0, 0);
  if (cpus != NULL)
    sched_setaffinity(0, sizeof *cpus, cpus); /* best effort: run unpinned otherwise */

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

/* The CPUs rank r is pinned to (--bind-to); false when it is not pinned. */
static bool run_bind_cpus(const struct run_job *job, int r, cpu_set_t *set)
{
  if (job->bind == RUN_BIND_NONE || job->ncpus == 0)
    return false;
  int share = job->bind == RUN_BIND_SHARE ? job->ncpus / job->nranks : 1;
  if (share < 1)
    share = 1;
  CPU_ZERO(set);
  for (int i = 0; i < share; i++)
    CPU_SET(job->cpus[(r * share + i) % job->ncpus], set);
  return true;
}

static void run_set_nonblock(int fd)
{
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

/* Starts rank r. Returns 0, or with a message printed, weftrun's exit status:
 * 127 when PROGRAM could not be executed, 1 when the rank could not start. */
int run_launch(struct run_job *job, int r, int devnull_fd)
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
  cpu_set_t cpus;
  bool pinned = run_bind_cpus(job, r, &cpus);
  pid_t pid = fork();
  if (pid == 0)
    run_child(job, parent, stdin_fd, out_pipe[1], err_pipe[1], exec_pipe[1], envp,
              pinned ? &cpus : NULL);
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
  /* a rank that ends before it joins (even with status 0: it never called
   * weft) fails the others' rendezvous at once, naming it, instead of
   * leaving them waiting until their timeout */
  if (weftUniqueIdWatchRank(&job->unique_id, r, (int)pid) != weftSuccess)
    run_note(job, "rank %d: %s", r, weftGetLastError(NULL));
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
    run_note(job, "cannot run %s: %s", job->argv[0], strerror(child_errno));
    return child_errno == ENOENT ? RUN_EXIT_EXEC : RUN_EXIT_NOEXEC;
  }
  return 0;

close_err:
  close(err_pipe[0]);
  close(err_pipe[1]);
close_out:
  close(out_pipe[0]);
  close(out_pipe[1]);
fail:
  run_note(job, "cannot launch rank %d: %s", r, strerror(errno));
  return 1;
}

/* --- Supervising -------------------------------------------------------- */

void run_record_failure(struct run_job *job, int r, int status)
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
  if (job->signal_received)
    return; /* ended by the signal weftrun forwarded, or by the SIGKILL after it */
  if (WIFEXITED(wstatus)) {
    run_record_failure(job, r, WEXITSTATUS(wstatus));
    run_note(job, "rank %d exited with status %d", r, WEXITSTATUS(wstatus));
  } else {
    char buf[16];
    int signo = WTERMSIG(wstatus);
    run_record_failure(job, r, 128 + signo);
    run_note(job, "rank %d killed by signal %s%s", r, run_signal_name(signo, buf, sizeof buf),
             WCOREDUMP(wstatus) ? " (core dumped)" : "");
  }
  /* the others first get the grace to end by themselves: a rank in a
   * collective with this one fails within milliseconds, says why and writes
   * its trace (WEFT_TRACE_DIR), which a SIGTERM now would cut short */
  if (job->fail_grace_ms == 0)
    run_teardown(job, SIGTERM);
  else if (job->term_due_ms == 0)
    job->term_due_ms = run_now_ms() + job->fail_grace_ms;
}

static void run_reap(struct run_job *job)
{
  for (;;) {
    int wstatus;
    pid_t pid = waitpid(-1, &wstatus, WNOHANG | WUNTRACED);
    if (pid < 0 && errno == EINTR)
      continue;
    if (pid <= 0) {
      job->children_left = (pid == 0);
      return;
    }
    int r = 0;
    while (r < job->nlaunched && (job->ranks[r].pid != pid || job->ranks[r].reaped))
      r++;
    if (WIFSTOPPED(wstatus)) {
      /* a rank that reads (or, with tostop, writes) the terminal stops: it
       * is not in the terminal's foreground group. The job would wait for
       * it without a word; said once per stop */
      int signo = WSTOPSIG(wstatus);
      if (r < job->nlaunched && (signo == SIGTTIN || signo == SIGTTOU))
        run_note(job,
                 "rank %d is stopped (%s): it %s the terminal, which ranks cannot (each "
                 "runs in a process group of its own); rank 0 reads weftrun's stdin where "
                 "that is not a terminal",
                 r, signo == SIGTTIN ? "SIGTTIN" : "SIGTTOU",
                 signo == SIGTTIN ? "read" : "wrote to");
      continue;
    }
    if (r < job->nlaunched)
      run_rank_exited(job, r, wstatus);
    else
      run_leftover_forget(job, pid); /* a leftover, reaped as subreaper */
  }
}

static void run_on_signal(int signo)
{
  int saved_errno = errno;
  unsigned char b = (unsigned char)signo;
  if (run_signal_ends_job(signo))
    sig_stop_launch = 1;
  ssize_t n = write(sig_pipe[1], &b, 1);
  (void)n;
  errno = saved_errno;
}

static void run_handle_signals(struct run_job *job);

/* A write to weftrun's output waits (run_write_all): signals and the
 * teardown's deadlines are served meanwhile; true once the job is over. */
static bool run_while_blocked(struct run_job *job)
{
  run_handle_signals(job);
  int64_t now = run_now_ms();
  if (job->term_due_ms && now >= job->term_due_ms && job->kill_deadline_ms == 0)
    run_teardown(job, SIGTERM);
  if (job->kill_deadline_ms && now >= job->kill_deadline_ms && !job->final_deadline_ms)
    run_kill_all(job);
  return job->final_deadline_ms && now >= job->final_deadline_ms;
}

void run_signals_install(struct run_job *job)
{
  if (pipe2(sig_pipe, O_CLOEXEC | O_NONBLOCK) < 0) {
    perror("weftrun: pipe");
    exit(1);
  }
  struct sigaction sa = {.sa_handler = run_on_signal, .sa_flags = SA_RESTART};
  sigemptyset(&sa.sa_mask);
  for (int i = 0; i < RUN_NFORWARDED; i++) {
    struct sigaction old;
    sig_ignored[i] = sigaction(run_forwarded_signals[i], NULL, &old) == 0 &&
                     old.sa_handler == SIG_IGN;
    if (!sig_ignored[i])
      sigaction(run_forwarded_signals[i], &sa, NULL);
  }
  /* stops too: a rank stopped on the terminal is said (run_reap) */
  sigaction(SIGCHLD, &sa, NULL);
  job->wake_fd = sig_pipe[0];
  job->while_blocked = run_while_blocked;
  struct sigaction ign = {.sa_handler = SIG_IGN};
  sigaction(SIGPIPE, &ign, NULL);
}

/* Stops weftrun as SIGTSTP's default action would, returning once it is
 * continued, or at once where the kernel drops the stop (an orphaned process
 * group, which nobody would continue). */
static void run_stop_self(void)
{
  struct sigaction dfl = {.sa_handler = SIG_DFL}, caught;
  sigaction(SIGTSTP, &dfl, &caught);
  raise(SIGTSTP);
  sigaction(SIGTSTP, &caught, NULL);
}

static void run_handle_signal(struct run_job *job, int signo)
{
  char buf[16];
  const char *name = run_signal_name(signo, buf, sizeof buf);
  if (signo == SIGCHLD)
    return; /* reaping happens on every turn of the loop */
  if (signo == SIGTSTP) {
    /* the ranks, in process groups of their own, missed the terminal's
     * SIGTSTP; SIGSTOP, which they cannot catch, stops them with weftrun */
    run_signal_ranks(job, SIGSTOP);
    run_stop_self();
    run_signal_ranks(job, SIGCONT);
    return;
  }
  if (!run_signal_ends_job(signo)) {
    run_signal_ranks(job, signo); /* SIGUSR1, SIGUSR2, SIGALRM, SIGCONT: the job goes on */
    return;
  }
  if (job->signal_received) {
    run_note(job, "interrupted again (%s): killing the ranks", name);
    run_kill_all(job);
    return;
  }
  job->signal_received = signo;
  run_note(job, "interrupted (%s): forwarded to the ranks, SIGKILL in %.3g s or on a second signal",
           name, (double)job->kill_timeout_ms / 1000);
  run_teardown(job, signo);
}

static void run_handle_signals(struct run_job *job)
{
  unsigned char sigs[64];
  ssize_t n;
  while ((n = read(sig_pipe[0], sigs, sizeof sigs)) > 0 || (n < 0 && errno == EINTR))
    for (ssize_t i = 0; i < n; i++)
      run_handle_signal(job, sigs[i]);
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
void run_supervise(struct run_job *job)
{
  struct pollfd *pfds = run_xmalloc((size_t)(1 + 2 * job->nranks) * sizeof *pfds);
  struct run_stream **streams = run_xmalloc((size_t)(2 * job->nranks) * sizeof *streams);
  int *stream_rank = run_xmalloc((size_t)(2 * job->nranks) * sizeof *stream_rank);
  for (;;) {
    /* a signal that stopped the launch may have come when no rank was left
     * to end: it is the job's outcome still */
    run_handle_signals(job);
    run_reap(job);
    int64_t now = run_now_ms();
    if (job->nlive == 0 && !run_streams_open(job) && !job->children_left)
      break;
    if (job->final_deadline_ms && now >= job->final_deadline_ms)
      break;
    if ((job->nlive == 0 || (job->term_due_ms && now >= job->term_due_ms)) &&
        job->kill_deadline_ms == 0)
      run_teardown(job, SIGTERM); /* the ranks are done (or their grace is); so are leftovers */
    if (job->kill_deadline_ms && now >= job->kill_deadline_ms && !job->final_deadline_ms)
      run_kill_all(job);
    /* leftovers whose parents died since the last look */
    bool tearing_down = job->kill_deadline_ms != 0;
    if (tearing_down && job->children_left &&
        now >= job->leftovers_scanned_ms + RUN_LEFTOVER_SCAN_MS) {
      if (job->final_deadline_ms)
        run_signal_leftovers(job, SIGKILL, false);
      else
        run_signal_leftovers(job, SIGTERM, true);
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
    if (deadline == 0)
      deadline = job->term_due_ms;
    int64_t partial_due_ms = run_partials_flush(job, now);
    if (partial_due_ms && (deadline == 0 || partial_due_ms < deadline))
      deadline = partial_due_ms;
    int timeout_ms = -1;
    if (deadline)
      timeout_ms = deadline > now ? (int)(deadline - now) : 0;
    /* leftovers are polled for by waitpid, and while tearing down, in /proc */
    if ((npfds == 1 || tearing_down) && job->children_left &&
        (timeout_ms < 0 || timeout_ms > RUN_LEFTOVER_SCAN_MS))
      timeout_ms = RUN_LEFTOVER_SCAN_MS;
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
