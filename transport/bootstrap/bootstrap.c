#include "bootstrap.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../base/param.h"
#include "../base/shm_segment.h"
#include "../base/status.h"
#include "../base/wait.h"

struct weft_param bootstrap_params[] = {
    {.name = "WEFT_HOSTID", .type = PARAM_STR,
     .doc = "the host identity, instead of the host name, boot id and network namespace: "
            "ranks with equal ids are taken to share memory"},
    PARAM_END,
};
enum { P_HOSTID };

#define BOOTSTRAP_MAGIC 0x77667462u /* "wftb" */
#define BOOTSTRAP_VERSION 2u
/* A connection must say its hello within this (and within the job's
 * timeout); unproven connections are served together, so a silent one
 * delays no one, it only holds a place until then. */
#define HELLO_TIMEOUT_NS 5000000000ull
#define SERVE_SLICE_NS 100000000ull /* how often the root looks at joined ranks */
#define ROOT_MAX_RANKS (1 << 20)       /* the root's tables grow with what a hello claims */

/* The hello deadline for a job whose waits last timeout_ns: a quarter of it
 * when that is shorter than HELLO_TIMEOUT_NS (a legitimate hello is sent
 * right after the connect), but not under 100 ms. */
static uint64_t hello_timeout(uint64_t timeout_ns) {
  uint64_t t = timeout_ns / 4;
  if (t > HELLO_TIMEOUT_NS) t = HELLO_TIMEOUT_NS;
  return t < 100000000ull ? 100000000ull : t;
}

/* The root's answer to a hello whose secret is right. A hello with a wrong
 * secret gets no answer at all: the root closes the connection. */
enum root_reply { ROOT_OK = 0, ROOT_BAD_NRANKS = 2, ROOT_BAD_RANK, ROOT_DUP_RANK };
/* What the root sends every joined rank at the end: the peer table follows
 * ROOT_ALL_JOINED; ROOT_RANK_LEFT is followed by the rank (int32) whose
 * connection closed before every rank joined; ROOT_GAVE_UP: the timeout. */
enum root_outcome { ROOT_ALL_JOINED = 0x6a6f696e, ROOT_RANK_LEFT, ROOT_GAVE_UP };

struct hello {
  uint32_t magic;
  uint32_t version;
  uint8_t secret[BOOTSTRAP_SECRET_BYTES];
  int32_t rank;
  int32_t nranks;
  struct peer_info info;
};

struct ring_hello {
  uint32_t magic;
  int32_t rank;
  uint8_t secret[BOOTSTRAP_SECRET_BYTES];
};

/* A point-to-point message that arrived before anyone asked for it. */
struct p2p_msg {
  struct p2p_msg *next;
  int32_t from;
  uint32_t tag;
  uint32_t nbytes;
  char data[];
};

struct p2p_header {
  uint32_t magic;
  int32_t from;
  uint32_t tag;
  uint32_t nbytes;
  uint8_t secret[BOOTSTRAP_SECRET_BYTES];
};

#define P2P_MAX_NBYTES 65536
#define P2P_TAG_FAILED 0xfa11ed00u /* "this rank failed": ends the receiver's waits on it */
#define P2P_MAGIC 0x77667470u /* "wftp": never mistaken for a ring hello */

static_assert(sizeof(struct hello) <= SOCK_HELLO_MAX_NBYTES, "hello fits a pending buffer");
static_assert(sizeof(struct p2p_header) <= SOCK_HELLO_MAX_NBYTES, "header fits");

struct bootstrap {
  int rank;
  int nranks;
  int fd_next;
  int fd_prev;
  int listen_fd;                  /* stays open for point-to-point messages */
  union weft_sockaddr *addrs;     /* every rank's listener */
  pid_t *pids;                    /* every rank's pid where it shares this host, else 0 */
  struct sock_hellos hellos;      /* connections to listen_fd not proven yet */
  uint8_t secret[BOOTSTRAP_SECRET_BYTES];
  struct p2p_msg *unexpected;
  const volatile uint32_t *abort; /* the owner's abort flag, or NULL */
  uint32_t poisoned;              /* bootstrap_poison ran (in this epoch) */
  uint32_t epoch;                 /* bootstrap_revoke calls so far: failures of older ones
                                     are over */
  uint64_t timeout_ns;
};

