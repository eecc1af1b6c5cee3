/* Joining a job (the root's admission and table) and the ring of sockets
 * that gives the ranks allgather and barrier. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../base/status.h"
#include "wire.h"

void bootstrap_set_abort(struct bootstrap *bs, const volatile uint32_t *abort) { bs->abort = abort; }

static const char *root_reply_text(uint32_t code) {
  switch (code) {
    case ROOT_BAD_NRANKS: return "nranks differs from the other ranks'";
    case ROOT_BAD_RANK: return "rank out of range";
    case ROOT_DUP_RANK: return "another process already joined with this rank";
    default: return "unknown reason";
  }
}

/* Accepts the ring connection from prev, keeping any point-to-point message
 * from a rank that finished joining first for bootstrap_recv. */
static weftResult_t ring_accept_prev(struct bootstrap *bs, int prev, uint64_t deadline,
                                     int *fd_out) {
  struct weft_wait w;
  bootstrap_watch(bs, prev, deadline - clock_ns(), "accept the bootstrap ring from", &w);
  int fd = -1;
  uint64_t probe_at = clock_ns() + RING_PROBE_NS;
  while (fd < 0) {
    weftResult_t res =
        bootstrap_listener_serve(bs, probe_at < deadline ? probe_at : deadline, &w, prev, &fd);
    if (res == weftInProgress && clock_ns() >= deadline)
      return weft_error_set(weftRemoteError, "timed out waiting for rank %d to join the ring",
                            prev);
    if (res != weftSuccess && res != weftInProgress) return res;
    if (fd >= 0) break;
    /* a rank that failed says so; one that died on another host (its pid
     * is not watched) is found by its listener, which refuses */
    const int failed = bootstrap_msg_failed_rank(bs, -1);
    if (failed >= 0)
      return weft_error_set(weftRemoteError, "rank %d failed while the bootstrap ring formed",
                            failed);
    if (clock_ns() >= probe_at) {
      char abuf[64];
      if (sock_probe_refused(&bs->addrs[prev], RING_PROBE_NS / 2))
        return weft_error_set(weftRemoteError,
                              "rank %d is gone (nothing listens at its bootstrap address %s any "
                              "more): it ended before joining the bootstrap ring",
                              prev, sock_addr_str(&bs->addrs[prev], abuf, sizeof abuf));
      probe_at = clock_ns() + RING_PROBE_NS;
    }
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
  /* the root gives up at its own deadline, about this one, and then says
   * which ranks did not join: its verdict is waited for a moment longer */
  uint32_t outcome;
  res = sock_recv_all(root_fd, &outcome, sizeof outcome, deadline + ROOT_VERDICT_GRACE_NS);
  if (res == weftSuccess && outcome == ROOT_RANK_LEFT) {
    int32_t left = -1;
    sock_recv_all(root_fd, &left, sizeof left, clock_ns() + HELLO_TIMEOUT_NS);
    return weft_error_set(weftRemoteError,
                          "rank %d left (exited, failed or died) before all %d ranks "
                          "joined at %s",
                          (int)left, nranks, root);
  }
  if (res == weftSuccess && outcome == ROOT_RANK_REFUSED) {
    struct root_refusal r = {0, -1, -1};
    sock_recv_all(root_fd, &r, sizeof r, clock_ns() + HELLO_TIMEOUT_NS);
    return weft_error_set(weftInvalidArgument,
                          "bootstrap root at %s refused another process of this job, which "
                          "asked to join as rank %d of %d (this rank %d of %d): %s; the ranks' calls "
                          "disagree", root, (int)r.rank, (int)r.nranks, rank, nranks,
                          root_reply_text(r.code));
  }
  if (res == weftSuccess && outcome == ROOT_OUT_OF_FDS) {
    struct root_fds f = {0, 0, 0};
    sock_recv_all(root_fd, &f, sizeof f, clock_ns() + HELLO_TIMEOUT_NS);
    return weft_error_set(weftSystemError,
                          "bootstrap root at %s is out of file descriptors: %d ranks need %u+ "
                          "descriptors in its process, RLIMIT_NOFILE is %u (hard limit %u); "
                          "raise it (ulimit -n) for the process that made the unique id",
                          root, nranks, f.need, f.soft, f.hard);
  }
  if (res == weftSuccess && outcome == ROOT_GAVE_UP) {
    struct root_missing m = {0, 0, {0}};
    if (sock_recv_all(root_fd, &m, sizeof m, clock_ns() + HELLO_TIMEOUT_NS) != weftSuccess ||
        m.nmissing == 0 || m.nmissing > (uint32_t)nranks)
      return weft_error_set(weftRemoteError, "bootstrap root at %s gave up: not every rank joined "
                            "in time", root);
    char list[256];
    size_t len = 0;
    for (uint32_t i = 0; i < m.nmissing && i < ROOT_MISSING_NAMED && len < sizeof list; i++)
      len += (size_t)snprintf(list + len, sizeof list - len, "%s%d", i ? "," : "", (int)m.ranks[i]);
    if (m.nmissing > ROOT_MISSING_NAMED && len < sizeof list)
      snprintf(list + len, sizeof list - len, " and %u more", m.nmissing - ROOT_MISSING_NAMED);
    return weft_error_set(weftRemoteError,
                          "bootstrap root at %s gave up at the timeout: %u of %d ranks joined; "
                          "rank%s %s never joined (not started, failed before joining, or given "
                          "another unique id, address or size)",
                          root, m.joined, nranks, m.nmissing > 1 ? "s" : "", list);
  }
  if (res == weftSuccess && outcome != ROOT_ALL_JOINED)
    return weft_error_set(weftRemoteError, "bootstrap root at %s sent an unknown outcome 0x%x",
                          root, outcome);
  if (res == weftSuccess)
    res = sock_recv_all(root_fd, peers_out, sizeof *peers_out * (size_t)nranks, deadline);
  if (res != weftSuccess)
    return weft_error_set(res, "waiting for all %d ranks to join at %s (a rank that did not "
                          "join in time was not started, failed before joining, or was given "
                          "another unique id): %s", nranks, root,
                          weft_error_text());
  return weftSuccess;
}

/* A rank that listens on a loopback address where a rank of another
 * machine or network namespace must reach it fails every rank alike (each
 * sees the same table), naming it, rather than leaving its peers to find
 * nothing at its address and take it for gone. */
static weftResult_t loopback_check(const struct peer_info *peers, int nranks) {
  int one_network = 1;
  for (int r = 1; r < nranks && one_network; r++)
    one_network = peers[r].net_hash == peers[0].net_hash;
  if (one_network) return weftSuccess; /* every loopback reaches every rank */
  for (int r = 0; r < nranks; r++) {
    if (!sock_addr_is_loopback(&peers[r].listen_addr)) continue;
    for (int s = 0; s < nranks; s++) {
      if (peers[s].net_hash == peers[r].net_hash) continue;
      char abuf[64];
      return weft_error_set(
          weftSystemError,
          "rank %d (host %s) listens on the loopback address %s, which rank %d (host %s) "
          "cannot reach: on host %s, WEFT_SOCKET_IFNAME allows only loopback, or its route "
          "to the rendezvous leaves by loopback (a host name that resolves to 127.x in "
          "/etc/hosts)",
          r, peers[r].hostname, sock_addr_str(&peers[r].listen_addr, abuf, sizeof abuf), s,
          peers[s].hostname, peers[r].hostname);
    }
  }
  return weftSuccess;
}

weftResult_t bootstrap_init(const struct bootstrap_id *id, int rank, int nranks,
                            const struct peer_info *self, uint64_t timeout_ns,
                            struct bootstrap **bs_out, struct peer_info *peers_out) {
  if (id->magic != BOOTSTRAP_MAGIC)
    return weft_error_set(weftInvalidArgument, "unique id is not a weft id (bad magic)");
  if (nranks < 1 || rank < 0 || rank >= nranks)
    return weft_error_set(weftInvalidArgument, "bootstrap: rank %d of %d", rank, nranks);
  uint64_t deadline = clock_ns() + timeout_ns;
  weftResult_t res;
  struct bootstrap *bs = calloc(1, sizeof *bs);
  if (bs == NULL) return weft_error_set(weftSystemError, "out of memory");
  bs->rank = rank;
  bs->nranks = nranks;
  bs->fd_next = bs->fd_prev = bs->listen_fd = -1;
  bs->timeout_ns = timeout_ns;
  memcpy(bs->secret, id->secret, sizeof bs->secret);
  bootstrap_query_init(bs);

  /* our listener, on the interface that reaches the root (loopback when the
   * root is on loopback) */
  union weft_sockaddr listen_addr;
  int root_fd = -1;
  WEFT_TRY_GOTO(sock_local_addr_to(&id->root, &listen_addr), res, free_bs);
  union weft_sockaddr query_addr = listen_addr;
  WEFT_TRY_GOTO(sock_listen(&listen_addr, &bs->listen_fd, &listen_addr), res, free_bs);
  WEFT_TRY_GOTO(sock_listen(&query_addr, &bs->query_fd, &query_addr), res, free_bs);

  struct hello h;
  memset(&h, 0, sizeof h);
  h.magic = BOOTSTRAP_MAGIC;
  h.version = BOOTSTRAP_VERSION;
  memcpy(h.secret, id->secret, sizeof h.secret);
  h.rank = rank;
  h.nranks = nranks;
  h.info = *self;
  h.info.listen_addr = listen_addr;
  h.info.query_addr = query_addr;
  WEFT_TRACE(LOG_BOOTSTRAP, "rank %d of %d: joining the root", rank, nranks);
  /* a root at a fixed address may not be up yet (rank 0 starts it): refused
   * is retried; any other root was up before its id existed */
  int connect_err = 0;
  const bool root_late = (id->flags & BOOTSTRAP_ID_ROOT_LATE) != 0;
  if (root_late)
    res = sock_connect_errno(&id->root, deadline, &root_fd, &connect_err);
  else
    res = sock_connect_peer_errno(&id->root, deadline, NULL, &root_fd, &connect_err);
  if (res != weftSuccess) {
    /* refused: the root's host is there and nothing listens on the id's port */
    const char *why = "";
    if (connect_err == ECONNREFUSED && root_late)
      why = "; rank 0 starts the root at this address, and it is not running, failed "
            "before joining, or was given another address or port";
    else if (connect_err == ECONNREFUSED)
      why = sock_addr_is_loopback(&id->root)
                ? " (the unique id names a loopback address, which only ranks on the host "
                  "that made it reach; or that process has exited)"
                : " (the process that made the unique id has exited, or the id is not this "
                  "job's)";
    char abuf[64];
    res = weft_error_set(res, "bootstrap root at %s: %s%s", sock_addr_str(&id->root, abuf, sizeof abuf),
                         weft_error_text(), why);
    goto free_bs;
  }
  WEFT_TRY_GOTO(sock_send_all(root_fd, &h, sizeof h, deadline), res, close_root);
  WEFT_TRY_GOTO(root_wait_table(root_fd, id, rank, nranks, deadline, peers_out), res, close_root);
  sock_close_reset(root_fd); /* all read; the root closes its end in order */
  root_fd = -1;
  WEFT_TRY_GOTO(loopback_check(peers_out, nranks), res, free_bs);

  bs->addrs = malloc(sizeof *bs->addrs * (size_t)nranks);
  bs->pids = calloc((size_t)nranks, sizeof *bs->pids);
  bs->query_addrs = malloc(sizeof *bs->query_addrs * (size_t)nranks);
  if (bs->addrs == NULL || bs->pids == NULL || bs->query_addrs == NULL) {
    res = weft_error_set(weftSystemError, "out of memory");
    goto free_bs;
  }
  /* the secret names the job, which a rendezvous at a fixed address keeps
   * from run to run; the ranks' processes name this run of it */
  bs->job_hash = bootstrap_hash_bytes(0xcbf29ce484222325ull, bs->secret, sizeof bs->secret);
  for (int r = 0; r < nranks; r++) {
    bs->job_hash = bootstrap_hash_bytes(bs->job_hash, &peers_out[r].pid, sizeof peers_out[r].pid);
    bs->job_hash = bootstrap_hash_bytes(bs->job_hash, &peers_out[r].host_hash,
                                        sizeof peers_out[r].host_hash);
  }
  for (int r = 0; r < nranks; r++) {
    bs->addrs[r] = peers_out[r].listen_addr;
    bs->query_addrs[r] = peers_out[r].query_addr;
    if (r != rank && peers_out[r].host_hash == self->host_hash) bs->pids[r] = peers_out[r].pid;
  }
  WEFT_TRACE(LOG_BOOTSTRAP, "rank %d: all %d ranks joined", rank, nranks);

  if (nranks > 1) {
    int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
    struct ring_hello rh = {.magic = BOOTSTRAP_MAGIC, .rank = rank};
    memcpy(rh.secret, id->secret, sizeof rh.secret);
    struct weft_wait w;
    bootstrap_watch(bs, next, timeout_ns, "connect the bootstrap ring to", &w);
    int connect_err = 0;
    res = sock_connect_peer_errno(&bs->addrs[next], deadline, &w, &bs->fd_next, &connect_err);
    if (res != weftSuccess && connect_err == ECONNREFUSED) {
      /* its listener is closed: it ended after the table reached it */
      char abuf[64];
      res = weft_error_set(weftRemoteError,
                           "rank %d is gone (nothing listens at its bootstrap address %s any "
                           "more): it ended before joining the bootstrap ring",
                           next, sock_addr_str(&bs->addrs[next], abuf, sizeof abuf));
    }
    if (res != weftSuccess) goto free_bs;
    WEFT_TRY_GOTO(sock_send_all(bs->fd_next, &rh, sizeof rh, deadline), res, free_bs);
    WEFT_TRY_GOTO(ring_accept_prev(bs, prev, deadline, &bs->fd_prev), res, free_bs);
  }
  WEFT_TRY_GOTO(bootstrap_query_start(bs), res, free_bs);
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

/* Appends to text what the ranks' question listeners say once the ring
 * broke or stalled: the ranks gone (nothing listens where they answered:
 * their process ended, or they closed the communicator) and those that did
 * not answer in half a second. Nothing when every rank answered. */
static void ring_missing(struct bootstrap *bs, char *text, size_t n) {
  const int nr = bs->nranks;
  if (bs->query_addrs == NULL || nr < 2) return;
  char *replies = calloc((size_t)nr, 1);
  size_t *got = calloc((size_t)nr, sizeof *got);
  enum bootstrap_ask_outcome *outcome = calloc((size_t)nr, sizeof *outcome);
  if (replies != NULL && got != NULL && outcome != NULL) {
    bootstrap_ask_all(bs, RING_ASK_NS, replies, 1, got, outcome, NULL, 0);
    static const struct {
      enum bootstrap_ask_outcome outcome;
      const char *one, *several;
    } kinds[] = {{BOOTSTRAP_ASK_GONE, "is gone (its process ended, or it left)",
                  "are gone (their processes ended, or they left)"},
                 {BOOTSTRAP_ASK_SILENT, "did not answer in half a second",
                  "did not answer in half a second"}};
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
      char list[128] = "";
      size_t len = 0;
      int count = 0;
      for (int r = 0; r < nr && len < sizeof list; r++) {
        if (r == bs->rank || outcome[r] != kinds[k].outcome) continue;
        len += (size_t)snprintf(list + len, sizeof list - len, "%s%d", count++ ? "," : "", r);
      }
      size_t at = strlen(text);
      if (count > 0 && at < n)
        snprintf(text + at, n - at, "; rank%s %s %s", count > 1 ? "s" : "", list,
                 count > 1 ? kinds[k].several : kinds[k].one);
    }
  }
  free(replies);
  free(got);
  free(outcome);
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
    if (now >= deadline) {
      char missing[256] = "";
      ring_missing(bs, missing, sizeof missing);
      return weft_error_set(weftRemoteError,
                            "bootstrap exchange timed out (%s from rank %d, %s to rank %d)%s",
                            got < nbytes ? "receiving" : "received",
                            (bs->rank + bs->nranks - 1) % bs->nranks,
                            sent < nbytes ? "sending" : "sent", (bs->rank + 1) % bs->nranks,
                            missing);
    }
    if (bs->abort != NULL && __atomic_load_n(bs->abort, __ATOMIC_ACQUIRE))
      return weft_error_set(weftRemoteError, "communicator aborted during a bootstrap exchange");
    uint64_t ms = (deadline - now) / 1000000 + 1;
    int rc = poll(p, bs->hellos.n > 0 ? 2 : 3, ms > 100 ? 100 : (int)ms);
    if (rc < 0 && errno != EINTR) return weft_error_errno(weftSystemError, "poll");
    /* a rank's failure counts once the ring stalls: what it (and the rest)
     * sent before failing completes the exchange first */
    int failed = rc == 0 ? bootstrap_msg_failed_rank(bs, -1) : -1;
    if (failed >= 0)
      return weft_error_set(weftRemoteError, "rank %d failed during a bootstrap exchange", failed);
    if (bs->hellos.n > 0 || (rc > 0 && (p[2].revents & POLLIN))) {
      /* take what is ready there without waiting */
      weftResult_t res = bootstrap_listener_serve(bs, clock_ns() + 1000000ull, NULL, -1, NULL);
      if (res != weftSuccess && res != weftInProgress) return res;
    }
    if (rc <= 0) continue;
    if (p[0].revents & (POLLOUT | POLLERR | POLLHUP)) {
      ssize_t n = send(fd_out, sbuf + sent, nbytes - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) sent += (size_t)n;
      else if (n < 0 && errno != EAGAIN && errno != EINTR) {
        const int err = errno;
        char missing[256] = "";
        ring_missing(bs, missing, sizeof missing);
        return weft_error_set(weftRemoteError, "bootstrap send to rank %d: %s%s",
                              (bs->rank + 1) % bs->nranks, strerror(err), missing);
      }
    }
    if (p[1].revents & (POLLIN | POLLERR | POLLHUP)) {
      ssize_t n = recv(fd_in, rbuf + got, nbytes - got, MSG_DONTWAIT);
      if (n > 0) got += (size_t)n;
      else if (n == 0) {
        /* the previous rank closed its end: it failed, or one before it did
         * and it closed in turn */
        char missing[256] = "";
        ring_missing(bs, missing, sizeof missing);
        return weft_error_set(weftRemoteError, "rank %d, the previous in the bootstrap ring, "
                              "closed it%s", (bs->rank + bs->nranks - 1) % bs->nranks, missing);
      }
      else if (errno != EAGAIN && errno != EINTR)
        return weft_error_errno(weftRemoteError, "bootstrap receive from rank %d",
                                (bs->rank + bs->nranks - 1) % bs->nranks);
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
  bootstrap_query_stop(bs);
  /* data only flows from prev to this rank, and every exchange of ours is
   * complete: the reading end resets, the writing end closes in order */
  if (bs->fd_next >= 0) close(bs->fd_next);
  if (bs->fd_prev >= 0) sock_close_reset(bs->fd_prev);
  if (bs->listen_fd >= 0) close(bs->listen_fd);
  sock_hellos_close(&bs->hellos);
  while (bs->unexpected != NULL) {
    struct bs_msg *m = bs->unexpected;
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
