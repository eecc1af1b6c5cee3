/* The device executor: ring collectives on CUDA device memory as kernels on
 * the caller's stream. Each comm gets, on its first device collective,
 * WEFT_DEVICE_NCHANNELS device channels on its ring order, each with a FIFO
 * pair per protocol to its ring neighbours over the p2p (same process),
 * cuda_ipc (other process) or host_fifo (no peer access) transport, or as a
 * device network connection to a neighbour on another host (device_hops.c). Launching then takes only stream-ordered calls:
 * enqueue and return, and graph capture records the kernel. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "../../../transport/cuda_ipc/cuda_fifo.h"
#include "../../../transport/base/log.h"
#include "../../../transport/base/param.h"
#include "../../../transport/base/status.h"
#include "device.h"
#include "device_mismatch.h"
#include "device_params.h"
#include "device_priv.h"
#include "../../algo/ring_steps.h"

/* Written by gen_kernels.py: [datatype][op][protocol], NULL outside the
 * matrix the build chose. */
extern const void *const (*const weft_dev_kernels[weftNumTypes])[DEV_NPROTOS];
extern const void *const (*const weft_dev_tree_kernels[weftNumTypes])[DEV_NPROTOS];
extern const char weft_dev_matrix[];

_Static_assert(sizeof(struct dev_fifo_ctrl) <= CUDA_FIFO_CTRL_NBYTES, "ctrl fits");
_Static_assert(DEV_FLAGS_NBYTES <= DEV_FLAGS_PAGE_NBYTES, "the flags fit their page");
_Static_assert(offsetof(struct dev_fifo_ctrl, poison) == DEV_FIFO_POISON_OFFSET,
               "poison where struct conn_ctrl has it");
_Static_assert(sizeof(struct dev_sendrecv_work) <= 4096,
               "send/recv work fits the kernel parameters");

#define cuda_check device_cuda_check

int device_built(void) { return 1; }

/* --- where memory lives ------------------------------------------------- */

/* The device (and managed) allocations this thread found last, newest
 * first, each as the driver gives its range, with the context it was found
 * in: a buffer inside one is that memory without asking again, which is
 * most calls of a training loop (a pointer query takes 0.17 us of the
 * host's time a call: docs/cuda.md, "Where the enqueue goes"). Under
 * unified addressing the driver keeps a freed device range's addresses for
 * device memory, so an entry stays true while its context lives (its id,
 * never reused in the process); every thread's entries are dropped when
 * weftMemFree frees device memory, and WEFT_DEVICE_PTR_CACHE=0 asks every
 * time (for allocators that hand freed device addresses back to the host). */
#define KNOWN_RANGES 8
struct known_range {
  uintptr_t base;
  size_t nbytes; /* 0: an empty entry */
  uint64_t ctx;  /* device_ctx_key */
  uint64_t gen;  /* known_gen when found */
  enum cudaMemoryType type;
};
static __thread struct known_range known[KNOWN_RANGES];
static uint64_t known_gen; /* device frees through weftMemFree so far */

static void known_add(const void *ptr, uint64_t ctx, enum cudaMemoryType type) {
  struct known_range r = {.ctx = ctx, .type = type,
                          .gen = __atomic_load_n(&known_gen, __ATOMIC_ACQUIRE)};
  if (!device_mem_range(ptr, &r.base, &r.nbytes)) return;
  memmove(&known[1], &known[0], sizeof known[0] * (KNOWN_RANGES - 1));
  known[0] = r;
}

/* Whether the process has a CUDA device at all, asked once: without one
 * no buffer is device memory, and a call asks the driver nothing (a
 * host-memory call of a CUDA build on a machine without a GPU). */
static int devices_present(void) {
  static int present = -1; /* not asked yet */
  int v = __atomic_load_n(&present, __ATOMIC_RELAXED);
  if (__builtin_expect(v < 0, 0)) {
    v = device_count() > 0;
    __atomic_store_n(&present, v, __ATOMIC_RELAXED);
  }
  return v;
}

