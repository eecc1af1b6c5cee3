/* Each rank's listener: it takes the ring connection from the previous
 * rank and the messages other ranks send this one (queued until asked for,
 * failure notices among them). */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../base/status.h"
#include "wire.h"

/* A watch on rank peer for a wait of timeout_ns: its pid when it shares the
 * host, and the owner's abort flag. */
void bootstrap_watch(const struct bootstrap *bs, int peer, uint64_t timeout_ns,
                     const char *what, struct weft_wait *w) {
  wait_begin(w, timeout_ns, bs->abort, NULL, bs->pids != NULL ? bs->pids[peer] : 0, peer, what);
}

/* A ring hello or a message header; anything else is dropped. */
static size_t listener_hello_size(const uint8_t *buf, size_t got, void *arg) {
  (void)arg;
  if (got < sizeof(uint32_t)) return sizeof(uint32_t);
  uint32_t magic;
  memcpy(&magic, buf, sizeof magic);
  if (magic == MSG_MAGIC) return sizeof(struct msg_header);
  if (magic == BOOTSTRAP_MAGIC) return sizeof(struct ring_hello);
  return 0;
}

/* Reads the payload of a proven message and queues it. */
static weftResult_t msg_queue(struct bootstrap *bs, int fd, const struct msg_header *h) {
  struct bs_msg *m = malloc(sizeof *m + h->nbytes);
  if (m == NULL) {
    sock_close_reset(fd);
    return weft_error_set(weftSystemError, "out of memory");
  }
  m->next = NULL;
  m->from = h->from;
  m->tag = h->tag;
  m->nbytes = h->nbytes;
  weftResult_t res = sock_recv_all(fd, m->data, h->nbytes, clock_ns() + HELLO_TIMEOUT_NS);
  sock_close_reset(fd); /* the message is in: the sender closes in order */
  if (res != weftSuccess) {
    WEFT_INFO(LOG_BOOTSTRAP, "dropped a message from rank %d cut short: %s", h->from,
              weft_error_text());
    free(m);
    return weftInProgress;
  }
  struct bs_msg **link = &bs->unexpected;
  while (*link != NULL) link = &(*link)->next;
  *link = m; /* in arrival order, as bootstrap_recv matches them */
  return weftSuccess;
}

/* Serves the listener until one thing arrives: a point-to-point message
 * (queued) or, when ring_fd_out is not NULL, the ring connection from rank
 * ring_prev. weftInProgress when `until` passes first or a stranger was
 * dropped. */
weftResult_t bootstrap_listener_serve(struct bootstrap *bs, uint64_t until, struct weft_wait *watch,
                                   int ring_prev, int *ring_fd_out) {
  union {
    struct ring_hello ring;
    struct msg_header msg;
    uint8_t raw[SOCK_HELLO_MAX_NBYTES];
  } u;
  int fd;
  size_t got;
  WEFT_TRY(sock_hellos_next(&bs->hellos, bs->listen_fd, hello_timeout(bs->timeout_ns),
                            listener_hello_size,
                            NULL, until, watch, &fd, &u, &got));
  if (u.ring.magic == MSG_MAGIC) {
    const struct msg_header *h = &u.msg;
    if (secret_equal(h->secret, bs->secret) && h->from >= 0 && h->from < bs->nranks &&
        h->nbytes <= MSG_MAX_NBYTES)
      return msg_queue(bs, fd, h);
  } else if (ring_fd_out != NULL && u.ring.rank == ring_prev &&
             secret_equal(u.ring.secret, bs->secret)) {
    *ring_fd_out = fd;
    return weftSuccess;
  }
  WEFT_WARN(LOG_BOOTSTRAP, "rank %d dropped a connection without the job's secret", bs->rank);
  sock_close_reset(fd);
  return weftInProgress;
}

/* The first rank (peer, or any when peer < 0) that said it failed, or -1.
 * Only while this rank has not failed itself: after that the ranks are
 * recovering (a shrink), and what they send then is new. */
int bootstrap_msg_failed_rank(const struct bootstrap *bs, int peer) {
  if (__atomic_load_n(&bs->poisoned, __ATOMIC_ACQUIRE)) return -1;
  uint32_t epoch = __atomic_load_n(&bs->epoch, __ATOMIC_ACQUIRE);
  for (const struct bs_msg *m = bs->unexpected; m != NULL; m = m->next) {
    if (m->tag != MSG_TAG_FAILED || (peer >= 0 && m->from != peer)) continue;
    uint32_t sent_in = 0; /* the sender's epoch */
    if (m->nbytes == sizeof sent_in) memcpy(&sent_in, m->data, sizeof sent_in);
    if (sent_in >= epoch) return m->from;
  }
  return -1;
}
