// cuda_emu's runtime (cuda_emu.h): the CUDA runtime functions weft's device
// path and its device suites call, on the host.
//
// - Device memory (cudaMalloc) is a memfd mapped shared, so that an IPC
//   handle (the owner's pid and fd) opens it in another process through
//   /proc; mapped host memory is the host pointer itself.
// - A stream is a worker thread that runs its queue in order: kernels,
//   copies, sets, event records and waits, host functions, frees. The
//   legacy and per-thread default streams are streams of their own.
// - A kernel launch runs every block at once, each as WEFT_CUDA_EMU_THREADS
//   threads (default 4; blockDim says so), with a barrier per block: the
//   kernels stride by blockDim and give thread 0 the flags, so fewer threads
//   than launched compute the same. A kernel registered apart (one thread
//   per index, threads that never meet) runs every thread of its blockDim
//   instead, one after another, its blocks shared among a few host threads.
// - A capture (cudaStreamBeginCapture) records what is enqueued into a
//   graph; a stream that waits on an event recorded under a capture joins
//   it; a graph launch enqueues its operations again in capture order.
// - The legacy default stream (NULL, and the synchronous copies and sets)
//   orders itself against every blocking stream, as CUDA's does: an
//   operation on it waits for what those streams queued before, and theirs
//   for what it queued before (OP_AFTER).
// - One device, compute capability 8.0: no programmatic dependent launch.
// - Kernels load lazily, as the runtime's default: a kernel's first launch
//   or question (attributes, occupancy) waits for every stream of the
//   process; CUDA_MODULE_LOADING=EAGER turns that off.
//
// This file: the kernels' registry, their threads and the launches; the
// other parts are cuda_emu_memory.cc, cuda_emu_streams.cc and
// cuda_emu_device.cc (cuda_emu_int.h).
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <thread>

#include "cuda_emu_int.h"

// --- kernels: the registry and the threads' coordinates ----------------------

namespace cuda_emu_rt {

std::map<const void *, Kernel> &kernels() {
  static auto *k = new std::map<const void *, Kernel>;
  return *k;
}
std::mutex &kernels_mutex() {
  static auto *m = new std::mutex;
  return *m;
}
std::mutex &loaded_mutex() {
  static auto *m = new std::mutex;
  return *m;
}

thread_local cudaError_t last_error = cudaSuccess;
thread_local int current_device = 0;
emu_ctx primary_ctx[8];
thread_local CUcontext current_ctx = NULL;
thread_local cuda_emu_thread self_ctx;

void ctx_need() {
  if (current_ctx == NULL) current_ctx = (CUcontext)&primary_ctx[current_device];
}

cudaError_t fail(cudaError_t e) {
  if (e != cudaSuccess && e != cudaErrorNotReady) last_error = e;
  return e;
}

int env_int(const char *name, int dflt, int lo, int hi) {
  const char *s = getenv(name);
  if (s == NULL || *s == 0) return dflt;
  int v = atoi(s);
  return v < lo ? lo : v > hi ? hi : v;
}

} // namespace cuda_emu_rt

using namespace cuda_emu_rt;

namespace {

thread_local unsigned polls;

// A block's barrier (__syncthreads_or).
struct Block {
  std::mutex m;
  std::condition_variable cv;
  unsigned n, arrived = 0;
  uint64_t generation = 0;
  int acc = 0, result = 0;
  alignas(64) char shared[CUDA_EMU_SHARED_NBYTES] = {};
};

} // namespace

// The kernel's own name out of cuda_emu_entry's __PRETTY_FUNCTION__
// ("... void (* F)(A ...) = weft_ring_kernel<red_f32_sum, 1>]"), kept for
// the program's life; name itself where it has no such part.
static const char *kernel_name(const char *name) {
  const char *mark = "(A ...) = ";
  const char *p = strstr(name, mark);
  if (p == NULL) return name;
  p += strlen(mark);
  size_t n = strlen(p);
  if (n > 0 && p[n - 1] == ']') n--;
  char *own = strndup(p, n);
  return own != NULL ? own : name;
}

extern "C" int cuda_emu_register(const void *fn, cuda_emu_run_fn run, int nargs,
                                 const size_t *sizes, const char *name, int apart) {
  std::lock_guard<std::mutex> g(kernels_mutex());
  if (kernels().count(fn) == 0)
    kernels().emplace(fn, Kernel{run, kernel_name(name), std::vector<size_t>(sizes, sizes + nargs),
                                 apart != 0});
  return 0;
}

namespace {
[[noreturn]] void refuse_apart(const char *what) {
  fprintf(stderr,
          "cuda_emu: %s in %s, registered apart (CUDA_EMU_KERNEL_APART): its threads run one "
          "after another\n",
          what, self_ctx.kernel != NULL ? self_ctx.kernel : "a kernel");
  abort();
}
} // namespace

