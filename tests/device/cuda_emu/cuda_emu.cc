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
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <set>
#include <thread>
#include <vector>

#include "cuda_emu.h"

// --- kernels: the registry and the threads' coordinates ----------------------

namespace {

struct Kernel {
  cuda_emu_run_fn run;
  const char *name;
  std::vector<size_t> sizes;
  int apart; // its threads never meet (cuda_emu_register)
};

// Never destroyed: worker threads may still use them while the process exits.
std::map<const void *, Kernel> &kernels() {
  static auto *k = new std::map<const void *, Kernel>;
  return *k;
}
std::mutex &kernels_mutex() {
  static auto *m = new std::mutex;
  return *m;
}

thread_local cudaError_t last_error = cudaSuccess;
thread_local int current_device = 0;
struct emu_ctx {
  int unused;
};
emu_ctx primary_ctx[8];           // each device's primary context
thread_local CUcontext current_ctx = NULL; // the thread's current context

// The runtime makes the current device's primary context current where a
// call needs one.
void ctx_need() {
  if (current_ctx == NULL) current_ctx = (CUcontext)&primary_ctx[current_device];
}
thread_local cuda_emu_thread self_ctx;
thread_local unsigned polls;

cudaError_t fail(cudaError_t e) {
  if (e != cudaSuccess && e != cudaErrorNotReady) last_error = e;
  return e;
}

// A block's barrier (__syncthreads_or).
struct Block {
  std::mutex m;
  std::condition_variable cv;
  unsigned n, arrived = 0;
  uint64_t generation = 0;
  int acc = 0, result = 0;
  alignas(64) char shared[CUDA_EMU_SHARED_NBYTES] = {};
};

int env_int(const char *name, int dflt, int lo, int hi) {
  const char *s = getenv(name);
  if (s == NULL || *s == 0) return dflt;
  int v = atoi(s);
  return v < lo ? lo : v > hi ? hi : v;
}

} // namespace

extern "C" int cuda_emu_register(const void *fn, cuda_emu_run_fn run, int nargs,
                                 const size_t *sizes, const char *name, int apart) {
  std::lock_guard<std::mutex> g(kernels_mutex());
  kernels().emplace(fn, Kernel{run, name, std::vector<size_t>(sizes, sizes + nargs), apart != 0});
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

// --- memory -----------------------------------------------------------------

namespace {

enum RegionKind { REGION_DEVICE, REGION_HOST_ALLOC, REGION_HOST_REGISTERED, REGION_IPC };

struct Region {
  char *base;
  size_t size; // mapped bytes
  RegionKind kind;
  int fd; // device memory's memfd, -1 otherwise
};

struct Memory {
  std::mutex m;
  std::map<uintptr_t, Region> regions; // by base
};
Memory &memory() {
  static auto *mem = new Memory;
  return *mem;
}

size_t page_round(size_t n) {
  const size_t page = (size_t)sysconf(_SC_PAGESIZE);
  return (n + page - 1) / page * page;
}

// The region holding p (memory().m held); NULL if none.
Region *region_of(const void *p) {
  auto &rs = memory().regions;
  auto it = rs.upper_bound((uintptr_t)p);
  if (it == rs.begin()) return NULL;
  --it;
  Region &r = it->second;
  return (uintptr_t)p < (uintptr_t)r.base + r.size ? &r : NULL;
}

void raise_fd_limit() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
      rl.rlim_cur = rl.rlim_max;
      setrlimit(RLIMIT_NOFILE, &rl);
    }
  });
}

cudaError_t device_alloc(void **p, size_t n) {
  ctx_need();
  if (p == NULL) return fail(cudaErrorInvalidValue);
  *p = NULL;
  if (n == 0) return cudaSuccess;
  raise_fd_limit();
  const size_t size = page_round(n);
  int fd = memfd_create("weft-cuda-emu", MFD_CLOEXEC);
  if (fd < 0) return fail(cudaErrorMemoryAllocation);
  if (ftruncate(fd, (off_t)size) != 0) {
    close(fd);
    return fail(cudaErrorMemoryAllocation);
  }
  void *base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    close(fd);
    return fail(cudaErrorMemoryAllocation);
  }
  // cudaMalloc's memory is not zeroed; say so to a test that reads it unwritten
  memset(base, 0xa5, std::min<size_t>(size, 4096));
  std::lock_guard<std::mutex> g(memory().m);
  memory().regions[(uintptr_t)base] = Region{(char *)base, size, REGION_DEVICE, fd};
  *p = base;
  return cudaSuccess;
}

