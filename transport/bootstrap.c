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

#include "param.h"
#include "status.h"
#include "wait.h"

struct weft_param bootstrap_params[] = {
    {"WEFT_SOCKET_IFNAME", PARAM_STR, NULL,
     "interface (name prefix) for bootstrap and socket traffic; default: first non-loopback", 0,
     0, NULL},
    {"WEFT_HOSTID", PARAM_STR, NULL,
     "overrides the host identity (ranks with equal ids share memory)", 0, 0, NULL},
    PARAM_END,
};
enum { P_IFNAME, P_HOSTID };

#define BOOTSTRAP_MAGIC 0x77667462u /* "wftb" */
#define BOOTSTRAP_VERSION 1u
#define HELLO_TIMEOUT_NS 5000000000ull /* a connected client must speak within 5 s */
#define ROOT_MAX_RANKS (1 << 20)       /* the root's tables grow with what a hello claims */

enum root_reply { ROOT_OK = 0, ROOT_BAD_SECRET, ROOT_BAD_NRANKS, ROOT_BAD_RANK, ROOT_DUP_RANK };

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
#define P2P_MAGIC 0x77667470u /* "wftp": never mistaken for a ring hello */

struct bootstrap {
  int rank;
  int nranks;
  int fd_next;
  int fd_prev;
  int listen_fd;                  /* stays open for point-to-point messages */
  union weft_sockaddr *addrs;     /* every rank's listener */
  uint8_t secret[BOOTSTRAP_SECRET_BYTES];
  struct p2p_msg *unexpected;
  const volatile uint32_t *abort; /* the owner's abort flag, or NULL */
  uint64_t timeout_ns;
};

void bootstrap_set_abort(struct bootstrap *bs, const volatile uint32_t *abort) { bs->abort = abort; }

static int secret_equal(const uint8_t *a, const uint8_t *b) {
  uint8_t diff = 0; /* constant time */
  for (int i = 0; i < BOOTSTRAP_SECRET_BYTES; i++) diff |= (uint8_t)(a[i] ^ b[i]);
  return diff == 0;
}

/* --- root service ------------------------------------------------------ */

struct root_state {
  int listen_fd;
  uint8_t secret[BOOTSTRAP_SECRET_BYTES];
  uint64_t timeout_ns;
};

static void root_reply(int fd, uint32_t code) {
  sock_send_all(fd, &code, sizeof code, clock_ns() + HELLO_TIMEOUT_NS);
}

