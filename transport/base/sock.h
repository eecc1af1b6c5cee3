/* TCP helpers with deadlines: every call that can block takes an absolute
 * deadline (clock_ns) and fails with weftRemoteError when it passes. */
#ifndef WEFT_SOCK_H
#define WEFT_SOCK_H

#include <netinet/in.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "../../include/weft.h"
#include "param_load.h"

/* The sockets' settings: WEFT_SOCKET_IFNAME. */
extern struct weft_param sock_params[];

union weft_sockaddr {
  struct sockaddr sa;
  struct sockaddr_in in;
  struct sockaddr_in6 in6;
};

/* "ip:port" ("[ip]:port" for IPv6) into buf (at least 64 bytes); returns buf. */
const char *sock_addr_str(const union weft_sockaddr *addr, char *buf, size_t nbytes);
/* Resolves "host" and port (numeric or name) to an address. */
weftResult_t sock_resolve(const char *host, int port, union weft_sockaddr *addr_out);
/* The address this host is reached at, port 0: sock_if_choose over this
 * host's interfaces and WEFT_SOCKET_IFNAME. Unset, loopback only when no
 * other interface is up with an address, and an INFO line says so.
 * weftInvalidArgument when WEFT_SOCKET_IFNAME allows no interface that is up
 * with an address. */
weftResult_t sock_local_addr(union weft_sockaddr *addr_out);

/* One address of an interface, as getifaddrs lists it. */
struct sock_if {
  const char *name;
  unsigned flags;           /* IFF_UP, IFF_RUNNING, IFF_LOOPBACK */
  union weft_sockaddr addr; /* AF_INET or AF_INET6; any other family is skipped */
};
/* Whether list, in WEFT_SOCKET_IFNAME's syntax (NCCL_SOCKET_IFNAME's), allows
 * the interface name: comma-separated name prefixes ("eth,ib"); '^' first
 * excludes the listed names instead ("^docker,lo"); '=' first, after the '^'
 * when both, makes them whole names ("=eth0", "^=docker0"). Empty items are
 * skipped; a list that names nothing (NULL, "", "^") allows every name. */
int sock_ifname_match(const char *list, const char *name);
/* The index in ifs of the address to listen on, -1 when there is none: of
 * the addresses that are up, not IPv6 link-local, and on an interface that
 * list allows (sock_ifname_match), the first in this order: running ones
 * neither loopback nor named docker*, then running docker*, then those
 * without a carrier (IFF_RUNNING clear), then loopback; IPv4 before IPv6 in
 * each, then the order of ifs. */
int sock_if_choose(const struct sock_if *ifs, int n, const char *list);
/* Listens on addr (port 0 picks one); writes the bound address. */
weftResult_t sock_listen(const union weft_sockaddr *addr, int *fd_out,
                         union weft_sockaddr *bound_out);
/* The address this host uses to reach peer (the interface a route to it
 * leaves by; loopback for a loopback peer), port 0. WEFT_SOCKET_IFNAME, when
 * set, wins. */
weftResult_t sock_local_addr_to(const union weft_sockaddr *peer, union weft_sockaddr *addr_out);
/* Whether addr is a loopback address (127.0.0.0/8, ::1). */
int sock_addr_is_loopback(const union weft_sockaddr *addr);

struct weft_wait;

/* Connects, retrying refused connections until the deadline (the listener may
 * not be up yet). */
weftResult_t sock_connect(const union weft_sockaddr *addr, uint64_t deadline_ns, int *fd_out);
/* As sock_connect; on failure *err_out is the last attempt's errno
 * (ECONNREFUSED: nothing listened there until the deadline). */
weftResult_t sock_connect_errno(const union weft_sockaddr *addr, uint64_t deadline_ns, int *fd_out,
                                int *err_out);
/* Connects to a listener that is known to be up (its owner published the
 * address after listening): "connection refused" means the owner is gone and
 * fails at once. While connecting, watch (may be NULL) is checked every few
 * milliseconds (wait_check: the peer's pid, a poison word, an abort flag), so
 * a dead peer is an error in well under a second. weftRemoteError: refused
 * (before the deadline) or timed out; weftSystemError: this process failed
 * (no descriptor left, no local address), which says nothing of the peer. */
weftResult_t sock_connect_peer(const union weft_sockaddr *addr, uint64_t deadline_ns,
                               struct weft_wait *watch, int *fd_out);
/* As sock_connect_peer; on failure *err_out is the last attempt's errno
 * (ECONNREFUSED: the address's host answered and nothing listens there;
 * ENETUNREACH, EHOSTUNREACH, ETIMEDOUT: no way there from this host), 0 when
 * the failure was not the connection's (the watch, this process). */
