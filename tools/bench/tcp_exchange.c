/* The floor under any library's TCP path on this host: two processes
 * exchange NBYTES over one loopback TCP connection, each writing its whole
 * buffer and then reading the peer's, with nothing between them and the
 * kernel (docs/ucx.md).
 *
 *   cc -O2 -o /tmp/tcp_exchange tools/bench/tcp_exchange.c
 *   /tmp/tcp_exchange 1048576 1000        # one 1 MiB exchange per iteration
 *   /tmp/tcp_exchange 1048576 1000 2      # 1 MiB as two 512 KiB exchanges in turn
 *
 * Each iteration runs PIECES exchanges of NBYTES / PIECES one after the other
 * (the shape of a two-rank reduce-scatter then all-gather when PIECES is 2).
 * Prints the time per iteration and the system calls each side made. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_pair.h"

#define WARMUP_ITERS 3

static void die(const char *what) {
  perror(what);
  exit(1);
}

/* Writes n bytes and reads n, writing first as far as the socket takes it
 * (both sides write at once: neither may block on a full socket); fd does not
 * block. Counts the calls. */
static void exchange(int fd, const char *out, char *in, size_t n, long *calls) {
  size_t sent = 0, got = 0;
  while (sent < n || got < n) {
    int moved = 0;
    if (sent < n) {
      ssize_t k = write(fd, out + sent, n - sent);
      ++*calls;
      if (k < 0 && errno != EAGAIN) die("write");
      if (k > 0) sent += (size_t)k, moved = 1;
    }
    if (got < n && (sent == n || !moved)) {
      ssize_t k = read(fd, in + got, n - got);
      ++*calls;
      if (k == 0 || (k < 0 && errno != EAGAIN)) die("read");
      if (k > 0) got += (size_t)k, moved = 1;
    }
    if (!moved) {
      struct pollfd pfd = {.fd = fd, .events = (short)(POLLIN | (sent < n ? POLLOUT : 0))};
      poll(&pfd, 1, -1);
      ++*calls;
    }
  }
}

static void side_run(int is_first, int fd, size_t nbytes, int pieces, int iters) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  fcntl(fd, F_SETFL, O_NONBLOCK);
  char *out = malloc(nbytes), *in = malloc(nbytes);
  if (out == NULL || in == NULL) die("malloc");
  memset(out, 1, nbytes);
  memset(in, 0, nbytes);
  const size_t piece = nbytes / (size_t)pieces;
  long calls = 0;
  double start = 0;
  for (int i = -WARMUP_ITERS; i < iters; i++) {
    if (i == 0) {
      calls = 0;
      start = bench_now_s();
    }
    for (int p = 0; p < pieces; p++)
      exchange(fd, out + (size_t)p * piece, in + (size_t)p * piece, piece, &calls);
  }
  double per_iter = (bench_now_s() - start) / iters;
  if (is_first)
    printf("%zu B as %d exchange(s): %.1f us, %.1f system calls per iteration\n", nbytes,
           pieces, per_iter * 1e6, (double)calls / iters);
  free(out);
  free(in);
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: tcp_exchange NBYTES ITERS [PIECES]\n");
    return 2;
  }
  size_t nbytes = strtoull(argv[1], NULL, 0);
  int iters = atoi(argv[2]), pieces = argc > 3 ? atoi(argv[3]) : 1;
  if (nbytes == 0 || iters <= 0 || pieces <= 0 || nbytes % (size_t)pieces != 0) {
    fprintf(stderr, "tcp_exchange: NBYTES, ITERS and PIECES must be positive, PIECES must "
                    "divide NBYTES\n");
    return 2;
  }
  int ls = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof addr;
  if (ls < 0 || bind(ls, (struct sockaddr *)&addr, sizeof addr) != 0 ||
      getsockname(ls, (struct sockaddr *)&addr, &len) != 0 || listen(ls, 1) != 0)
    die("listening on loopback");
  pid_t pid = fork();
  if (pid < 0) die("fork");
  if (pid == 0) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) die("connect");
    side_run(0, fd, nbytes, pieces, iters);
    _exit(0);
  }
  int fd = accept(ls, NULL, NULL);
  if (fd < 0) die("accept");
  side_run(1, fd, nbytes, pieces, iters);
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}