/* Whether a buffer of this thread may be device memory: 0 without a
 * device in the process or a context on the thread (asking would create
 * one); else 1 and the context's key (device_ctx_key) in *ctx_out. */
static int ptr_ctx(uint64_t *ctx_out) {
  if (!devices_present()) return 0;
  int current;
  *ctx_out = device_ctx_key_current(&current);
  return current;
}

/* What CUDA says ptr is, asked in the thread's context ctx (ptr_ctx):
 * cudaMemoryTypeUnregistered when it cannot say. */
static enum cudaMemoryType ptr_type_in(const void *ptr, uint64_t ctx) {
  if (ptr == NULL) return cudaMemoryTypeUnregistered;
  const int cache = ctx != 0 && param_int(&device_params[DEVICE_P_PTR_CACHE]) != 0;
  const uint64_t gen = __atomic_load_n(&known_gen, __ATOMIC_ACQUIRE);
  for (int i = 0; cache && i < KNOWN_RANGES; i++)
    if (known[i].ctx == ctx && known[i].gen == gen &&
        (uintptr_t)ptr - known[i].base < known[i].nbytes)
      return known[i].type;
  struct cudaPointerAttributes attr;
  if (cudaPointerGetAttributes(&attr, ptr) != cudaSuccess) {
    cudaGetLastError();
    return cudaMemoryTypeUnregistered;
  }
  if (cache && (attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged))
    known_add(ptr, ctx, attr.type);
  return attr.type;
}

/* What CUDA says ptr is (cudaMemoryTypeUnregistered when it cannot say, or
 * when this thread has no context to ask with). */
static enum cudaMemoryType ptr_type(const void *ptr) {
  uint64_t ctx;
  if (ptr == NULL || !ptr_ctx(&ctx)) return cudaMemoryTypeUnregistered;
  return ptr_type_in(ptr, ctx);
}

int device_ptr_on_device(const void *ptr) {
  enum cudaMemoryType t = ptr_type(ptr);
  return t == cudaMemoryTypeDevice || t == cudaMemoryTypeManaged;
}

int device_ptr_device_only(const void *ptr) { return ptr_type(ptr) == cudaMemoryTypeDevice; }

int device_current(void) {
  int dev = -1;
  if (!device_ctx_current()) return -1;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return dev;
}

int device_count(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError(); /* no driver, no device: none */
    return 0;
  }
  return n;
}

void device_ctx_make(void) {
  int dev = 0;
  if (device_count() == 0 || cudaGetDevice(&dev) != cudaSuccess ||
      cudaSetDevice(dev) != cudaSuccess) /* cudaSetDevice makes the primary context current */
    cudaGetLastError();
}

int device_plan_on_device(const struct weft_plan *plan, int uses_send, int uses_recv) {
  const void *first = uses_recv ? plan->recvbuf : NULL, *second = uses_send ? plan->sendbuf : NULL;
  if (first == NULL) {
    first = second;
    second = NULL;
  }
  if (first == NULL) /* nothing touched (no elements): as the buffers say */
    first = plan->recvbuf != NULL ? plan->recvbuf : plan->sendbuf;
  uint64_t ctx; /* the thread's context, looked up once for both buffers */
  if (first == NULL || !ptr_ctx(&ctx)) return 0;
  if (second == NULL || second == first || plan->count == 0) { /* one buffer, or none touched */
    const enum cudaMemoryType t = ptr_type_in(first, ctx);
    return t == cudaMemoryTypeDevice || t == cudaMemoryTypeManaged;
  }
  /* device memory runs on the device, with pinned or managed memory beside
   * it (kernels reach both); managed with pageable memory on the host
   * (which reaches both); device-only memory with pageable memory nowhere */
  const enum cudaMemoryType a = ptr_type_in(first, ctx), b = ptr_type_in(second, ctx);
  const int a_dev = a == cudaMemoryTypeDevice || a == cudaMemoryTypeManaged;
  const int b_dev = b == cudaMemoryTypeDevice || b == cudaMemoryTypeManaged;
  if (!a_dev && !b_dev) return 0;
  const int a_pageable = a == cudaMemoryTypeUnregistered, b_pageable = b == cudaMemoryTypeUnregistered;
  if (!a_pageable && !b_pageable) return 1;
  if (a == cudaMemoryTypeDevice || b == cudaMemoryTypeDevice) return -1;
  return 0;
}

