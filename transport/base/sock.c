#include "sock.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include "param.h"
#include "status.h"
#include "wait.h"

struct weft_param sock_params[] = {
    {.name = "WEFT_SOCKET_IFNAME", .type = PARAM_STR,
     .doc = "interfaces that bootstrap and socket-transport listeners may bind, in NCCL's "
            "syntax: comma-separated name prefixes (`eth,ib`); `^` first excludes the listed "
            "ones (`^docker,lo`); `=` first, after `^` if both, makes them whole names "
            "(`=eth0`, `^=docker0`). Of the allowed interfaces that are up (all when unset), "
            "listeners take the first of: running ones other than loopback and `docker*`, "
            "then `docker*`, then those without a carrier, then loopback (said at `WEFT_DEBUG=INFO` "
            "when unset); IPv4 before IPv6 in each, link-local addresses skipped. Unset, a unique "
            "id's root (`weftGetUniqueId`) listens on that choice and each rank's listeners "
            "on the interface its route to that root leaves by. `weftrun` sets it to the "
            "loopback interface's exact name (`=lo`)"},
    PARAM_END,
};
enum { P_IFNAME };

const char *sock_addr_str(const union weft_sockaddr *addr, char *buf, size_t nbytes) {
  char ip[INET6_ADDRSTRLEN] = "?";
  if (addr->sa.sa_family == AF_INET) {
    inet_ntop(AF_INET, &addr->in.sin_addr, ip, sizeof ip);
    snprintf(buf, nbytes, "%s:%d", ip, ntohs(addr->in.sin_port));
  } else if (addr->sa.sa_family == AF_INET6) {
    /* brackets: the address's own colons are not the port's */
    inet_ntop(AF_INET6, &addr->in6.sin6_addr, ip, sizeof ip);
    snprintf(buf, nbytes, "[%s]:%d", ip, ntohs(addr->in6.sin6_port));
  } else {
    snprintf(buf, nbytes, "?:0");
  }
  return buf;
}

static socklen_t addr_len(const union weft_sockaddr *a) {
  return a->sa.sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
}

weftResult_t sock_resolve(const char *host, int port, union weft_sockaddr *addr_out) {
  struct addrinfo hints = {0}, *res = NULL;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_family = AF_UNSPEC;
  int rc = getaddrinfo(host, NULL, &hints, &res);
  if (rc != 0)
    return weft_error_set(weftInvalidArgument, "cannot resolve host '%s': %s", host,
                          gai_strerror(rc));
  union weft_sockaddr a;
  memset(&a, 0, sizeof a);
  memcpy(&a, res->ai_addr, res->ai_addrlen < sizeof a ? res->ai_addrlen : sizeof a);
  freeaddrinfo(res);
  if (a.sa.sa_family == AF_INET) a.in.sin_port = htons((uint16_t)port);
  else a.in6.sin6_port = htons((uint16_t)port);
  *addr_out = a;
  return weftSuccess;
}

/* --- choosing the interface --------------------------------------------- */

/* Whether name is item: the whole name (exact) or its beginning. */
static int ifname_item_match(const char *item, size_t len, const char *name, int exact) {
  if (strncmp(name, item, len) != 0) return 0;
  return !exact || name[len] == '\0';
}

/* The list's names less its '^' and '=': *exclude_p, *exact_p say which were there. */
static const char *ifname_list_names(const char *list, int *exclude_p, int *exact_p) {
  *exclude_p = list[0] == '^';
  if (*exclude_p) list++;
  *exact_p = list[0] == '=';
  if (*exact_p) list++;
  return list;
}

static int ifname_list_has_names(const char *list) {
  int exclude, exact;
  const char *names = ifname_list_names(list, &exclude, &exact);
  return names[strspn(names, ",")] != '\0';
}

int sock_ifname_match(const char *list, const char *name) {
  if (list == NULL || !ifname_list_has_names(list)) return 1;
  int exclude, exact;
  const char *p = ifname_list_names(list, &exclude, &exact);
  int listed = 0;
  while (*p != '\0' && !listed) {
    size_t len = strcspn(p, ",");
    listed = len > 0 && ifname_item_match(p, len, name, exact); /* "a,,b": no empty name */
    p += len;
    if (*p == ',') p++;
  }
  return listed != exclude;
}

