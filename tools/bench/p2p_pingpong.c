/* Point-to-point latency of 2 ranks, built against weft (meson builds it as
 * build/tools/p2p_pingpong, run under weftrun) or, for the comparison, the
 * same loops against MPI:
 *
 *   build/tools/weftrun -n 2 build/tools/p2p_pingpong [BYTES=8] [ITERS=200000] [REPEATS=3]
 *   mpicc -O2 -DP2P_MPI tools/bench/p2p_pingpong.c -o p2p_mpi &&
 *     mpirun -np 2 --bind-to core ./p2p_mpi [BYTES] [ITERS] [REPEATS]
 *
 * Prints, on rank 0, the best of REPEATS runs of ITERS iterations of each:
 * the ping-pong's round trip (rank 0 sends then receives, rank 1 receives
 * then sends: blocking calls one at a time, as osu_latency) and the
 * exchange (each rank sends to and receives from the other at once: a weft
 * group of a send and a receive, MPI_Sendrecv; nccl-tests' sendrecv step),
 * in ns per iteration. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#ifdef P2P_MPI
#include <mpi.h>
#else
#include "weft.h"
#endif

static double now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

#ifdef P2P_MPI
static int rank_;
static int p2p_init(int *argc, char ***argv) {
  MPI_Init(argc, argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  return rank_;
}
static int p2p_send(const char *buf, size_t n, int peer) {
  return MPI_Send(buf, (int)n, MPI_BYTE, peer, 0, MPI_COMM_WORLD) != MPI_SUCCESS;
}
static int p2p_recv(char *buf, size_t n, int peer) {
  return MPI_Recv(buf, (int)n, MPI_BYTE, peer, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE) !=
         MPI_SUCCESS;
}
static int p2p_exchange(const char *out, char *in, size_t n, int peer) {
  return MPI_Sendrecv(out, (int)n, MPI_BYTE, peer, 1, in, (int)n, MPI_BYTE, peer, 1,
                      MPI_COMM_WORLD, MPI_STATUS_IGNORE) != MPI_SUCCESS;
}
static void p2p_fini(void) { MPI_Finalize(); }
static const char *p2p_name = "MPI";
#else
static weftComm_t comm_;
static int p2p_init(int *argc, char ***argv) {
  (void)argc, (void)argv;
  if (weftCommInitFromEnv(&comm_, NULL) != weftSuccess) {
    fprintf(stderr, "p2p_pingpong: %s (run under weftrun -n 2)\n", weftGetLastError(NULL));
    exit(1);
  }
  int rank;
  weftCommUserRank(comm_, &rank);
  return rank;
}
static int p2p_send(const char *buf, size_t n, int peer) {
  return weftSend(buf, n, weftUint8, peer, comm_, NULL) != weftSuccess;
}
static int p2p_recv(char *buf, size_t n, int peer) {
  return weftRecv(buf, n, weftUint8, peer, comm_, NULL) != weftSuccess;
}
static int p2p_exchange(const char *out, char *in, size_t n, int peer) {
  weftGroupStart();
  int bad = weftSend(out, n, weftUint8, peer, comm_, NULL) != weftSuccess;
  bad |= weftRecv(in, n, weftUint8, peer, comm_, NULL) != weftSuccess;
  return (weftGroupEnd() != weftSuccess) | bad;
}
static void p2p_fini(void) { weftCommDestroy(comm_); }
static const char *p2p_name = "weft";
#endif

int main(int argc, char **argv) {
  const int rank = p2p_init(&argc, &argv);
  const size_t n = argc > 1 ? (size_t)strtoull(argv[1], NULL, 10) : 8;
  const long iters = argc > 2 ? atol(argv[2]) : 200000;
  const int repeats = argc > 3 ? atoi(argv[3]) : 3;
  char *out = calloc(n ? n : 1, 1), *in = calloc(n ? n : 1, 1);
  if (out == NULL || in == NULL || iters < 1 || repeats < 1 || rank > 1) {
    fprintf(stderr, "p2p_pingpong: 2 ranks, BYTES ITERS >= 1 REPEATS >= 1\n");
    return 2;
  }
  const int peer = 1 - rank;
  double best_pp = 1e300, best_ex = 1e300;
  for (int r = 0; r < repeats; r++) {
    double t0 = now_ns();
    for (long i = 0; i < iters; i++) {
      int bad = rank == 0 ? p2p_send(out, n, peer) || p2p_recv(in, n, peer)
                          : p2p_recv(in, n, peer) || p2p_send(out, n, peer);
      if (bad) {
        fprintf(stderr, "p2p_pingpong: rank %d: a call failed\n", rank);
        return 1;
      }
    }
    double pp = (now_ns() - t0) / (double)iters;
    t0 = now_ns();
    for (long i = 0; i < iters; i++)
      if (p2p_exchange(out, in, n, peer)) {
        fprintf(stderr, "p2p_pingpong: rank %d: an exchange failed\n", rank);
        return 1;
      }
    double ex = (now_ns() - t0) / (double)iters;
    if (pp < best_pp) best_pp = pp;
    if (ex < best_ex) best_ex = ex;
  }
  if (rank == 0)
    printf("%s %zu B: ping-pong round trip %.1f ns, exchange %.1f ns (best of %d x %ld)\n",
           p2p_name, n, best_pp, best_ex, repeats, iters);
  free(out);
  free(in);
  p2p_fini();
  return 0;
}