// Unmaps an allocation made by device_alloc (kind REGION_DEVICE) or
// host_alloc; p must be its base.
cudaError_t region_free(void *p, RegionKind kind) {
  if (p == NULL) return cudaSuccess;
  Region r;
  {
    std::lock_guard<std::mutex> g(memory().m);
    auto it = memory().regions.find((uintptr_t)p);
    if (it == memory().regions.end() || it->second.kind != kind)
      return fail(cudaErrorInvalidValue);
    r = it->second;
    memory().regions.erase(it);
  }
  if (r.kind != REGION_HOST_REGISTERED) munmap(r.base, r.size);
  if (r.fd >= 0) close(r.fd);
  return cudaSuccess;
}

struct IpcHandle {
  uint64_t magic;
  int32_t pid, fd;
  uint64_t size;
};
const uint64_t IPC_MAGIC = 0x77656674656d7531ull;
static_assert(sizeof(IpcHandle) <= sizeof(cudaIpcMemHandle_t), "IPC handle fits");

} // namespace

// --- streams and events -----------------------------------------------------

struct CUgraph_st;

struct CUevent_st {
  uint64_t recorded = 0;      // under events_mutex: records made,
  std::set<uint64_t> pending; // and those not reached yet by their streams
  CUgraph_st *captured_in = NULL;  // recorded last under this capture
  unsigned flags = 0;
  uint64_t reached = 0, reached_ns = 0; // the latest record its stream reached, and when
};

namespace {

std::mutex &events_mutex() {
  static auto *m = new std::mutex;
  return *m;
}
std::condition_variable &events_cv() {
  static auto *cv = new std::condition_variable;
  return *cv;
}

enum OpKind { OP_KERNEL, OP_COPY, OP_SET, OP_RECORD, OP_WAIT, OP_HOST, OP_FREE, OP_AFTER };

struct Op {
  OpKind kind;
  // OP_KERNEL
  cuda_emu_run_fn run = NULL;
  const char *name = NULL;
  int apart = 0;
  std::shared_ptr<char> args;  // the parameters' copies, 64-byte aligned each
  std::vector<size_t> offsets; // of each in args
  dim3 grid, block;
  // OP_COPY, OP_SET, OP_FREE
  void *dst = NULL;
  const void *src = NULL;
  size_t n = 0;
  int value = 0;
  // OP_RECORD, OP_WAIT
  CUevent_st *event = NULL;
  uint64_t seq = 0;
  // OP_HOST
  cudaHostFn_t host = NULL;
  void *data = NULL;
  // OP_AFTER: until that stream has run its first seq operations
  CUstream_st *after = NULL;
};

} // namespace

struct CUgraph_st {
  std::vector<Op> ops;
};
struct CUgraphExec_st {
  std::vector<Op> ops;
};

struct CUstream_st {
  std::mutex m;
  std::condition_variable cv;
  std::deque<Op> q;
  bool busy = false, dying = false;
  uint64_t queued = 0, done = 0; // operations put in its queue, and run
  unsigned flags = 0;
  int priority = 0;
  unsigned long long id = 0;
  CUgraph_st *capture = NULL;
  cudaStreamCaptureMode capture_mode = cudaStreamCaptureModeGlobal;
};