void bootstrap_set_abort(struct bootstrap *bs, const volatile uint32_t *abort) { bs->abort = abort; }

static int secret_equal(const uint8_t *a, const uint8_t *b) {
  uint8_t diff = 0; /* constant time */
  for (int i = 0; i < BOOTSTRAP_SECRET_BYTES; i++) diff |= (uint8_t)(a[i] ^ b[i]);
  return diff == 0;
}

/* --- root service ------------------------------------------------------ */

static uint32_t presence_key(const uint8_t secret[BOOTSTRAP_SECRET_BYTES], int rank);

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
    keys[n++] = presence_key(st->secret, r);
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

/* --- host identity ----------------------------------------------------- */

static uint64_t hash_bytes(uint64_t h, const void *data, size_t n) {
  const unsigned char *p = data;
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull; /* FNV-1a */
  return h;
}

static uint64_t hash_file(uint64_t h, const char *path) {
  char buf[128];
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return h;
  ssize_t n = read(fd, buf, sizeof buf);
  close(fd);
  return n > 0 ? hash_bytes(h, buf, (size_t)n) : h;
}

void bootstrap_peer_info_local(struct peer_info *info) {
  info->pid = (int32_t)getpid();
  gethostname(info->hostname, sizeof info->hostname - 1);
  info->hostname[sizeof info->hostname - 1] = '\0';
  uint64_t h = 0xcbf29ce484222325ull;
  const char *override = param_str(&bootstrap_params[P_HOSTID]);
  if (override != NULL) {
    h = hash_bytes(h, override, strlen(override));
  } else {
    h = hash_bytes(h, info->hostname, strlen(info->hostname));
    h = hash_file(h, "/proc/sys/kernel/random/boot_id");
    /* ranks in different network namespaces count as different hosts */
    struct stat st;
    if (stat("/proc/self/ns/net", &st) == 0) h = hash_bytes(h, &st.st_ino, sizeof st.st_ino);
  }
  info->host_hash = h;
}

/* --- joining ------------------------------------------------------------ */

static const char *root_reply_text(uint32_t code) {
  switch (code) {
    case ROOT_BAD_NRANKS: return "nranks differs from the other ranks'";
    case ROOT_BAD_RANK: return "rank out of range";
    case ROOT_DUP_RANK: return "another process already joined with this rank";
    default: return "unknown reason";
  }
}

/* A ring hello or a point-to-point header; anything else is dropped. */
static size_t listener_hello_size(const uint8_t *buf, size_t got, void *arg) {
  (void)arg;
  if (got < sizeof(uint32_t)) return sizeof(uint32_t);
  uint32_t magic;
  memcpy(&magic, buf, sizeof magic);
  if (magic == P2P_MAGIC) return sizeof(struct p2p_header);
  if (magic == BOOTSTRAP_MAGIC) return sizeof(struct ring_hello);
  return 0;
}

/* Reads the payload of a proven point-to-point message and queues it. */
static weftResult_t p2p_queue(struct bootstrap *bs, int fd, const struct p2p_header *h) {
  struct p2p_msg *m = malloc(sizeof *m + h->nbytes);
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
  struct p2p_msg **link = &bs->unexpected;
  while (*link != NULL) link = &(*link)->next;
  *link = m; /* in arrival order, as bootstrap_recv matches them */
  return weftSuccess;
}

/* Serves the listener until one thing arrives: a point-to-point message
 * (queued) or, when ring_fd_out is not NULL, the ring connection from rank
 * ring_prev. weftInProgress when `until` passes first or a stranger was
 * dropped. */
