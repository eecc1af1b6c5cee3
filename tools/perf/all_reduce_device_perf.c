/* all_reduce_perf on device memory: ranks started by weftrun each take GPU
 * (local rank % GPUs), all-reduce float32 sum in cudaMalloc'd buffers on a
 * stream, timed with CUDA events, and print nccl-tests' columns plus the
 * device-to-device copy bandwidth of the same GPU measured in the same run,
 * so that the bus bandwidth can be set against what the memory can do.
 *
 *   weftrun -n 4 all_reduce_device_perf [-b 8] [-e 256M] [-f 4] [-n 20] [-w 5] [-c 1]
 *   all_reduce_device_perf -g 4 [...]
 *
 * -d and -o are taken as the other perf tools take them, for float and sum
 * only: all_reduce_perf -M cuda runs every datatype and op on device memory.
 *
 * -g N runs N ranks in this one process (weftCommInitAll, rank r on GPU
 * r % GPUs), driven by this thread through group calls, as nccl-tests' -g.
 * Several processes that share one GPU take turns on it (each has its own
 * context) unless MPS runs; ranks of one process share a context and their
 * kernels run side by side.
 *
 * Each size runs its warm-up calls (-w, at least one), waits for them on
 * every local stream (the last completes only once every rank has joined
 * it, so the ranks start the timed calls together), then times -n calls.
 *
 * enq(us) is the host's time per call to enqueue the timed calls (the
 * wall-clock time of the loop, without waiting for the GPU): where it comes
 * near time(us), the GPU waits for the host's launches rather than the
 * kernels taking that long.
 *
 * -G N (as nccl-tests' -G): the -n calls of each size are captured into a
 * CUDA graph, which is launched N times; the time is per call, over the N
 * launches, and without the host's launch of each kernel in it. One rank a
 * process (-g 1).
 */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "weft.h"

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static size_t parse_size(const char *s) {
  char *end;
  double v = strtod(s, &end);
  if (*end == 'K' || *end == 'k') v *= 1024;
  if (*end == 'M' || *end == 'm') v *= 1024 * 1024;
  if (*end == 'G' || *end == 'g') v *= 1024.0 * 1024 * 1024;
  return (size_t)v;
}