namespace {

struct Streams {
  std::mutex m;
  std::set<CUstream_st *> all;
  unsigned long long next_id = 1;
  CUstream_st *legacy = NULL;
  std::set<CUgraph_st *> captures; // going on
  uint64_t generation = 0; // bumped in a forked child: the parent's workers are gone
};
Streams &streams() {
  static auto *s = new Streams;
  return *s;
}
thread_local CUstream_st *per_thread = NULL;
thread_local uint64_t per_thread_generation = 0;
thread_local cudaStreamCaptureMode thread_capture_mode = cudaStreamCaptureModeGlobal;

void run_op(Op &op);

void worker(CUstream_st *s) {
  std::unique_lock<std::mutex> l(s->m);
  for (;;) {
    s->cv.wait(l, [&] { return !s->q.empty() || s->dying; });
    if (s->q.empty()) break; // dying, drained
    Op op = std::move(s->q.front());
    s->q.pop_front();
    s->busy = true;
    l.unlock();
    run_op(op);
    l.lock();
    s->busy = false;
    s->done++;
    s->cv.notify_all();
  }
  l.unlock();
  // left allocated: a caller may still hold it from streams().all (sync_all)
  std::lock_guard<std::mutex> g(streams().m);
  streams().all.erase(s);
}

CUstream_st *stream_new(unsigned flags, int priority) {
  ctx_need();
  auto *s = new CUstream_st;
  s->flags = flags;
  s->priority = priority;
  {
    std::lock_guard<std::mutex> g(streams().m);
    s->id = streams().next_id++;
    streams().all.insert(s);
  }
  std::thread(worker, s).detach();
  return s;
}

// In a forked child the parent's stream workers are gone and any lock may
// have been held at the fork: start over (what was there is left, unfreed).
void fork_child() {
  const uint64_t gen = streams().generation + 1;
  new (&streams()) Streams();
  streams().generation = gen;
  new (&events_mutex()) std::mutex();
  new (&events_cv()) std::condition_variable();
  new (&memory().m) std::mutex();
  new (&kernels_mutex()) std::mutex();
}
const int fork_child_registered = pthread_atfork(NULL, NULL, fork_child);

CUstream_st *resolve(cudaStream_t stream) {
  Streams &ss = streams();
  if (stream == cudaStreamPerThread) {
    if (per_thread == NULL || per_thread_generation != ss.generation) {
      per_thread = stream_new(0, 0);
      per_thread_generation = ss.generation;
    }
    return per_thread;
  }
  if (stream == NULL || stream == cudaStreamLegacy) {
    std::lock_guard<std::mutex> g(ss.m);
    if (ss.legacy == NULL) {
      auto *s = new CUstream_st;
      s->id = 0;
      ss.all.insert(s);
      ss.legacy = s;
      std::thread(worker, s).detach();
    }
    return ss.legacy;
  }
  return stream;
}

void stream_sync(CUstream_st *s) {
  std::unique_lock<std::mutex> l(s->m);
  s->cv.wait(l, [&] { return s->q.empty() && !s->busy; });
}

void sync_all() {
  std::vector<CUstream_st *> all;
  {
    std::lock_guard<std::mutex> g(streams().m);
    all.assign(streams().all.begin(), streams().all.end());
  }
  for (auto *s : all) stream_sync(s);
}

bool blocking(const CUstream_st *s) { return (s->flags & cudaStreamNonBlocking) == 0; }

// An OP_AFTER on what t has queued but not run yet; false when nothing is
// pending there or t is capturing.
bool after_pending(CUstream_st *t, Op *out) {
  std::lock_guard<std::mutex> g(t->m);
  if (t->capture != NULL || t->queued == t->done) return false;
  out->kind = OP_AFTER;
  out->after = t;
  out->seq = t->queued;
  return true;
}

// What an operation on s waits for first, as the legacy default stream
// orders itself: on the legacy stream, the work queued before it on every
// blocking stream (not created cudaStreamNonBlocking); on a blocking
// stream, the work queued before it on the legacy stream.
std::vector<Op> implicit_waits(CUstream_st *s) {
  std::vector<Op> waits;
  std::vector<CUstream_st *> others;
  {
    std::lock_guard<std::mutex> g(streams().m);
    if (s == streams().legacy) {
      for (CUstream_st *t : streams().all)
        if (t != s && blocking(t)) others.push_back(t);
    } else if (blocking(s) && streams().legacy != NULL) {
      others.push_back(streams().legacy);
    }
  }
  for (CUstream_st *t : others) { // never freed (worker): safe outside the lock
    Op w;
    if (after_pending(t, &w)) waits.push_back(std::move(w));
  }
  return waits;
}

// Queues op on stream (or records it into the stream's capture).
cudaError_t enqueue(cudaStream_t stream, Op op) {
  ctx_need();
  CUstream_st *s = resolve(stream);
  std::vector<Op> waits = implicit_waits(s); // dropped under a capture
  std::lock_guard<std::mutex> g(s->m);
  if (s->dying) return fail(cudaErrorInvalidResourceHandle);
  if (s->capture != NULL) {
    s->capture->ops.push_back(std::move(op));
    return cudaSuccess;
  }
  for (Op &w : waits) {
    s->q.push_back(std::move(w));
    s->queued++;
  }
  s->q.push_back(std::move(op));
  s->queued++;
  s->cv.notify_all();
  return cudaSuccess;
}

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

void run_kernel(const Op &op) {
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

void run_op(Op &op) {
  switch (op.kind) {
  case OP_KERNEL: run_kernel(op); break;
  case OP_COPY: memmove(op.dst, op.src, op.n); break;
  case OP_SET: memset(op.dst, op.value, op.n); break;
  case OP_RECORD: {
    std::lock_guard<std::mutex> g(events_mutex());
    op.event->pending.erase(op.seq);
    if (op.seq > op.event->reached) {
      op.event->reached = op.seq;
      op.event->reached_ns = cuda_emu_clock_ns();
    }
    events_cv().notify_all();
    break;
  }
  case OP_WAIT: {
    std::unique_lock<std::mutex> l(events_mutex());
    // the record it saw, whatever records came after it on other streams
    events_cv().wait(l, [&] { return op.event->pending.count(op.seq) == 0; });
    break;
  }
  case OP_HOST: op.host(op.data); break;
  case OP_FREE: region_free(op.dst, REGION_DEVICE); break;
  case OP_AFTER: {
    std::unique_lock<std::mutex> l(op.after->m);
    op.after->cv.wait(l, [&] { return op.after->done >= op.seq; });
    break;
  }
  }
}

} // namespace

// --- the runtime's functions -------------------------------------------------

extern "C" {

cudaError_t cudaGetLastError(void) {
  cudaError_t e = last_error;
  last_error = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError(void) { return last_error; }

const char *cudaGetErrorName(cudaError_t e) {
  switch (e) {
  case cudaSuccess: return "cudaSuccess";
  case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
  case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
  case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
  case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
  case cudaErrorNotReady: return "cudaErrorNotReady";
  case cudaErrorNotSupported: return "cudaErrorNotSupported";
  case cudaErrorInvalidDeviceFunction: return "cudaErrorInvalidDeviceFunction";
  case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
  default: return "cudaErrorUnknown";
  }
}
const char *cudaGetErrorString(cudaError_t e) {
  switch (e) {
  case cudaSuccess: return "no error";
  case cudaErrorInvalidValue: return "invalid argument";
  case cudaErrorMemoryAllocation: return "out of memory";
  case cudaErrorInvalidDevice: return "invalid device ordinal";
  case cudaErrorInvalidResourceHandle: return "invalid resource handle";
  case cudaErrorNotReady: return "device not ready";
  case cudaErrorNotSupported: return "operation not supported";
  case cudaErrorInvalidDeviceFunction: return "invalid device function";
  case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
  default: return "unknown error";
  }
}

// --- devices

static int device_count(void) { return env_int("WEFT_CUDA_EMU_DEVICES", 1, 0, 8); }

cudaError_t cudaGetDeviceCount(int *n) {
  if (n == NULL) return fail(cudaErrorInvalidValue);
  *n = device_count();
  return *n > 0 ? cudaSuccess : fail(cudaErrorNoDevice);
}
cudaError_t cudaGetDevice(int *d) {
  if (d == NULL) return fail(cudaErrorInvalidValue);
  *d = current_device;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int d) {
  if (d < 0 || d >= device_count()) return fail(cudaErrorInvalidDevice);
  current_device = d;
  current_ctx = (CUcontext)&primary_ctx[d];
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void) {
  ctx_need();
  sync_all();
  return cudaSuccess;
}

static int sm_count(void) { return env_int("WEFT_CUDA_EMU_SMS", 8, 1, 256); }

cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr attr, int dev) {
  if (v == NULL) return fail(cudaErrorInvalidValue);
  if (dev < 0 || dev >= device_count()) return fail(cudaErrorInvalidDevice);
  switch (attr) {
  case cudaDevAttrMultiProcessorCount: *v = sm_count(); break;
  case cudaDevAttrPciDomainId: *v = 0; break;
  case cudaDevAttrPciBusId: *v = 0xe0 + dev; break;
  case cudaDevAttrPciDeviceId: *v = 0; break;
  case cudaDevAttrComputeCapabilityMajor: *v = 8; break;
  case cudaDevAttrComputeCapabilityMinor: *v = 0; break;
  case cudaDevAttrMaxThreadsPerBlock: *v = 1024; break;
  case cudaDevAttrWarpSize: *v = 32; break;
  case cudaDevAttrUnifiedAddressing: *v = 1; break;
  case cudaDevAttrCanMapHostMemory: *v = 1; break;
  default: *v = 0; break;
  }
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int dev) {
  if (p == NULL) return fail(cudaErrorInvalidValue);
  if (dev < 0 || dev >= device_count()) return fail(cudaErrorInvalidDevice);
  memset(p, 0, sizeof *p);
  snprintf(p->name, sizeof p->name, "cuda_emu (host threads)");
  p->major = 8;
  p->minor = 0;
  p->multiProcessorCount = sm_count();
  p->totalGlobalMem = (size_t)16 << 30;
  p->maxThreadsPerBlock = 1024;
  p->warpSize = 32;
  p->pciBusID = 0xe0 + dev;
  p->unifiedAddressing = 1;
  p->canMapHostMemory = 1;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetByPCIBusId(int *dev, const char *bus) {
  if (dev == NULL || bus == NULL) return fail(cudaErrorInvalidValue);
  unsigned domain = 0, b = 0, slot = 0;
  if (sscanf(bus, "%x:%x:%x", &domain, &b, &slot) != 3 || domain != 0 || b < 0xe0 ||
      (int)(b - 0xe0) >= device_count() || slot != 0)
    return fail(cudaErrorInvalidDevice);
  *dev = (int)(b - 0xe0);
  return cudaSuccess;
}
cudaError_t cudaDeviceCanAccessPeer(int *can, int dev, int peer) {
  if (can == NULL) return fail(cudaErrorInvalidValue);
  *can = dev != peer && dev >= 0 && peer >= 0 && dev < device_count() && peer < device_count();
  return cudaSuccess;
}
cudaError_t cudaDeviceEnablePeerAccess(int peer, unsigned int flags) {
  (void)flags;
  if (peer < 0 || peer >= device_count() || peer == current_device)
    return fail(cudaErrorInvalidDevice);
  return cudaSuccess;
}

// The driver's context calls weft looks up (device_driver.c): a thread has
// the device's primary context once it set a device or made a runtime call
// that needs one, as with CUDA's runtime. No driver launches: weft launches
// through the runtime then.
static CUresult CUDAAPI emu_ctx_get_current(CUcontext *c) {
  if (c == NULL) return CUDA_ERROR_INVALID_VALUE;
  *c = current_ctx;
  return CUDA_SUCCESS;
}
static CUresult CUDAAPI emu_ctx_set_current(CUcontext c) {
  current_ctx = c;
  if (c != NULL) current_device = (int)((struct emu_ctx *)c - primary_ctx);
  return CUDA_SUCCESS;
}
static CUresult CUDAAPI emu_ctx_get_id(CUcontext c, unsigned long long *id) {
  if (c == NULL || id == NULL) return CUDA_ERROR_INVALID_VALUE;
  *id = 1 + (unsigned long long)((struct emu_ctx *)c - primary_ctx);
  return CUDA_SUCCESS;
}
static CUresult CUDAAPI emu_get_error_string(CUresult r, const char **s) {
  if (s == NULL) return CUDA_ERROR_INVALID_VALUE;
  *s = r == CUDA_SUCCESS ? "no error" : "cuda_emu driver error";
  return CUDA_SUCCESS;
}
static CUresult CUDAAPI emu_mem_get_address_range(CUdeviceptr *base, size_t *size, CUdeviceptr p) {
  std::lock_guard<std::mutex> g(memory().m);
  Region *r = region_of((const void *)p);
  if (r == NULL || (r->kind != REGION_DEVICE && r->kind != REGION_IPC))
    return CUDA_ERROR_NOT_FOUND;
  if (base != NULL) *base = (CUdeviceptr)r->base;
  if (size != NULL) *size = r->size;
  return CUDA_SUCCESS;
}

cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **fn, unsigned int version,
                                             unsigned long long flags,
                                             enum cudaDriverEntryPointQueryResult *status) {
  (void)version, (void)flags;
  if (fn == NULL || symbol == NULL) return fail(cudaErrorInvalidValue);
  static const struct {
    const char *name;
    void *fn;
  } table[] = {
      {"cuCtxGetCurrent", (void *)emu_ctx_get_current},
      {"cuCtxSetCurrent", (void *)emu_ctx_set_current},
      {"cuCtxGetId", (void *)emu_ctx_get_id},
      {"cuGetErrorString", (void *)emu_get_error_string},
      {"cuMemGetAddressRange", (void *)emu_mem_get_address_range},
  };
  *fn = NULL;
  for (const auto &e : table)
    if (strcmp(e.name, symbol) == 0) *fn = e.fn;
  if (status != NULL)
    *status = *fn != NULL ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
  return cudaSuccess;
}

// --- memory

cudaError_t cudaMalloc(void **p, size_t n) { return device_alloc(p, n); }
cudaError_t cudaFree(void *p) {
  if (p == NULL) return cudaSuccess;
  sync_all(); // as CUDA's: the device's work first
  return region_free(p, REGION_DEVICE);
}
cudaError_t cudaMallocAsync(void **p, size_t n, cudaStream_t stream) {
  (void)stream;
  return device_alloc(p, n);
}
cudaError_t cudaFreeAsync(void *p, cudaStream_t stream) {
  if (p == NULL) return cudaSuccess;
  { // under a capture: its allocation was made once (cudaMallocAsync) and
    // stays for every replay, as a graph's memory does
    CUstream_st *s = resolve(stream);
    std::lock_guard<std::mutex> g(s->m);
    if (s->capture != NULL) return cudaSuccess;
  }
  Op op;
  op.kind = OP_FREE;
  op.dst = p;
  return enqueue(stream, std::move(op));
}

static cudaError_t host_alloc(void **p, size_t n) {
  ctx_need();
  if (p == NULL) return fail(cudaErrorInvalidValue);
  const size_t size = page_round(n ? n : 1);
  void *base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) return fail(cudaErrorMemoryAllocation);
  std::lock_guard<std::mutex> g(memory().m);
  memory().regions[(uintptr_t)base] = Region{(char *)base, size, REGION_HOST_ALLOC, -1};
  *p = base;
  return cudaSuccess;
}
cudaError_t cudaMallocHost(void **p, size_t n) { return host_alloc(p, n); }
cudaError_t cudaHostAlloc(void **p, size_t n, unsigned int flags) {
  (void)flags;
  return host_alloc(p, n);
}
cudaError_t cudaFreeHost(void *p) { return region_free(p, REGION_HOST_ALLOC); }
cudaError_t cudaHostRegister(void *p, size_t n, unsigned int flags) {
  ctx_need();
  (void)flags;
  if (p == NULL || n == 0) return fail(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> g(memory().m);
  if (region_of(p) != NULL) return fail(cudaErrorHostMemoryAlreadyRegistered);
  memory().regions[(uintptr_t)p] = Region{(char *)p, n, REGION_HOST_REGISTERED, -1};
  return cudaSuccess;
}
cudaError_t cudaHostUnregister(void *p) {
  std::lock_guard<std::mutex> g(memory().m);
  auto it = memory().regions.find((uintptr_t)p);
  if (it == memory().regions.end() || it->second.kind != REGION_HOST_REGISTERED)
    return fail(cudaErrorHostMemoryNotRegistered);
  memory().regions.erase(it);
  return cudaSuccess;
}
cudaError_t cudaHostGetDevicePointer(void **dev, void *host, unsigned int flags) {
  (void)flags;
  if (dev == NULL) return fail(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> g(memory().m);
  Region *r = region_of(host);
  if (r == NULL || (r->kind != REGION_HOST_ALLOC && r->kind != REGION_HOST_REGISTERED))
    return fail(cudaErrorInvalidValue);
  *dev = host;
  return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *p) {
  if (a == NULL) return fail(cudaErrorInvalidValue);
  memset(a, 0, sizeof *a);
  a->type = cudaMemoryTypeUnregistered;
  a->device = -2;
  std::lock_guard<std::mutex> g(memory().m);
  Region *r = region_of(p);
  if (r == NULL) return cudaSuccess;
  a->device = 0;
  if (r->kind == REGION_DEVICE || r->kind == REGION_IPC) {
    a->type = cudaMemoryTypeDevice;
    a->devicePointer = (void *)p;
  } else {
    a->type = cudaMemoryTypeHost;
    a->devicePointer = (void *)p;
    a->hostPointer = (void *)p;
  }
  return cudaSuccess;
}

cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *handle, void *p) {
  if (handle == NULL) return fail(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> g(memory().m);
  Region *r = region_of(p);
  if (r == NULL || r->kind != REGION_DEVICE) return fail(cudaErrorInvalidValue);
  IpcHandle h = {IPC_MAGIC, (int32_t)getpid(), r->fd, r->size};
  memset(handle, 0, sizeof *handle);
  memcpy(handle, &h, sizeof h);
  return cudaSuccess;
}
cudaError_t cudaIpcOpenMemHandle(void **p, cudaIpcMemHandle_t handle, unsigned int flags) {
  ctx_need();
  (void)flags;
  if (p == NULL) return fail(cudaErrorInvalidValue);
  IpcHandle h;
  memcpy(&h, &handle, sizeof h);
  if (h.magic != IPC_MAGIC) return fail(cudaErrorInvalidValue);
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)h.pid, (int)h.fd);
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) return fail(cudaErrorInvalidValue);
  void *base = mmap(NULL, h.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED) return fail(cudaErrorMemoryAllocation);
  std::lock_guard<std::mutex> g(memory().m);
  memory().regions[(uintptr_t)base] = Region{(char *)base, h.size, REGION_IPC, -1};
  *p = base;
  return cudaSuccess;
}
cudaError_t cudaIpcCloseMemHandle(void *p) { return region_free(p, REGION_IPC); }

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind,
                            cudaStream_t stream) {
  (void)kind;
  if (n == 0) return cudaSuccess;
  if (dst == NULL || src == NULL) return fail(cudaErrorInvalidValue);
  Op op;
  op.kind = OP_COPY;
  op.dst = dst;
  op.src = src;
  op.n = n;
  return enqueue(stream, std::move(op));
}
cudaError_t cudaMemsetAsync(void *dst, int value, size_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (dst == NULL) return fail(cudaErrorInvalidValue);
  Op op;
  op.kind = OP_SET;
  op.dst = dst;
  op.value = value;
  op.n = n;
  return enqueue(stream, std::move(op));
}
// The synchronous calls go on the legacy stream and wait for it.
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind) {
  cudaError_t e = cudaMemcpyAsync(dst, src, n, kind, cudaStreamLegacy);
  if (e == cudaSuccess) stream_sync(resolve(cudaStreamLegacy));
  return e;
}
cudaError_t cudaMemset(void *dst, int value, size_t n) {
  cudaError_t e = cudaMemsetAsync(dst, value, n, cudaStreamLegacy);
  if (e == cudaSuccess) stream_sync(resolve(cudaStreamLegacy));
  return e;
}