static weftResult_t listener_serve(struct bootstrap *bs, uint64_t until, struct weft_wait *watch,
                                   int ring_prev, int *ring_fd_out) {
  union {
    struct ring_hello ring;
    struct p2p_header p2p;
    uint8_t raw[SOCK_HELLO_MAX_NBYTES];
  } u;
  int fd;
  size_t got;
  WEFT_TRY(sock_hellos_next(&bs->hellos, bs->listen_fd, hello_timeout(bs->timeout_ns),
                            listener_hello_size,
                            NULL, until, watch, &fd, &u, &got));
  if (u.ring.magic == P2P_MAGIC) {
    const struct p2p_header *h = &u.p2p;
    if (secret_equal(h->secret, bs->secret) && h->from >= 0 && h->from < bs->nranks &&
        h->nbytes <= P2P_MAX_NBYTES)
      return p2p_queue(bs, fd, h);
  } else if (ring_fd_out != NULL && u.ring.rank == ring_prev &&
             secret_equal(u.ring.secret, bs->secret)) {
    *ring_fd_out = fd;
    return weftSuccess;
  }
  WEFT_WARN(LOG_BOOTSTRAP, "rank %d dropped a connection without the job's secret", bs->rank);
  sock_close_reset(fd);
  return weftInProgress;
}

/* A watch on rank peer for a wait of timeout_ns: its pid when it shares the
 * host, and the owner's abort flag. */
static void bootstrap_watch(const struct bootstrap *bs, int peer, uint64_t timeout_ns,
                            const char *what, struct weft_wait *w) {
  wait_begin(w, timeout_ns, bs->abort, NULL, bs->pids != NULL ? bs->pids[peer] : 0, peer, what);
}

/* Accepts the ring connection from prev, keeping any point-to-point message
 * from a rank that finished joining first for bootstrap_recv. */
static weftResult_t ring_accept_prev(struct bootstrap *bs, int prev, uint64_t deadline,
                                     int *fd_out) {
  struct weft_wait w;
  bootstrap_watch(bs, prev, deadline - clock_ns(), "accept the bootstrap ring from", &w);
  int fd = -1;
  while (fd < 0) {
    weftResult_t res = listener_serve(bs, deadline, &w, prev, &fd);
    if (res == weftInProgress && clock_ns() >= deadline)
      return weft_error_set(weftRemoteError, "timed out waiting for rank %d to join the ring",
                            prev);
    if (res != weftSuccess && res != weftInProgress) return res;
  }
  *fd_out = fd;
  return weftSuccess;
}

/* Reads the root's answers: admission, then the outcome and the table. */
static weftResult_t root_wait_table(int root_fd, const struct bootstrap_id *id, int rank,
                                    int nranks, uint64_t deadline, struct peer_info *peers_out) {
  char abuf[64];
  const char *root = sock_addr_str(&id->root, abuf, sizeof abuf);
  uint32_t code;
  weftResult_t res = sock_recv_all(root_fd, &code, sizeof code, deadline);
  if (res != weftSuccess && clock_ns() < deadline)
    return weft_error_set(weftInvalidArgument,
                          "bootstrap root at %s closed the connection without admitting rank %d "
                          "(%s): the unique id's secret is not the root's (an id or WEFT_SECRET "
                          "of another job: a wrong secret gets no answer), or the root has gone",
                          root, rank, weft_error_text());
  if (res != weftSuccess)
    return weft_error_set(res, "bootstrap root at %s did not answer rank %d: %s", root, rank,
                          weft_error_text());
  if (code != ROOT_OK)
    return weft_error_set(weftInvalidArgument, "bootstrap root at %s refused rank %d of %d: %s",
                          root, rank, nranks, root_reply_text(code));
  WEFT_TRACE(LOG_BOOTSTRAP, "rank %d: admitted by the root at %s", rank, root);
  uint32_t outcome;
  res = sock_recv_all(root_fd, &outcome, sizeof outcome, deadline);
  if (res == weftSuccess && outcome == ROOT_RANK_LEFT) {
    int32_t left = -1;
    sock_recv_all(root_fd, &left, sizeof left, clock_ns() + HELLO_TIMEOUT_NS);
    return weft_error_set(weftRemoteError,
                          "rank %d left (failed or died) before all %d ranks joined at %s",
                          (int)left, nranks, root);
  }
  if (res == weftSuccess && outcome != ROOT_ALL_JOINED)
    res = weft_error_set(weftRemoteError, "the root gave up (not every rank joined in time)");
  if (res == weftSuccess)
    res = sock_recv_all(root_fd, peers_out, sizeof *peers_out * (size_t)nranks, deadline);
  if (res != weftSuccess)
    return weft_error_set(res, "waiting for all %d ranks to join at %s: %s", nranks, root,
                          weft_error_text());
  return weftSuccess;
}