weftResult_t sock_connect_peer_errno(const union weft_sockaddr *addr, uint64_t deadline_ns,
                                     struct weft_wait *watch, int *fd_out, int *err_out);
/* 1 when a connection to addr is refused within timeout_ns (nothing listens
 * there: the process that did has ended), else 0 (accepted, and closed at
 * once; no answer in time; this process's own failure). Sets no error text. */
int sock_probe_refused(const union weft_sockaddr *addr, uint64_t timeout_ns);
/* Whether a connect that failed with err is tried again until its deadline:
 * a network on its way, or a listener's full backlog (EINTR, EAGAIN,
 * ETIMEDOUT, ENETUNREACH, EHOSTUNREACH, ECONNRESET). Refused (nothing
 * listens there) and this host's own failures are final. */
bool sock_connect_err_transient(int err);
/* Connects to the n addresses at once (a NULL one is skipped), each as
 * sock_connect_peer would, without one that does not answer holding up the
 * others: fds[i] the connected socket, else -1 with errs[i] the last
 * attempt's errno (ETIMEDOUT, ENETUNREACH, EHOSTUNREACH, ECONNRESET: tried
 * again until the deadline; ECONNREFUSED, nothing listens there, and this
 * host's own failures, as EADDRNOTAVAIL or EACCES: given up at once). Returns when
 * every address is settled or the deadline passes; connected (may be NULL)
 * is called with each connection as it is made (it may close it and set
 * *fd to -1), so that what goes over it need not wait for the others. */
void sock_connect_many(const union weft_sockaddr *const *addrs, int n, uint64_t deadline_ns,
                       int *fds, int *errs, void (*connected)(void *arg, int i, int *fd),
                       void *arg);
/* Accepts one connection before the deadline, checking watch (may be NULL)
 * as sock_connect_peer does. */
weftResult_t sock_accept(int listen_fd, uint64_t deadline_ns, struct weft_wait *watch,
                         int *fd_out);

/* Connections accepted on a listener whose first bytes (a hello) are not in
 * yet. They are read together, by poll, so a silent or slow connection never
 * delays another; each must complete its hello before its own deadline. */
#define SOCK_HELLO_MAX_NBYTES 512
#define SOCK_HELLOS_MAX 64 /* unproven connections kept; the oldest idle one goes first */
/* An idle connection younger than this is not let go to make room: it may
 * be a peer between its connect and its first write, descheduled on a
 * loaded machine (it would see a reset); those after it wait in the
 * listener's backlog meanwhile. */
#define SOCK_HELLO_GRACE_NS 1000000000ull
struct sock_hello {
  int fd;
  uint64_t accepted_ns;
  uint64_t deadline_ns;
  size_t got;
  uint8_t buf[SOCK_HELLO_MAX_NBYTES];
};
struct sock_hellos {
  int n;
  /* what to do when accept runs out of descriptors: 0 (the default) lets the
   * oldest pending connection go to make room (a listener that strangers
   * flood); 1 keeps every pending one and fails with weftSystemError (a
   * listener whose every connection is a rank: the root) */
  int out_of_fds_fails;
  int accept_errno; /* errno of the last accept that failed, 0: none */
  struct sock_hello v[SOCK_HELLOS_MAX];
};
/* How many bytes the hello takes, judged from its first got bytes (more than
 * got: read on); 0 drops the connection. */
typedef size_t (*sock_hello_size_fn)(const uint8_t *buf, size_t got, void *arg);

/* Accepts from listen_fd and reads every pending hello until one is complete,
 * until `until` passes (weftInProgress), or until watch (may be NULL) fails.
 * On success the caller owns *fd_out and checks the hello (hello_out holds
 * SOCK_HELLO_MAX_NBYTES). Does not block past until. */
weftResult_t sock_hellos_next(struct sock_hellos *hs, int listen_fd, uint64_t hello_timeout_ns,
                              sock_hello_size_fn size_fn, void *arg, uint64_t until,
                              struct weft_wait *watch, int *fd_out, void *hello_out,
                              size_t *nbytes_out);
/* Closes every pending connection. */
void sock_hellos_close(struct sock_hellos *hs);
/* Closes a connection whose incoming data this end has read all it needs
 * of: with a reset instead of the orderly close, so that neither end keeps
 * the port in TIME_WAIT. The other end closes in order (after its last
 * send). Communicators made and destroyed by the thousand would otherwise
 * leave so many ports in TIME_WAIT that no listener can bind. */
void sock_close_reset(int fd);
weftResult_t sock_send_all(int fd, const void *buf, size_t nbytes, uint64_t deadline_ns);
/* Fails with weftRemoteError when the peer closes before nbytes arrived. */
weftResult_t sock_recv_all(int fd, void *buf, size_t nbytes, uint64_t deadline_ns);

#endif
