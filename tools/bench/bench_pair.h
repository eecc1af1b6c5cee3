/* What the two-process benchmarks in this folder share: a clock, whole reads
 * and writes on the socket pair between the processes, and the fork. Each
 * benchmark stays one file built with one cc line; this header comes along
 * by its relative include. */
#ifndef WEFT_BENCH_PAIR_H
#define WEFT_BENCH_PAIR_H

#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static inline double bench_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Writes or reads all nbytes on fd; exits if the other process went. */
static inline void bench_io_all(int fd, void *buf, size_t nbytes, int writing) {
  for (size_t done = 0; done < nbytes;) {
    ssize_t n = writing ? write(fd, (char *)buf + done, nbytes - done)
                        : read(fd, (char *)buf + done, nbytes - done);
    if (n <= 0) {
      fprintf(stderr, "the socket pair to the other process broke\n");
      exit(1);
    }
    done += (size_t)n;
  }
}

/* Returns once the other process has called it too. */
static inline void bench_barrier(int fd) {
  char token = 0;
  bench_io_all(fd, &token, 1, 1);
  bench_io_all(fd, &token, 1, 0);
}

/* Runs side(0, ...) here and side(1, ...) in a child, joined by a socket
 * pair (fd); returns 0 when both ended well. */
static inline int bench_run_pair(void (*side)(int rank, int fd, void *arg), void *arg) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) {
    perror("socketpair");
    return 1;
  }
  pid_t pid = fork();
  if (pid < 0) {
    perror("fork");
    return 1;
  }
  if (pid == 0) {
    side(1, sv[1], arg);
    _exit(0);
  }
  side(0, sv[0], arg);
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}

#endif
