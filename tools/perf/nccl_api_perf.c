/* nccl_api_perf: all-reduce, all-gather or reduce-scatter timed through
 * nccl.h alone, so that one binary measures any libnccl.so.2: weft's, or
 * NCCL's own when LD_LIBRARY_PATH names its folder first. It starts its own
 * ranks (fork, one process each, every one on GPU 0 unless -D), passes the
 * unique id from rank 0 to the others through shared memory, checks each
 * size's result once (float32 sum) and prints nccl-tests' columns for the
 * out-of-place call, with the library's path and version on top.
 *
 *   nccl_api_perf -n 4 -b 8 -e 64M -f 4                 device memory
 *   nccl_api_perf -n 2 -b 8 -e 8 -i 100 -G 20            the calls in a CUDA graph
 *   LD_LIBRARY_PATH=$NCCL_LIB NCCL_MULTI_RANK_GPU_ENABLE=1 nccl_api_perf -n 4 ...
 *   nccl_api_perf -M host -n 3 ...                       host memory (weft's library)
 *
 * Exit 0 when every rank ran and no value was wrong; 1 on a wrong value or
 * a failed call; 2 on bad usage. */
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "nccl.h"

#define MAX_RANKS 64

enum coll { ALLREDUCE, ALLGATHER, REDUCESCATTER };
static const char *const coll_names[] = {"allreduce", "allgather", "reducescatter"};

struct opts {
  int nranks, iters, warmup, graphs, device_mem, per_gpu_device, coll, timeout_s;
  int skip_checked_call; /* -Z: the check reads an output no call wrote */
  size_t min_bytes, max_bytes;
  double factor;
};

/* What the ranks share: the unique id, a barrier, each rank's time and
 * wrong count for the size at hand. */
struct shared {
  ncclUniqueId id;
  atomic_int id_ready;
  atomic_int bar_arrived, bar_gen;
  atomic_int failed;
  double us[MAX_RANKS];
  long wrong[MAX_RANKS];
};

static struct shared *sh;
static int g_rank;

static void die(const char *what, const char *detail) {
  fprintf(stderr, "nccl_api_perf: rank %d: %s: %s\n", g_rank, what, detail);
  atomic_store(&sh->failed, 1);
  exit(1);
}

