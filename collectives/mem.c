/* Memory for collectives: weftMemAlloc/weftMemAllocHost/weftMemFree and
 * buffer registration. Host memory is page aligned; registration records the
 * range with the communicator and returns a handle. */
#include <stdlib.h>
#include <string.h>

#include "../transport/status.h"
#include "comm.h"
#include "device.h"

#define MEM_ALIGN 4096

struct mem_reg {
  struct weftComm *comm;
  void *buff;
  size_t nbytes;
  int on_device; /* a device buffer, for the device executor's single-copy paths */
};

weftResult_t weftMemAllocHost(void **ptr, size_t nbytes) {
  weft_error_clear();
  if (ptr == NULL) return weft_error_set(weftInvalidArgument, "MemAllocHost: ptr is NULL");
  if (nbytes == 0) return weft_error_set(weftInvalidArgument, "MemAllocHost: nbytes is 0");
  void *p = NULL;
  size_t rounded = (nbytes + MEM_ALIGN - 1) / MEM_ALIGN * MEM_ALIGN;
  if (posix_memalign(&p, MEM_ALIGN, rounded) != 0)
    return weft_error_set(weftSystemError, "MemAllocHost: cannot allocate %zu bytes", nbytes);
  *ptr = p;
  return weftSuccess;
}

/* Device memory when this thread has a CUDA context (as ncclMemAlloc), else
 * host memory as weftMemAllocHost. */
weftResult_t weftMemAlloc(void **ptr, size_t nbytes) {
  weft_error_clear();
  if (ptr == NULL) return weft_error_set(weftInvalidArgument, "MemAlloc: ptr is NULL");
  if (nbytes == 0) return weft_error_set(weftInvalidArgument, "MemAlloc: nbytes is 0");
  int on_device = 0;
  WEFT_TRY(device_mem_alloc(ptr, nbytes, &on_device));
  return on_device ? weftSuccess : weftMemAllocHost(ptr, nbytes);
}

weftResult_t weftMemFree(void *ptr) {
  weft_error_clear();
  if (!device_mem_free(ptr)) free(ptr);
  return weftSuccess;
}

weftResult_t weftCommRegister(const weftComm_t comm, void *buff, size_t nbytes, void **handle) {
  weft_error_clear();
  WEFT_TRY(comm_check(comm));
  if (buff == NULL || handle == NULL)
    return weft_error_set(weftInvalidArgument, "CommRegister: %s is NULL",
                          buff == NULL ? "buff" : "handle");
  struct mem_reg *reg = calloc(1, sizeof(*reg));
  if (reg == NULL) return weft_error_set(weftSystemError, "CommRegister: out of memory");
  reg->comm = comm;
  reg->buff = buff;
  reg->nbytes = nbytes;
  reg->on_device = device_ptr_on_device(buff);
  *handle = reg;
  return weftSuccess;
}

weftResult_t weftCommDeregister(const weftComm_t comm, void *handle) {
  weft_error_clear();
  WEFT_TRY(comm_check(comm));
  struct mem_reg *reg = handle;
  if (reg == NULL || reg->comm != comm)
    return weft_error_set(weftInvalidArgument,
                          "CommDeregister: handle was not registered with this communicator");
  free(reg);
  return weftSuccess;
}