/* --- presence while joining ------------------------------------------- */

static uint32_t presence_key(const uint8_t secret[BOOTSTRAP_SECRET_BYTES], int rank) {
  uint64_t h = hash_bytes(0xcbf29ce484222325ull, secret, BOOTSTRAP_SECRET_BYTES);
  h = hash_bytes(h, &rank, sizeof rank);
  return (uint32_t)(h ^ (h >> 32));
}

void bootstrap_presence_begin(const struct bootstrap_id *id, int rank,
                              struct bootstrap_presence *p) {
  static_assert(sizeof p->name == SHM_NAME_BYTES, "a marker's name fits");
  if (shm_marker_create(presence_key(id->secret, rank), p->name) != weftSuccess)
    WEFT_INFO(LOG_BOOTSTRAP, "rank %d joins unmarked: %s", rank, weft_error_text());
}

void bootstrap_presence_end(struct bootstrap_presence *p, int failed) {
  shm_marker_remove(p->name);
  if (failed) bootstrap_sweep_dead();
}

void bootstrap_sweep_dead(void) { shm_segment_sweep(); }

weftResult_t bootstrap_init(const struct bootstrap_id *id, int rank, int nranks,
                            const struct peer_info *self, uint64_t timeout_ns,
                            struct bootstrap **bs_out, struct peer_info *peers_out) {
  if (id->magic != BOOTSTRAP_MAGIC)
    return weft_error_set(weftInvalidArgument, "unique id is not a weft id (bad magic)");
  uint64_t deadline = clock_ns() + timeout_ns;
  weftResult_t res;
  struct bootstrap *bs = calloc(1, sizeof *bs);
  if (bs == NULL) return weft_error_set(weftSystemError, "out of memory");
  bs->rank = rank;
  bs->nranks = nranks;
  bs->fd_next = bs->fd_prev = bs->listen_fd = -1;
  bs->timeout_ns = timeout_ns;
  memcpy(bs->secret, id->secret, sizeof bs->secret);

  /* our listener, on the interface that reaches the root (loopback when the
   * root is on loopback) */
  union weft_sockaddr listen_addr;
  int root_fd = -1;
  WEFT_TRY_GOTO(sock_local_addr_to(&id->root, &listen_addr), res, free_bs);
  WEFT_TRY_GOTO(sock_listen(&listen_addr, &bs->listen_fd, &listen_addr), res, free_bs);

  struct hello h;
  memset(&h, 0, sizeof h);
  h.magic = BOOTSTRAP_MAGIC;
  h.version = BOOTSTRAP_VERSION;
  memcpy(h.secret, id->secret, sizeof h.secret);
  h.rank = rank;
  h.nranks = nranks;
  h.info = *self;
  h.info.listen_addr = listen_addr;
  WEFT_TRACE(LOG_BOOTSTRAP, "rank %d of %d: joining the root", rank, nranks);
  /* a root at a fixed address may not be up yet (rank 0 starts it): refused
   * is retried; any other root was up before its id existed */
  if (id->flags & BOOTSTRAP_ID_ROOT_LATE)
    res = sock_connect(&id->root, deadline, &root_fd);
  else
    res = sock_connect_peer(&id->root, deadline, NULL, &root_fd);
  if (res != weftSuccess) {
    char abuf[64];
    res = weft_error_set(res, "bootstrap root at %s: %s%s", sock_addr_str(&id->root, abuf, sizeof abuf),
                         weft_error_text(),
                         id->flags & BOOTSTRAP_ID_ROOT_LATE
                             ? ""
                             : " (the process that made the unique id has exited, or the id is "
                               "not this job's)");
    goto free_bs;
  }
  WEFT_TRY_GOTO(sock_send_all(root_fd, &h, sizeof h, deadline), res, close_root);
  WEFT_TRY_GOTO(root_wait_table(root_fd, id, rank, nranks, deadline, peers_out), res, close_root);
  sock_close_reset(root_fd); /* all read; the root closes its end in order */
  root_fd = -1;

  bs->addrs = malloc(sizeof *bs->addrs * (size_t)nranks);
  bs->pids = calloc((size_t)nranks, sizeof *bs->pids);
  if (bs->addrs == NULL || bs->pids == NULL) {
    res = weft_error_set(weftSystemError, "out of memory");
    goto free_bs;
  }
  for (int r = 0; r < nranks; r++) {
    bs->addrs[r] = peers_out[r].listen_addr;
    if (r != rank && peers_out[r].host_hash == self->host_hash) bs->pids[r] = peers_out[r].pid;
  }
  WEFT_TRACE(LOG_BOOTSTRAP, "rank %d: all %d ranks joined", rank, nranks);

  if (nranks > 1) {
    int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
    struct ring_hello rh = {.magic = BOOTSTRAP_MAGIC, .rank = rank};
    memcpy(rh.secret, id->secret, sizeof rh.secret);
    struct weft_wait w;
    bootstrap_watch(bs, next, timeout_ns, "connect the bootstrap ring to", &w);
    WEFT_TRY_GOTO(sock_connect_peer(&bs->addrs[next], deadline, &w, &bs->fd_next), res,
                  free_bs);
    WEFT_TRY_GOTO(sock_send_all(bs->fd_next, &rh, sizeof rh, deadline), res, free_bs);
    WEFT_TRY_GOTO(ring_accept_prev(bs, prev, deadline, &bs->fd_prev), res, free_bs);
  }
  WEFT_TRACE(LOG_BOOTSTRAP, "rank %d: bootstrap ring ready", rank);
  *bs_out = bs;
  return weftSuccess;

close_root:
  sock_close_reset(root_fd);
free_bs:
  if (res == weftRemoteError || res == weftSystemError)
    res = weft_error_set(res, "bootstrap of rank %d of %d: %s", rank, nranks, weft_error_text());
  bootstrap_close(bs);
  return res;
}

