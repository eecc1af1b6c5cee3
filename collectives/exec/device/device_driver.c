/* Driver entry points, found through the runtime (no link to libcuda):
 * whether this thread has a context, an allocation's range, and the kernel
 * launches; what tells a call's stream from the others (its id, and the
 * per-thread stream's caller); and a GPU's PCI address. */
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include "device_priv.h"

/* NULL where the driver has none; the launches both or neither, with
 * something to name their errors by. Through the driver, a launch takes a
 * quarter microsecond less of the host's time than cudaLaunchKernel
 * (docs/cuda.md, "Where the enqueue goes"). */
static struct {
  PFN_cuCtxGetCurrent_v4000 ctx_get_current;
  PFN_cuCtxSetCurrent_v4000 ctx_set_current;
  PFN_cuCtxGetId_v12000 ctx_get_id;
  PFN_cuLaunchKernel_v4000 launch;
  PFN_cuLaunchKernelEx_v11060 launch_ex;
  PFN_cuGetErrorString_v6000 error_string;
  PFN_cuMemGetAddressRange_v3020 mem_range;
} drv;
static pthread_once_t drv_once = PTHREAD_ONCE_INIT;

/* The entry point name; NULL without one. Clears only an error of its own
 * (the caller's pending one stays for the caller). */
static void *drv_entry(const char *name) {
  void *fn = NULL;
  enum cudaDriverEntryPointQueryResult q;
  cudaError_t err = cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &q);
  if (err != cudaSuccess) cudaGetLastError();
  return err == cudaSuccess && q == cudaDriverEntryPointSuccess ? fn : NULL;
}

static void drv_lookup(void) {
  drv.ctx_get_current = (PFN_cuCtxGetCurrent_v4000)drv_entry("cuCtxGetCurrent");
  drv.ctx_set_current = (PFN_cuCtxSetCurrent_v4000)drv_entry("cuCtxSetCurrent");
  drv.ctx_get_id = (PFN_cuCtxGetId_v12000)drv_entry("cuCtxGetId");
  drv.error_string = (PFN_cuGetErrorString_v6000)drv_entry("cuGetErrorString");
  drv.mem_range = (PFN_cuMemGetAddressRange_v3020)drv_entry("cuMemGetAddressRange");
  drv.launch = (PFN_cuLaunchKernel_v4000)drv_entry("cuLaunchKernel");
  drv.launch_ex = (PFN_cuLaunchKernelEx_v11060)drv_entry("cuLaunchKernelEx");
  if (drv.launch == NULL || drv.launch_ex == NULL || drv.error_string == NULL) {
    drv.launch = NULL;
    drv.launch_ex = NULL;
  }
}

static CUcontext ctx_current(void) {
  pthread_once(&drv_once, drv_lookup);
  CUcontext ctx = NULL;
  if (drv.ctx_get_current == NULL || drv.ctx_get_current(&ctx) != CUDA_SUCCESS) return NULL;
  return ctx;
}

int device_ctx_current(void) { return ctx_current() != NULL; }

void device_ctx_save(struct device_ctx_saved *s) {
  s->ctx = ctx_current();
  s->dev = -1;
  if (s->ctx != NULL && cudaGetDevice(&s->dev) != cudaSuccess) {
    cudaGetLastError();
    s->dev = -1;
  }
}

void device_ctx_restore(const struct device_ctx_saved *s) {
  if (drv.ctx_set_current != NULL) { /* NULL too: the thread had none */
    drv.ctx_set_current((CUcontext)s->ctx);
    return;
  }
  if (s->dev >= 0 && cudaSetDevice(s->dev) != cudaSuccess) cudaGetLastError();
}

uint64_t device_ctx_key_current(int *current_out) {
  CUcontext ctx = ctx_current();
  *current_out = ctx != NULL;
  if (ctx == NULL) return 0;
  unsigned long long id = 0;
  if (drv.ctx_get_id == NULL || drv.ctx_get_id(ctx, &id) != CUDA_SUCCESS) return 0;
  return (uint64_t)id + 1;
}

uint64_t device_ctx_key(void) {
  int current;
  return device_ctx_key_current(&current);
}

int device_mem_range(const void *ptr, uintptr_t *base_out, size_t *nbytes_out) {
  pthread_once(&drv_once, drv_lookup);
  CUdeviceptr base = 0;
  size_t n = 0;
  if (drv.mem_range == NULL) return 0;
  if (drv.mem_range(&base, &n, (CUdeviceptr)(uintptr_t)ptr) != CUDA_SUCCESS || n == 0) return 0;
  *base_out = (uintptr_t)base;
  *nbytes_out = n;
  return 1;
}