#define CUDA_OK(call)                                                             \
  do {                                                                            \
    cudaError_t e_ = (call);                                                      \
    if (e_ != cudaSuccess) {                                                      \
      fprintf(stderr, "all_reduce_device_perf: %s: %s\n", #call, cudaGetErrorString(e_)); \
      return 1;                                                                   \
    }                                                                             \
  } while (0)

/* Device-to-device copy bandwidth at nbytes (read + write counted once: the
 * bytes copied per second, as cudaMemcpy reports it). */
static double copy_gbps(void *a, void *b, size_t nbytes, cudaStream_t s) {
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  cudaMemcpyAsync(b, a, nbytes, cudaMemcpyDeviceToDevice, s);
  cudaEventRecord(e0, s);
  for (int i = 0; i < 10; i++) cudaMemcpyAsync(b, a, nbytes, cudaMemcpyDeviceToDevice, s);
  cudaEventRecord(e1, s);
  cudaEventSynchronize(e1);
  float ms = 0;
  cudaEventElapsedTime(&ms, e0, e1);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return ms > 0 ? (double)nbytes * 10 / (ms * 1e-3) / 1e9 : 0;
}

#define MAX_LOCAL 16

/* -d/-o: the one datatype and op this tool runs; anything else is refused
 * with the tool that runs it. */
static int only_value(const char *flag, const char *value, const char *a, const char *b) {
  if (strcmp(value, a) == 0 || strcmp(value, b) == 0) return 0;
  fprintf(stderr, "all_reduce_device_perf: %s %s: this tool runs float sum only; "
                  "all_reduce_perf -M cuda %s %s runs it on device memory\n",
          flag, value, flag, value);
  return 2;
}

/* One rank this process drives (its comm is comms[] of main, at the same index). */
struct local_rank {
  int rank, dev;
  float *send, *recv;
  cudaStream_t stream;
  cudaEvent_t e0, e1;
};

/* One all-reduce of count floats on every local rank (a group when there
 * are several). */
static weftResult_t all_reduce_all(const struct local_rank *lr, weftComm_t *comms, int g,
                                   size_t count) {
  if (g > 1 && weftGroupStart() != weftSuccess) return weftInternalError;
  weftResult_t res = weftSuccess;
  for (int l = 0; l < g && res == weftSuccess; l++)
    res = weftAllReduce(lr[l].send, lr[l].recv, count, weftFloat32, weftSum, comms[l],
                        lr[l].stream);
  if (g > 1) {
    weftResult_t end = weftGroupEnd();
    if (res == weftSuccess) res = end;
  }
  return res;
}

/* The -n calls of count floats (iters), each of them or, with graphs > 0,
 * captured once into a graph on lr[0]'s stream and launched graphs times
 * (g is 1), after a launch of it as warm-up. Returns 0, or 1 after saying
 * why; *us_out is the slowest local rank's GPU time per call, *enq_us_out
 * the host's. */
static int timed_calls(struct local_rank *lr, weftComm_t *comms, int g, size_t count, int iters,
                       int graphs, double *us_out, double *enq_us_out) {
  cudaGraphExec_t exec = NULL;
  if (graphs > 0) {
    cudaGraph_t graph = NULL;
    CUDA_OK(cudaStreamBeginCapture(lr[0].stream, cudaStreamCaptureModeGlobal));
    weftResult_t res = weftSuccess;
    for (int i = 0; i < iters && res == weftSuccess; i++)
      res = all_reduce_all(lr, comms, g, count);
    cudaError_t end = cudaStreamEndCapture(lr[0].stream, &graph);
    if (res != weftSuccess) {
      fprintf(stderr, "all_reduce_device_perf: captured call: %s\n", weftGetLastError(comms[0]));
      if (graph != NULL) cudaGraphDestroy(graph);
      return 1;
    }
    CUDA_OK(end);
    cudaError_t inst = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    CUDA_OK(inst);
    CUDA_OK(cudaGraphLaunch(exec, lr[0].stream));
    CUDA_OK(cudaStreamSynchronize(lr[0].stream));
  }
  int failed = 0;
  double enq0 = now_us();
  for (int l = 0; l < g; l++) cudaEventRecord(lr[l].e0, lr[l].stream);
  if (graphs > 0) {
    for (int i = 0; i < graphs && !failed; i++)
      failed = cudaGraphLaunch(exec, lr[0].stream) != cudaSuccess;
  } else {
    for (int i = 0; i < iters && !failed; i++)
      failed = all_reduce_all(lr, comms, g, count) != weftSuccess;
  }
  double enq1 = now_us();
  for (int l = 0; l < g; l++) cudaEventRecord(lr[l].e1, lr[l].stream);
  const int ncalls = graphs > 0 ? graphs * iters : iters;
  double us = 0;
  for (int l = 0; l < g; l++) {
    CUDA_OK(cudaStreamSynchronize(lr[l].stream));
    float ms = 0;
    cudaEventElapsedTime(&ms, lr[l].e0, lr[l].e1);
    if (ms * 1e3 / ncalls > us) us = ms * 1e3 / ncalls;
  }
  if (exec != NULL) cudaGraphExecDestroy(exec);
  if (failed) {
    fprintf(stderr, "all_reduce_device_perf: %s\n",
            graphs > 0 ? "cudaGraphLaunch failed" : weftGetLastError(comms[0]));
    return 1;
  }
  *us_out = us;
  *enq_us_out = (enq1 - enq0) / ncalls;
  return 0;
}

int main(int argc, char **argv) {
  size_t min_nbytes = 8, max_nbytes = 256u << 20;
  double factor = 4;
  int iters = 20, warmup = 5, check = 1, g = 1, graphs = 0, opt;
  while ((opt = getopt(argc, argv, "b:e:f:n:w:c:g:G:d:o:")) != -1) {
    switch (opt) {
      case 'b': min_nbytes = parse_size(optarg); break;
      case 'e': max_nbytes = parse_size(optarg); break;
      case 'f': factor = atof(optarg); break;
      case 'n': iters = atoi(optarg); break;
      case 'w': warmup = atoi(optarg); break;
      case 'c': check = atoi(optarg); break;
      case 'g': g = atoi(optarg); break;
      case 'G': graphs = atoi(optarg); break;
      case 'd':
        if (only_value("-d", optarg, "float", "float32")) return 2;
        break;
      case 'o':
        if (only_value("-o", optarg, "sum", "sum")) return 2;
        break;
      default:
        fprintf(stderr,
                "usage: %s [-b min] [-e max] [-f factor] [-n iters] [-w warmup] [-c 0|1] "
                "[-g ranks in this process] [-G graph launches] [-d float] [-o sum]\n",
                argv[0]);
        return 2;
    }
  }
  if (g < 1 || g > MAX_LOCAL || (g > 1 && getenv("WEFT_NRANKS") != NULL)) {
    fprintf(stderr, "all_reduce_device_perf: -g takes 1 to %d, and more than 1 only without "
                    "weftrun\n", MAX_LOCAL);
    return 2;
  }
  if (graphs < 0 || (graphs > 0 && g > 1) || iters < 1) {
    fprintf(stderr, "all_reduce_device_perf: -n takes 1 or more; -G takes 0 or more, and more "
                    "than 0 only with -g 1\n");
    return 2;
  }
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    fprintf(stderr, "all_reduce_device_perf: no CUDA device\n");
    return 1;
  }
  struct local_rank lr[MAX_LOCAL] = {0};
  weftComm_t comms[MAX_LOCAL];
  weftResult_t init;
  if (g == 1) {
    const char *local = getenv("WEFT_LOCAL_RANK");
    lr[0].dev = local ? atoi(local) % ndev : 0;
    CUDA_OK(cudaSetDevice(lr[0].dev));
    weftConfig_t config = WEFT_CONFIG_INITIALIZER;
    init = weftCommInitFromEnv(&comms[0], &config);
  } else {
    int devs[MAX_LOCAL];
    for (int i = 0; i < g; i++) devs[i] = lr[i].dev = i % ndev;
    init = weftCommInitAll(comms, g, devs);
  }
  if (init != weftSuccess) {
    fprintf(stderr, "all_reduce_device_perf: init: %s\n", weftGetLastError(NULL));
    return 1;
  }
  int nranks;
  weftCommCount(comms[0], &nranks);
  for (int i = 0; i < g; i++) {
    struct local_rank *l = &lr[i];
    weftCommUserRank(comms[i], &l->rank);
    CUDA_OK(cudaSetDevice(l->dev));
    CUDA_OK(cudaMalloc((void **)&l->send, max_nbytes));
    CUDA_OK(cudaMalloc((void **)&l->recv, max_nbytes));
    CUDA_OK(cudaStreamCreate(&l->stream));
    CUDA_OK(cudaEventCreate(&l->e0));
    CUDA_OK(cudaEventCreate(&l->e1));
  }
  /* one all-reduce waited for: every rank of the job copies below at about
   * the same time, so that processes sharing a GPU measure its copy shared
   * among them (gpu-check counts k of them under MPS) */
  if (all_reduce_all(lr, comms, g, 1) != weftSuccess) {
    fprintf(stderr, "all_reduce_device_perf: %s\n", weftGetLastError(comms[0]));
    return 1;
  }
  for (int i = 0; i < g; i++) CUDA_OK(cudaStreamSynchronize(lr[i].stream));
  CUDA_OK(cudaSetDevice(lr[0].dev));
  double copy = copy_gbps(lr[0].send, lr[0].recv, max_nbytes, lr[0].stream);
  if (lr[0].rank == 0 && graphs > 0)
    printf("# each size's %d calls captured into a CUDA graph, launched %d times\n", iters,
           graphs);
  if (lr[0].rank == 0)
    printf("# all-reduce float32 sum on device memory, %d ranks (%d in this process), "
           "%d GPU(s)\n"
           "# device-to-device copy at %zu B: %.1f GB/s\n"
           "# %10s  %12s  %9s  %8s  %8s  %6s  %7s\n",
           nranks, g, ndev, max_nbytes, copy, "size(B)", "count", "time(us)", "algbw",
           "busbw", "#wrong", "enq(us)");
  float *host = malloc(max_nbytes);
  int failed = host == NULL;
  for (size_t nbytes = min_nbytes; nbytes <= max_nbytes && !failed;
       nbytes = (size_t)(nbytes * factor) > nbytes ? (size_t)(nbytes * factor) : nbytes + 1) {
    size_t count = nbytes / sizeof(float);
    if (count == 0) continue;
    for (int l = 0; l < g; l++) {
      for (size_t i = 0; i < count; i++) host[i] = (float)((i + (size_t)lr[l].rank * 3) % 17);
      CUDA_OK(cudaMemcpy(lr[l].send, host, count * sizeof(float), cudaMemcpyHostToDevice));
    }
    /* the warm-up (at least one call), then every local stream drained: the
     * last warm-up call completes only once every rank has joined it, so
     * the timed calls start together rather than the first size's timing
     * holding the other processes' start-up */
    for (int i = 0; i < (warmup > 0 ? warmup : 1) && !failed; i++)
      failed = all_reduce_all(lr, comms, g, count) != weftSuccess;
    for (int l = 0; l < g && !failed; l++) CUDA_OK(cudaStreamSynchronize(lr[l].stream));
    double us = 0, enq_us = 0;
    if (!failed) failed = timed_calls(lr, comms, g, count, iters, graphs, &us, &enq_us);
    long long wrong = 0;
    for (int l = 0; l < g; l++) {
      if (!check || failed) continue;
      CUDA_OK(cudaMemcpy(host, lr[l].recv, count * sizeof(float), cudaMemcpyDeviceToHost));
      for (size_t i = 0; i < count; i++) {
        double want = 0;
        for (int r = 0; r < nranks; r++) want += (double)((i + (size_t)r * 3) % 17);
        wrong += host[i] != (float)want;
      }
    }
    double algbw = (double)count * sizeof(float) / (us * 1e-6) / 1e9;
    if (lr[0].rank == 0 && !failed)
      printf("  %10zu  %12zu  %9.2f  %8.2f  %8.2f  %6lld  %7.2f\n", count * sizeof(float), count,
             us, algbw, algbw * 2.0 * (nranks - 1) / nranks, wrong, enq_us);
    if (wrong) failed = 1;
  }
  if (failed) fprintf(stderr, "rank %d: failed: %s\n", lr[0].rank, weftGetLastError(comms[0]));
  free(host);
  for (int l = 0; l < g; l++) {
    cudaFree(lr[l].send);
    cudaFree(lr[l].recv);
    weftCommDestroy(comms[l]);
  }
  return failed;
}