extern "C" struct cuda_emu_thread *cuda_emu_self(void) { return &self_ctx; }

extern "C" void *cuda_emu_shared(size_t nbytes) {
  if (self_ctx.block == NULL) refuse_apart("shared memory");
  if (nbytes > CUDA_EMU_SHARED_NBYTES) abort();
  return static_cast<Block *>(self_ctx.block)->shared;
}

extern "C" int cuda_emu_syncthreads_or(int pred) {
  Block *b = static_cast<Block *>(self_ctx.block);
  if (b == NULL) refuse_apart("__syncthreads");
  std::unique_lock<std::mutex> l(b->m);
  b->acc |= pred != 0;
  if (++b->arrived == b->n) {
    b->result = b->acc;
    b->acc = 0;
    b->arrived = 0;
    b->generation++;
    b->cv.notify_all();
    return b->result;
  }
  const uint64_t gen = b->generation;
  b->cv.wait(l, [&] { return b->generation != gen; });
  return b->result;
}

extern "C" void cuda_emu_poll(void) {
  if ((++polls & 15) == 0) sched_yield();
}

extern "C" uint64_t cuda_emu_clock_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

// --- launches

namespace {

// Blocks resident at once: every block of a channel kernel (at most
// DEV_MAX_CHANNELS, device.h), whose blocks wait on peers' blocks; a larger
// grid (a grid-stride kernel) runs in waves of this many.
const unsigned RESIDENT_BLOCKS = 64;

// A kernel registered apart: every thread of every block, one after
// another, blocks shared out among WEFT_CUDA_EMU_THREADS host threads.
void run_kernel_apart(const Op &op) {
  const unsigned nblocks = op.grid.x * op.grid.y * op.grid.z;
  const unsigned nworkers =
      std::min<unsigned>(nblocks, (unsigned)env_int("WEFT_CUDA_EMU_THREADS", 4, 1, 1024));
  std::atomic<unsigned> next{0};
  std::vector<void *> argv(op.offsets.size());
  for (size_t i = 0; i < op.offsets.size(); i++) argv[i] = op.args.get() + op.offsets[i];
  auto work = [&] {
    std::vector<void *> mine(argv);
    self_ctx.block_dim = op.block;
    self_ctx.grid_dim = op.grid;
    self_ctx.block = NULL;
    self_ctx.kernel = op.name;
    for (unsigned b; (b = next.fetch_add(1)) < nblocks;) {
      self_ctx.block_idx =
          uint3{b % op.grid.x, b / op.grid.x % op.grid.y, b / (op.grid.x * op.grid.y)};
      for (unsigned z = 0; z < op.block.z; z++)
        for (unsigned y = 0; y < op.block.y; y++)
          for (unsigned x = 0; x < op.block.x; x++) {
            self_ctx.thread_idx = uint3{x, y, z};
            op.run(mine.data());
          }
    }
  };
  std::vector<std::thread> threads;
  for (unsigned w = 1; w < nworkers; w++) threads.emplace_back(work);
  work();
  for (auto &t : threads) t.join();
}

} // namespace

void cuda_emu_rt::run_kernel(const Op &op) {
  if (op.apart) return run_kernel_apart(op);
  const unsigned want = op.block.x * op.block.y * op.block.z;
  const unsigned nthreads =
      std::min<unsigned>(want, (unsigned)env_int("WEFT_CUDA_EMU_THREADS", 4, 1, 1024));
  const unsigned nblocks = op.grid.x * op.grid.y * op.grid.z;
  std::vector<void *> argv(op.offsets.size());
  for (size_t i = 0; i < op.offsets.size(); i++) argv[i] = op.args.get() + op.offsets[i];
  for (unsigned first = 0; first < nblocks; first += RESIDENT_BLOCKS) {
    const unsigned last = std::min(nblocks, first + RESIDENT_BLOCKS);
    std::vector<std::unique_ptr<Block>> blocks(last - first);
    std::vector<std::thread> threads;
    threads.reserve((size_t)(last - first) * nthreads);
    for (unsigned b = first; b < last; b++) {
      Block *blk = new Block;
      blk->n = nthreads;
      blocks[b - first].reset(blk);
      for (unsigned t = 0; t < nthreads; t++) {
        threads.emplace_back([&op, &argv, blk, nthreads, b, t] {
          self_ctx.thread_idx = uint3{t, 0, 0};
          self_ctx.block_idx = uint3{b % op.grid.x, b / op.grid.x % op.grid.y,
                                     b / (op.grid.x * op.grid.y)};
          self_ctx.block_dim = dim3(nthreads, 1, 1);
          self_ctx.grid_dim = op.grid;
          self_ctx.block = blk;
          self_ctx.kernel = op.name;
          std::vector<void *> mine(argv); // each thread's own pointers to the parameters
          op.run(mine.data());
        });
      }
    }
    for (auto &t : threads) t.join();
  }
}