// --- streams

cudaError_t cudaStreamCreateWithPriority(cudaStream_t *s, unsigned int flags, int priority) {
  if (s == NULL) return fail(cudaErrorInvalidValue);
  *s = stream_new(flags, priority);
  return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags) {
  return cudaStreamCreateWithPriority(s, flags, 0);
}
cudaError_t cudaStreamCreate(cudaStream_t *s) { return cudaStreamCreateWithPriority(s, 0, 0); }
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  if (stream == NULL || stream == cudaStreamLegacy || stream == cudaStreamPerThread)
    return fail(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::mutex> g(stream->m);
  stream->dying = true; // its worker drains the queue and ends
  stream->cv.notify_all();
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  CUstream_st *s = resolve(stream);
  {
    std::lock_guard<std::mutex> g(s->m);
    if (s->capture != NULL) return fail(cudaErrorStreamCaptureUnsupported);
  }
  stream_sync(s);
  return cudaSuccess;
}
cudaError_t cudaStreamQuery(cudaStream_t stream) {
  CUstream_st *s = resolve(stream);
  std::lock_guard<std::mutex> g(s->m);
  if (s->capture != NULL) return fail(cudaErrorStreamCaptureUnsupported);
  return s->q.empty() && !s->busy ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t cudaStreamGetId(cudaStream_t stream, unsigned long long *id) {
  if (id == NULL) return fail(cudaErrorInvalidValue);
  *id = resolve(stream)->id;
  return cudaSuccess;
}
cudaError_t cudaStreamGetDevice(cudaStream_t stream, int *dev) {
  (void)stream;
  if (dev == NULL) return fail(cudaErrorInvalidValue);
  *dev = 0;
  return cudaSuccess;
}
cudaError_t cudaStreamGetPriority(cudaStream_t stream, int *priority) {
  if (priority == NULL) return fail(cudaErrorInvalidValue);
  *priority = resolve(stream)->priority;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetStreamPriorityRange(int *least, int *greatest) {
  if (least != NULL) *least = 0;
  if (greatest != NULL) *greatest = -5;
  return cudaSuccess;
}
cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void *data) {
  if (fn == NULL) return fail(cudaErrorInvalidValue);
  Op op;
  op.kind = OP_HOST;
  op.host = fn;
  op.data = data;
  return enqueue(stream, std::move(op));
}

// --- events

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags) {
  ctx_need();
  if (e == NULL) return fail(cudaErrorInvalidValue);
  *e = new CUevent_st;
  (*e)->flags = flags;
  return cudaSuccess;
}
// Milliseconds between two completed records, as the host's clock saw their
// streams reach them.
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
  if (ms == NULL) return fail(cudaErrorInvalidValue);
  if (start == NULL || end == NULL) return fail(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::mutex> g(events_mutex());
  for (CUevent_st *e : {start, end}) {
    if ((e->flags & cudaEventDisableTiming) != 0 || e->recorded == 0)
      return fail(cudaErrorInvalidResourceHandle);
    if (e->reached != e->recorded) return fail(cudaErrorNotReady);
  }
  *ms = (float)(((double)end->reached_ns - (double)start->reached_ns) / 1e6);
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, 0); }
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  // kept: an operation still queued may name it (CUDA frees it once done)
  return e == NULL ? fail(cudaErrorInvalidResourceHandle) : cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t stream) {
  if (e == NULL) return fail(cudaErrorInvalidResourceHandle);
  CUstream_st *s = resolve(stream);
  CUgraph_st *capture;
  {
    std::lock_guard<std::mutex> g(s->m);
    capture = s->capture;
  }
  if (capture != NULL) { // an edge of the graph: capture order keeps it
    std::lock_guard<std::mutex> ge(events_mutex()); // (never with a stream's lock held)
    e->captured_in = capture;
    return cudaSuccess;
  }
  Op op;
  op.kind = OP_RECORD;
  op.event = e;
  {
    std::lock_guard<std::mutex> g(events_mutex());
    e->captured_in = NULL;
    op.seq = ++e->recorded;
    e->pending.insert(op.seq);
  }
  return enqueue(s, std::move(op));
}
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t e, unsigned int flags) {
  (void)flags;
  if (e == NULL) return fail(cudaErrorInvalidResourceHandle);
  CUstream_st *s = resolve(stream);
  Op op;
  op.kind = OP_WAIT;
  op.event = e;
  {
    std::lock_guard<std::mutex> g(events_mutex());
    if (e->captured_in != NULL) { // joins that capture, if it goes on
      bool live;
      {
        std::lock_guard<std::mutex> gl(streams().m);
        live = streams().captures.count(e->captured_in) != 0;
      }
      if (live) {
        std::lock_guard<std::mutex> gs(s->m);
        s->capture = e->captured_in;
      }
      return cudaSuccess; // an ended capture's record is no wait
    }
    op.seq = e->recorded;
  }
  if (op.seq == 0) return cudaSuccess;
  return enqueue(s, std::move(op));
}
cudaError_t cudaEventQuery(cudaEvent_t e) {
  if (e == NULL) return fail(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::mutex> g(events_mutex());
  return e->pending.count(e->recorded) == 0 ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  if (e == NULL) return fail(cudaErrorInvalidResourceHandle);
  std::unique_lock<std::mutex> l(events_mutex());
  const uint64_t seq = e->recorded;
  events_cv().wait(l, [&] { return e->pending.count(seq) == 0; });
  return cudaSuccess;
}

// --- capture and graphs

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode) {
  if (stream == NULL || stream == cudaStreamLegacy) return fail(cudaErrorStreamCaptureUnsupported);
  CUstream_st *s = resolve(stream);
  std::lock_guard<std::mutex> g(s->m);
  if (s->capture != NULL) return fail(cudaErrorIllegalState);
  s->capture = new CUgraph_st;
  s->capture_mode = mode;
  std::lock_guard<std::mutex> gl(streams().m);
  streams().captures.insert(s->capture);
  return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *graph) {
  if (graph == NULL) return fail(cudaErrorInvalidValue);
  CUstream_st *s = resolve(stream);
  CUgraph_st *g;
  {
    std::lock_guard<std::mutex> l(s->m);
    g = s->capture;
    if (g == NULL) return fail(cudaErrorIllegalState);
  }
  std::vector<CUstream_st *> all; // this stream and those that joined its capture
  {
    std::lock_guard<std::mutex> l(streams().m);
    all.assign(streams().all.begin(), streams().all.end());
    streams().captures.erase(g);
  }
  if (std::find(all.begin(), all.end(), s) == all.end()) all.push_back(s);
  for (auto *o : all) {
    std::lock_guard<std::mutex> l(o->m);
    if (o->capture == g) o->capture = NULL;
  }
  *graph = g;
  return cudaSuccess;
}
cudaError_t cudaStreamIsCapturing(cudaStream_t stream, enum cudaStreamCaptureStatus *status) {
  if (status == NULL) return fail(cudaErrorInvalidValue);
  CUstream_st *s = resolve(stream);
  std::lock_guard<std::mutex> g(s->m);
  *status = s->capture != NULL ? cudaStreamCaptureStatusActive : cudaStreamCaptureStatusNone;
  return cudaSuccess;
}
cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode *mode) {
  if (mode == NULL) return fail(cudaErrorInvalidValue);
  std::swap(*mode, thread_capture_mode);
  return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph, unsigned long long flags) {
  (void)flags;
  if (exec == NULL || graph == NULL) return fail(cudaErrorInvalidValue);
  *exec = new CUgraphExec_st{graph->ops};
  return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  if (exec == NULL) return fail(cudaErrorInvalidResourceHandle);
  for (const Op &op : exec->ops) {
    cudaError_t e = enqueue(stream, op);
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete exec; // its operations were copied into the queues they went to
  return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete graph;
  return cudaSuccess;
}

// --- kernels

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
  *n = 2;
  return cudaSuccess;
}
cudaError_t cudaGetKernel(cudaKernel_t *k, const void *fn) {
  (void)k, (void)fn;
  return fail(cudaErrorNotSupported);
}

} // extern "C"
