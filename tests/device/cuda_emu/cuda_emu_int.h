// cuda_emu's runtime inside: what its files share (cuda_emu.h is what the
// kernels see). cuda_emu.cc: kernels and their threads; cuda_emu_memory.cc:
// device, host and IPC memory, copies; cuda_emu_streams.cc: streams, events,
// captures and graphs; cuda_emu_device.cc: devices, errors, the driver's
// context calls.
#ifndef WEFT_CUDA_EMU_INT_H
#define WEFT_CUDA_EMU_INT_H

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <stdint.h>

#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

#include "cuda_emu.h"

struct CUgraph_st;
struct CUstream_st;

struct CUevent_st {
  uint64_t recorded = 0;      // under events_mutex: records made,
  std::set<uint64_t> pending; // and those not reached yet by their streams
  CUgraph_st *captured_in = NULL;  // recorded last under this capture
  unsigned flags = 0;
  uint64_t reached = 0, reached_ns = 0; // the latest record its stream reached, and when
};

namespace cuda_emu_rt {

// --- the calling thread (cuda_emu.cc)

extern thread_local cudaError_t last_error;
extern thread_local int current_device;
struct emu_ctx {
  int unused;
};
extern emu_ctx primary_ctx[8];              // each device's primary context
extern thread_local CUcontext current_ctx; // the thread's current context
extern thread_local cuda_emu_thread self_ctx;

// The runtime makes the current device's primary context current where a
// call needs one.
void ctx_need();
// e, kept as the thread's last error (but success and not-ready).
cudaError_t fail(cudaError_t e);
// The environment's integer name, dflt when unset, clamped to [lo, hi].
int env_int(const char *name, int dflt, int lo, int hi);

// --- kernels (cuda_emu.cc)

struct Kernel {
  cuda_emu_run_fn run;
  const char *name;
  std::vector<size_t> sizes;
  int apart; // its threads never meet (cuda_emu_register)
};
// Never destroyed: worker threads may still use them while the process exits.
std::map<const void *, Kernel> &kernels();
std::mutex &kernels_mutex();
std::mutex &loaded_mutex(); // the kernels loaded so far (cuda_emu.cc, lazy loading)

// --- memory (cuda_emu_memory.cc)

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
Memory &memory();
// The region holding p (memory().m held); NULL if none.
Region *region_of(const void *p);
cudaError_t device_alloc(void **p, size_t n);
// Unmaps an allocation made by device_alloc (kind REGION_DEVICE) or
// host_alloc; p must be its base.
cudaError_t region_free(void *p, RegionKind kind);

// --- streams' operations (cuda_emu_streams.cc)

std::mutex &events_mutex();
std::condition_variable &events_cv();

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

// The stream a handle names (the legacy and per-thread ones made when first named).
CUstream_st *resolve(cudaStream_t stream);
// Queues op on stream (or records it into the stream's capture); pos, when
// given, is set to its place in the stream's queue (0 under a capture).
cudaError_t enqueue(cudaStream_t stream, Op op, uint64_t *pos = NULL);
// Until s has run its first pos operations.
void stream_wait_for(CUstream_st *s, uint64_t pos);
// Until s has run everything queued on it, whoever queued it.
void stream_sync(CUstream_st *s);
// Every stream's queue run (cudaDeviceSynchronize).
void sync_all();
// A kernel's launch, run on its stream's thread (cuda_emu.cc).
void run_kernel(const Op &op);

} // namespace cuda_emu_rt

struct CUgraph_st {
  std::vector<cuda_emu_rt::Op> ops;
};
struct CUgraphExec_st {
  std::vector<cuda_emu_rt::Op> ops;
};

struct CUstream_st {
  std::mutex m;
  std::condition_variable cv;
  std::deque<cuda_emu_rt::Op> q;
  bool busy = false, dying = false;
  uint64_t queued = 0, done = 0; // operations put in its queue, and run
  unsigned flags = 0;
  int device = 0;
  bool legacy = false; // its device's legacy default stream
  int priority = 0;
  unsigned long long id = 0;
  CUgraph_st *capture = NULL;
  cudaStreamCaptureMode capture_mode = cudaStreamCaptureModeGlobal;
};

#endif
