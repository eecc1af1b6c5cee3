/* What the CUDA calls on a device collective's enqueue path cost the host,
 * each alone, on this GPU (gpu-check's perf_launch: docs/gpu-check.md): the
 * host time per call, averaged over many calls, and, for kernels, the GPU's
 * time per back-to-back launch (queued behind a gate kernel, so that the
 * host's pace is not what is timed), with and without an event recorded
 * after each, and with programmatic dependent launch. Host calls are timed
 * in batches with the stream drained between them, so that a full launch
 * queue never blocks a timed call.
 *
 *   nvcc -O2 -arch=native -o launch_cost tools/bench/launch_cost.cu \
 *     -L/usr/local/cuda/lib64/stubs -lcuda
 *   ./launch_cost [CALLS=20000] [host]
 *
 * Under MPS (a daemon running) the same binary measures an MPS client;
 * "host" leaves the GPU rows out, for two clients timed at once (gpu-check's
 * perf_launch_mps). */
#include <cuda.h>
#include <cuda_runtime.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct arg64 {
  void *p[8];
};
struct arg160 { /* a ring launch's parameters (struct dev_work) are about this size */
  void *p[20];
};

__global__ void empty_kernel(void) {}
__global__ void arg_kernel(arg64 a) {
  if (a.p[0] == (void *)1 && threadIdx.x == 0) *(int *)a.p[1] = 1;
}
__global__ void arg160_kernel(arg160 a) {
  if (a.p[0] == (void *)1 && threadIdx.x == 0) *(int *)a.p[1] = 1;
}

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e6 + (double)t.tv_nsec * 1e-3;
}

#define OK(x)                                                             \
  do {                                                                    \
    cudaError_t e_ = (x);                                                 \
    if (e_ != cudaSuccess) {                                              \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x,           \
              cudaGetErrorString(e_));                                    \
      exit(1);                                                            \
    }                                                                     \
  } while (0)

static cudaStream_t s;
static int calls = 20000;
enum { BATCH = 256 };

/* Host microseconds per call of body(i), BATCH calls at a time, the stream
 * drained (untimed) between batches when drain is set. */
template <typename F>
static double per_call(F body, bool drain) {
  for (int i = 0; i < BATCH; i++) body(i); /* warm */
  OK(cudaStreamSynchronize(s));
  double total = 0;
  for (int done = 0; done < calls; done += BATCH) {
    double t0 = now_us();
    for (int i = 0; i < BATCH; i++) body(done + i);
    total += now_us() - t0;
    if (drain) OK(cudaStreamSynchronize(s));
  }
  OK(cudaStreamSynchronize(s));
  return total / ((calls + BATCH - 1) / BATCH * BATCH);
}

/* Holds the stream until the host sets *open (mapped host memory), or for
 * at most a second, so that the launches queued behind it run back to
 * back at the GPU's pace, not the host's. */
__global__ void gate_kernel(const volatile int *open) {
  uint64_t t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (*open == 0 && t - t0 < 1000000000ull);
}

/* A kernel launched to overlap its predecessor (programmatic dependent
 * launch): waits for it, then lets the next one be scheduled. */