static void *root_main(void *arg) {
  struct root_state *st = arg;
  uint64_t deadline = clock_ns() + st->timeout_ns;
  int nranks = -1, joined = 0;
  int *fds = NULL;
  struct peer_info *infos = NULL;
  while (nranks < 0 || joined < nranks) {
    int fd;
    if (sock_accept(st->listen_fd, deadline, &fd) != weftSuccess) {
      WEFT_WARN(LOG_BOOTSTRAP, "root: %d of %d ranks joined before the timeout; giving up",
                joined, nranks);
      goto close_all;
    }
    struct hello h;
    if (sock_recv_all(fd, &h, sizeof h, clock_ns() + HELLO_TIMEOUT_NS) != weftSuccess ||
        h.magic != BOOTSTRAP_MAGIC || h.version != BOOTSTRAP_VERSION) {
      WEFT_INFO(LOG_BOOTSTRAP, "root: dropped a connection that did not say hello");
      close(fd);
      continue;
    }
    uint32_t code = ROOT_OK;
    if (!secret_equal(h.secret, st->secret)) code = ROOT_BAD_SECRET;
    else if (h.nranks < 1 || h.nranks > ROOT_MAX_RANKS || (nranks > 0 && h.nranks != nranks))
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
    if (fds == NULL) {
      nranks = h.nranks;
      fds = malloc(sizeof *fds * (size_t)nranks);
      infos = calloc((size_t)nranks, sizeof *infos);
      if (fds == NULL || infos == NULL) {
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
  }
  for (int r = 0; r < nranks; r++)
    sock_send_all(fds[r], infos, sizeof *infos * (size_t)nranks, clock_ns() + st->timeout_ns);
close_all:
  for (int r = 0; fds != NULL && infos != NULL && r < nranks; r++) /* fds is set once both are */
    if (fds[r] >= 0) close(fds[r]);
  free(fds);
  free(infos);
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

weftResult_t bootstrap_id_create(struct bootstrap_id *id_out) {
  struct bootstrap_id id;
  memset(&id, 0, sizeof id);
  id.magic = BOOTSTRAP_MAGIC;
  if (getrandom(id.secret, sizeof id.secret, 0) != (ssize_t)sizeof id.secret)
    return weft_error_errno(weftSystemError, "getrandom");
  union weft_sockaddr local;
  WEFT_TRY(sock_local_addr(&local));
  WEFT_TRY(bootstrap_root_start(&local, id.secret, &id.root));
  *id_out = id;
  return weftSuccess;
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
    case ROOT_BAD_SECRET: return "wrong secret (the unique id does not match the root's)";
    case ROOT_BAD_NRANKS: return "nranks differs from the other ranks'";
    case ROOT_BAD_RANK: return "rank out of range";
    case ROOT_DUP_RANK: return "another process already joined with this rank";
    default: return "unknown reason";
  }
}

static weftResult_t p2p_take(struct bootstrap *bs, int fd, const uint32_t *magic_read,
                             struct p2p_msg **msg_out);

/* Accepts the ring connection from prev. A point-to-point message from a
 * rank that finished joining first is kept for bootstrap_recv. */
static weftResult_t ring_accept_prev(struct bootstrap *bs, int listen_fd, int prev,
                                     uint64_t deadline, int *fd_out) {
  for (;;) {
    int fd;
    WEFT_TRY(sock_accept(listen_fd, deadline, &fd));
    struct ring_hello rh;
    uint64_t hello_deadline = clock_ns() + HELLO_TIMEOUT_NS;
    if (sock_recv_all(fd, &rh.magic, sizeof rh.magic, hello_deadline) != weftSuccess) {
      close(fd);
      continue;
    }
    if (rh.magic == P2P_MAGIC) {
      struct p2p_msg *m;
      if (p2p_take(bs, fd, &rh.magic, &m) == weftSuccess) {
        struct p2p_msg **link = &bs->unexpected;
        while (*link != NULL) link = &(*link)->next;
        *link = m; /* in arrival order, as bootstrap_recv matches them */
      }
      continue;
    }
    if (sock_recv_all(fd, (char *)&rh + sizeof rh.magic, sizeof rh - sizeof rh.magic,
                      hello_deadline) == weftSuccess &&
        rh.magic == BOOTSTRAP_MAGIC && rh.rank == prev && secret_equal(rh.secret, bs->secret)) {
      *fd_out = fd;
      return weftSuccess;
    }
    WEFT_WARN(LOG_BOOTSTRAP, "dropped a ring connection without the right secret or rank");
    close(fd);
  }
}

weftResult_t bootstrap_init(const struct bootstrap_id *id, int rank, int nranks,
                            const struct peer_info *self, uint64_t timeout_ns,
                            struct bootstrap **bs_out, struct peer_info *peers_out) {
  if (id->magic != BOOTSTRAP_MAGIC)
    return weft_error_set(weftInvalidArgument, "unique id is not a weft id (bad magic)");
  uint64_t deadline = clock_ns() + timeout_ns;
  char abuf[64];
  weftResult_t res;
  struct bootstrap *bs = calloc(1, sizeof *bs);
  if (bs == NULL) return weft_error_set(weftSystemError, "out of memory");
  bs->rank = rank;
  bs->nranks = nranks;
  bs->fd_next = bs->fd_prev = bs->listen_fd = -1;
  bs->timeout_ns = timeout_ns;
  memcpy(bs->secret, id->secret, sizeof bs->secret);

  /* our ring listener: loopback when the root is, else the chosen interface */
  union weft_sockaddr listen_addr;
  int listen_fd = -1, root_fd = -1;
  int root_loopback = id->root.sa.sa_family == AF_INET &&
                      (ntohl(id->root.in.sin_addr.s_addr) >> 24) == 127;
  if (root_loopback) {
    memset(&listen_addr, 0, sizeof listen_addr);
    listen_addr.in.sin_family = AF_INET;
    listen_addr.in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  } else {
    WEFT_TRY_GOTO(sock_local_addr(&listen_addr), res, free_bs);
  }
  WEFT_TRY_GOTO(sock_listen(&listen_addr, &listen_fd, &listen_addr), res, free_bs);

  struct hello h;
  memset(&h, 0, sizeof h);
  h.magic = BOOTSTRAP_MAGIC;
  h.version = BOOTSTRAP_VERSION;
  memcpy(h.secret, id->secret, sizeof h.secret);
  h.rank = rank;
  h.nranks = nranks;
  h.info = *self;
  h.info.listen_addr = listen_addr;
  WEFT_TRY_GOTO(sock_connect(&id->root, deadline, &root_fd), res, close_listen);
  WEFT_TRY_GOTO(sock_send_all(root_fd, &h, sizeof h, deadline), res, close_root);
  uint32_t code;
  res = sock_recv_all(root_fd, &code, sizeof code, deadline);
  if (res != weftSuccess) {
    weft_error_set(res, "bootstrap root at %s did not answer rank %d: %s",
                   sock_addr_str(&id->root, abuf, sizeof abuf), rank, weft_error_text());
    goto close_root;
  }
  if (code != ROOT_OK) {
    res = weft_error_set(weftInvalidArgument, "bootstrap root at %s refused rank %d of %d: %s",
                         sock_addr_str(&id->root, abuf, sizeof abuf), rank, nranks,
                         root_reply_text(code));
    goto close_root;
  }
  res = sock_recv_all(root_fd, peers_out, sizeof *peers_out * (size_t)nranks, deadline);
  if (res != weftSuccess) {
    weft_error_set(res, "waiting for all %d ranks to join at %s: %s", nranks,
                   sock_addr_str(&id->root, abuf, sizeof abuf), weft_error_text());
    goto close_root;
  }
  close(root_fd);
  root_fd = -1;

  if (nranks > 1) {
    int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
    struct ring_hello rh = {.magic = BOOTSTRAP_MAGIC, .rank = rank};
    memcpy(rh.secret, id->secret, sizeof rh.secret);
    WEFT_TRY_GOTO(sock_connect(&peers_out[next].listen_addr, deadline, &bs->fd_next), res,
                  close_listen);
    WEFT_TRY_GOTO(sock_send_all(bs->fd_next, &rh, sizeof rh, deadline), res, close_ring);
    WEFT_TRY_GOTO(ring_accept_prev(bs, listen_fd, prev, deadline, &bs->fd_prev), res, close_ring);
  }
  bs->addrs = malloc(sizeof *bs->addrs * (size_t)nranks);
  if (bs->addrs == NULL) {
    res = weft_error_set(weftSystemError, "out of memory");
    goto close_ring;
  }
  for (int r = 0; r < nranks; r++) bs->addrs[r] = peers_out[r].listen_addr;
  bs->listen_fd = listen_fd;
  *bs_out = bs;
  return weftSuccess;

close_ring:
  if (bs->fd_next >= 0) close(bs->fd_next);
  if (bs->fd_prev >= 0) close(bs->fd_prev);
close_root:
  if (root_fd >= 0) close(root_fd);
close_listen:
  close(listen_fd);
free_bs:
  while (bs->unexpected != NULL) {
    struct p2p_msg *m = bs->unexpected;
    bs->unexpected = m->next;
    free(m);
  }
  free(bs);
  return res;
}

/* Sends sbuf to fd_out while receiving rbuf from fd_in, so that neither side
 * blocks on a full socket buffer. */
static weftResult_t sock_exchange(int fd_out, const char *sbuf, int fd_in, char *rbuf,
                                  size_t nbytes, uint64_t deadline) {
  size_t sent = 0, got = 0;
  while (sent < nbytes || got < nbytes) {
    struct pollfd p[2] = {{.fd = sent < nbytes ? fd_out : -1, .events = POLLOUT},
                          {.fd = got < nbytes ? fd_in : -1, .events = POLLIN}};
    uint64_t now = clock_ns();
    if (now >= deadline) return weft_error_set(weftRemoteError, "bootstrap exchange timed out");
    int rc = poll(p, 2, (int)((deadline - now) / 1000000 + 1 > 1000 ? 1000 : (deadline - now) / 1000000 + 1));
    if (rc < 0 && errno != EINTR) return weft_error_errno(weftSystemError, "poll");
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
    weftResult_t res = sock_exchange(bs->fd_next, d + (size_t)send_block * nbytes, bs->fd_prev,
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
  if (bs->fd_next >= 0) close(bs->fd_next);
  if (bs->fd_prev >= 0) close(bs->fd_prev);
  if (bs->listen_fd >= 0) close(bs->listen_fd);
  while (bs->unexpected != NULL) {
    struct p2p_msg *m = bs->unexpected;
    bs->unexpected = m->next;
    free(m);
  }
  free(bs->addrs);
  free(bs);
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
  weftResult_t res = sock_connect(&bs->addrs[peer], deadline, &fd);
  if (res != weftSuccess)
    return weft_error_set(res, "bootstrap message to rank %d: %s", peer, weft_error_text());
  res = sock_send_all(fd, &h, sizeof h, deadline);
  if (res == weftSuccess && nbytes > 0) res = sock_send_all(fd, data, nbytes, deadline);
  close(fd);
  return res;
}

/* Reads the message on an accepted connection and closes it; magic_read:
 * the header's first word, when the caller read it already. Returns
 * weftInProgress for a sender without the secret (dropped). */
static weftResult_t p2p_take(struct bootstrap *bs, int fd, const uint32_t *magic_read,
                             struct p2p_msg **msg_out) {
  struct p2p_header h;
  size_t skip = magic_read != NULL ? sizeof h.magic : 0;
  if (magic_read != NULL) h.magic = *magic_read;
  uint64_t hello_deadline = clock_ns() + HELLO_TIMEOUT_NS;
  if (sock_recv_all(fd, (char *)&h + skip, sizeof h - skip, hello_deadline) != weftSuccess ||
      h.magic != P2P_MAGIC || !secret_equal(h.secret, bs->secret) || h.from < 0 ||
      h.from >= bs->nranks || h.nbytes > P2P_MAX_NBYTES) {
    WEFT_WARN(LOG_BOOTSTRAP, "dropped a bootstrap message without the right secret");
    close(fd);
    return weftInProgress;
  }
  struct p2p_msg *m = malloc(sizeof *m + h.nbytes);
  if (m == NULL) {
    close(fd);
    return weft_error_set(weftSystemError, "out of memory");
  }
  m->next = NULL;
  m->from = h.from;
  m->tag = h.tag;
  m->nbytes = h.nbytes;
  weftResult_t res = sock_recv_all(fd, m->data, h.nbytes, hello_deadline);
  close(fd);
  if (res != weftSuccess) {
    free(m);
    return weftInProgress;
  }
  *msg_out = m;
  return weftSuccess;
}

/* Accepts one message from the listener; drops senders without the secret. */
static weftResult_t p2p_accept(struct bootstrap *bs, uint64_t deadline, struct p2p_msg **msg_out) {
  for (;;) {
    int fd;
    WEFT_TRY(sock_accept(bs->listen_fd, deadline, &fd));
    weftResult_t res = p2p_take(bs, fd, NULL, msg_out);
    if (res != weftInProgress) return res;
  }
}

weftResult_t bootstrap_recv(struct bootstrap *bs, int peer, uint32_t tag, void *data,
                            size_t nbytes) {
  uint64_t deadline = clock_ns() + bs->timeout_ns;
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
    struct p2p_msg *m = NULL;
    /* accept in short slices, so that an abort is noticed promptly */
    uint64_t slice = clock_ns() + 100000000ull;
    weftResult_t res = p2p_accept(bs, slice < deadline ? slice : deadline, &m);
    if (res == weftRemoteError && clock_ns() < deadline) {
      if (bs->abort != NULL && __atomic_load_n(bs->abort, __ATOMIC_ACQUIRE))
        return weft_error_set(weftRemoteError, "aborted while waiting for rank %d", peer);
      continue;
    }
    if (res != weftSuccess)
      return weft_error_set(res, "waiting for a bootstrap message from rank %d: %s", peer,
                            weft_error_text());
    *link = m; /* append; the scan resumes at it */
  }
}
