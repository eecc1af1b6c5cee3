/* The root service: a thread that admits every rank of a job that proves
 * the job's secret, then hands each the table of all; and the unique ids
 * that name a root. */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "../base/shm_segment.h"
#include "../base/status.h"
#include "wire.h"

struct root_watch {
  int rank;
  pid_t pid;
};

struct root_state {
  int listen_fd;
  uint8_t secret[BOOTSTRAP_SECRET_BYTES];
  uint64_t timeout_ns;
  struct root_state *next_live; /* the registry of this process's roots */
  /* processes of this host that are to join (bootstrap_root_watch), under
   * roots_lock: one that ends before it joined fails the rendezvous */
  struct root_watch *watches;
  int nwatches, watches_cap;
};

static pthread_mutex_t roots_lock = PTHREAD_MUTEX_INITIALIZER;
static struct root_state *roots;

weftResult_t bootstrap_root_watch(const struct bootstrap_id *id, int rank, pid_t pid) {
  if (rank < 0 || rank >= ROOT_MAX_RANKS || pid <= 0)
    return weft_error_set(weftInvalidArgument, "watching rank %d (pid %d): out of range", rank,
                          (int)pid);
  weftResult_t res = weftSuccess;
  pthread_mutex_lock(&roots_lock);
  struct root_state *st = roots;
  while (st != NULL && !secret_equal(st->secret, id->secret)) st = st->next_live;
  if (st == NULL) {
    res = weft_error_set(weftInvalidArgument,
                         "the rendezvous of this id is not served by this process (or has "
                         "ended)");
  } else {
    if (st->nwatches == st->watches_cap) {
      int cap = st->watches_cap ? 2 * st->watches_cap : 16;
      struct root_watch *w = realloc(st->watches, sizeof *w * (size_t)cap);
      if (w == NULL) res = weft_error_set(weftSystemError, "out of memory");
      else {
        st->watches = w;
        st->watches_cap = cap;
      }
    }
    if (res == weftSuccess) st->watches[st->nwatches++] = (struct root_watch){rank, pid};
  }
  pthread_mutex_unlock(&roots_lock);
  return res;
}

/* Takes st out of the registry, with its watches. */
static void root_unregister(struct root_state *st) {
  pthread_mutex_lock(&roots_lock);
  struct root_state **link = &roots;
  while (*link != NULL && *link != st) link = &(*link)->next_live;
  if (*link != NULL) *link = st->next_live;
  free(st->watches);
  st->watches = NULL;
  st->nwatches = st->watches_cap = 0;
  pthread_mutex_unlock(&roots_lock);
}

/* A watched rank still to join whose process has ended, or -1. */
static int root_watched_gone(struct root_state *st, const int *fds, int nranks) {
  int gone = -1;
  pthread_mutex_lock(&roots_lock);
  for (int i = 0; i < st->nwatches && gone < 0; i++) {
    const struct root_watch *w = &st->watches[i];
    if (w->rank < nranks && fds[w->rank] == -1 && pid_gone(w->pid, 1)) gone = w->rank;
  }
  pthread_mutex_unlock(&roots_lock);
  return gone;
}

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

/* How many descriptors this process has open, or -1 when it cannot tell
 * (no descriptor to read /proc with). */
static int fds_open(void) {
  DIR *d = opendir("/proc/self/fd");
  if (d == NULL) return -1;
  int n = 0;
  while (readdir(d) != NULL) n++;
  closedir(d);
  return n - 3; /* ".", ".." and the directory's own */
}

static uint32_t rlim_u32(rlim_t v) {
  return v == RLIM_INFINITY || v > UINT32_MAX ? UINT32_MAX : (uint32_t)v;
}

/* Makes room for `more` connections besides what the process holds now: the
 * root holds one per rank until every rank has joined. Raises the soft
 * RLIMIT_NOFILE toward the hard limit when it is short (as launchers do);
 * 0 with *short_out filled when even that is too few, else 1. */
static int root_fds_fit(int more, struct root_fds *short_out) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return 1; /* cannot tell: try */
  int open_now = fds_open();
  if (open_now < 0) /* no descriptor left to count them with: all are taken */
    open_now = rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur > INT32_MAX ? INT32_MAX / 2
                                                                        : (int)rl.rlim_cur;
  const rlim_t need = (rlim_t)open_now + (rlim_t)more + 1; /* + 1: to accept with */
  const rlim_t want = need + SOCK_HELLOS_MAX + 16;        /* strangers; the program's own */
  if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < want) {
    struct rlimit raised = rl;
    raised.rlim_cur = rl.rlim_max != RLIM_INFINITY && rl.rlim_max < want ? rl.rlim_max : want;
    if (raised.rlim_cur > rl.rlim_cur && setrlimit(RLIMIT_NOFILE, &raised) == 0) {
      WEFT_INFO(LOG_BOOTSTRAP, "root: raised RLIMIT_NOFILE from %llu to %llu for %d connections",
                (unsigned long long)rl.rlim_cur, (unsigned long long)raised.rlim_cur, more + 1);
      rl = raised;
    }
  }
  if (rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= need) return 1;
  *short_out = (struct root_fds){.need = rlim_u32(need), .soft = rlim_u32(rl.rlim_cur),
                                 .hard = rlim_u32(rl.rlim_max)};
  return 0;
}

