// Helper of the bootstrap suites (test_bootstrap.cc,
// test_bootstrap_listeners.cc): a connection to a listener that says nothing,
// as a stranger's or a descheduled peer's.
#ifndef WEFT_TEST_BOOTSTRAP_PROBE_H
#define WEFT_TEST_BOOTSTRAP_PROBE_H

#include <sys/socket.h>
#include <unistd.h>

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

}  // namespace weft_test

#endif
