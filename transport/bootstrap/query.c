/* Questions between ranks that the asked rank answers on a thread of its own
 * (its "query" thread, one per bootstrap of more than one rank), so that an
 * answer comes while the rank's own threads are stuck in a wait or busy in
 * the program: the layer above asks every peer where it is when a
 * collective stalls (collectives/core/hang.c). Each question is a connection
 * of its own to the asked rank's query listener; the asker proves the job's
 * secret, the answer is the bytes the owner's answer function writes. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../base/status.h"
#include "wire.h"

#define QUERY_MAGIC 0x77667471u /* "wftq" */
#define QUERY_BYE_MAGIC 0x77667462u /* "wftb": the sender asks no more, and wants no answer */
#define ASKED_NO_MORE UINT64_MAX /* asked_ns of a rank that said bye */
#define QUERY_IO_NS 200000000ull /* a question or an answer must move within this */
/* How long the query thread waits before it accepts again after accept
 * failed of this process's own (out of descriptors): the question stays in
 * the listener's backlog meanwhile, which keeps it readable, so accepting
 * at once would spin. */
#define QUERY_BACKOFF_MS 100

struct query_question {
  uint32_t magic;
  int32_t from;
  uint8_t secret[BOOTSTRAP_SECRET_BYTES];
};

/* What this rank sends a peer's query thread: magic says what it wants. */
static struct query_question query_question_of(const struct bootstrap *bs, uint32_t magic) {
  struct query_question q = {.magic = magic, .from = bs->rank};
  memcpy(q.secret, bs->secret, sizeof q.secret);
  return q;
}

struct query_answer_header {
  uint32_t magic;
  uint32_t nbytes;
};

/* Answers one connection: the question, then the owner's answer. */
static void query_answer_one(struct bootstrap *bs, int fd) {
  struct query_question q;
  if (sock_recv_all(fd, &q, sizeof q, clock_ns() + QUERY_IO_NS) != weftSuccess ||
      (q.magic != QUERY_MAGIC && q.magic != QUERY_BYE_MAGIC) ||
      !secret_equal(q.secret, bs->secret)) {
    sock_close_reset(fd);
    return;
  }
  const int bye = q.magic == QUERY_BYE_MAGIC;
  if (q.from >= 0 && q.from < bs->nranks && bs->asked_ns != NULL)
    __atomic_store_n(&bs->asked_ns[q.from], bye ? ASKED_NO_MORE : clock_ns(), __ATOMIC_RELEASE);
  if (bye) {
    close(fd);
    return;
  }
  uint8_t reply[QUERY_ANSWER_MAX_NBYTES];
  size_t n = 0;
  pthread_mutex_lock(&bs->answer_mutex);
  if (bs->answer_fn != NULL) n = bs->answer_fn(bs->answer_arg, reply, sizeof reply);
  pthread_mutex_unlock(&bs->answer_mutex);
  struct query_answer_header h = {.magic = QUERY_MAGIC, .nbytes = (uint32_t)n};
  uint64_t deadline = clock_ns() + QUERY_IO_NS;
  if (sock_send_all(fd, &h, sizeof h, deadline) == weftSuccess && n > 0)
    sock_send_all(fd, reply, n, deadline);
  close(fd); /* the asker, who reads last, resets its end */
}

static void *query_thread_main(void *p) {
  struct bootstrap *bs = p;
  pthread_setname_np(pthread_self(), "weft-query");
  int warned = 0; /* that accept fails (once per bootstrap) */
  for (;;) {
    struct pollfd fds[2] = {{.fd = bs->query_fd, .events = POLLIN},
                            {.fd = bs->query_stop[0], .events = POLLIN}};
    int rc = poll(fds, 2, -1);
    if (rc < 0 && errno != EINTR) break;
    if (rc <= 0) continue;
    if (fds[1].revents != 0) break;
    if (fds[0].revents & POLLIN) {
      int fd = accept4(bs->query_fd, NULL, NULL, SOCK_CLOEXEC);
      if (fd >= 0) {
        query_answer_one(bs, fd);
      } else if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED) {
        if (!warned)
          WEFT_WARN(LOG_BOOTSTRAP, "rank %d cannot answer the other ranks' questions: accept: %m",
                    bs->rank);
        warned = 1;
        /* only the stop pipe, for a while: the question waits in the backlog */
        poll(&fds[1], 1, QUERY_BACKOFF_MS);
      }
    }
  }
  return NULL;
}

void bootstrap_query_init(struct bootstrap *bs) {
  bs->query_fd = -1;
  bs->query_stop[0] = bs->query_stop[1] = -1;
  pthread_mutex_init(&bs->answer_mutex, NULL);
}