/* How good an address is to listen on, lower is better; -1: not usable. */
static int sock_if_rank(const struct sock_if *i) {
  int family = i->addr.sa.sa_family;
  if (!(i->flags & IFF_UP) || (family != AF_INET && family != AF_INET6)) return -1;
  /* a link-local address needs its interface named by every peer */
  if (family == AF_INET6 && IN6_IS_ADDR_LINKLOCAL(&i->addr.in6.sin6_addr)) return -1;
  int cls;
  if ((i->flags & IFF_LOOPBACK) || sock_addr_is_loopback(&i->addr)) cls = 3;
  else if (!(i->flags & IFF_RUNNING)) cls = 2; /* no carrier: an empty bridge, a cable out */
  else if (strncmp(i->name, "docker", 6) == 0) cls = 1; /* reaches this host's containers */
  else cls = 0;
  return cls * 2 + (family == AF_INET6);
}

int sock_if_choose(const struct sock_if *ifs, int n, const char *list) {
  int best = -1, best_rank = 0;
  for (int k = 0; k < n; k++) {
    int r = sock_if_rank(&ifs[k]);
    if (r < 0 || !sock_ifname_match(list, ifs[k].name)) continue;
    if (best < 0 || r < best_rank) {
      best = k;
      best_rank = r;
    }
  }
  return best;
}

/* The interfaces that are up, as "eth0, lo": for an error that says what there is. */
static void sock_ifs_names(const struct sock_if *ifs, int n, char *buf, size_t nbytes) {
  size_t o = 0;
  buf[0] = '\0';
  for (int k = 0; k < n && o < nbytes; k++) {
    if (!(ifs[k].flags & IFF_UP)) continue;
    int seen = 0;
    for (int j = 0; j < k && !seen; j++) seen = strcmp(ifs[j].name, ifs[k].name) == 0;
    if (seen) continue;
    int w = snprintf(buf + o, nbytes - o, "%s%s", o > 0 ? ", " : "", ifs[k].name);
    if (w < 0) break;
    o += (size_t)w;
  }
}

weftResult_t sock_local_addr(union weft_sockaddr *addr_out) {
  const char *want = param_str(&sock_params[P_IFNAME]);
  struct ifaddrs *all = NULL;
  if (getifaddrs(&all) != 0) return weft_error_errno(weftSystemError, "getifaddrs");
  int n = 0;
  for (struct ifaddrs *i = all; i != NULL; i = i->ifa_next) n++;
  struct sock_if *ifs = calloc((size_t)n + 1, sizeof *ifs);
  if (ifs == NULL) {
    freeifaddrs(all);
    return weft_error_set(weftSystemError, "out of memory");
  }
  n = 0;
  for (struct ifaddrs *i = all; i != NULL; i = i->ifa_next) {
    struct sock_if *e = &ifs[n++];
    e->name = i->ifa_name;
    e->flags = i->ifa_flags;
    if (i->ifa_addr != NULL && i->ifa_addr->sa_family == AF_INET)
      memcpy(&e->addr.in, i->ifa_addr, sizeof e->addr.in);
    else if (i->ifa_addr != NULL && i->ifa_addr->sa_family == AF_INET6)
      memcpy(&e->addr.in6, i->ifa_addr, sizeof e->addr.in6);
  }
  int k = sock_if_choose(ifs, n, want);
  union weft_sockaddr found;
  memset(&found, 0, sizeof found);
  weftResult_t res = weftSuccess;
  char names[256];
  if (k >= 0) {
    found = ifs[k].addr;
  } else if (want != NULL && ifname_list_has_names(want)) {
    sock_ifs_names(ifs, n, names, sizeof names);
    res = weft_error_set(weftInvalidArgument,
                         "WEFT_SOCKET_IFNAME=%s: no interface it allows is up with an address "
                         "(up: %s)", want, names[0] != '\0' ? names : "none");
  } else {
    found.in.sin_family = AF_INET;
    found.in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  }
  int default_loopback = res == weftSuccess && sock_addr_is_loopback(&found) &&
                         (want == NULL || !ifname_list_has_names(want));
  free(ifs);
  freeifaddrs(all);
  if (res != weftSuccess) return res;
  if (found.sa.sa_family == AF_INET) found.in.sin_port = 0;
  else found.in6.sin6_port = 0;
  static int warned;
  if (default_loopback && !__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED)) {
    char buf[64];
    /* said, not warned: one host alone is a usual job */
    WEFT_INFO(LOG_INIT, "no interface but loopback is up: listening on %s, which ranks on "
              "other hosts cannot reach", sock_addr_str(&found, buf, sizeof buf));
  }
  *addr_out = found;
  return weftSuccess;
}

