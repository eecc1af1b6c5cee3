// Helpers of the bootstrap and socket suites (test_bootstrap.cc,
// test_bootstrap_listeners.cc, test_sock_ifname.cc): a connection to a
// listener that says nothing, as a stranger's or a descheduled peer's; a
// listener that answers nothing, as a host gone from the network.
#ifndef WEFT_TEST_BOOTSTRAP_PROBE_H
#define WEFT_TEST_BOOTSTRAP_PROBE_H

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <vector>

extern "C" {
#include "transport/base/sock.h"
}

namespace weft_test {

// Opens a TCP connection to addr that never says anything; -1 on failure.
inline int silent_connection(const union weft_sockaddr &addr) {
  int fd = socket(addr.sa.sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  socklen_t len = addr.sa.sa_family == AF_INET6 ? sizeof addr.in6 : sizeof addr.in;
  if (fd >= 0 && connect(fd, &addr.sa, len) == 0) return fd;
  if (fd >= 0) close(fd);
  return -1;
}

// A loopback listener that accepts nothing and whose queue is full: a
// connection to it gets no answer (the kernel drops its SYNs), as one to a
// host gone from the network. Its socket and the connections that fill it
// are held in fds; the address in *addr.
inline bool silent_listener(union weft_sockaddr *addr, std::vector<int> *fds) {
  int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (l < 0 || bind(l, (sockaddr *)&a, sizeof a) != 0 || listen(l, 0) != 0 ||
      getsockname(l, (sockaddr *)&a, &len) != 0)
    return false;
  fds->push_back(l);
  memset(addr, 0, sizeof *addr);
  memcpy(&addr->in, &a, sizeof a);
  for (int i = 0; i < 16; i++) { /* until one is left waiting */
    int c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (c < 0) return false;
    fds->push_back(c);
    if (connect(c, (sockaddr *)&a, sizeof a) == 0) continue;
    if (errno != EINPROGRESS) return false;
    pollfd p = {c, POLLOUT, 0};
    if (poll(&p, 1, 100) == 0) return true;
  }
  return false;
}

}  // namespace weft_test

#endif
