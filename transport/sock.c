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
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "param.h"
#include "status.h"
#include "wait.h"

extern struct weft_param bootstrap_params[];
#define P_IFNAME 0 /* index of WEFT_SOCKET_IFNAME in bootstrap_params */

const char *sock_addr_str(const union weft_sockaddr *addr, char *buf, size_t nbytes) {
  char ip[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (addr->sa.sa_family == AF_INET) {
    inet_ntop(AF_INET, &addr->in.sin_addr, ip, sizeof ip);
    port = ntohs(addr->in.sin_port);
  } else if (addr->sa.sa_family == AF_INET6) {
    inet_ntop(AF_INET6, &addr->in6.sin6_addr, ip, sizeof ip);
    port = ntohs(addr->in6.sin6_port);
  }
  snprintf(buf, nbytes, "%s:%d", ip, port);
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

weftResult_t sock_local_addr(union weft_sockaddr *addr_out) {
  const char *want = param_str(&bootstrap_params[P_IFNAME]);
  struct ifaddrs *ifs = NULL;
  if (getifaddrs(&ifs) != 0) return weft_error_errno(weftSystemError, "getifaddrs");
  union weft_sockaddr found;
  int have = 0;
  for (struct ifaddrs *i = ifs; i != NULL && !have; i = i->ifa_next) {
    if (i->ifa_addr == NULL || !(i->ifa_flags & IFF_UP)) continue;
    if (i->ifa_addr->sa_family != AF_INET && i->ifa_addr->sa_family != AF_INET6) continue;
    if (i->ifa_addr->sa_family == AF_INET6 &&
        IN6_IS_ADDR_LINKLOCAL(&((struct sockaddr_in6 *)i->ifa_addr)->sin6_addr))
      continue;
    if (want != NULL ? strncmp(i->ifa_name, want, strlen(want)) != 0
                     : (i->ifa_flags & IFF_LOOPBACK) || i->ifa_addr->sa_family != AF_INET)
      continue;
    memset(&found, 0, sizeof found);
    memcpy(&found, i->ifa_addr,
           i->ifa_addr->sa_family == AF_INET ? sizeof(struct sockaddr_in)
                                             : sizeof(struct sockaddr_in6));
    have = 1;
  }
  freeifaddrs(ifs);
  if (!have) {
    if (want != NULL)
      return weft_error_set(weftInvalidArgument, "WEFT_SOCKET_IFNAME=%s: no such interface up",
                            want);
    memset(&found, 0, sizeof found);
    found.in.sin_family = AF_INET;
    found.in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  }
  if (found.sa.sa_family == AF_INET) found.in.sin_port = 0;
  else found.in6.sin6_port = 0;
  *addr_out = found;
  return weftSuccess;
}

weftResult_t sock_listen(const union weft_sockaddr *addr, int *fd_out,
                         union weft_sockaddr *bound_out) {
  int fd = socket(addr->sa.sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return weft_error_errno(weftSystemError, "socket");
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
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

static void sock_tune(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* Waits for events on fd until the deadline; EINTR retried. */
static weftResult_t sock_poll(int fd, short events, uint64_t deadline_ns, const char *what) {
  for (;;) {
    uint64_t now = clock_ns();
    if (now >= deadline_ns)
      return weft_error_set(weftRemoteError, "timed out in %s", what);
    uint64_t left_ms = (deadline_ns - now) / 1000000 + 1;
    struct pollfd p = {.fd = fd, .events = events};
    int rc = poll(&p, 1, left_ms > 1000 ? 1000 : (int)left_ms);
    if (rc > 0) return weftSuccess;
    if (rc < 0 && errno != EINTR) return weft_error_errno(weftSystemError, "poll in %s", what);
  }
}

weftResult_t sock_connect(const union weft_sockaddr *addr, uint64_t deadline_ns, int *fd_out) {
  char buf[64];
  unsigned delay_us = 1000;
  for (;;) {
    int fd = socket(addr->sa.sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return weft_error_errno(weftSystemError, "socket");
    if (connect(fd, &addr->sa, addr_len(addr)) == 0) {
      sock_tune(fd);
      *fd_out = fd;
      return weftSuccess;
    }
    int err = errno;
    close(fd);
    if (err != ECONNREFUSED && err != EINTR && err != ETIMEDOUT && err != EAGAIN &&
        err != ENETUNREACH && err != EHOSTUNREACH) {
      errno = err;
      return weft_error_errno(weftSystemError, "connect to %s",
                              sock_addr_str(addr, buf, sizeof buf));
    }
    if (clock_ns() >= deadline_ns) {
      errno = err;
      return weft_error_errno(weftRemoteError, "timed out connecting to %s",
                              sock_addr_str(addr, buf, sizeof buf));
    }
    struct timespec ts = {0, (long)delay_us * 1000};
    nanosleep(&ts, NULL);
    if (delay_us < 100000) delay_us *= 2;
  }
}

weftResult_t sock_accept(int listen_fd, uint64_t deadline_ns, int *fd_out) {
  for (;;) {
    WEFT_TRY(sock_poll(listen_fd, POLLIN, deadline_ns, "accept"));
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

weftResult_t sock_send_all(int fd, const void *buf, size_t nbytes, uint64_t deadline_ns) {
  const char *p = buf;
  while (nbytes > 0) {
    ssize_t n = send(fd, p, nbytes, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      nbytes -= (size_t)n;
    } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      WEFT_TRY(sock_poll(fd, POLLOUT, deadline_ns, "socket send"));
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
      WEFT_TRY(sock_poll(fd, POLLIN, deadline_ns, "socket receive"));
    } else {
      return weft_error_errno(weftRemoteError, "socket receive");
    }
  }
  return weftSuccess;
}