#define NCCL_OK(call)                                                                \
  do {                                                                               \
    ncclResult_t r_ = (call);                                                        \
    if (r_ != ncclSuccess) die(#call, ncclGetErrorString(r_));                       \
  } while (0)

#ifdef NCCL_PERF_CUDA
#include <cuda_runtime.h>
#define CUDA_OK(call)                                                                \
  do {                                                                               \
    cudaError_t e_ = (call);                                                         \
    if (e_ != cudaSuccess) die(#call, cudaGetErrorString(e_));                       \
  } while (0)
#endif

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

/* Every rank of the job; yields while it waits (ranks may share cores).
 * A rank that failed ends the others' wait. */
static void barrier(int nranks) {
  int gen = atomic_load(&sh->bar_gen);
  if (atomic_fetch_add(&sh->bar_arrived, 1) == nranks - 1) {
    atomic_store(&sh->bar_arrived, 0);
    atomic_fetch_add(&sh->bar_gen, 1);
    return;
  }
  while (atomic_load(&sh->bar_gen) == gen) {
    if (atomic_load(&sh->failed)) exit(1);
    sched_yield();
  }
}

/* Elements each rank sends and receives for a size of bytes (nccl-tests'
 * meaning: the all-reduce's buffer; the all-gather's whole output; the
 * reduce-scatter's whole input). */
static void coll_counts(const struct opts *o, size_t bytes, size_t *send_n, size_t *recv_n) {
  size_t elems = bytes / sizeof(float);
  if (o->coll == ALLREDUCE) *send_n = *recv_n = elems;
  else {
    size_t per = elems / (size_t)o->nranks;
    *send_n = o->coll == ALLGATHER ? per : per * (size_t)o->nranks;
    *recv_n = o->coll == ALLGATHER ? per * (size_t)o->nranks : per;
  }
}

/* Rank r's element i: small integers, so that every sum is exact. */
static float input(int r, size_t i) { return (float)(r + 1) + (float)(i % 7); }

static ncclResult_t call(const struct opts *o, const void *s, void *r, size_t send_n,
                         size_t recv_n, ncclComm_t comm, cudaStream_t st) {
  switch (o->coll) {
  case ALLREDUCE: return ncclAllReduce(s, r, send_n, ncclFloat32, ncclSum, comm, st);
  case ALLGATHER: return ncclAllGather(s, r, send_n, ncclFloat32, comm, st);
  default: return ncclReduceScatter(s, r, recv_n, ncclFloat32, ncclSum, comm, st);
  }
}

/* Wrong elements of one call's output (host copy). */
static long check(const struct opts *o, const float *out, size_t recv_n) {
  size_t n = (size_t)o->nranks;
  long wrong = 0;
  for (size_t i = 0; i < recv_n; i++) {
    /* the all-gather's element i is rank i / per's element i % per; a
     * reduce-scatter's, the sum at this rank's offset of the input */
    size_t per = recv_n / n, at = o->coll == REDUCESCATTER ? (size_t)g_rank * recv_n + i : i;
    float want = o->coll == ALLGATHER ? input((int)(i / per), i % per)
                                      : (float)(n * (n + 1) / 2 + n * (at % 7));
    if (out[i] != want) wrong++;
  }
  return wrong;
}

/* The buffers of one rank, in the memory the run asked for. */
struct bufs {
  float *send, *recv, *host;
  size_t send_n, recv_n;
};

static void bufs_alloc(const struct opts *o, struct bufs *b) {
  coll_counts(o, o->max_bytes, &b->send_n, &b->recv_n);
  size_t sb = (b->send_n ? b->send_n : 1) * sizeof(float);
  size_t rb = (b->recv_n ? b->recv_n : 1) * sizeof(float);
  b->host = malloc(sb > rb ? sb : rb);
  if (b->host == NULL) die("malloc", strerror(errno));
  if (!o->device_mem) {
    b->send = malloc(sb), b->recv = malloc(rb);
    if (b->send == NULL || b->recv == NULL) die("malloc", strerror(errno));
    return;
  }
#ifdef NCCL_PERF_CUDA
  CUDA_OK(cudaMalloc((void **)&b->send, sb));
  CUDA_OK(cudaMalloc((void **)&b->recv, rb));
#endif
}

static void to_buf(const struct opts *o, float *dst, const float *src, size_t n) {
  if (!o->device_mem) memcpy(dst, src, n * sizeof(float));
#ifdef NCCL_PERF_CUDA
  else CUDA_OK(cudaMemcpy(dst, src, n * sizeof(float), cudaMemcpyHostToDevice));
#endif
}

static void from_buf(const struct opts *o, float *dst, const float *src, size_t n) {
  if (!o->device_mem) memcpy(dst, src, n * sizeof(float));
#ifdef NCCL_PERF_CUDA
  else CUDA_OK(cudaMemcpy(dst, src, n * sizeof(float), cudaMemcpyDeviceToHost));
#endif
}

static void sync_stream(const struct opts *o, cudaStream_t st) {
  (void)o, (void)st;
#ifdef NCCL_PERF_CUDA
  if (o->device_mem) CUDA_OK(cudaStreamSynchronize(st));
#endif
}

/* One size: the check, the warm-up, then the timed calls (or graph
 * launches); this rank's time per call in sh->us. */
static void run_size(const struct opts *o, struct bufs *b, size_t bytes, ncclComm_t comm,
                     cudaStream_t st) {
  size_t send_n, recv_n;
  coll_counts(o, bytes, &send_n, &recv_n);
  for (size_t i = 0; i < send_n; i++) b->host[i] = input(g_rank, i);
  to_buf(o, b->send, b->host, send_n);
  for (size_t i = 0; i < recv_n; i++) b->host[i] = NAN;
  to_buf(o, b->recv, b->host, recv_n);
  if (!o->skip_checked_call) NCCL_OK(call(o, b->send, b->recv, send_n, recv_n, comm, st));
  sync_stream(o, st);
  from_buf(o, b->host, b->recv, recv_n);
  sh->wrong[g_rank] = check(o, b->host, recv_n);

  for (int i = 0; i < o->warmup; i++) NCCL_OK(call(o, b->send, b->recv, send_n, recv_n, comm, st));
  sync_stream(o, st);
  double t0, t1;
  if (o->graphs == 0) {
    barrier(o->nranks);
    t0 = now_us();
    for (int i = 0; i < o->iters; i++) NCCL_OK(call(o, b->send, b->recv, send_n, recv_n, comm, st));
    sync_stream(o, st);
    t1 = now_us();
    sh->us[g_rank] = (t1 - t0) / o->iters;
    return;
  }
#ifdef NCCL_PERF_CUDA
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_OK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < o->iters; i++) NCCL_OK(call(o, b->send, b->recv, send_n, recv_n, comm, st));
  CUDA_OK(cudaStreamEndCapture(st, &graph));
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  CUDA_OK(cudaGraphLaunch(exec, st));
  CUDA_OK(cudaStreamSynchronize(st));
  barrier(o->nranks);
  t0 = now_us();
  for (int g = 0; g < o->graphs; g++) CUDA_OK(cudaGraphLaunch(exec, st));
  CUDA_OK(cudaStreamSynchronize(st));
  t1 = now_us();
  sh->us[g_rank] = (t1 - t0) / ((double)o->graphs * o->iters);
  CUDA_OK(cudaGraphExecDestroy(exec));
  CUDA_OK(cudaGraphDestroy(graph));
#endif
}

static double bus_factor(const struct opts *o) {
  double n = o->nranks;
  return o->coll == ALLREDUCE ? 2.0 * (n - 1) / n : (n - 1) / n;
}

/* Which libnccl.so.2 the loader took (LD_LIBRARY_PATH decides): said
 * before any rank starts, so that a failing init is seen to be that
 * library's. */
static void print_library(void) {
  Dl_info info;
  int version = 0;
  ncclGetVersion(&version);
  const char *path = dladdr((void *)ncclGetVersion, &info) && info.dli_fname ? info.dli_fname : "?";
  printf("# library: %s (version code %d)\n", path, version);
  fflush(stdout);
}

static void print_header(const struct opts *o) {
  printf("# nccl_api_perf: %s, %d ranks, float32 sum, %s memory%s\n", coll_names[o->coll],
         o->nranks, o->device_mem ? "device" : "host",
         o->graphs ? ", calls captured into a CUDA graph" : "");
  if (o->graphs)
    printf("# each size's %d calls in one graph, launched %d times; time per call\n", o->iters,
           o->graphs);
  printf("#\n# %10s %12s %6s %6s %10s %8s %8s %6s\n", "size", "count", "type", "redop", "time",
         "algbw", "busbw", "#wrong");
  printf("# %10s %12s %6s %6s %10s %8s %8s %6s\n", "(B)", "(elements)", "", "", "(us)", "(GB/s)",
         "(GB/s)", "");
  fflush(stdout);
}

static int rank_main(const struct opts *o, int rank) {
  g_rank = rank;
  cudaStream_t st = NULL;
#ifdef NCCL_PERF_CUDA
  if (o->device_mem) {
    int ndev = 0;
    CUDA_OK(cudaGetDeviceCount(&ndev));
    CUDA_OK(cudaSetDevice(o->per_gpu_device ? rank % ndev : 0));
    CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  }
#endif
  if (rank == 0) {
    NCCL_OK(ncclGetUniqueId(&sh->id));
    atomic_store(&sh->id_ready, 1);
  }
  while (!atomic_load(&sh->id_ready)) {
    if (atomic_load(&sh->failed)) return 1;
    sched_yield();
  }
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRank(&comm, o->nranks, sh->id, rank));
  struct bufs b;
  bufs_alloc(o, &b);
  if (rank == 0) print_header(o);
  long total_wrong = 0;
  for (size_t bytes = o->min_bytes; bytes <= o->max_bytes;) {
    size_t send_n, recv_n;
    coll_counts(o, bytes, &send_n, &recv_n);
    size_t next = (size_t)((double)bytes * o->factor);
    next = next > bytes ? next : bytes + 1;
    if (send_n == 0 || recv_n == 0) { /* under one element a rank */
      bytes = next;
      continue;
    }
    run_size(o, &b, bytes, comm, st);
    barrier(o->nranks);
    if (rank == 0) {
      double us = 0;
      long wrong = 0;
      for (int r = 0; r < o->nranks; r++) {
        if (sh->us[r] > us) us = sh->us[r];
        wrong += sh->wrong[r];
      }
      size_t shown = o->coll == ALLREDUCE ? send_n * sizeof(float)
                                          : (o->coll == ALLGATHER ? recv_n : send_n) * sizeof(float);
      double algbw = (double)shown / us / 1e3;
      printf("  %10zu %12zu %6s %6s %10.2f %8.2f %8.2f %6ld\n", shown, shown / sizeof(float),
             "float", o->coll == ALLGATHER ? "none" : "sum", us, algbw, algbw * bus_factor(o),
             wrong);
      fflush(stdout);
      total_wrong += wrong;
    }
    barrier(o->nranks);
    bytes = next;
  }
  NCCL_OK(ncclCommDestroy(comm));
  if (rank == 0) printf("# wrong values in all: %ld\n", total_wrong);
  return total_wrong > 0;
}

