// cuda_emu's devices (cuda_emu_int.h): errors, device properties and
// selection, and the driver's context calls weft looks up.
#include <stdio.h>
#include <string.h>

#include "cuda_emu_int.h"

using namespace cuda_emu_rt;

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


} // extern "C"