weftResult_t bootstrap_query_start(struct bootstrap *bs) {
  if (bs->nranks < 2) return weftSuccess; /* no one to ask */
  bs->asked_ns = calloc((size_t)bs->nranks, sizeof *bs->asked_ns);
  if (bs->asked_ns == NULL) return weft_error_set(weftSystemError, "out of memory");
  if (pipe2(bs->query_stop, O_CLOEXEC) != 0)
    return weft_error_errno(weftSystemError, "pipe for the bootstrap's query thread");
  int err = pthread_create(&bs->query_tid, NULL, query_thread_main, bs);
  if (err != 0) {
    errno = err;
    return weft_error_errno(weftSystemError, "starting the bootstrap's query thread");
  }
  bs->query_running = 1;
  return weftSuccess;
}

void bootstrap_query_stop(struct bootstrap *bs) {
  if (bs->query_running) {
    ssize_t n;
    do n = write(bs->query_stop[1], "x", 1);
    while (n < 0 && errno == EINTR);
    pthread_join(bs->query_tid, NULL);
    bs->query_running = 0;
  }
  for (int i = 0; i < 2; i++)
    if (bs->query_stop[i] >= 0) close(bs->query_stop[i]);
  if (bs->query_fd >= 0) close(bs->query_fd);
  bs->query_fd = bs->query_stop[0] = bs->query_stop[1] = -1;
  pthread_mutex_destroy(&bs->answer_mutex);
  free(bs->query_addrs);
  free(bs->asked_ns);
  bs->query_addrs = NULL;
  bs->asked_ns = NULL;
}

void bootstrap_query_linger(struct bootstrap *bs, uint64_t recent_ns, uint64_t max_ns) {
  if (bs == NULL || !bs->query_running) return;
  const uint64_t start = clock_ns();
  for (;;) {
    const uint64_t now = clock_ns();
    int waiting = 0;
    for (int r = 0; r < bs->nranks && !waiting; r++) {
      if (r == bs->rank) continue;
      if (bs->pids != NULL && bs->pids[r] > 0 && pid_gone(bs->pids[r], 1)) continue;
      const uint64_t asked = __atomic_load_n(&bs->asked_ns[r], __ATOMIC_ACQUIRE);
      if (asked == ASKED_NO_MORE) continue; /* it closes too: it will never ask */
      const uint64_t failed = __atomic_load_n(&bs->failed_ns, __ATOMIC_ACQUIRE);
      /* asked since this rank told it of its failure (it learns of it then,
       * and asks), or at least lately */
      waiting = asked == 0 || (failed != 0 ? asked < failed : asked + recent_ns < now);
    }
    if (!waiting || now - start >= max_ns) return;
    struct timespec ts = {0, 5000000};
    nanosleep(&ts, NULL);
  }
}

void bootstrap_query_bye(struct bootstrap *bs) {
  if (bs == NULL || bs->query_addrs == NULL) return;
  const uint64_t deadline = clock_ns() + QUERY_IO_NS; /* for all of them: best effort */
  const struct query_question q = query_question_of(bs, QUERY_BYE_MAGIC);
  /* the caller's error stays the one to report: a peer that is gone here
   * would overwrite its text */
  char *error = strdup(weft_error_text());
  for (int r = 0; r < bs->nranks; r++) {
    if (r == bs->rank) continue;
    if (bs->pids != NULL && bs->pids[r] > 0 && pid_gone(bs->pids[r], 1)) continue;
    int fd;
    if (sock_connect_peer(&bs->query_addrs[r], deadline, NULL, &fd) != weftSuccess) continue;
    sock_send_all(fd, &q, sizeof q, deadline);
    close(fd); /* not reset: the question is to arrive */
  }
  if (error != NULL) weft_error_set(weftSuccess, "%s", error);
  free(error);
}

void bootstrap_answer_set(struct bootstrap *bs, bootstrap_answer_fn fn, void *arg) {
  pthread_mutex_lock(&bs->answer_mutex);
  bs->answer_fn = fn;
  bs->answer_arg = arg;
  pthread_mutex_unlock(&bs->answer_mutex);
}

/* Reads rank r's answer on fd (connected, the question sent) into reply. */
static enum bootstrap_ask_outcome ask_read(int fd, void *reply, size_t nbytes, uint64_t deadline,
                                           size_t *got_out) {
  struct query_answer_header h;
  if (sock_recv_all(fd, &h, sizeof h, deadline) != weftSuccess || h.magic != QUERY_MAGIC ||
      h.nbytes > QUERY_ANSWER_MAX_NBYTES)
    return BOOTSTRAP_ASK_SILENT;
  uint8_t buf[QUERY_ANSWER_MAX_NBYTES];
  if (h.nbytes > 0 && sock_recv_all(fd, buf, h.nbytes, deadline) != weftSuccess)
    return BOOTSTRAP_ASK_SILENT;
  size_t n = h.nbytes < nbytes ? h.nbytes : nbytes;
  memcpy(reply, buf, n);
  *got_out = n;
  return BOOTSTRAP_ASK_ANSWERED;
}