/* A whole number for flag, or usage's exit: a typo is refused, not read as 0. */
static int parse_int(const char *s, char flag) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (end == s || *end != '\0' || errno != 0 || v < INT_MIN || v > INT_MAX) {
    fprintf(stderr, "nccl_api_perf: -%c %s is not a whole number\n", flag, s);
    exit(2);
  }
  return (int)v;
}

static size_t parse_size(const char *s) {
  char *end;
  double v = strtod(s, &end);
  if (end == s || v < 0) return 0;
  switch (*end) {
  case 'K': case 'k': v *= 1024; break;
  case 'M': case 'm': v *= 1024 * 1024; break;
  case 'G': case 'g': v *= 1024.0 * 1024 * 1024; break;
  default: break;
  }
  return (size_t)v;
}

/* The usage text: on stdout with status 0 (--help, -h), else on stderr
 * with status 2. */
static void usage_exit(int status) {
  fprintf(status == 0 ? stdout : stderr,
          "usage: nccl_api_perf [-n ranks] [-C allreduce|allgather|reducescatter] [-b min]\n"
          "                     [-e max] [-f factor] [-i iters] [-w warmup] [-G graph launches]\n"
          "                     [-M cuda|host] [-D (rank r on GPU r)] [-T timeout s]\n"
          "                     [-Z (self-test: check an output no call wrote)]\n"
          "the libnccl.so.2 it runs is the one the loader finds: weft's (installed: its\n"
          "run path, <libdir>/weft; built: LD_LIBRARY_PATH=build/), NVIDIA's with NCCL's\n"
          "folder in LD_LIBRARY_PATH; the first line names it\n");
  exit(status);
}
static void usage(void) { usage_exit(2); }

