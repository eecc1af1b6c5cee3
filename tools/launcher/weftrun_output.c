/* weftrun's output: each rank's stdout and stderr read from its pipes and
 * written line by line, each line prefixed with "[rank] ", or with
 * --no-prefix written as read. A line is printed at its '\n' or '\r' (a
 * progress bar's redraw), or in part once it has waited RUN_PARTIAL_LINE_MS;
 * another stream's line on the same output then starts on a line of its own. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "weftrun_job.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* --- Output ------------------------------------------------------------- */

/* Writes all of buf to fd. When fd's reader has gone away (EPIPE), output for
 * fd is dropped and the ranks' pipes to it are closed on their next read, as
 * in a shell's pipeline. Any other failure (a full disk) is said once on
 * stderr and makes weftrun's exit status 1; the output for fd is dropped and
 * the ranks go on. While fd's reader is not reading, the job is served
 * (job->while_blocked); past the teardown's last deadline the rest is
 * dropped. A write waits in poll, never in write: at most PIPE_BUF bytes go
 * at a time, which a pipe that polls writable takes without blocking. */
static void run_write_all(struct run_job *job, int fd, const char *buf, size_t nbytes)
{
  while (nbytes > 0 && !job->dest_closed[fd] && !job->dest_errno[fd]) {
    struct pollfd p[2] = {{.fd = fd, .events = POLLOUT}, {.fd = job->wake_fd, .events = POLLIN}};
    const bool serve = !job->in_blocked && job->while_blocked != NULL;
    int rc = poll(p, serve && job->wake_fd >= 0 ? 2 : 1, serve ? 100 : 0);
    if (rc < 0 && errno == EINTR)
      continue;
    if (rc < 0 || p[0].revents != 0) {
      ssize_t n = write(fd, buf, nbytes < PIPE_BUF ? nbytes : PIPE_BUF);
      if (n < 0 && (errno == EINTR || errno == EAGAIN))
        continue;
      if (n < 0 && errno == EPIPE) {
        job->dest_closed[fd] = true;
      } else if (n < 0) {
        job->dest_errno[fd] = errno;
        if (fd == 1)
          run_note(job, "writing its standard output failed: %s; the ranks' output to it is "
                        "dropped from here on", strerror(job->dest_errno[fd]));
      } else {
        buf += n;
        nbytes -= (size_t)n;
      }
      continue;
    }
    if (!serve)
      return; /* a note written while the job is served: dropped where it cannot go now */
    job->in_blocked = true;
    bool over = job->while_blocked(job);
    job->in_blocked = false;
    if (over)
      job->dest_closed[fd] = true; /* what its reader never took is dropped */
  }
}

/* Where fd's unfinished line is kept: one place for both when they are one file. */
static int run_line_slot(const struct run_job *job, int fd)
{
  return job->same_output ? 1 : fd;
}

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

/* Appends part of s's current line: nbytes of data, then term ('\n', '\r',
 * or 0 when the line goes on). */
static void run_emit(struct run_job *job, int rank, struct run_stream *s, const char *data,
                     size_t nbytes, char term)
{
  struct run_stream **open = &job->open_line[run_line_slot(job, s->dest_fd)];
  if (*open != NULL && *open != s) {
    /* another rank's line is unfinished here: end it, its rest gets a prefix */
    run_out_append(job, "\n", 1);
    (*open)->line = RUN_LINE_START;
  }
  bool crlf = term == '\n' && nbytes == 0 && s->line == RUN_LINE_AFTER_CR;
  bool bare_cr = term == '\r' && nbytes == 0;
  if (s->line != RUN_LINE_OPEN && !crlf && !bare_cr) {
    char prefix[32];
    int n = snprintf(prefix, sizeof prefix, "[%*d] ", job->prefix_width, rank);
    run_out_append(job, prefix, (size_t)n);
  }
  run_out_append(job, data, nbytes);
  if (term)
    run_out_append(job, &term, 1);
  s->line = term == '\n' ? RUN_LINE_START : term == '\r' ? RUN_LINE_AFTER_CR : RUN_LINE_OPEN;
  *open = s->line == RUN_LINE_START ? NULL : s;
}