__global__ void pdl_kernel(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

static int *gate_h, *gate_d;

/* GPU microseconds per kernel of BATCH launched back to back: queued behind
 * a gate, timed by events from the gate's end to the last one's; negative
 * when the host could not queue them all while the gate held (a full
 * launch queue waits for the GPU). */
template <typename F>
static double gpu_per_launch(F launch) {
  cudaEvent_t e0, e1;
  OK(cudaEventCreate(&e0));
  OK(cudaEventCreate(&e1));
  for (int i = 0; i < BATCH; i++) launch(i); /* warm */
  OK(cudaStreamSynchronize(s));
  *(volatile int *)gate_h = 0;
  gate_kernel<<<1, 1, 0, s>>>(gate_d);
  OK(cudaEventRecord(e0, s));
  double t0 = now_us();
  for (int i = 0; i < BATCH; i++) launch(i);
  OK(cudaEventRecord(e1, s));
  bool held = cudaEventQuery(e0) == cudaErrorNotReady;
  double queued_us = now_us() - t0;
  __sync_synchronize();
  *(volatile int *)gate_h = 1;
  OK(cudaEventSynchronize(e1));
  cudaGetLastError(); /* the query's cudaErrorNotReady */
  float ms = 0;
  OK(cudaEventElapsedTime(&ms, e0, e1));
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return held && queued_us < 9e5 ? ms * 1e3 / BATCH : -1;
}

int main(int argc, char **argv) {
  if (argc > 1) calls = atoi(argv[1]);
  const bool host_only = argc > 2 && strcmp(argv[2], "host") == 0;
  if (calls < BATCH) calls = BATCH;
  OK(cudaSetDevice(0));
  OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  void *dbuf, *dbuf2;
  OK(cudaMalloc(&dbuf, 1 << 20));
  OK(cudaMalloc(&dbuf2, 1 << 20));
  void *hbuf = malloc(1 << 20);
  void *pinned;
  OK(cudaMallocHost(&pinned, 1 << 20));
  cudaEvent_t ev;
  OK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  cudaFunction_t fn_empty, fn_arg;
  OK(cudaGetFuncBySymbol(&fn_empty, (const void *)empty_kernel));
  OK(cudaGetFuncBySymbol(&fn_arg, (const void *)arg_kernel));
  arg64 a;
  memset(&a, 0, sizeof a);
  a.p[1] = dbuf;
  void *args[] = {&a};
  cudaDeviceProp prop;
  OK(cudaGetDeviceProperties(&prop, 0));
  printf("# %s, %d SMs; %d calls a figure, host us per call\n", prop.name,
         prop.multiProcessorCount, calls);

  struct row {
    const char *name;
    double us;
  };
  row rows[32];
  int n = 0;
  rows[n++] = {"cudaLaunchKernel empty <<<1,32>>>", per_call([&](int) {
                 cudaLaunchKernel((const void *)empty_kernel, dim3(1), dim3(32), nullptr, 0, s);
               }, true)};
  rows[n++] = {"cudaLaunchKernel 64 B arg <<<1,512>>>", per_call([&](int) {
                 cudaLaunchKernel((const void *)arg_kernel, dim3(1), dim3(512), args, 0, s);
               }, true)};
  rows[n++] = {"cudaLaunchKernel 64 B arg <<<32,512>>>", per_call([&](int) {
                 cudaLaunchKernel((const void *)arg_kernel, dim3(32), dim3(512), args, 0, s);
               }, true)};
  rows[n++] = {"cuLaunchKernel 64 B arg <<<1,512>>>", per_call([&](int) {
                 cuLaunchKernel((CUfunction)fn_arg, 1, 1, 1, 512, 1, 1, 0, (CUstream)s, args,
                                nullptr);
               }, true)};
  cudaKernel_t k_arg;
  OK(cudaGetKernel(&k_arg, (const void *)arg_kernel));
  rows[n++] = {"cuLaunchKernel of a cudaGetKernel handle", per_call([&](int) {
                 cuLaunchKernel((CUfunction)k_arg, 1, 1, 1, 512, 1, 1, 0, (CUstream)s, args,
                                nullptr);
               }, true)};
  /* what the host calls of CUDA for a device all-reduce once its buffers are
   * known (collectives/exec/device/device_launch.c): the context, the
   * device, whether a graph captures the stream, the kernel */
  arg160 a160;
  memset(&a160, 0, sizeof a160);
  void *args160[] = {&a160};
  cudaKernel_t k_arg160;
  OK(cudaGetKernel(&k_arg160, (const void *)arg160_kernel));
  rows[n++] = {"weft's calls: ctx, device, capture, 160 B launch", per_call([&](int) {
                 CUcontext c;
                 cuCtxGetCurrent(&c);
                 int d;
                 cudaGetDevice(&d);
                 cudaStreamCaptureStatus cs;
                 cudaStreamIsCapturing(s, &cs);
                 cuLaunchKernel((CUfunction)k_arg160, 1, 1, 1, 512, 1, 1, 0, (CUstream)s,
                                args160, nullptr);
               }, true)};
  rows[n++] = {"cudaEventRecord", per_call([&](int) { cudaEventRecord(ev, s); }, false)};
  rows[n++] = {"cudaLaunchKernel + cudaEventRecord", per_call([&](int) {
                 cudaLaunchKernel((const void *)arg_kernel, dim3(1), dim3(512), args, 0, s);
                 cudaEventRecord(ev, s);
               }, true)};
  rows[n++] = {"cudaStreamWaitEvent", per_call([&](int) { cudaStreamWaitEvent(s, ev, 0); },
                                               false)};
  rows[n++] = {"cudaStreamIsCapturing", per_call([&](int) {
                 cudaStreamCaptureStatus c;
                 cudaStreamIsCapturing(s, &c);
               }, false)};
  rows[n++] = {"cudaEventQuery (done)", per_call([&](int) { cudaEventQuery(ev); }, false)};
  rows[n++] = {"cudaPointerGetAttributes device", per_call([&](int i) {
                 cudaPointerAttributes at;
                 cudaPointerGetAttributes(&at, (char *)dbuf + (i & 1023));
               }, false)};
  rows[n++] = {"cudaPointerGetAttributes malloc", per_call([&](int i) {
                 cudaPointerAttributes at;
                 cudaPointerGetAttributes(&at, (char *)hbuf + (i & 1023));
               }, false)};
  rows[n++] = {"cudaPointerGetAttributes pinned", per_call([&](int i) {
                 cudaPointerAttributes at;
                 cudaPointerGetAttributes(&at, (char *)pinned + (i & 1023));
               }, false)};
  rows[n++] = {"cuPointerGetAttribute MEMORY_TYPE device", per_call([&](int i) {
                 unsigned t = 0;
                 cuPointerGetAttribute(&t, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                       (CUdeviceptr)((char *)dbuf + (i & 1023)));
               }, false)};
  rows[n++] = {"cudaGetDevice", per_call([&](int) {
                 int d;
                 cudaGetDevice(&d);
               }, false)};
  rows[n++] = {"cudaSetDevice (same)", per_call([&](int) { cudaSetDevice(0); }, false)};
  rows[n++] = {"cuCtxGetCurrent", per_call([&](int) {
                 CUcontext c;
                 cuCtxGetCurrent(&c);
               }, false)};
  rows[n++] = {"cudaGetLastError", per_call([&](int) { cudaGetLastError(); }, false)};
  rows[n++] = {"cudaMemcpyAsync D2D 8 B", per_call([&](int) {
                 cudaMemcpyAsync(dbuf2, dbuf, 8, cudaMemcpyDeviceToDevice, s);
               }, true)};
  cudaGetLastError();
  for (int i = 0; i < n; i++) printf("  %-48s\t%8.3f\n", rows[i].name, rows[i].us);
  if (host_only) return 0;

  printf("# GPU us per kernel, %d launched back to back behind a gate\n", (int)BATCH);
  OK(cudaHostAlloc(&gate_h, sizeof(int), cudaHostAllocMapped));
  OK(cudaHostGetDevicePointer(&gate_d, gate_h, 0));
  cudaLaunchAttribute pdl_attr;
  memset(&pdl_attr, 0, sizeof pdl_attr);
  pdl_attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  pdl_attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t pdl_cfg;
  memset(&pdl_cfg, 0, sizeof pdl_cfg);
  pdl_cfg.gridDim = dim3(1);
  pdl_cfg.blockDim = dim3(32);
  pdl_cfg.stream = s;
  pdl_cfg.attrs = &pdl_attr;
  pdl_cfg.numAttrs = 1;
  struct {
    const char *name;
    double us;
  } gpu[] = {
      {"GPU empty <<<1,32>>>", gpu_per_launch([&](int) {
         cudaLaunchKernel((const void *)empty_kernel, dim3(1), dim3(32), nullptr, 0, s);
       })},
      {"GPU empty, each + cudaEventRecord", gpu_per_launch([&](int) {
         cudaLaunchKernel((const void *)empty_kernel, dim3(1), dim3(32), nullptr, 0, s);
         cudaEventRecord(ev, s);
       })},
      {"GPU PDL <<<1,32>>> (griddepcontrol)", gpu_per_launch([&](int) {
         cudaLaunchKernelExC(&pdl_cfg, (const void *)pdl_kernel, nullptr);
       })},
      {"GPU PDL, each + cudaEventRecord", gpu_per_launch([&](int) {
         cudaLaunchKernelExC(&pdl_cfg, (const void *)pdl_kernel, nullptr);
         cudaEventRecord(ev, s);
       })},
      {"GPU 64 B arg <<<32,512>>>", gpu_per_launch([&](int) {
         cudaLaunchKernel((const void *)arg_kernel, dim3(32), dim3(512), args, 0, s);
       })},
      {"GPU memcpy D2D 8 B", gpu_per_launch([&](int) {
         cudaMemcpyAsync(dbuf2, dbuf, 8, cudaMemcpyDeviceToDevice, s);
       })},
  };
  for (const auto &g : gpu)
    if (g.us < 0) printf("  %-48s\t%8s\n", g.name, "n/a");
    else printf("  %-48s\t%8.3f\n", g.name, g.us);
  OK(cudaGetLastError());
  return 0;
}