int sock_addr_is_loopback(const union weft_sockaddr *addr) {
  if (addr->sa.sa_family == AF_INET) return (ntohl(addr->in.sin_addr.s_addr) >> 24) == 127;
  if (addr->sa.sa_family == AF_INET6) return IN6_IS_ADDR_LOOPBACK(&addr->in6.sin6_addr);
  return 0;
}

weftResult_t sock_local_addr_to(const union weft_sockaddr *peer, union weft_sockaddr *addr_out) {
  const char *want = param_str(&sock_params[P_IFNAME]);
  if (want != NULL && ifname_list_has_names(want)) return sock_local_addr(addr_out);
  /* a datagram socket "connected" to the peer sends nothing, but the kernel
   * picks the route and so the local address */
  int fd = socket(peer->sa.sa_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return weft_error_errno(weftSystemError, "socket");
  union weft_sockaddr to = *peer, local;
  if (to.sa.sa_family == AF_INET && to.in.sin_port == 0) to.in.sin_port = htons(9);
  if (to.sa.sa_family == AF_INET6 && to.in6.sin6_port == 0) to.in6.sin6_port = htons(9);
  socklen_t len = sizeof local;
  memset(&local, 0, sizeof local);
  int ok = connect(fd, &to.sa, addr_len(&to)) == 0 && getsockname(fd, &local.sa, &len) == 0;
  close(fd);
  if (!ok) return sock_local_addr(addr_out); /* no route yet: the default choice */
  if (local.sa.sa_family == AF_INET) local.in.sin_port = 0;
  else local.in6.sin6_port = 0;
  *addr_out = local;
  return weftSuccess;
}

static weftResult_t fd_set_nonblock(int fd, int on) {
  int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || fcntl(fd, F_SETFL, on ? flags | O_NONBLOCK : flags & ~O_NONBLOCK) != 0)
    return weft_error_errno(weftSystemError, "fcntl O_NONBLOCK");
  return weftSuccess;
}

/* A listener on a fixed port (WEFT_COMM_ID) sets SO_REUSEADDR, so that the
 * port can be bound again at once while its last connections linger in
 * TIME_WAIT. One on a port the kernel picks does not: the kernel then never
 * hands out a port that a lingering connection still names, whose
 * leftovers would answer a new client's SYN in the listener's place. */
static void sock_set_reuse(int fd, const union weft_sockaddr *addr) {
  int port = addr->sa.sa_family == AF_INET ? addr->in.sin_port : addr->in6.sin6_port;
  if (port == 0) return;
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
}

weftResult_t sock_listen(const union weft_sockaddr *addr, int *fd_out,
                         union weft_sockaddr *bound_out) {
  /* non-blocking: poll says a connection is ready, and accept must not block
   * when that connection was reset meanwhile */
  int fd = socket(addr->sa.sa_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return weft_error_errno(weftSystemError, "socket");
  sock_set_reuse(fd, addr);
  char buf[64];
  if (bind(fd, &addr->sa, addr_len(addr)) != 0) {
    weft_error_errno(weftSystemError, "bind %s", sock_addr_str(addr, buf, sizeof buf));
    goto close_fd;
  }
  if (listen(fd, 1024) != 0) {
    weft_error_errno(weftSystemError, "listen");
    goto close_fd;
  }
  union weft_sockaddr bound;
  socklen_t len = sizeof bound;
  if (getsockname(fd, &bound.sa, &len) != 0) {
    weft_error_errno(weftSystemError, "getsockname");
    goto close_fd;
  }
  *fd_out = fd;
  if (bound_out) *bound_out = bound;
  return weftSuccess;
close_fd:
  close(fd);
  return weftSystemError;
}

/* No delay for small messages; and a peer host that dies or a link that goes
 * down fails the socket within WEFT_TIMEOUT (data unacknowledged that long,
 * or keepalive probes unanswered), so a proxy waiting on it hears of it. A
 * live peer's TCP acknowledges whatever its process does. */
static void sock_tune(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  uint64_t timeout_ms = wait_default_timeout_ns() / 1000000ull;
  if (timeout_ms == 0 || timeout_ms > 0x7fffffffull) return;
  unsigned user_ms = (unsigned)timeout_ms;
  int probe_s = (int)(timeout_ms / 3000) > 0 ? (int)(timeout_ms / 3000) : 1, count = 3;
  setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_ms, sizeof user_ms);
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &probe_s, sizeof probe_s);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &probe_s, sizeof probe_s);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof count);
}