/* Tells a rank that the root's process is out of descriptors, and lets it go. */
static void root_tell_out_of_fds(int fd, const struct root_fds *f) {
  uint32_t msg[4] = {ROOT_OUT_OF_FDS, f->need, f->soft, f->hard};
  sock_send_all(fd, msg, sizeof msg, clock_ns() + HELLO_TIMEOUT_NS);
  close(fd);
}

/* Tells a joined rank that rank `left` left, and lets it go. */
static void root_tell_left(int fd, int32_t left) {
  uint32_t msg[2] = {ROOT_RANK_LEFT, (uint32_t)left};
  sock_send_all(fd, msg, sizeof msg, clock_ns() + HELLO_TIMEOUT_NS);
  close(fd);
}

/* Tells a joined rank that a process of the job was refused, and lets it go. */
static void root_tell_refused(int fd, const struct root_refusal *r) {
  uint32_t msg[4] = {ROOT_RANK_REFUSED, r->code, (uint32_t)r->rank, (uint32_t)r->nranks};
  sock_send_all(fd, msg, sizeof msg, clock_ns() + HELLO_TIMEOUT_NS);
  close(fd);
}

/* Serves every connection at once (sock_hellos_next): strangers and silent
 * clients are dropped without delaying the ranks. A rank that leaves before
 * all have joined fails the others at once instead of at the timeout: those
 * joined are told, and those still to come are told when they arrive. So
 * does a process of the job (it has the secret) that the root refuses (its
 * size differs from the first rank's, its rank is out of range or taken):
 * the ranks disagree, and none could finish joining. */
