/* TCP helpers with deadlines: every call that can block takes an absolute
 * deadline (clock_ns) and fails with weftRemoteError when it passes. */
#ifndef WEFT_SOCK_H
#define WEFT_SOCK_H

#include <netinet/in.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "../include/weft.h"

union weft_sockaddr {
  struct sockaddr sa;
  struct sockaddr_in in;
  struct sockaddr_in6 in6;
};

/* "ip:port" into buf (at least 64 bytes); returns buf. */
const char *sock_addr_str(const union weft_sockaddr *addr, char *buf, size_t nbytes);
/* Resolves "host" and port (numeric or name) to an address. */
weftResult_t sock_resolve(const char *host, int port, union weft_sockaddr *addr_out);
/* The address this host is reached at: WEFT_SOCKET_IFNAME's interface, else
 * the first non-loopback interface that is up, else loopback. Port 0. */
weftResult_t sock_local_addr(union weft_sockaddr *addr_out);
/* Listens on addr (port 0 picks one); writes the bound address. */
weftResult_t sock_listen(const union weft_sockaddr *addr, int *fd_out,
                         union weft_sockaddr *bound_out);
/* Connects, retrying refused connections until the deadline (the listener may
 * not be up yet). */
weftResult_t sock_connect(const union weft_sockaddr *addr, uint64_t deadline_ns, int *fd_out);
/* Accepts one connection before the deadline. */
weftResult_t sock_accept(int listen_fd, uint64_t deadline_ns, int *fd_out);
weftResult_t sock_send_all(int fd, const void *buf, size_t nbytes, uint64_t deadline_ns);
/* Fails with weftRemoteError when the peer closes before nbytes arrived. */
weftResult_t sock_recv_all(int fd, void *buf, size_t nbytes, uint64_t deadline_ns);

#endif