/* A kernel handle that says: launch through the runtime (the driver's
 * entry or the kernel's handle is not at hand). */
#define RUNTIME_LAUNCH ((cudaKernel_t)(uintptr_t)1)

/* The launch through the runtime; NULL or what went wrong. */
static const char *runtime_launch(const void *fn, dim3 grid, dim3 block, void **args,
                                  cudaStream_t stream, int pdl) {
  cudaError_t err;
  if (pdl) {
    cudaLaunchAttribute attr;
    memset(&attr, 0, sizeof attr);
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.stream = stream;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    err = cudaLaunchKernelExC(&cfg, fn, args);
  } else {
    err = cudaLaunchKernel(fn, grid, block, args, 0, stream);
  }
  if (err == cudaSuccess) return NULL;
  cudaGetLastError();
  return cudaGetErrorString(err);
}

/* The launch through the driver, of k cast to a CUfunction: a CUkernel
 * launches in its stream's context, and on the NULL, legacy and per-thread
 * streams in the current one, which comm_launch has made the comm's device's
 * (cudaSetDevice makes the primary context current). The entry found is
 * the legacy-stream one, as this library's runtime calls read stream 0. */
static const char *driver_launch(cudaKernel_t k, dim3 grid, dim3 block, void **args,
                                 cudaStream_t stream, int pdl) {
  CUresult r;
  if (pdl) {
    CUlaunchAttribute attr;
    memset(&attr, 0, sizeof attr);
    attr.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attr.value.programmaticStreamSerializationAllowed = 1;
    CUlaunchConfig cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.gridDimX = grid.x, cfg.gridDimY = grid.y, cfg.gridDimZ = grid.z;
    cfg.blockDimX = block.x, cfg.blockDimY = block.y, cfg.blockDimZ = block.z;
    cfg.hStream = (CUstream)stream;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    r = drv.launch_ex(&cfg, (CUfunction)k, args, NULL);
  } else {
    r = drv.launch((CUfunction)k, grid.x, grid.y, grid.z, block.x, block.y, block.z, 0,
                   (CUstream)stream, args, NULL);
  }
  if (r == CUDA_SUCCESS) return NULL;
  const char *why = NULL;
  if (drv.error_string(r, &why) != CUDA_SUCCESS || why == NULL) why = "unknown driver error";
  return why;
}

const char *device_kernel_launch(const void *fn, cudaKernel_t *handle, dim3 grid, dim3 block,
                                 void **args, cudaStream_t stream, int pdl) {
  cudaKernel_t k = __atomic_load_n(handle, __ATOMIC_ACQUIRE);
  if (k == NULL) { /* asked once: the kernel's handle, or RUNTIME_LAUNCH */
    pthread_once(&drv_once, drv_lookup);
    cudaError_t err = drv.launch != NULL ? cudaGetKernel(&k, fn) : cudaErrorNotSupported;
    if (err != cudaSuccess || k == NULL) k = RUNTIME_LAUNCH;
    if (err != cudaSuccess && drv.launch != NULL) cudaGetLastError();
    __atomic_store_n(handle, k, __ATOMIC_RELEASE);
  }
  if (k == RUNTIME_LAUNCH) return runtime_launch(fn, grid, block, args, stream, pdl);
  return driver_launch(k, grid, block, args, stream, pdl);
}

void device_kernel_load(const void *fn) {
  struct cudaFuncAttributes attr;
  if (cudaFuncGetAttributes(&attr, fn) != cudaSuccess) cudaGetLastError();
}

int64_t device_bus_id(int dev) {
  int domain = 0, bus = 0, slot = 0;
  if (cudaDeviceGetAttribute(&domain, cudaDevAttrPciDomainId, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&bus, cudaDevAttrPciBusId, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&slot, cudaDevAttrPciDeviceId, dev) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return (int64_t)domain << 20 | (int64_t)bus << 12 | (int64_t)slot << 4;
}

uint64_t device_stream_key(cudaStream_t stream) {
  if ((uintptr_t)stream <= 2) return (uintptr_t)stream;
  unsigned long long id = 0;
  if (cudaStreamGetId(stream, &id) != cudaSuccess) { /* the handle, apart from every id */
    cudaGetLastError();
    return (uint64_t)(uintptr_t)stream | (1ull << 63);
  }
  return (uint64_t)id + 3;
}

uintptr_t device_stream_thread(cudaStream_t stream) {
  static uint64_t last;
  static __thread uintptr_t id;
  if (stream != cudaStreamPerThread) return 0;
  if (id == 0) id = (uintptr_t)__atomic_add_fetch(&last, 1, __ATOMIC_RELAXED);
  return id;
}