/* The question bootstrap_ask_all sends over each connection as soon as it
 * is made, and the time it has. */
struct ask_send_ctx {
  struct query_question q;
  uint64_t deadline;
};

static void ask_send(void *arg, int r, int *fd) {
  (void)r;
  const struct ask_send_ctx *x = arg;
  if (sock_send_all(*fd, &x->q, sizeof x->q, x->deadline) != weftSuccess) {
    sock_close_reset(*fd);
    *fd = -1;
  }
}

void bootstrap_ask_all(struct bootstrap *bs, uint64_t timeout_ns, void *replies, size_t nbytes,
                       size_t *got, enum bootstrap_ask_outcome *outcome, char *why,
                       size_t why_nbytes) {
  const int n = bs->nranks;
  const uint64_t deadline = clock_ns() + timeout_ns;
  int *fds = malloc(sizeof *fds * (size_t)n);
  const struct query_question q = query_question_of(bs, QUERY_MAGIC);
  if (why_nbytes > 0) why[0] = '\0';
  if (fds == NULL && why_nbytes > 0) snprintf(why, why_nbytes, "out of memory");
  /* the questions first, to every rank, then the answers in rank order: the
   * askers' waits overlap, so the whole takes about the slowest answer; the
   * connections are made at once too, so that a rank whose host does not
   * answer (gone from the network) leaves the others their time */
  const union weft_sockaddr **addrs = malloc(sizeof *addrs * (size_t)n);
  int *errs = malloc(sizeof *errs * (size_t)n);
  if ((addrs == NULL || errs == NULL) && fds != NULL) {
    free(fds);
    fds = NULL;
    if (why_nbytes > 0) snprintf(why, why_nbytes, "out of memory");
  }
  for (int r = 0; r < n; r++) {
    got[r] = 0;
    outcome[r] = fds == NULL && r != bs->rank ? BOOTSTRAP_ASK_UNASKED : BOOTSTRAP_ASK_SILENT;
    if (fds == NULL) continue;
    addrs[r] = r != bs->rank && bs->query_addrs != NULL ? &bs->query_addrs[r] : NULL;
  }
  /* half the time to connect: answers of the ranks connected early come in
   * meanwhile, and those connected late have the rest to answer */
  struct ask_send_ctx send = {q, deadline};
  if (fds != NULL)
    sock_connect_many(addrs, n, clock_ns() + timeout_ns / 2, fds, errs, ask_send, &send);
  for (int r = 0; fds != NULL && r < n; r++) {
    if (addrs[r] == NULL) continue;
    if (fds[r] < 0) {
      /* refused: nothing listens there any more (the process ended, or its
       * communicator was destroyed); no answer until the deadline says
       * nothing; a failure of this process's own (no descriptor) leaves the
       * peer unasked */
      const int e = errs[r];
      if (e == ECONNREFUSED) {
        outcome[r] = BOOTSTRAP_ASK_GONE;
      } else if (!sock_connect_err_transient(e)) {
        outcome[r] = BOOTSTRAP_ASK_UNASKED;
        if (why_nbytes > 0 && why[0] == '\0')
          snprintf(why, why_nbytes, "connecting to ask rank %d: %s", r, strerror(e));
      }
      if (bs->pids != NULL && bs->pids[r] > 0 && pid_gone(bs->pids[r], 1))
        outcome[r] = BOOTSTRAP_ASK_GONE;
    }
  }
  free(addrs);
  free(errs);
  for (int r = 0; fds != NULL && r < n; r++) {
    if (fds[r] < 0) continue;
    outcome[r] = ask_read(fds[r], (char *)replies + (size_t)r * nbytes, nbytes, deadline, &got[r]);
    sock_close_reset(fds[r]);
    if (outcome[r] != BOOTSTRAP_ASK_ANSWERED && bs->pids != NULL && bs->pids[r] > 0 &&
        pid_gone(bs->pids[r], 1))
      outcome[r] = BOOTSTRAP_ASK_GONE;
  }
  free(fds);
}

uint64_t bootstrap_job_hash(const struct bootstrap *bs) { return bs->job_hash; }

pid_t bootstrap_peer_pid(const struct bootstrap *bs, int rank) {
  return bs->pids != NULL && rank >= 0 && rank < bs->nranks ? bs->pids[rank] : 0;
}