namespace {

// Lazy loading, as the CUDA runtime does it by default (CUDA 12.2 on;
// CUDA_MODULE_LOADING=EAGER turns it off): a kernel loads at its first
// launch or the first question about it (attributes, occupancy), and
// loading waits for every stream's work of the process (the context
// synchronizes). A kernel whose first launch comes behind a running kernel
// that waits on work not launched yet waits as long as that kernel does: on
// a GPU, ranks sharing a process hang there. A launch that a capture
// records loads its kernel without waiting (a capture may not synchronize).
void load(const void *fn, bool wait) {
  static const bool eager = [] {
    const char *v = getenv("CUDA_MODULE_LOADING");
    return v != NULL && strcmp(v, "EAGER") == 0;
  }();
  static auto *loaded = new std::set<const void *>;
  if (eager) return;
  {
    std::lock_guard<std::mutex> g(cuda_emu_rt::loaded_mutex());
    if (loaded->count(fn) != 0) return;
  }
  if (wait) cuda_emu_rt::sync_all();
  std::lock_guard<std::mutex> g(cuda_emu_rt::loaded_mutex());
  loaded->insert(fn);
}

// Whether a capture records stream's launches.
bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  return cudaStreamIsCapturing(stream, &st) == cudaSuccess && st != cudaStreamCaptureStatusNone;
}

} // namespace

extern "C" {

static cudaError_t launch(const void *fn, dim3 grid, dim3 block, void **args, cudaStream_t stream) {
  Kernel k;
  {
    std::lock_guard<std::mutex> g(kernels_mutex());
    auto it = kernels().find(fn);
    if (it == kernels().end()) return fail(cudaErrorInvalidDeviceFunction);
    k = it->second;
  }
  if (grid.x * grid.y * grid.z == 0 || block.x * block.y * block.z == 0 ||
      block.x * block.y * block.z > 1024)
    return fail(cudaErrorInvalidConfiguration);
  load(fn, !capturing(stream));
  if (getenv("WEFT_CUDA_EMU_LOG") != NULL) fprintf(stderr, "cuda_emu: launch %s <<<%u, %u>>>\n", k.name, grid.x * grid.y * grid.z, block.x * block.y * block.z);
  Op op;
  op.kind = OP_KERNEL;
  op.run = k.run;
  op.name = k.name;
  op.apart = k.apart;
  op.grid = grid;
  op.block = block;
  size_t total = 0;
  for (size_t sz : k.sizes) {
    op.offsets.push_back(total);
    total += (sz + 63) / 64 * 64;
  }
  op.args.reset(static_cast<char *>(aligned_alloc(64, total ? total : 64)), free);
  for (size_t i = 0; i < k.sizes.size(); i++) memcpy(op.args.get() + op.offsets[i], args[i], k.sizes[i]);
  return enqueue(stream, std::move(op));
}
cudaError_t cudaLaunchKernel(const void *fn, dim3 grid, dim3 block, void **args, size_t shmem,
                             cudaStream_t stream) {
  (void)shmem;
  return launch(fn, grid, block, args, stream);
}
cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t *config, const void *fn, void **args) {
  if (config == NULL) return fail(cudaErrorInvalidValue);
  return launch(fn, config->gridDim, config->blockDim, args, config->stream);
}
cudaError_t cudaFuncGetAttributes(struct cudaFuncAttributes *a, const void *fn) {
  if (a == NULL) return fail(cudaErrorInvalidValue);
  {
    std::lock_guard<std::mutex> g(kernels_mutex());
    if (kernels().find(fn) == kernels().end()) return fail(cudaErrorInvalidDeviceFunction);
  }
  load(fn, true);
  memset(a, 0, sizeof *a);
  a->maxThreadsPerBlock = 1024;
  a->numRegs = 64;
  a->ptxVersion = 80;
  a->binaryVersion = 80;
  return cudaSuccess;
}
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *n, const void *fn, int block,
                                                          size_t shmem) {
  (void)block, (void)shmem;
  if (n == NULL) return fail(cudaErrorInvalidValue);
  {
    std::lock_guard<std::mutex> g(kernels_mutex());
    if (kernels().find(fn) == kernels().end()) return fail(cudaErrorInvalidDeviceFunction);
  }
  load(fn, true);
  *n = 2;
  return cudaSuccess;
}
cudaError_t cudaGetKernel(cudaKernel_t *k, const void *fn) {
  (void)k, (void)fn;
  return fail(cudaErrorNotSupported);
}

} // extern "C"