/* The first rank (peer, or any when peer < 0) that said it failed, or -1.
 * Only while this rank has not failed itself: after that the ranks are
 * recovering (a shrink), and what they send then is new. */
static int p2p_failed_rank(const struct bootstrap *bs, int peer) {
  if (__atomic_load_n(&bs->poisoned, __ATOMIC_ACQUIRE)) return -1;
  uint32_t epoch = __atomic_load_n(&bs->epoch, __ATOMIC_ACQUIRE);
  for (const struct p2p_msg *m = bs->unexpected; m != NULL; m = m->next) {
    if (m->tag != P2P_TAG_FAILED || (peer >= 0 && m->from != peer)) continue;
    uint32_t sent_in = 0; /* the sender's epoch */
    if (m->nbytes == sizeof sent_in) memcpy(&sent_in, m->data, sizeof sent_in);
    if (sent_in >= epoch) return m->from;
  }
  return -1;
}

/* Sends sbuf to fd_out while receiving rbuf from fd_in, so that neither side
 * blocks on a full socket buffer. */
static weftResult_t sock_exchange(struct bootstrap *bs, const char *sbuf, char *rbuf,
                                  size_t nbytes, uint64_t deadline) {
  int fd_out = bs->fd_next, fd_in = bs->fd_prev;
  size_t sent = 0, got = 0;
  while (sent < nbytes || got < nbytes) {
    /* the listener too: a rank that failed says so there */
    struct pollfd p[3] = {{.fd = sent < nbytes ? fd_out : -1, .events = POLLOUT},
                          {.fd = got < nbytes ? fd_in : -1, .events = POLLIN},
                          {.fd = bs->listen_fd, .events = POLLIN}};
    uint64_t now = clock_ns();
    if (now >= deadline) return weft_error_set(weftRemoteError, "bootstrap exchange timed out");
    if (bs->abort != NULL && *bs->abort)
      return weft_error_set(weftRemoteError, "communicator aborted during a bootstrap exchange");
    uint64_t ms = (deadline - now) / 1000000 + 1;
    int rc = poll(p, bs->hellos.n > 0 ? 2 : 3, ms > 100 ? 100 : (int)ms);
    if (rc < 0 && errno != EINTR) return weft_error_errno(weftSystemError, "poll");
    /* a rank's failure counts once the ring stalls: what it (and the rest)
     * sent before failing completes the exchange first */
    int failed = rc == 0 ? p2p_failed_rank(bs, -1) : -1;
    if (failed >= 0)
      return weft_error_set(weftRemoteError, "rank %d failed during a bootstrap exchange", failed);
    if (bs->hellos.n > 0 || (rc > 0 && (p[2].revents & POLLIN))) {
      /* take what is ready there without waiting */
      weftResult_t res = listener_serve(bs, clock_ns() + 1000000ull, NULL, -1, NULL);
      if (res != weftSuccess && res != weftInProgress) return res;
    }
    if (rc <= 0) continue;
    if (p[0].revents & (POLLOUT | POLLERR | POLLHUP)) {
      ssize_t n = send(fd_out, sbuf + sent, nbytes - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) sent += (size_t)n;
      else if (n < 0 && errno != EAGAIN && errno != EINTR)
        return weft_error_errno(weftRemoteError, "bootstrap send to next rank");
    }
    if (p[1].revents & (POLLIN | POLLERR | POLLHUP)) {
      ssize_t n = recv(fd_in, rbuf + got, nbytes - got, MSG_DONTWAIT);
      if (n > 0) got += (size_t)n;
      else if (n == 0) return weft_error_set(weftRemoteError, "previous rank closed the bootstrap ring");
      else if (errno != EAGAIN && errno != EINTR)
        return weft_error_errno(weftRemoteError, "bootstrap receive from previous rank");
    }
  }
  return weftSuccess;
}