static void *root_main(void *arg) {
  struct root_state *st = arg;
  uint64_t deadline = clock_ns() + st->timeout_ns;
  int nranks = -1, joined = 0;
  int left = -1, told = 0; /* after a rank left: how many others know */
  int out_of_fds = 0;       /* 1: found just now, 2: the joined ranks were told */
  struct root_refusal refused = {0, 0, 0}; /* the first, which every rank is told */
  struct root_fds fds_short = {0, 0, 0};
  int *fds = NULL;
  struct peer_info *infos = NULL;
  uint32_t *keys = NULL; /* presence keys of the ranks still to join */
  int *key_rank = NULL;
  struct sock_hellos *hs = calloc(1, sizeof *hs);
  if (hs == NULL) goto close_all;
  hs->out_of_fds_fails = 1; /* every pending connection may be a rank's */
  while (out_of_fds      ? told < nranks
         : refused.code ? nranks < 0 || told < nranks /* those to come: at the deadline */
         : left < 0     ? nranks < 0 || joined < nranks
                        : told < nranks - 1) {
    if (out_of_fds == 1) { /* every rank learns why, instead of a dropped connection */
      WEFT_WARN(LOG_BOOTSTRAP,
                "root: out of file descriptors: %d ranks need %u+, RLIMIT_NOFILE is %u (hard %u)",
                nranks, fds_short.need, fds_short.soft, fds_short.hard);
      out_of_fds = 2;
      for (int r = 0; r < nranks; r++) {
        if (fds[r] < 0) continue;
        root_tell_out_of_fds(fds[r], &fds_short);
        fds[r] = -1;
        told++;
      }
      continue;
    }
    if (left < 0 && !out_of_fds && !refused.code) { /* after a refusal every rank was told */
      left = root_rank_left(fds, nranks);
      int died = left < 0 ? root_rank_died_unjoined(st, fds, nranks, keys, key_rank) : -1;
      if (died < 0 && fds != NULL) died = root_watched_gone(st, fds, nranks);
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
      if (refused.code)
        ; /* said when it was refused */
      else if (left < 0 && nranks < 0)
        WEFT_WARN(LOG_BOOTSTRAP, "root: no rank joined before the timeout; giving up");
      else if (left < 0)
        WEFT_WARN(LOG_BOOTSTRAP, "root: %d of %d ranks joined before the timeout; giving up",
                  joined, nranks);
      /* the joined ranks learn which have not */
      struct {
        uint32_t outcome;
        struct root_missing m;
      } gave_up = {ROOT_GAVE_UP, {(uint32_t)joined, 0, {0}}};
      for (int r = 0; fds != NULL && r < nranks; r++)
        if (fds[r] < 0 && gave_up.m.nmissing++ < ROOT_MISSING_NAMED)
          gave_up.m.ranks[gave_up.m.nmissing - 1] = r;
      /* the ranks of this process last: one told ends its process (and this
       * thread) as it returns */
      for (int pass = 0; pass < 2; pass++)
        for (int r = 0; fds != NULL && r < nranks; r++)
          if (fds[r] >= 0 && (infos[r].pid == (int32_t)getpid()) == (pass == 1))
            sock_send_all(fds[r], &gave_up, sizeof gave_up, now + HELLO_TIMEOUT_NS);
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
    if (res == weftSystemError && (hs->accept_errno == EMFILE || hs->accept_errno == ENFILE)) {
      hs->accept_errno = 0;
      if (nranks > 0 && !out_of_fds && root_fds_fit(nranks - joined, &fds_short)) {
        /* the limit was raised for the rest (the process had opened more
         * since the first rank came) */
        struct timespec ts = {0, 10000000};
        nanosleep(&ts, NULL);
      } else if (nranks > 0 && !out_of_fds) {
        /* the joined ranks' connections, the pending ones and the rest of
         * the process fill the soft limit */
        struct rlimit rl = {0, 0};
        getrlimit(RLIMIT_NOFILE, &rl);
        const int64_t others = (int64_t)rlim_u32(rl.rlim_cur) - joined - hs->n;
        fds_short = (struct root_fds){.need = (uint32_t)((others > 0 ? others : 0) + nranks + 1),
                                      .soft = rlim_u32(rl.rlim_cur),
                                      .hard = rlim_u32(rl.rlim_max)};
        out_of_fds = 1;
      } else {
        /* the pending ones free theirs as they are read (or the program its
         * own): look again in a while */
        struct timespec ts = {0, 10000000};
        nanosleep(&ts, NULL);
      }
      continue;
    }
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
      if (left >= 0 || out_of_fds || refused.code) continue; /* the ranks are told already */
      refused = (struct root_refusal){code, h.rank, h.nranks};
      for (int r = 0; fds != NULL && r < nranks; r++) {
        if (fds[r] < 0) continue;
        root_tell_refused(fds[r], &refused);
        fds[r] = -1;
        told++;
      }
      continue;
    }
    if (refused.code) {
      root_reply(fd, ROOT_OK);
      root_tell_refused(fd, &refused);
      told++;
      continue;
    }
    if (left >= 0) {
      root_reply(fd, ROOT_OK);
      root_tell_left(fd, left);
      told++;
      continue;
    }
    if (out_of_fds) {
      root_reply(fd, ROOT_OK);
      root_tell_out_of_fds(fd, &fds_short);
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
      if (!root_fds_fit(nranks - 1, &fds_short)) { /* this rank's is open already */
        out_of_fds = 1;
        root_reply(fd, ROOT_OK);
        root_tell_out_of_fds(fd, &fds_short);
        told++;
        continue;
      }
    }
    fds[h.rank] = fd;
    infos[h.rank] = h.info;
    infos[h.rank].rank = h.rank;
    joined++;
    root_reply(fd, ROOT_OK);
    WEFT_TRACE(LOG_BOOTSTRAP, "root: rank %d of %d joined (%d so far)", h.rank, nranks, joined);
  }
  /* the ranks of this process last: one that fails on reading the table (a
   * check every rank makes alike) and ends its process ends this thread */
  struct peer_info self;
  memset(&self, 0, sizeof self);
  bootstrap_peer_info_local(&self); /* its pid, on this machine and network */
  for (int pass = 0; left < 0 && !out_of_fds && pass < 2; pass++)
    for (int r = 0; r < nranks; r++) {
      const int ours = infos[r].pid == self.pid && infos[r].net_hash == self.net_hash;
      if (ours != (pass == 1)) continue;
      uint32_t outcome = ROOT_ALL_JOINED;
      uint64_t d = clock_ns() + st->timeout_ns;
      if (sock_send_all(fds[r], &outcome, sizeof outcome, d) == weftSuccess)
        sock_send_all(fds[r], infos, sizeof *infos * (size_t)nranks, d);
    }
close_all:
  root_unregister(st);
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
  pthread_mutex_lock(&roots_lock);
  st->next_live = roots;
  roots = st;
  pthread_mutex_unlock(&roots_lock);
  pthread_t tid;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  int rc = pthread_create(&tid, &attr, root_main, st);
  pthread_attr_destroy(&attr);
  if (rc != 0) {
    root_unregister(st);
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
