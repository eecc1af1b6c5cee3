/* Private to weftrun: the job it supervises and what its files share.
 * weftrun.c parses the arguments and sets up; weftrun_supervise.c launches,
 * reaps and signals the ranks and tears the job down; weftrun_output.c reads
 * the ranks' pipes and prefixes their lines; weftrun_env.c (a leaf) holds the
 * allocation helpers and builds the ranks' environment. Calls run one way:
 * weftrun.c -> weftrun_supervise.c -> weftrun_output.c -> weftrun_env.c. */
#ifndef WEFT_WEFTRUN_JOB_H
#define WEFT_WEFTRUN_JOB_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/resource.h>
#include <sys/types.h>

#include "weft.h"


enum {
  RUN_MAX_RANKS = 4096,
  RUN_LINE_MAX_NBYTES = 65536,  /* longer lines are broken here */
  RUN_DRAIN_MAX_READS = 64,     /* reads per stream when its rank exits */
  RUN_FINAL_GRACE_MS = 2000,    /* after SIGKILL, wait this long for EOFs */
  RUN_EXIT_USAGE = 2,
  RUN_EXIT_EXEC = 127,          /* PROGRAM not found, as a shell's */
  RUN_EXIT_NOEXEC = 126,        /* found but not runnable (no permission, a directory) */
  RUN_OWN_VARS = 11,            /* variables weftrun sets for every rank */
  RUN_PARTIAL_LINE_MS = 200,    /* a line without its end yet is printed after this long */
};

/* Where a stream's current line stands in weftrun's output. */
enum run_line {
  RUN_LINE_START,    /* nothing of it printed: it starts with the prefix */
  RUN_LINE_OPEN,     /* prefix and part of it printed: the rest follows as is */
  RUN_LINE_AFTER_CR, /* ended by '\r': what follows overwrites it, with a prefix */
};

/* --bind-to */
enum run_bind {
  RUN_BIND_AUTO = -1, /* share when the ranks fit and use no socket proxies, else none */
  RUN_BIND_NONE = 0,
  RUN_BIND_CORE = 1,  /* rank r on the r-th CPU weftrun may use */
  RUN_BIND_SHARE = 2, /* rank r on the r-th of nranks equal contiguous slices of them */
};

struct run_stream {
  int fd;        /* non-blocking read end of the rank's pipe; -1 after EOF */
  int dest_fd;   /* weftrun's 1 or 2 */
  char *buf;     /* the partial line read so far */
  size_t len;
  size_t cap;
  enum run_line line;
  int64_t partial_since_ms; /* when buf's first byte was seen; 0 when empty */
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
  enum run_bind bind;
  int ncpus;                 /* CPUs weftrun may run on, listed in cpus */
  int *cpus;
  int prefix_width;          /* digits of nranks-1 */
  char **argv;               /* PROGRAM ARGS..., NULL-terminated */
  char *exec_path;           /* PROGRAM resolved on PATH */
  char **sh_argv;            /* "sh exec_path ARGS..." for scripts without #! */
  char **x_vars;             /* -x NAME=VALUE, later ones win */
  int n_x_vars;
  weftUniqueId unique_id;     /* the rendezvous this process serves */
  char unique_id_hex[2 * WEFT_UNIQUE_ID_BYTES + 1];
  int master_port;
  int64_t kill_timeout_ms;
  int64_t fail_grace_ms;     /* WEFTRUN_FAIL_GRACE: the others' time to end by themselves */
  struct rlimit nofile;      /* RLIMIT_NOFILE as weftrun found it, which the ranks get */
  struct run_rank *ranks;
  int nlaunched;
  int nlive;                 /* launched and not reaped */
  bool children_left;        /* waitpid saw unreaped descendants */
  pid_t *signalled;          /* leftovers sent the teardown signal, until reaped */
  int n_signalled;
  int cap_signalled;
  int64_t leftovers_scanned_ms; /* when /proc was last searched for leftovers */
  int fail_rank;             /* first rank that failed, or -1 */
  int fail_status;           /* weftrun's exit status for that failure */
  int signal_received;       /* first signal that ends the job, or 0 */
  int64_t term_due_ms;       /* after a failure: SIGTERM the others then; 0 = none due */
  int64_t kill_deadline_ms;  /* SIGKILL everything then; 0 = not tearing down */
  int64_t final_deadline_ms; /* stop waiting then; 0 = not yet */
  char *out;                 /* prefixed lines waiting for one write */
  size_t out_len;
  size_t out_cap;
  bool dest_closed[3];       /* weftrun's stdout/stderr reader went away */
  int dest_errno[3];         /* writing weftrun's stdout/stderr failed otherwise: dropped */
  bool same_output;          /* weftrun's 1 and 2 are one file (a terminal, 2>&1) */
  struct run_stream *open_line[3]; /* stream whose line is unfinished on weftrun's 1 or 2
                                      (both in [1] when same_output) */
  /* While a write to weftrun's 1 or 2 waits for its reader: the signals
   * (wake_fd, readable when one came) and the teardown's deadlines are
   * served by while_blocked, so that a reader that stalls cannot keep the
   * job from being interrupted or its ranks from being killed; it returns
   * true once the job is over (its last deadline passed): the write is
   * dropped. */
  int wake_fd;
  bool (*while_blocked)(struct run_job *job);
  bool in_blocked;           /* while_blocked runs: its own notes do not wait */
};

/* Set by a forwarded signal: launch no more ranks. */
extern volatile sig_atomic_t sig_stop_launch;

/* weftrun_env.c: allocation that exits when out of memory */
void run_die_oom(void);
void *run_xmalloc(size_t nbytes);
char *run_printf(const char *fmt, ...);
/* Rank's environment; own[] receives strings to free. */
char **run_env_build(const struct run_job *job, int rank, char *own[RUN_OWN_VARS]);

/* weftrun_output.c: a rank's stream, read into prefixed lines */
/* weftrun's own message on its stderr ("weftrun: " and a newline added),
 * after ending any rank's unfinished line there */
void run_note(struct run_job *job, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void run_stream_close(struct run_job *job, int rank, struct run_stream *s);
void run_stream_read(struct run_job *job, int rank, struct run_stream *s, int max_reads);
/* Prints partial lines held RUN_PARTIAL_LINE_MS; returns when the next one is
 * due, or 0. */
int64_t run_partials_flush(struct run_job *job, int64_t now_ms);

/* weftrun_supervise.c: the ranks' lives */
void run_signals_install(struct run_job *job);
int run_launch(struct run_job *job, int r, int devnull_fd);
void run_record_failure(struct run_job *job, int r, int status);
void run_teardown(struct run_job *job, int signo);
void run_supervise(struct run_job *job);

#endif