weftResult_t bootstrap_allgather(struct bootstrap *bs, void *data, size_t nbytes) {
  int n = bs->nranks, r = bs->rank;
  char *d = data;
  uint64_t deadline = clock_ns() + bs->timeout_ns;
  for (int s = 0; s < n - 1; s++) {
    int send_block = (r - s + n) % n, recv_block = (r - s - 1 + n) % n;
    weftResult_t res = sock_exchange(bs, d + (size_t)send_block * nbytes,
                                     d + (size_t)recv_block * nbytes, nbytes, deadline);
    if (res != weftSuccess)
      return weft_error_set(res, "bootstrap allgather on rank %d: %s", r, weft_error_text());
  }
  return weftSuccess;
}

weftResult_t bootstrap_barrier(struct bootstrap *bs) {
  char *tmp = calloc((size_t)bs->nranks, 1);
  if (tmp == NULL) return weft_error_set(weftSystemError, "out of memory");
  weftResult_t res = bootstrap_allgather(bs, tmp, 1);
  free(tmp);
  return res;
}

void bootstrap_close(struct bootstrap *bs) {
  if (bs == NULL) return;
  /* data only flows from prev to this rank, and every exchange of ours is
   * complete: the reading end resets, the writing end closes in order */
  if (bs->fd_next >= 0) close(bs->fd_next);
  if (bs->fd_prev >= 0) sock_close_reset(bs->fd_prev);
  if (bs->listen_fd >= 0) close(bs->listen_fd);
  sock_hellos_close(&bs->hellos);
  while (bs->unexpected != NULL) {
    struct p2p_msg *m = bs->unexpected;
    bs->unexpected = m->next;
    free(m);
  }
  free(bs->addrs);
  free(bs->pids);
  free(bs);
}

const union weft_sockaddr *bootstrap_listen_addr(const struct bootstrap *bs) {
  return &bs->addrs[bs->rank];
}

/* --- point-to-point messages ------------------------------------------- */