/* How long one poll may sleep: the watch is looked at this often. */
#define SOCK_SLICE_MS 20

/* Checks watch; weftInProgress to go on. */
static weftResult_t sock_watch_check(struct weft_wait *watch) {
  if (watch == NULL) return weftInProgress;
  return wait_check(watch);
}

/* Waits for events on fd until the deadline; EINTR retried. */
static weftResult_t sock_poll(int fd, short events, uint64_t deadline_ns, struct weft_wait *watch,
                              const char *what) {
  wait_prelude_run(); /* a wait as any other (wait.h) */
  for (;;) {
    uint64_t now = clock_ns();
    if (now >= deadline_ns)
      return weft_error_set(weftRemoteError, "timed out in %s", what);
    weftResult_t res = sock_watch_check(watch);
    if (res != weftInProgress) return res;
    uint64_t left_ms = (deadline_ns - now) / 1000000 + 1;
    uint64_t cap_ms = watch != NULL ? SOCK_SLICE_MS : 1000;
    struct pollfd p = {.fd = fd, .events = events};
    int rc = poll(&p, 1, (int)(left_ms > cap_ms ? cap_ms : left_ms));
    if (rc > 0) return weftSuccess;
    if (rc < 0 && errno != EINTR) return weft_error_errno(weftSystemError, "poll in %s", what);
  }
}

/* One non-blocking connect, waited for until the deadline or for one attempt
 * (SOCK_ATTEMPT_NS), whichever is first; the socket's own error in *err_out
 * (0 when connected, ETIMEDOUT when the attempt ran out: the caller may try
 * again from a fresh socket, whose new source port gets past a handshake
 * that stalled). */