weftResult_t device_check_ordinal(int dev) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    n = 0;
  }
  if (dev < 0 || dev >= n)
    return weft_error_set(weftInvalidArgument, "CUDA device %d requested, but %d %s present", dev, n,
                          n == 1 ? "device is" : "devices are");
  return weftSuccess;
}

weftResult_t device_mem_alloc(void **ptr, size_t nbytes, int *on_device_out) {
  *on_device_out = 0;
  if (!device_ctx_current()) return weftSuccess;
  CUDA_TRY(cudaMalloc(ptr, nbytes), "MemAlloc");
  *on_device_out = 1;
  return weftSuccess;
}

int device_mem_free(void *ptr) {
  __atomic_add_fetch(&known_gen, 1, __ATOMIC_ACQ_REL); /* every thread's entries (above) */
  const cudaError_t e = cudaFree(ptr);
  cudaGetLastError();
  if (e != cudaSuccess) weft_error_set(weftUnhandledCudaError, "cudaFree: %s", cudaGetErrorString(e));
  return e == cudaSuccess;
}

/* --- connecting ---------------------------------------------------------- */

/* The ring (and tree) kernel blocks of DEV_NTHREADS threads that one SM of
 * the current device holds at once: the fewest over the kernels this build
 * has (their registers differ by datatype and op), at least 1. */
static int ring_blocks_per_sm_of(void) {
  int fewest = 0;
  for (int k = 0; k < 2; k++)
    for (int t = 0; t < weftNumTypes; t++)
      for (int o = 0; o < DEV_NOPS; o++)
        for (int p = 0; p < DEV_NPROTOS; p++) {
          const void *fn = (k == 0 ? weft_dev_kernels : weft_dev_tree_kernels)[t][o][p];
          int nb = 0;
          if (fn == NULL) continue;
          if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&nb, fn, DEV_NTHREADS, 0) !=
              cudaSuccess) {
            cudaGetLastError();
            return 1;
          }
          if (fewest == 0 || nb < fewest) fewest = nb;
        }
  return fewest > 0 ? fewest : 1;
}

/* The same for device dev (the current one), asked once per device. */
#define DEV_MAX_GPUS 64 /* devices whose answer is remembered */
static int ring_blocks_per_sm(int dev) {
  static int known[DEV_MAX_GPUS]; /* 0: not asked yet */
  if (dev < 0 || dev >= DEV_MAX_GPUS) return ring_blocks_per_sm_of();
  int n = __atomic_load_n(&known[dev], __ATOMIC_ACQUIRE);
  if (n == 0) {
    n = ring_blocks_per_sm_of();
    __atomic_store_n(&known[dev], n, __ATOMIC_RELEASE);
  }
  return n;
}

void device_ring_kernels_load(void) {
  for (int k = 0; k < 2; k++)
    for (int t = 0; t < weftNumTypes; t++)
      for (int o = 0; o < DEV_NOPS; o++)
        for (int p = 0; p < DEV_NPROTOS; p++) {
          const void *fn = (k == 0 ? weft_dev_kernels : weft_dev_tree_kernels)[t][o][p];
          if (fn != NULL) device_kernel_load(fn);
        }
}

/* Whether the current device runs ring kernels that wait for a predecessor
 * they were launched to overlap: compute capability 9.0 and kernels built
 * from PTX for it (a build for sm_80 alone, JIT-compiled on a Hopper,
 * leaves the wait out: kernels.cuh). Asked of one kernel: the matrix is
 * built alike. */
