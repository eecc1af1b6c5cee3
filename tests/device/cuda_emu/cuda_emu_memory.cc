// cuda_emu's memory (cuda_emu_int.h): device memory as shared memfds whose
// IPC handles open in other processes through /proc, pinned and registered
// host memory, copies and sets on streams.
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>

#include "cuda_emu_int.h"

using namespace cuda_emu_rt;

namespace {

size_t page_round(size_t n) {
  const size_t page = (size_t)sysconf(_SC_PAGESIZE);
  return (n + page - 1) / page * page;
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

struct IpcHandle {
  uint64_t magic;
  int32_t pid, fd;
  uint64_t size;
};
const uint64_t IPC_MAGIC = 0x77656674656d7531ull;
static_assert(sizeof(IpcHandle) <= sizeof(cudaIpcMemHandle_t), "IPC handle fits");

} // namespace

namespace cuda_emu_rt {

Memory &memory() {
  static auto *mem = new Memory;
  return *mem;
}

Region *region_of(const void *p) {
  auto &rs = memory().regions;
  auto it = rs.upper_bound((uintptr_t)p);
  if (it == rs.begin()) return NULL;
  --it;
  Region &r = it->second;
  return (uintptr_t)p < (uintptr_t)r.base + r.size ? &r : NULL;
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

} // namespace cuda_emu_rt

extern "C" {


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

// A copy or set on stream; wait: done when the call returns (the stream's
// earlier work first, others' later work not waited for), unless a graph
// captures the stream.
static cudaError_t copy_or_set(OpKind kind, void *dst, const void *src, int value, size_t n,
                               cudaStream_t stream, bool wait) {
  if (n == 0) return cudaSuccess;
  if (dst == NULL || (kind == OP_COPY && src == NULL)) return fail(cudaErrorInvalidValue);
  Op op;
  op.kind = kind;
  op.dst = dst;
  op.src = src;
  op.value = value;
  op.n = n;
  uint64_t pos = 0;
  cudaError_t e = enqueue(stream, std::move(op), &pos);
  if (e == cudaSuccess && wait && pos != 0) stream_wait_for(resolve(stream), pos);
  return e;
}

// Pageable host memory (no region: neither allocated nor registered here) on
// either side makes the copy done on return, as CUDA stages it.
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind,
                            cudaStream_t stream) {
  (void)kind;
  bool pageable;
  {
    std::lock_guard<std::mutex> g(memory().m);
    pageable = region_of(dst) == NULL || region_of(src) == NULL;
  }
  return copy_or_set(OP_COPY, dst, src, 0, n, stream, pageable);
}
cudaError_t cudaMemsetAsync(void *dst, int value, size_t n, cudaStream_t stream) {
  return copy_or_set(OP_SET, dst, NULL, value, n, stream, false);
}
// The synchronous calls go on the legacy stream and wait for themselves.
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind) {
  (void)kind;
  return copy_or_set(OP_COPY, dst, src, 0, n, cudaStreamLegacy, true);
}
cudaError_t cudaMemset(void *dst, int value, size_t n) {
  return copy_or_set(OP_SET, dst, NULL, value, n, cudaStreamLegacy, true);
}

} // extern "C"