#define SOCK_ATTEMPT_NS 1000000000ull
static weftResult_t sock_connect_once(const union weft_sockaddr *addr, uint64_t deadline_ns,
                                      struct weft_wait *watch, int *fd_out, int *err_out) {
  int fd = socket(addr->sa.sa_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return weft_error_errno(weftSystemError, "socket");
  int err = 0;
  if (connect(fd, &addr->sa, addr_len(addr)) != 0) err = errno;
  if (err == EINPROGRESS) {
    uint64_t attempt_end = clock_ns() + SOCK_ATTEMPT_NS;
    if (attempt_end > deadline_ns) attempt_end = deadline_ns;
    err = ETIMEDOUT;
    for (;;) {
      /* polled at least once, so that an answer already here (a refusal)
       * is not taken for no answer at the deadline */
      uint64_t now = clock_ns();
      weftResult_t res = sock_watch_check(watch);
      if (res != weftInProgress) {
        close(fd);
        return res;
      }
      uint64_t ms = now >= attempt_end ? 0 : (attempt_end - now) / 1000000 + 1;
      struct pollfd p = {.fd = fd, .events = POLLOUT};
      int rc = poll(&p, 1, (int)(ms > SOCK_SLICE_MS ? SOCK_SLICE_MS : ms));
      if (rc > 0) {
        socklen_t len = sizeof err;
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
        break;
      }
      if (rc < 0 && errno != EINTR) {
        res = weft_error_errno(weftSystemError, "poll in connect");
        close(fd);
        return res;
      }
      if (now >= attempt_end) break;
    }
  }
  if (err == 0) {
    weftResult_t res = fd_set_nonblock(fd, 0);
    if (res != weftSuccess) {
      close(fd);
      return res;
    }
    sock_tune(fd);
    *fd_out = fd;
  } else {
    close(fd);
  }
  *err_out = err;
  return weftSuccess;
}

int sock_probe_refused(const union weft_sockaddr *addr, uint64_t timeout_ns) {
  int fd = socket(addr->sa.sa_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return 0;
  int err = 0;
  if (connect(fd, &addr->sa, addr_len(addr)) != 0) err = errno;
  if (err == EINPROGRESS) {
    struct pollfd p = {.fd = fd, .events = POLLOUT};
    int rc;
    do
      rc = poll(&p, 1, (int)(timeout_ns / 1000000));
    while (rc < 0 && errno == EINTR);
    socklen_t len = sizeof err;
    if (rc <= 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = 0;
  }
  close(fd);
  return err == ECONNREFUSED;
}

bool sock_connect_err_transient(int err) {
  return err == EINTR || err == EAGAIN || err == ETIMEDOUT || err == ENETUNREACH ||
         err == EHOSTUNREACH || err == ECONNRESET;
}

/* What a connect's last error says of the address, for the error text. */
static const char *sock_connect_why(int err) {
  switch (err) {
  case ECONNREFUSED:
    return " (nothing listens there)";
  case ENETUNREACH:
  case EHOSTUNREACH:
    return " (the address is not reachable from this host: WEFT_SOCKET_IFNAME chooses the "
           "interface each host listens on)";
  case ETIMEDOUT:
    return " (no answer: the address is not reachable from this host, or a firewall drops "
           "the connection; WEFT_SOCKET_IFNAME chooses the interface each host listens on)";
  default:
    return "";
  }
}

/* Connects; *err_out is the last attempt's errno, 0 when the failure was not
 * the connection's (the watch, this process). */
static weftResult_t sock_connect_impl(const union weft_sockaddr *addr, uint64_t deadline_ns,
                                      struct weft_wait *watch, int refused_final, int *fd_out,
                                      int *err_out) {
  char buf[64];
  unsigned delay_us = 1000;
  *err_out = 0;
  for (;;) {
    int fd = -1, err = 0;
    WEFT_TRY(sock_connect_once(addr, deadline_ns, watch, &fd, &err));
    if (err == 0) {
      *fd_out = fd;
      return weftSuccess;
    }
    if (err == ECONNREFUSED && refused_final) {
      *err_out = err;
      return weft_error_set(weftRemoteError, "connect to %s: %s%s",
                            sock_addr_str(addr, buf, sizeof buf), strerror(err),
                            sock_connect_why(err));
    }
    /* a reset before the connection is made (a listener whose backlog
     * overflowed while many ranks connect at once) sent nothing: try again */
    if (err != ECONNREFUSED && !sock_connect_err_transient(err)) {
      *err_out = err;
      errno = err;
      return weft_error_errno(weftSystemError, "connect to %s",
                              sock_addr_str(addr, buf, sizeof buf));
    }
    weftResult_t res = sock_watch_check(watch);
    if (res != weftInProgress) return res;
    struct timespec ts = {0, (long)delay_us * 1000};
    nanosleep(&ts, NULL);
    if (delay_us < 20000) delay_us *= 2;
    /* no attempt starts past the deadline: the last one's error is the
     * answer (a refusal is not reported as no answer) */
    if (clock_ns() >= deadline_ns) {
      *err_out = err;
      return weft_error_set(weftRemoteError, "connect to %s, tried until the deadline: %s%s",
                            sock_addr_str(addr, buf, sizeof buf), strerror(err),
                            sock_connect_why(err));
    }
  }
}

weftResult_t sock_connect(const union weft_sockaddr *addr, uint64_t deadline_ns, int *fd_out) {
  int err;
  return sock_connect_impl(addr, deadline_ns, NULL, 0, fd_out, &err);
}

weftResult_t sock_connect_errno(const union weft_sockaddr *addr, uint64_t deadline_ns, int *fd_out,
                                int *err_out) {
  return sock_connect_impl(addr, deadline_ns, NULL, 0, fd_out, err_out);
}

weftResult_t sock_connect_peer(const union weft_sockaddr *addr, uint64_t deadline_ns,
                               struct weft_wait *watch, int *fd_out) {
  int err;
  return sock_connect_impl(addr, deadline_ns, watch, 1, fd_out, &err);
}

weftResult_t sock_connect_peer_errno(const union weft_sockaddr *addr, uint64_t deadline_ns,
                                     struct weft_wait *watch, int *fd_out, int *err_out) {
  return sock_connect_impl(addr, deadline_ns, watch, 1, fd_out, err_out);
}

/* One address of sock_connect_many: its attempt under way (fd), or the time
 * of the next. */
struct connect_slot {
  int fd;          /* the attempt's socket, -1 between attempts */
  int done;        /* connected or given up */
  uint64_t end_ns; /* the attempt's end (SOCK_ATTEMPT_NS), or the next's start */
  unsigned delay_us;
};

/* What sock_connect_many calls as each connection is made. */
struct connect_hook {
  void (*fn)(void *arg, int i, int *fd);
  void *arg;
};

/* Ends slot i's attempt with its socket's outcome err: connected, refused
 * (final), or another try after a pause. */
static void connect_slot_settle(struct connect_slot *c, int i, int err, int *fds, int *errs,
                                const struct connect_hook *hook) {
  errs[i] = err;
  if (err == 0 && fd_set_nonblock(c->fd, 0) == weftSuccess) {
    sock_tune(c->fd);
    fds[i] = c->fd;
    c->done = 1;
    if (hook->fn != NULL) hook->fn(hook->arg, i, &fds[i]);
    return;
  }
  close(c->fd);
  c->fd = -1;
  if (err == 0) errs[i] = EIO;
  /* tried again: what a network on its way, or a listener's full backlog,
   * says; refused and this host's own failures (no address, not allowed)
   * are final, as sock_connect_peer's */
  if (!sock_connect_err_transient(err)) {
    c->done = 1;
    return;
  }
  c->end_ns = clock_ns() + c->delay_us * 1000ull;
  c->delay_us = c->delay_us < 100000 ? c->delay_us * 2 : 100000;
}

void sock_connect_many(const union weft_sockaddr *const *addrs, int n, uint64_t deadline_ns,
                       int *fds, int *errs, void (*connected)(void *arg, int i, int *fd),
                       void *arg) {
  const struct connect_hook hook = {connected, arg};
  struct connect_slot *c = calloc((size_t)(n > 0 ? n : 1), sizeof *c);
  struct pollfd *p = calloc((size_t)(n > 0 ? n : 1), sizeof *p);
  int *at = calloc((size_t)(n > 0 ? n : 1), sizeof *at);
  for (int i = 0; i < n; i++) {
    fds[i] = -1;
    errs[i] = addrs[i] == NULL ? 0 : ETIMEDOUT;
    if (c != NULL) c[i] = (struct connect_slot){-1, addrs[i] == NULL, 0, 1000};
  }
  if (c == NULL || p == NULL || at == NULL) { /* out of memory: one after another */
    for (int i = 0; i < n; i++)
      if (addrs[i] != NULL && sock_connect_peer_errno(addrs[i], deadline_ns, NULL, &fds[i],
                                                      &errs[i]) != weftSuccess)
        fds[i] = -1;
      else if (addrs[i] != NULL && connected != NULL)
        connected(arg, i, &fds[i]);
    goto out;
  }
  for (;;) {
    uint64_t now = clock_ns(), wake = deadline_ns;
    int npoll = 0, left = 0;
    for (int i = 0; i < n; i++) {
      if (c[i].done) continue;
      left++;
      if (c[i].fd < 0 && now >= c[i].end_ns && now < deadline_ns) { /* the next attempt */
        c[i].fd = socket(addrs[i]->sa.sa_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (c[i].fd < 0) {
          errs[i] = errno;
          c[i].done = 1;
          left--;
          continue;
        }
        c[i].end_ns = now + SOCK_ATTEMPT_NS;
        int err = connect(c[i].fd, &addrs[i]->sa, addr_len(addrs[i])) == 0 ? 0 : errno;
        if (err != EINPROGRESS) {
          connect_slot_settle(&c[i], i, err, fds, errs, &hook);
          if (c[i].done) left--;
          continue;
        }
      }
      if (c[i].fd >= 0 && now >= c[i].end_ns) { /* the attempt timed out: another */
        connect_slot_settle(&c[i], i, ETIMEDOUT, fds, errs, &hook);
        continue;
      }
      if (c[i].end_ns < wake) wake = c[i].end_ns;
      if (c[i].fd >= 0) {
        p[npoll] = (struct pollfd){.fd = c[i].fd, .events = POLLOUT};
        at[npoll++] = i;
      }
    }
    if (left == 0 || now >= deadline_ns) break;
    uint64_t ms = wake > now ? (wake - now) / 1000000 + 1 : 0;
    int rc = poll(p, (nfds_t)npoll, (int)(ms > SOCK_SLICE_MS ? SOCK_SLICE_MS : ms));
    for (int k = 0; rc > 0 && k < npoll; k++) {
      if (p[k].revents == 0) continue;
      const int i = at[k];
      int err = 0;
      socklen_t len = sizeof err;
      if (getsockopt(c[i].fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
      connect_slot_settle(&c[i], i, err, fds, errs, &hook);
    }
  }
  for (int i = 0; i < n; i++) /* attempts still under way at the deadline */
    if (!c[i].done && c[i].fd >= 0) close(c[i].fd);
out:
  free(c);
  free(p);
  free(at);
}

weftResult_t sock_accept(int listen_fd, uint64_t deadline_ns, struct weft_wait *watch,
                         int *fd_out) {
  for (;;) {
    WEFT_TRY(sock_poll(listen_fd, POLLIN, deadline_ns, watch, "accept"));
    int fd = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC);
    if (fd >= 0) {
      sock_tune(fd);
      *fd_out = fd;
      return weftSuccess;
    }
    if (errno != EINTR && errno != EAGAIN && errno != ECONNABORTED)
      return weft_error_errno(weftSystemError, "accept");
  }
}

/* --- unproven connections ----------------------------------------------- */

static void sock_hellos_drop(struct sock_hellos *hs, int i, const char *why) {
  WEFT_INFO(LOG_BOOTSTRAP, "dropped an unproven connection: %s", why);
  sock_close_reset(hs->v[i].fd);
  memmove(&hs->v[i], &hs->v[i + 1], sizeof hs->v[0] * (size_t)(hs->n - i - 1));
  hs->n--;
}

void sock_hellos_close(struct sock_hellos *hs) {
  for (int i = 0; i < hs->n; i++) sock_close_reset(hs->v[i].fd);
  hs->n = 0;
}

/* The connection to let go when no more fit: the oldest that has sent
 * nothing yet for SOCK_HELLO_GRACE_NS, -1 when there is none. A connection
 * with bytes in may carry a peer's whole message (the sender has closed
 * already), so it is never dropped unread; a younger idle one may be a peer
 * about to write. The rest wait in the listener's backlog. */
static int sock_hellos_victim(const struct sock_hellos *hs, uint64_t now) {
  for (int i = 0; i < hs->n; i++) {
    int avail = 0;
    if (hs->v[i].got == 0 && now - hs->v[i].accepted_ns >= SOCK_HELLO_GRACE_NS &&
        ioctl(hs->v[i].fd, FIONREAD, &avail) == 0 && avail == 0)
      return i;
  }
  return -1;
}

/* Whether the listener may be accepted from: room, or an idle one to drop. */
static int sock_hellos_room(const struct sock_hellos *hs, uint64_t now) {
  return hs->n < SOCK_HELLOS_MAX || sock_hellos_victim(hs, now) >= 0;
}

/* Accepts the connections waiting on the listener while there is room. */
static weftResult_t sock_hellos_accept(struct sock_hellos *hs, int listen_fd,
                                       uint64_t hello_timeout_ns) {
  for (;;) {
    if (hs->n == SOCK_HELLOS_MAX) {
      int victim = sock_hellos_victim(hs, clock_ns());
      if (victim < 0) return weftSuccess;
      sock_hellos_drop(hs, victim, "too many unproven connections");
    }
    int fd = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == ECONNABORTED || errno == EINTR)
        return weftSuccess;
      hs->accept_errno = errno;
      if ((errno == EMFILE || errno == ENFILE) && !hs->out_of_fds_fails) {
        /* out of descriptors: make room by letting the oldest stranger go */
        if (hs->n > 0) {
          sock_hellos_drop(hs, 0, "out of file descriptors");
          continue;
        }
      }
      return weft_error_errno(weftSystemError, "accept");
    }
    sock_tune(fd);
    struct sock_hello *h = &hs->v[hs->n++];
    h->fd = fd;
    h->accepted_ns = clock_ns();
    h->deadline_ns = h->accepted_ns + hello_timeout_ns;
    h->got = 0;
  }
}

/* Reads what hello i has; 1 when it is complete, 0 to read on, -1 dropped. */
static int sock_hello_read(struct sock_hellos *hs, int i, sock_hello_size_fn size_fn, void *arg) {
  struct sock_hello *h = &hs->v[i];
  for (;;) {
    size_t need = size_fn(h->buf, h->got, arg);
    if (need == 0 || need > sizeof h->buf || need < h->got) {
      sock_hellos_drop(hs, i, "not a weft hello");
      return -1;
    }
    if (need == h->got) return 1;
    ssize_t n = recv(h->fd, h->buf + h->got, need - h->got, MSG_DONTWAIT);
    if (n > 0) {
      h->got += (size_t)n;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      return 0;
    } else {
      sock_hellos_drop(hs, i, n == 0 ? "closed before its hello" : "error before its hello");
      return -1;
    }
  }
}

weftResult_t sock_hellos_next(struct sock_hellos *hs, int listen_fd, uint64_t hello_timeout_ns,
                              sock_hello_size_fn size_fn, void *arg, uint64_t until,
                              struct weft_wait *watch, int *fd_out, void *hello_out,
                              size_t *nbytes_out) {
  for (;;) {
    uint64_t now = clock_ns();
    /* silent ones only: bytes waiting in the kernel are a message (a peer's
     * whole one, sent and closed) that arrived while nobody served the
     * listener, read below; a reset would lose it */
    for (int i = hs->n - 1; i >= 0; i--) {
      int avail = 0;
      if (now >= hs->v[i].deadline_ns &&
          (ioctl(hs->v[i].fd, FIONREAD, &avail) != 0 || avail == 0))
        sock_hellos_drop(hs, i, "silent past its deadline");
    }
    if (now >= until) return weftInProgress;
    uint64_t wake = until;
    for (int i = 0; i < hs->n; i++)
      if (hs->v[i].deadline_ns < wake) wake = hs->v[i].deadline_ns;
    uint64_t ms = (wake - now) / 1000000 + 1;
    if (watch != NULL && ms > SOCK_SLICE_MS) ms = SOCK_SLICE_MS;
    if (ms > 1000) ms = 1000;
    /* full: look again soon, when an idle one may have outlived its grace */
    if (hs->n == SOCK_HELLOS_MAX && ms > 100) ms = 100;
    struct pollfd p[SOCK_HELLOS_MAX + 1];
    /* full of connections with bytes in or young ones: they are read (or
     * age) before more come */
    p[0] = (struct pollfd){.fd = sock_hellos_room(hs, now) ? listen_fd : -1, .events = POLLIN};
    for (int i = 0; i < hs->n; i++) p[i + 1] = (struct pollfd){.fd = hs->v[i].fd, .events = POLLIN};
    int npoll = hs->n + 1;
    int rc = poll(p, (nfds_t)npoll, (int)ms);
    if (rc < 0 && errno != EINTR) return weft_error_errno(weftSystemError, "poll on a listener");
    /* the watch is looked at only when nothing is ready: what a peer sent
     * before it exited is still taken */
    if (rc <= 0) {
      weftResult_t res = sock_watch_check(watch);
      if (res != weftInProgress) return res;
      continue;
    }
    /* the pending ones first (accepting may evict one), oldest first: one
     * peer's messages, each on a connection of its own made after the last
     * was written, are taken in the order it sent them */
    for (int j = 0, dropped = 0; j < npoll - 1; j++) {
      if (p[j + 1].revents == 0) continue;
      int i = j - dropped; /* entries after a dropped one moved down */
      int done = sock_hello_read(hs, i, size_fn, arg);
      if (done < 0) dropped++;
      if (done != 1) continue;
      struct sock_hello *h = &hs->v[i];
      *fd_out = h->fd;
      memcpy(hello_out, h->buf, h->got);
      *nbytes_out = h->got;
      memmove(&hs->v[i], &hs->v[i + 1], sizeof hs->v[0] * (size_t)(hs->n - i - 1));
      hs->n--;
      return weftSuccess;
    }
    if (p[0].revents & POLLIN) WEFT_TRY(sock_hellos_accept(hs, listen_fd, hello_timeout_ns));
    else if (p[0].revents & (POLLERR | POLLNVAL))
      return weft_error_set(weftSystemError, "listener failed");
  }
}

void sock_close_reset(int fd) {
  struct linger l = {.l_onoff = 1, .l_linger = 0};
  setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
  close(fd);
}

weftResult_t sock_send_all(int fd, const void *buf, size_t nbytes, uint64_t deadline_ns) {
  const char *p = buf;
  while (nbytes > 0) {
    ssize_t n = send(fd, p, nbytes, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      nbytes -= (size_t)n;
    } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      WEFT_TRY(sock_poll(fd, POLLOUT, deadline_ns, NULL, "socket send"));
    } else {
      return weft_error_errno(weftRemoteError, "socket send");
    }
  }
  return weftSuccess;
}

weftResult_t sock_recv_all(int fd, void *buf, size_t nbytes, uint64_t deadline_ns) {
  char *p = buf;
  while (nbytes > 0) {
    ssize_t n = recv(fd, p, nbytes, MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      nbytes -= (size_t)n;
    } else if (n == 0) {
      return weft_error_set(weftRemoteError, "connection closed by peer");
    } else if (errno == EAGAIN || errno == EINTR) {
      WEFT_TRY(sock_poll(fd, POLLIN, deadline_ns, NULL, "socket receive"));
    } else {
      return weft_error_errno(weftRemoteError, "socket receive");
    }
  }
  return weftSuccess;
}