static int ring_kernels_wait_for_pdl(const struct cudaDeviceProp *prop) {
  if (prop->major < 9) return 0;
  const void *fn = weft_dev_kernels[weftFloat32][0][DEV_PROTO_LL];
  struct cudaFuncAttributes attr;
  if (fn == NULL || cudaFuncGetAttributes(&attr, fn) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return attr.ptxVersion >= 90 && attr.binaryVersion >= 90;
}

/* Waits for the comm's own kernels to end (launch_done.h), never for other
 * work of the device or its streams (the frees that follow may: cudaFree
 * waits for the whole device). Not at all where the flags are no longer
 * mapped (the context was reset, or the runtime is unloading: nothing of
 * the comm runs), and no longer where the context is broken (a kernel
 * fault: nothing will end). Returns 0 where the words stayed still for the
 * comm's timeout with a launch not ended (which its kernels' own timeouts
 * rule out): its memory may still be in use. */
static int device_comm_wait(struct device_comm *d, uint64_t timeout_ns) {
  const uint64_t *ended = device_ended_h(d);
  struct cudaPointerAttributes attr;
  cudaError_t err = cudaPointerGetAttributes(&attr, ended);
  cudaGetLastError();
  if (err != cudaSuccess || attr.type != cudaMemoryTypeHost) return 1;
  long ns = 2000;
  uint64_t seen = 0, still_ns = 0;
  for (int polls = 0; !launch_done_ended(&d->done, ended); polls++) {
    uint64_t now_seen = 0;
    for (int b = 0; b < d->done.nblocks; b++)
      now_seen += __atomic_load_n(&ended[b], __ATOMIC_ACQUIRE);
    still_ns = now_seen == seen ? still_ns + (uint64_t)ns : 0;
    seen = now_seen;
    if (polls % 64 == 63) {
      /* a query of a stream of this thread (not the legacy one, which
       * would break another thread's graph capture) says the sticky error */
      err = cudaStreamQuery(cudaStreamPerThread);
      cudaGetLastError();
      if (err != cudaSuccess && err != cudaErrorNotReady) {
        WEFT_WARN(LOG_INIT, "device comm: not waiting for its kernels: %s",
                  cudaGetErrorString(err));
        return 1;
      }
    }
    if (timeout_ns != 0 && still_ns > timeout_ns) return 0;
    struct timespec ts = {0, ns};
    nanosleep(&ts, NULL);
    if (ns < 1000000) ns *= 2;
  }
  return 1;
}

weftResult_t device_comm_stream_check(struct device_comm *d, cudaStream_t stream, uint64_t key) {
  /* the NULL, legacy and per-thread streams are the current device's, which
   * the launch has made the comm's. A stream being captured is not asked
   * (a global-mode capture refuses the question and is broken by it): the
   * caller checks it at its first use outside a capture. Known by its key,
   * not its handle, which a new stream may have on another device. */
  if (key <= 2 || key == d->stream_checked) return weftSuccess;
  int dev = -1;
  CUDA_TRY(cudaStreamGetDevice(stream, &dev), "the stream's device");
  if (dev != d->dev)
    return weft_error_set(weftInvalidArgument, "a stream of CUDA device %d given to a "
                          "communicator of device %d", dev, d->dev);
  d->stream_checked = key;
  return weftSuccess;
}

static void device_ring_close(struct device_comm *d) {
  for (int c = 0; c < d->nchannels; c++)
    for (int p = 0; p < DEV_NPROTOS; p++) {
      if (d->send[c][p].transport) d->send[c][p].transport->close(&d->send[c][p]);
      if (d->recv[c][p].transport) d->recv[c][p].transport->close(&d->recv[c][p]);
    }
  memset(d->send, 0, sizeof d->send);
  memset(d->recv, 0, sizeof d->recv);
  cudaFree(d->channels_d);
  cudaFree(d->rings_d);
  d->channels_d = NULL;
  d->rings_d = NULL;
  d->nchannels = 0;
}

/* WEFT_DETERMINISTIC's scratch, the ones it outgrew, and its event
 * (device_det.c). */
static void device_det_close(struct device_comm *d) {
  if (d->det_done != NULL) cudaEventDestroy(d->det_done);
  cudaFree(d->det_scratch);
  for (int i = 0; i < d->det_nretired; i++) cudaFree(d->det_retired[i]);
  d->det_done = NULL;
  d->det_scratch = NULL;
  d->det_nbytes = 0;
  d->det_nretired = 0;
}

void device_comm_free(struct weftComm *comm) {
  struct device_comm *d = comm->device;
  if (d == NULL) return;
  struct device_ctx_saved prev; /* a thread without a context (a collector's) keeps none */
  device_ctx_save(&prev);
  cudaSetDevice(d->dev);
  /* the FIFOs, and the words the kernels report in, may be in use until then */
  const int ended = d->flags_h == NULL || device_comm_wait(d, comm_timeout_ns(comm));
  /* peers asking meanwhile saw the calls' states; from here the words may go */
  if (d->flags_h != NULL) device_watch_close(comm, d);
  if (ended) {
    device_tree_close(d);
    device_ring_close(d);
    device_sendrecv_free(&d->sendrecv, comm->nranks);
    device_det_close(d);
    if (d->flags_h != NULL) {
      cudaHostUnregister(d->flags_h);
      free(d->flags_h);
    }
  } else {
    WEFT_WARN(LOG_INIT, "device comm of rank %d: launch %llu not ended after the timeout; its "
              "device memory stays allocated", comm->rank, (unsigned long long)d->done.seq);
  }
  cudaGetLastError();
  device_ctx_restore(&prev);
  device_watch_fini(d);
  free(d);
  comm->device = NULL;
}

/* Writes the comm's channels (rings, FIFOs at step 0) where the kernels
 * read them. */
static weftResult_t device_channels_publish(struct weftComm *comm, struct device_comm *d) {
  const int n = comm->nranks, nch = d->nchannels;
  const struct weft_channel *ch = &comm->channels[0];
  struct dev_channel host[DEV_MAX_CHANNELS];
  int *rings = calloc((size_t)nch * (size_t)n, sizeof *rings);
  if (rings == NULL) return weft_error_set(weftSystemError, "out of memory");
  memset(host, 0, sizeof host);
  weftResult_t res = weftSuccess;
  for (int c = 0; c < nch; c++) {
    memcpy(rings + (size_t)c * n, ch->ring, sizeof *rings * (size_t)n);
    host[c].ring_pos = ch->ring_pos;
    host[c].nranks = n;
    for (int p = 0; p < device_ring_nprotos(d) && n > 1 && res == weftSuccess; p++) {
      res = device_hop_fifo(&d->send[c][p], &host[c].send[p]);
      if (res == weftSuccess) res = device_hop_fifo(&d->recv[c][p], &host[c].recv[p]);
    }
  }
  if (res == weftSuccess)
    res = cuda_check(cudaMalloc((void **)&d->rings_d, sizeof *rings * (size_t)nch * n), "rings");
  if (res == weftSuccess)
    res = cuda_fifo_copy(d->rings_d, rings, sizeof *rings * (size_t)nch * n, "rings");
  free(rings);
  WEFT_TRY(res);
  for (int c = 0; c < nch; c++) host[c].ring = d->rings_d + (size_t)c * n;
  CUDA_TRY(cudaMalloc((void **)&d->channels_d, sizeof host[0] * (size_t)nch), "channels");
  WEFT_TRY(cuda_fifo_copy(d->channels_d, host, sizeof host[0] * (size_t)nch, "channels"));
  return weftSuccess;
}

/* Sets up every device connection of comm (collective over its ranks). */
static weftResult_t device_connect(struct weftComm *comm, struct device_comm *d) {
  const int n = comm->nranks;
  /* a value out of range is refused after the exchange below, on every rank
   * (refusing before it would leave the peers waiting in it) */
  int64_t nch64 = param_int(&device_params[DEVICE_P_NCHANNELS]);
  const int nch_set = param_str(&device_params[DEVICE_P_NCHANNELS]) != NULL;
  const int nch_bad = nch_set && (nch64 < 1 || nch64 > DEV_MAX_CHANNELS);
  const int64_t il64 = param_int(&device_params[DEVICE_P_RING_INTERLEAVE]);
  const int il_max = ring_interleave_max(DEV_NSLOTS);
  const int il_bad = il64 < 1 || il64 > il_max;
  /* every device channel follows the comm's ring order (channel 0's) */
  const struct weft_channel *ch = &comm->channels[0];
  /* ranks learn each other's devices (the transports choose by them) and how
   * many SMs each has */
  struct cudaDeviceProp prop;
  CUDA_TRY(cudaGetDeviceProperties(&prop, d->dev), "device properties");
  struct device_gpu_ident *info = calloc((size_t)n, sizeof *info);
  if (info == NULL) return weft_error_set(weftSystemError, "out of memory");
  _Static_assert(sizeof prop.uuid.bytes == sizeof info->uuid, "a CUDA UUID");
  memcpy(info[comm->rank].uuid, prop.uuid.bytes, sizeof info->uuid);
  info[comm->rank].dev = d->dev;
  info[comm->rank].sms = prop.multiProcessorCount;
  info[comm->rank].blocks_per_sm = nch_set ? ring_blocks_per_sm(d->dev) : 1;
  info[comm->rank].want_channels =
      nch_bad ? -1 : device_nchannels(nch_set ? (int)nch64 : DEV_DEFAULT_CHANNELS,
                                      comm->cfg_min_channels, comm->cfg_max_channels,
                                      DEV_MAX_CHANNELS);
  info[comm->rank].want_interleave = il_bad ? -1 : (int32_t)il64;
  info[comm->rank].bus_id = device_bus_id(d->dev);
  /* this rank's launches only: nothing the peers need to agree on */
  d->pdl = param_int(&device_params[DEVICE_P_PDL]) != 0 && ring_kernels_wait_for_pdl(&prop);
  weftResult_t res = bootstrap_allgather(comm->bs, info, sizeof *info);
  int nch = 1;
  if (res == weftSuccess && nch_bad)
    res = weft_error_set(weftInvalidArgument, "WEFT_DEVICE_NCHANNELS=%lld: must be 1 to %d",
                         (long long)nch64, DEV_MAX_CHANNELS);
  if (res == weftSuccess && il_bad)
    res = weft_error_set(weftInvalidArgument, "WEFT_DEVICE_RING_INTERLEAVE=%lld: must be 1 to %d",
                         (long long)il64, il_max);
  for (int i = 0; i < n && res == weftSuccess; i++)
    if (info[i].want_channels < 0)
      res = weft_error_set(weftInvalidArgument, "rank %d's WEFT_DEVICE_NCHANNELS is not 1 to %d",
                           i, DEV_MAX_CHANNELS);
    else if (info[i].want_interleave < 0)
      res = weft_error_set(weftInvalidArgument,
                           "rank %d's WEFT_DEVICE_RING_INTERLEAVE is not 1 to %d", i, il_max);
  if (res == weftSuccess) {
    for (int i = 0; i < n; i++) { /* what CUDA says wins over a guess from the device number */
      comm->peers[i].cuda_dev = info[i].dev;
      if (info[i].bus_id >= 0) comm->peers[i].bus_id = info[i].bus_id;
    }
    int cap = device_channel_cap(info, n);
    nch = device_nchannels_agreed(info, n, cap);
    d->interleave = device_interleave_agreed(info, n);
    if (d->interleave < info[comm->rank].want_interleave)
      WEFT_INFO(LOG_INIT, "rank %d: %d device ring loops together of the %d asked (another "
                "rank's WEFT_DEVICE_RING_INTERLEAVE)", comm->rank, d->interleave,
                info[comm->rank].want_interleave);
    if (nch < info[comm->rank].want_channels)
      WEFT_INFO(LOG_INIT, "rank %d: %d device channels of the %d asked (the GPU's SMs over the "
                "ranks sharing it, or another rank's settings)", comm->rank, nch,
                info[comm->rank].want_channels);
  }
  free(info);
  WEFT_TRY(res);
  d->nchannels = nch;

  if (n > 1) {
    const size_t per_rank = (size_t)nch * DEV_NPROTOS;
    struct conn_blob *blobs = calloc((size_t)n * per_rank, sizeof *blobs);
    if (blobs == NULL) return weft_error_set(weftSystemError, "out of memory");
    struct conn_blob *mine = blobs + (size_t)comm->rank * per_rank;
    weftResult_t local = weftSuccess;
    char why[512] = "";
    int prev = ch->ring[(ch->ring_pos + n - 1) % n], next = ch->ring[(ch->ring_pos + 1) % n];
    const int np = device_ring_nprotos(d); /* alike on every rank */
    for (int c = 0; c < nch && local == weftSuccess; c++)
      for (int p = 0; p < np && local == weftSuccess; p++)
        local = device_hop_recv_setup(comm, d->dev, &d->recv[c][p], prev, p,
                                      &mine[c * DEV_NPROTOS + p]);
    if (local != weftSuccess) {
      snprintf(why, sizeof why, "%s", weft_error_text());
      for (size_t i = 0; i < per_rank; i++) mine[i].transport = -2; /* tell peers */
    }
    res = bootstrap_allgather(comm->bs, blobs, sizeof *blobs * per_rank);
    if (res == weftSuccess && local != weftSuccess) res = weft_error_set(local, "%s", why);
    for (int c = 0; c < nch && res == weftSuccess; c++)
      for (int p = 0; p < np && res == weftSuccess; p++)
        res = device_hop_send_connect(
            comm, &d->send[c][p], next, p,
            &blobs[(size_t)next * per_rank + (size_t)c * DEV_NPROTOS + p]);
    free(blobs);
    WEFT_TRY(res);
    WEFT_TRY(bootstrap_barrier(comm->bs));
    for (int c = 0; c < nch; c++)
      for (int p = 0; p < np; p++) WEFT_TRY(device_hop_recv_connect(&d->recv[c][p]));
  }

  return device_channels_publish(comm, d);
}

/* The comm's device state (the flags the kernels share with the host),
 * made on first use; local, nothing collective. */
weftResult_t device_comm_get(struct weftComm *comm, struct device_comm **out) {
  if (comm->device != NULL) {
    *out = comm->device;
    return weftSuccess;
  }
  int dev;
  CUDA_TRY(cudaGetDevice(&dev), "current device");
  if (comm->cuda_dev < 0) comm->cuda_dev = dev;
  struct device_comm *d = calloc(1, sizeof *d);
  if (d == NULL) return weft_error_set(weftSystemError, "out of memory");
  device_watch_init(d); /* before any thread can find d */
  d->dev = comm->cuda_dev;
  d->crosses_hosts = device_comm_crosses_hosts(comm); /* the peers' hosts are fixed at init */
  comm->device = d;
  /* host pages the process owns, registered: they outlive a reset context,
   * which destroy may meet (device_comm_wait) */
  void *flags = NULL;
  weftResult_t res = posix_memalign(&flags, 4096, DEV_FLAGS_PAGE_NBYTES) == 0
                         ? weftSuccess
                         : weft_error_set(weftSystemError, "out of memory");
  if (res == weftSuccess) {
    memset(flags, 0, DEV_FLAGS_PAGE_NBYTES);
    res = cuda_check(cudaHostRegister(flags, DEV_FLAGS_PAGE_NBYTES, cudaHostRegisterMapped),
                     "registering the abort flag");
    if (res != weftSuccess) free(flags);
    else d->flags_h = flags;
  }
  if (res == weftSuccess)
    res = cuda_check(cudaHostGetDevicePointer((void **)&d->flags_d, d->flags_h, 0),
                     "mapping the abort flag");
  if (d->flags_h != NULL) device_watch_open(comm, d); /* closed by device_comm_free */
  if (res != weftSuccess) {
    device_comm_free(comm);
    return res;
  }
  *out = d;
  return weftSuccess;
}

weftResult_t device_ring_get(struct weftComm *comm, struct device_comm **out) {
  struct device_comm *d;
  WEFT_TRY(device_comm_get(comm, &d));
  if (!d->ring_ready) {
    weftResult_t res = device_connect(comm, d);
    if (res != weftSuccess) {
      device_ring_close(d); /* what was made of it */
      return res;
    }
    d->ring_ready = 1;
  }
  *out = d;
  return weftSuccess;
}

uint64_t device_comm_pdl_launches(const struct weftComm *comm) {
  const struct device_comm *d = comm->device;
  return d != NULL ? d->pdl_launches : 0;
}

int device_comm_interleave(const struct weftComm *comm) {
  const struct device_comm *d = comm->device;
  return d != NULL && d->ring_ready ? d->interleave : 0;
}

void device_comm_abort(struct weftComm *comm) {
  struct device_comm *d = comm->device;
  if (d != NULL && d->flags_h != NULL) __atomic_store_n(&d->flags_h[0], 1u, __ATOMIC_RELEASE);
}

/* What the kernels' error word says, in the host's words. */
static weftResult_t kernels_error(struct weftComm *comm, struct device_comm *d, uint32_t why) {
  /* a block of this rank compared and recorded (another block of it may
   * have set the error word after, with the mismatch passed back to it) */
  if ((why == DEV_GAVE_UP_MISMATCH || why == DEV_GAVE_UP_PEER_MISMATCH) &&
      device_mismatch_found(device_mismatch_h(d), DEV_MAX_CHANNELS))
    return device_mismatch_error(comm->rank, device_mismatch_h(d), DEV_MAX_CHANNELS);
  if (why == DEV_GAVE_UP_PEER_MISMATCH)
    return weft_error_set(weftRemoteError,
                          "a device kernel of rank %d gave up: another rank found that the "
                          "ranks' calls disagree (a collective's fields, or the sizes of a send "
                          "and its receive; its connections are poisoned, and its error names "
                          "what differs)",
                          comm->rank);
  static const char *const whys[] = {
      "?", "communicator was aborted", "no progress from a peer within the timeout",
      "a peer's kernel gave up first (its connection is poisoned)"};
  char stalled[160];
  if (why == DEV_GAVE_UP_TIMEOUT &&
      device_stall_describe(stalled, sizeof stalled, device_stall_h(d), DEV_MAX_CHANNELS))
    return weft_error_set(weftSystemError,
                          "a device kernel of rank %d gave up: no progress from %s within the "
                          "timeout",
                          comm->rank, stalled);
  const uint64_t *stopped = (const uint64_t *)(d->flags_h + 4);
  uint64_t op = __atomic_load_n(&stopped[0], __ATOMIC_ACQUIRE);
  char where[96] = "";
  if (op != 0)
    snprintf(where, sizeof where, "; point-to-point stopped at the group's operation %llu "
             "after %llu chunks", (unsigned long long)op - 1, (unsigned long long)stopped[1]);
  return weft_error_set(why == DEV_GAVE_UP_ABORT ? weftRemoteError : weftSystemError,
                        "a device kernel of rank %d gave up: %s%s", comm->rank,
                        whys[why <= DEV_GAVE_UP_POISON ? why : 0], where);
}

weftResult_t device_comm_error(struct weftComm *comm) {
  struct device_comm *d = comm->device;
  if (d == NULL || d->flags_h == NULL) return weftSuccess;
  const weftResult_t kept = device_watch_kept(d);
  if (kept != weftSuccess) return kept;
  uint32_t why = __atomic_load_n(&d->flags_h[1], __ATOMIC_ACQUIRE);
  if (why == 0) return weftSuccess;
  /* the peers' answers explain it (once; kept for every later question) */
  return device_watch_failure(comm, d, why, kernels_error(comm, d, why));
}

weftResult_t device_comm_watch(struct weftComm *comm) {
  weftResult_t res = device_comm_error(comm);
  struct device_comm *d = comm->device;
  if (res == weftSuccess && d != NULL && d->flags_h != NULL) res = device_watch_stall(comm, d);
  return res;
}