int main(int argc, char **argv) {
  struct opts o = {.nranks = 2, .iters = 20, .warmup = 5, .min_bytes = 8, .max_bytes = 8,
                   .factor = 2, .timeout_s = 300, .coll = ALLREDUCE};
#ifdef NCCL_PERF_CUDA
  o.device_mem = 1;
#endif
  int opt;
  static const struct option longopts[] = {{"help", no_argument, NULL, 'h'}, {NULL, 0, NULL, 0}};
  while ((opt = getopt_long(argc, argv, "n:C:b:e:f:i:w:G:M:DT:Zh", longopts, NULL)) != -1) {
    switch (opt) {
    case 'h': usage_exit(0); break;
    case 'n': o.nranks = parse_int(optarg, 'n'); break;
    case 'C':
      o.coll = -1;
      for (int c = 0; c < 3; c++)
        if (strcmp(optarg, coll_names[c]) == 0) o.coll = c;
      if (o.coll < 0) usage();
      break;
    case 'b': o.min_bytes = parse_size(optarg); break;
    case 'e': o.max_bytes = parse_size(optarg); break;
    case 'f': o.factor = atof(optarg); break;
    case 'i': o.iters = parse_int(optarg, 'i'); break;
    case 'w': o.warmup = parse_int(optarg, 'w'); break;
    case 'G': o.graphs = parse_int(optarg, 'G'); break;
    case 'M':
      if (strcmp(optarg, "host") == 0) o.device_mem = 0;
      else if (strcmp(optarg, "cuda") == 0) o.device_mem = 1;
      else usage();
      break;
    case 'D': o.per_gpu_device = 1; break;
    case 'T': o.timeout_s = parse_int(optarg, 'T'); break;
    case 'Z': o.skip_checked_call = 1; break;
    default: usage();
    }
  }
  if (o.nranks < 1 || o.nranks > MAX_RANKS || o.iters < 1 || o.warmup < 0 || o.graphs < 0 ||
      o.min_bytes < sizeof(float) || o.max_bytes < o.min_bytes || o.factor < 1)
    usage();
#ifndef NCCL_PERF_CUDA
  if (o.device_mem || o.graphs) {
    fprintf(stderr, "nccl_api_perf: built without the CUDA runtime: -M host only, no -G\n");
    return 2;
  }
#endif
  if (o.graphs && !o.device_mem) {
    fprintf(stderr, "nccl_api_perf: -G needs device memory (-M cuda)\n");
    return 2;
  }
  print_library();
  sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (sh == MAP_FAILED) {
    perror("nccl_api_perf: mmap");
    return 1;
  }
  pid_t pids[MAX_RANKS];
  for (int r = 0; r < o.nranks; r++) {
    pids[r] = fork();
    if (pids[r] < 0) {
      perror("nccl_api_perf: fork");
      atomic_store(&sh->failed, 1);
      break;
    }
    if (pids[r] == 0) _exit(rank_main(&o, r));
  }
  /* The parent waits; past the timeout it ends every rank. */
  int bad = 0, left = o.nranks;
  double deadline = now_us() + o.timeout_s * 1e6;
  while (left > 0) {
    int status;
    pid_t p = waitpid(-1, &status, WNOHANG);
    if (p > 0) {
      left--;
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        bad = 1;
        atomic_store(&sh->failed, 1);
      }
      continue;
    }
    if (p < 0) break;
    if (now_us() > deadline) {
      fprintf(stderr, "nccl_api_perf: timed out after %d s; ending the ranks\n", o.timeout_s);
      for (int r = 0; r < o.nranks; r++) kill(pids[r], SIGKILL);
      bad = 1;
      deadline = INFINITY;
    }
    usleep(10000);
  }
  return bad;
}
