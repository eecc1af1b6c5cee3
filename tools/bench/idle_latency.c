/* One rank of a weftrun job: the time of an all-reduce that follows an idle
 * spell, as in training, where compute separates the collectives. Each
 * sample: an all-reduce that lines the ranks up, GAP microseconds of sleep,
 * then the timed all-reduce of BYTES bytes (float sum). Rank 0 prints the
 * median and the 90th percentile of SAMPLES samples (after 5 unrecorded).
 *
 *   weftrun -n 2 idle_latency [GAP_US=5000] [BYTES=8] [SAMPLES=40] */
#include <weft.h>

#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e6 + (double)t.tv_nsec * 1e-3;
}

static int by_value(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  int gap_us = argc > 1 ? atoi(argv[1]) : 5000;
  size_t count = (argc > 2 ? (size_t)atol(argv[2]) : 8) / sizeof(float);
  int samples = argc > 3 ? atoi(argv[3]) : 40;
  if (count == 0) count = 1;
  if (samples < 1) samples = 1;
  weftComm_t comm;
  if (weftCommInitFromEnv(&comm, NULL) != weftSuccess) {
    fprintf(stderr, "idle_latency: %s\n", weftGetLastError(NULL));
    return 1;
  }
  int rank;
  weftCommUserRank(comm, &rank);
  float *in = calloc(count, sizeof *in), *out = calloc(count, sizeof *out);
  double *t = calloc((size_t)samples, sizeof *t);
  if (in == NULL || out == NULL || t == NULL) return 1;
  for (int i = -5; i < samples; i++) {
    if (weftAllReduce(in, out, count, weftFloat32, weftSum, comm, NULL) != weftSuccess) break;
    usleep((useconds_t)gap_us);
    double t0 = now_us();
    if (weftAllReduce(in, out, count, weftFloat32, weftSum, comm, NULL) != weftSuccess) break;
    if (i >= 0) t[i] = now_us() - t0;
  }
  const char *err = weftGetLastError(comm);
  if (err != NULL && err[0] != '\0') {
    fprintf(stderr, "idle_latency: rank %d: %s\n", rank, err);
    return 1;
  }
  qsort(t, (size_t)samples, sizeof *t, by_value);
  if (rank == 0)
    printf("%zu B after %d us idle: median %.1f us, p90 %.1f us (%d samples)\n",
           count * sizeof(float), gap_us, t[samples / 2], t[samples * 9 / 10], samples);
  weftCommDestroy(comm);
  free(in);
  free(out);
  free(t);
  return 0;
}
