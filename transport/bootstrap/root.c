/* The root service: a thread that admits every rank of a job that proves
 * the job's secret, then hands each the table of all; and the unique ids
 * that name a root. */
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "../base/shm_segment.h"
#include "../base/status.h"
#include "wire.h"

struct root_state {
  int listen_fd;
  uint8_t secret[BOOTSTRAP_SECRET_BYTES];
  uint64_t timeout_ns;
};

static void root_reply(int fd, uint32_t code) {
  sock_send_all(fd, &code, sizeof code, clock_ns() + HELLO_TIMEOUT_NS);
}

static size_t root_hello_size(const uint8_t *buf, size_t got, void *arg) {
  (void)arg;
  if (got < 2 * sizeof(uint32_t)) return 2 * sizeof(uint32_t);
  uint32_t magic, version;
  memcpy(&magic, buf, sizeof magic);
  memcpy(&version, buf + sizeof magic, sizeof version);
  return magic == BOOTSTRAP_MAGIC && version == BOOTSTRAP_VERSION ? sizeof(struct hello) : 0;
}

/* The first joined rank whose connection closed (or spoke out of turn)
 * before the table went out, or -1. Joined ranks only wait. */
static int root_rank_left(const int *fds, int nranks) {
  for (int r = 0; fds != NULL && r < nranks; r++) {
    if (fds[r] < 0) continue;
    struct pollfd p = {.fd = fds[r], .events = POLLIN};
    if (poll(&p, 1, 0) > 0) return r;
  }
  return -1;
}

/* A rank still to join whose presence marker (bootstrap_presence_begin) says
 * it died on this host, or -1. keys and key_rank have room for nranks. */
static int root_rank_died_unjoined(const struct root_state *st, const int *fds, int nranks,
                                   uint32_t *keys, int *key_rank) {
  if (keys == NULL) return -1;
  int n = 0;
  for (int r = 0; r < nranks; r++) {
    if (fds[r] >= 0) continue;
    key_rank[n] = r;
    keys[n++] = bootstrap_presence_key(st->secret, r);
  }
  int i = shm_marker_find_dead(keys, n);
  return i >= 0 ? key_rank[i] : -1;
}

/* Tells a joined rank that rank `left` left, and lets it go. */
static void root_tell_left(int fd, int32_t left) {
  uint32_t msg[2] = {ROOT_RANK_LEFT, (uint32_t)left};
  sock_send_all(fd, msg, sizeof msg, clock_ns() + HELLO_TIMEOUT_NS);
  close(fd);
}

/* Serves every connection at once (sock_hellos_next): strangers and silent
 * clients are dropped without delaying the ranks. A rank that leaves before
 * all have joined fails the others at once instead of at the timeout: those
 * joined are told, and those still to come are told when they arrive. */