weftResult_t bootstrap_send(struct bootstrap *bs, int peer, uint32_t tag, const void *data,
                            size_t nbytes) {
  if (nbytes > P2P_MAX_NBYTES)
    return weft_error_set(weftInternalError, "bootstrap message of %zu bytes too large", nbytes);
  uint64_t deadline = clock_ns() + bs->timeout_ns;
  struct p2p_header h = {.magic = P2P_MAGIC, .from = bs->rank, .tag = tag,
                         .nbytes = (uint32_t)nbytes};
  memcpy(h.secret, bs->secret, sizeof h.secret);
  int fd;
  struct weft_wait w;
  bootstrap_watch(bs, peer, bs->timeout_ns, "send a bootstrap message to", &w);
  weftResult_t res = sock_connect_peer(&bs->addrs[peer], deadline, &w, &fd);
  if (res != weftSuccess)
    return weft_error_set(res, "bootstrap message to rank %d: %s", peer, weft_error_text());
  res = sock_send_all(fd, &h, sizeof h, deadline);
  if (res == weftSuccess && nbytes > 0) res = sock_send_all(fd, data, nbytes, deadline);
  close(fd);
  return res;
}

weftResult_t bootstrap_recv(struct bootstrap *bs, int peer, uint32_t tag, void *data,
                            size_t nbytes) {
  uint64_t deadline = clock_ns() + bs->timeout_ns;
  struct weft_wait w;
  bootstrap_watch(bs, peer, bs->timeout_ns, "receive a bootstrap message from", &w);
  struct p2p_msg **link = &bs->unexpected;
  for (;;) {
    for (; *link != NULL; link = &(*link)->next) {
      struct p2p_msg *m = *link;
      if (m->from != peer || m->tag != tag) continue;
      *link = m->next;
      weftResult_t res = weftSuccess;
      if (m->nbytes != nbytes)
        res = weft_error_set(weftInternalError,
                             "bootstrap message from rank %d has %u bytes, expected %zu", peer,
                             m->nbytes, nbytes);
      else
        memcpy(data, m->data, nbytes);
      free(m);
      return res;
    }
    if (p2p_failed_rank(bs, peer) >= 0)
      return weft_error_set(weftRemoteError,
                            "rank %d failed (seen while waiting for a bootstrap message from it)",
                            peer);
    /* the scan resumes at *link, where a newly queued message lands; in
     * slices, so that a failure message is seen promptly */
    uint64_t slice = clock_ns() + SERVE_SLICE_NS;
    weftResult_t res = listener_serve(bs, slice < deadline ? slice : deadline, &w, -1, NULL);
    if (res == weftInProgress && clock_ns() >= deadline)
      res = weft_error_set(weftRemoteError, "timed out");
    if (res != weftSuccess && res != weftInProgress)
      return weft_error_set(res, "waiting for a bootstrap message from rank %d: %s", peer,
                            weft_error_text());
  }
}

void bootstrap_poison(struct bootstrap *bs) {
  if (bs == NULL || __atomic_exchange_n(&bs->poisoned, 1u, __ATOMIC_ACQ_REL)) return;
  /* the caller's error is the one to report: a peer that is gone here
   * would overwrite its text */
  char *error = strdup(weft_error_text());
  uint32_t epoch = __atomic_load_n(&bs->epoch, __ATOMIC_ACQUIRE);
  struct p2p_header h = {.magic = P2P_MAGIC, .from = bs->rank, .tag = P2P_TAG_FAILED,
                         .nbytes = sizeof epoch};
  memcpy(h.secret, bs->secret, sizeof h.secret);
  for (int r = 0; r < bs->nranks; r++) {
    if (r == bs->rank) continue;
    /* best effort and brief: a peer that is gone refuses at once */
    uint64_t deadline = clock_ns() + 250000000ull;
    int fd;
    if (sock_connect_peer(&bs->addrs[r], deadline, NULL, &fd) != weftSuccess) continue;
    if (sock_send_all(fd, &h, sizeof h, deadline) == weftSuccess)
      sock_send_all(fd, &epoch, sizeof epoch, deadline);
    close(fd);
  }
  WEFT_INFO(LOG_BOOTSTRAP, "rank %d told the other %d ranks that it failed", bs->rank,
            bs->nranks - 1);
  if (error != NULL) weft_error_set(weftSuccess, "%s", error);
  free(error);
}

void bootstrap_revoke(struct bootstrap *bs) {
  if (bs == NULL) return;
  __atomic_add_fetch(&bs->epoch, 1u, __ATOMIC_ACQ_REL);
  __atomic_store_n(&bs->poisoned, 0u, __ATOMIC_RELEASE);
}