static void run_out_flush(struct run_job *job, int fd)
{
  run_write_all(job, fd, job->out, job->out_len);
  job->out_len = 0;
}

/* Written apart from job->out (run_write_all calls it while writing that). */
void run_note(struct run_job *job, const char *fmt, ...)
{
  char msg[1100];
  size_t len = 0;
  struct run_stream **open = &job->open_line[run_line_slot(job, 2)];
  if (*open != NULL) {
    /* a rank's line is unfinished here: end it, its rest gets a prefix */
    msg[len++] = '\n';
    (*open)->line = RUN_LINE_START;
    *open = NULL;
  }
  memcpy(msg + len, "weftrun: ", 9);
  len += 9;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(msg + len, sizeof msg - len - 1, fmt, ap);
  va_end(ap);
  if (n > 0)
    len += (size_t)n < sizeof msg - len - 1 ? (size_t)n : sizeof msg - len - 2;
  msg[len++] = '\n';
  run_write_all(job, 2, msg, len);
}

void run_stream_close(struct run_job *job, int rank, struct run_stream *s)
{
  if (s->len > 0 || s->line != RUN_LINE_START) {
    /* the last line, ended with a newline that it may not have had */
    run_emit(job, rank, s, s->buf, s->len, '\n');
    run_out_flush(job, s->dest_fd);
    s->len = 0;
    s->partial_since_ms = 0;
  }
  if (s->fd >= 0)
    close(s->fd);
  s->fd = -1;
}

/* Reads up to max_reads times from s, emitting every complete line; stops
 * early when the pipe is empty. Closes s at EOF, flushing a partial line. */
void run_stream_read(struct run_job *job, int rank, struct run_stream *s, int max_reads)
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
        run_emit(job, rank, s, s->buf, s->len, '\n');
        run_out_flush(job, s->dest_fd);
        s->len = 0;
        s->partial_since_ms = 0;
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
    if (!job->prefix) {
      run_write_all(job, s->dest_fd, s->buf, (size_t)n); /* as it comes */
      continue;
    }
    size_t start = 0;
    size_t end = s->len + (size_t)n;
    for (size_t j = s->len; j < end; j++) {
      if (s->buf[j] == '\n' || s->buf[j] == '\r') {
        run_emit(job, rank, s, s->buf + start, j - start, s->buf[j]);
        start = j + 1;
      }
    }
    if (start > 0)
      s->partial_since_ms = 0;
    memmove(s->buf, s->buf + start, end - start);
    s->len = end - start;
    run_out_flush(job, s->dest_fd);
  }
}

static int64_t run_partial_flush(struct run_job *job, int rank, struct run_stream *s,
                                 int64_t now_ms)
{
  if (s->len == 0)
    return 0;
  if (s->partial_since_ms == 0)
    s->partial_since_ms = now_ms;
  int64_t due_ms = s->partial_since_ms + RUN_PARTIAL_LINE_MS;
  if (now_ms < due_ms)
    return due_ms;
  run_emit(job, rank, s, s->buf, s->len, 0);
  run_out_flush(job, s->dest_fd);
  s->len = 0;
  s->partial_since_ms = 0;
  return 0;
}

int64_t run_partials_flush(struct run_job *job, int64_t now_ms)
{
  int64_t next_ms = 0;
  for (int r = 0; r < job->nlaunched; r++) {
    struct run_stream *s[2] = {&job->ranks[r].out, &job->ranks[r].err};
    for (int k = 0; k < 2; k++) {
      int64_t due_ms = run_partial_flush(job, r, s[k], now_ms);
      if (due_ms && (next_ms == 0 || due_ms < next_ms))
        next_ms = due_ms;
    }
  }
  return next_ms;
}