static void *root_main(void *arg) {
  struct root_state *st = arg;
  uint64_t deadline = clock_ns() + st->timeout_ns;
  int nranks = -1, joined = 0;
  int left = -1, told = 0; /* after a rank left: how many others know */
  int *fds = NULL;
  struct peer_info *infos = NULL;
  uint32_t *keys = NULL; /* presence keys of the ranks still to join */
  int *key_rank = NULL;
  struct sock_hellos *hs = calloc(1, sizeof *hs);
  if (hs == NULL) goto close_all;
  while (left < 0 ? nranks < 0 || joined < nranks : told < nranks - 1) {
    if (left < 0) {
      left = root_rank_left(fds, nranks);
      int died = left < 0 ? root_rank_died_unjoined(st, fds, nranks, keys, key_rank) : -1;
      if (died >= 0) left = died;
    }
    if (left >= 0 && fds[left] != -2) { /* found just now: tell the joined ranks */
      WEFT_WARN(LOG_BOOTSTRAP, "root: rank %d %s before all %d ranks joined", left,
                fds[left] >= 0 ? "left" : "died", nranks);
      if (fds[left] >= 0) close(fds[left]);
      fds[left] = -2; /* told */
      for (int r = 0; r < nranks; r++) {
        if (fds[r] < 0) continue;
        root_tell_left(fds[r], left);
        fds[r] = -1;
        told++;
      }
      continue;
    }
    uint64_t now = clock_ns();
    if (now >= deadline) {
      if (left < 0)
        WEFT_WARN(LOG_BOOTSTRAP, "root: %d of %d ranks joined before the timeout; giving up",
                  joined, nranks);
      for (int r = 0; fds != NULL && r < nranks; r++) {
        uint32_t outcome = ROOT_GAVE_UP;
        if (fds[r] >= 0) sock_send_all(fds[r], &outcome, sizeof outcome, now + HELLO_TIMEOUT_NS);
      }
      goto close_all;
    }
    int fd;
    struct hello h;
    size_t got;
    uint64_t until = now + SERVE_SLICE_NS < deadline ? now + SERVE_SLICE_NS : deadline;
    weftResult_t res = sock_hellos_next(hs, st->listen_fd, hello_timeout(st->timeout_ns),
                                        root_hello_size,
                                        NULL, until, NULL, &fd, &h, &got);
    if (res == weftInProgress) continue;
    if (res != weftSuccess) {
      WEFT_WARN(LOG_BOOTSTRAP, "root: %s; giving up", weft_error_text());
      deadline = 0; /* tells the joined ranks, next turn */
      continue;
    }
    if (!secret_equal(h.secret, st->secret)) {
      /* nothing goes back to a client that has not proven the secret */
      WEFT_WARN(LOG_BOOTSTRAP, "root: dropped a client without the job's secret");
      sock_close_reset(fd);
      continue;
    }
    uint32_t code = ROOT_OK;
    if (h.nranks < 1 || h.nranks > ROOT_MAX_RANKS || (nranks > 0 && h.nranks != nranks))
      code = ROOT_BAD_NRANKS;
    else if (h.rank < 0 || h.rank >= h.nranks) code = ROOT_BAD_RANK;
    else if (fds != NULL && fds[h.rank] >= 0) code = ROOT_DUP_RANK;
    if (code != ROOT_OK) {
      WEFT_WARN(LOG_BOOTSTRAP, "root: refused rank %d of %d (reason %u)", h.rank, h.nranks,
                code);
      root_reply(fd, code);
      close(fd);
      continue;
    }
    if (left >= 0) {
      root_reply(fd, ROOT_OK);
      root_tell_left(fd, left);
      told++;
      continue;
    }
    if (fds == NULL) {
      nranks = h.nranks;
      fds = malloc(sizeof *fds * (size_t)nranks);
      infos = calloc((size_t)nranks, sizeof *infos);
      keys = malloc(sizeof *keys * (size_t)nranks);
      key_rank = malloc(sizeof *key_rank * (size_t)nranks);
      if (fds == NULL || infos == NULL || keys == NULL || key_rank == NULL) {
        close(fd);
        goto close_all;
      }
      for (int i = 0; i < nranks; i++) fds[i] = -1;
    }
    fds[h.rank] = fd;
    infos[h.rank] = h.info;
    infos[h.rank].rank = h.rank;
    joined++;
    root_reply(fd, ROOT_OK);
    WEFT_TRACE(LOG_BOOTSTRAP, "root: rank %d of %d joined (%d so far)", h.rank, nranks, joined);
  }
  for (int r = 0; left < 0 && r < nranks; r++) {
    uint32_t outcome = ROOT_ALL_JOINED;
    uint64_t d = clock_ns() + st->timeout_ns;
    if (sock_send_all(fds[r], &outcome, sizeof outcome, d) == weftSuccess)
      sock_send_all(fds[r], infos, sizeof *infos * (size_t)nranks, d);
  }
close_all:
  for (int r = 0; fds != NULL && infos != NULL && r < nranks; r++) /* fds is set once both are */
    if (fds[r] >= 0) close(fds[r]);
  if (hs != NULL) sock_hellos_close(hs);
  free(hs);
  free(fds);
  free(infos);
  free(keys);
  free(key_rank);
  close(st->listen_fd);
  free(st);
  return NULL;
}

weftResult_t bootstrap_root_start(const union weft_sockaddr *bind_addr,
                                  const uint8_t secret[BOOTSTRAP_SECRET_BYTES],
                                  union weft_sockaddr *bound_out) {
  struct root_state *st = calloc(1, sizeof *st);
  if (st == NULL) return weft_error_set(weftSystemError, "out of memory");
  union weft_sockaddr bound;
  weftResult_t res;
  WEFT_TRY_GOTO(sock_listen(bind_addr, &st->listen_fd, &bound), res, free_state);
  memcpy(st->secret, secret, BOOTSTRAP_SECRET_BYTES);
  st->timeout_ns = wait_default_timeout_ns();
  pthread_t tid;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  int rc = pthread_create(&tid, &attr, root_main, st);
  pthread_attr_destroy(&attr);
  if (rc != 0) {
    errno = rc;
    res = weft_error_errno(weftSystemError, "starting the bootstrap root thread");
    goto close_listen;
  }
  if (bound_out) *bound_out = bound;
  return weftSuccess;
close_listen:
  close(st->listen_fd);
free_state:
  free(st);
  return res;
}

weftResult_t bootstrap_id_create_at(const union weft_sockaddr *bind_addr,
                                    struct bootstrap_id *id_out) {
  struct bootstrap_id id;
  memset(&id, 0, sizeof id);
  id.magic = BOOTSTRAP_MAGIC;
  if (getrandom(id.secret, sizeof id.secret, 0) != (ssize_t)sizeof id.secret)
    return weft_error_errno(weftSystemError, "getrandom");
  WEFT_TRY(bootstrap_root_start(bind_addr, id.secret, &id.root));
  *id_out = id;
  return weftSuccess;
}

weftResult_t bootstrap_id_create(struct bootstrap_id *id_out) {
  union weft_sockaddr local;
  WEFT_TRY(sock_local_addr(&local));
  return bootstrap_id_create_at(&local, id_out);
}

weftResult_t bootstrap_id_create_local(struct bootstrap_id *id_out) {
  union weft_sockaddr lo;
  memset(&lo, 0, sizeof lo);
  lo.in.sin_family = AF_INET;
  lo.in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return bootstrap_id_create_at(&lo, id_out);
}

weftResult_t bootstrap_id_create_like(const struct bootstrap *bs, struct bootstrap_id *id_out) {
  union weft_sockaddr at = bs->addrs[bs->rank];
  if (at.sa.sa_family == AF_INET) at.in.sin_port = 0;
  else at.in6.sin6_port = 0;
  return bootstrap_id_create_at(&at, id_out);
}
