/* The device executor: ring collectives on CUDA device memory as kernels on
 * the caller's stream. Each comm gets, on its first device collective,
 * WEFT_DEVICE_NCHANNELS device channels on its ring order, each with a FIFO
 * pair per protocol to its ring neighbours over the p2p (same process) or
 * cuda_ipc (other process) transport. Launching then takes only stream-ordered calls:
 * enqueue and return, and graph capture records the kernel. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "../../../transport/cuda_ipc/cuda_fifo.h"
#include "../../../transport/param.h"
#include "../../../transport/status.h"
#include "device.h"
#include "dev_types.h"
#include "../../algo/ring_steps.h"

/* Written by gen_kernels.py: [datatype][op][protocol], NULL outside the
 * matrix the build chose. */
extern const void *const (*const weft_dev_kernels[weftNumTypes])[DEV_NPROTOS];
extern const char weft_dev_matrix[];

#define DEV_NTHREADS 512 /* prims_device.cuh */
#define DEV_NSLOTS 4
#define DEV_SIMPLE_SLOT_NBYTES (256u << 10)
#define DEV_LL_SLOT_NBYTES (16u << 10)
/* a launch uses one channel (block) per this many bytes, up to the comm's */
#define DEV_CHANNEL_NBYTES (64u << 10)
/* device channels a comm may have (WEFT_DEVICE_NCHANNELS): one block each */
#define DEV_MAX_CHANNELS 64

_Static_assert(sizeof(struct dev_fifo_ctrl) <= CUDA_FIFO_CTRL_NBYTES, "ctrl fits");

struct device_comm {
  int dev;
  int nchannels;
  struct weft_conn send[DEV_MAX_CHANNELS][DEV_NPROTOS];
  struct weft_conn recv[DEV_MAX_CHANNELS][DEV_NPROTOS];
  struct dev_channel *channels_d; /* [nchannels] */
  int *rings_d;                   /* [nchannels][nranks] */
  uint32_t *flags_h;              /* mapped host memory: [0] abort, [1] error */
  uint32_t *flags_d;
};

static weftResult_t cuda_check(cudaError_t err, const char *what) {
  if (err == cudaSuccess) return weftSuccess;
  cudaGetLastError();
  return weft_error_set(weftSystemError, "cuda: %s: %s", what, cudaGetErrorString(err));
}
#define CUDA_TRY(call, what) WEFT_TRY(cuda_check((call), (what)))

int device_built(void) { return 1; }

/* --- where memory lives ------------------------------------------------- */

typedef CUresult (*ctx_get_current_fn)(CUcontext *);

/* The driver's cuCtxGetCurrent, found through the runtime (no link to libcuda). */
static ctx_get_current_fn ctx_get_current;
static pthread_once_t ctx_once = PTHREAD_ONCE_INIT;
static void ctx_lookup(void) {
  void *fn = NULL;
  enum cudaDriverEntryPointQueryResult q;
  if (cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &fn, 12000, cudaEnableDefault, &q) ==
          cudaSuccess &&
      q == cudaDriverEntryPointSuccess)
    ctx_get_current = (ctx_get_current_fn)fn;
  cudaGetLastError();
}

/* Whether this thread has a CUDA context: without one, no buffer it holds can
 * be device memory it allocated, and asking would create a context. */
static int ctx_current(void) {
  pthread_once(&ctx_once, ctx_lookup);
  CUcontext ctx = NULL;
  return ctx_get_current != NULL && ctx_get_current(&ctx) == CUDA_SUCCESS && ctx != NULL;
}

int device_ptr_on_device(const void *ptr) {
  if (ptr == NULL || !ctx_current()) return 0;
  struct cudaPointerAttributes attr;
  if (cudaPointerGetAttributes(&attr, ptr) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
}

int device_plan_on_device(const struct weft_plan *plan) {
  return device_ptr_on_device(plan->recvbuf != NULL ? plan->recvbuf : plan->sendbuf);
}

weftResult_t device_check_ordinal(int dev) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    n = 0;
  }
  if (dev < 0 || dev >= n)
    return weft_error_set(weftInvalidUsage, "CUDA device %d requested, but %d %s present", dev, n,
                          n == 1 ? "device is" : "devices are");
  return weftSuccess;
}

weftResult_t device_mem_alloc(void **ptr, size_t nbytes, int *on_device_out) {
  *on_device_out = 0;
  if (!ctx_current()) return weftSuccess;
  CUDA_TRY(cudaMalloc(ptr, nbytes), "MemAlloc");
  *on_device_out = 1;
  return weftSuccess;
}

int device_mem_free(void *ptr) {
  if (!device_ptr_on_device(ptr)) return 0;
  cudaFree(ptr);
  cudaGetLastError();
  return 1;
}

/* --- connecting ---------------------------------------------------------- */

static void conn_shape(struct weft_conn *c, struct weftComm *comm, int peer, int proto) {
  memset(c, 0, sizeof *c);
  c->nslots = DEV_NSLOTS;
  c->slot_nbytes = proto == DEV_PROTO_LL ? DEV_LL_SLOT_NBYTES : DEV_SIMPLE_SLOT_NBYTES;
  c->peer_rank = peer;
  c->peer_pid = comm->peers[peer].pid;
}

static struct dev_fifo fifo_of(const struct weft_conn *c) {
  struct dev_fifo f = {.ctrl = cuda_fifo_ctrl(c), .slots = c->slots, .nslots = c->nslots,
                       .slot_nbytes = (uint32_t)c->slot_nbytes, .step = 0};
  return f;
}

void device_comm_free(struct weftComm *comm) {
  struct device_comm *d = comm->device;
  if (d == NULL) return;
  int prev = -1;
  cudaGetDevice(&prev);
  cudaSetDevice(d->dev);
  cudaDeviceSynchronize(); /* kernels may still use the FIFOs */
  for (int c = 0; c < d->nchannels; c++)
    for (int p = 0; p < DEV_NPROTOS; p++) {
      if (d->send[c][p].transport) d->send[c][p].transport->close(&d->send[c][p]);
      if (d->recv[c][p].transport) d->recv[c][p].transport->close(&d->recv[c][p]);
    }
  cudaFree(d->channels_d);
  cudaFree(d->rings_d);
  cudaFreeHost(d->flags_h);
  cudaGetLastError();
  if (prev >= 0) cudaSetDevice(prev);
  free(d);
  comm->device = NULL;
}

/* Sets up every device connection of comm (collective over its ranks). */
static weftResult_t device_connect(struct weftComm *comm, struct device_comm *d) {
  const int n = comm->nranks;
  int64_t nch64 = param_int(&cuda_params[2]);
  if (nch64 < 1 || nch64 > DEV_MAX_CHANNELS)
    return weft_error_set(weftInvalidArgument, "WEFT_DEVICE_NCHANNELS=%lld: must be 1 to %d",
                          (long long)nch64, DEV_MAX_CHANNELS);
  /* every device channel follows the comm's ring order (channel 0's) */
  const struct weft_channel *ch = &comm->channels[0];
  /* ranks learn each other's devices (the transports choose by them) and how
   * many SMs each has */
  int sms = 0;
  CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, d->dev), "SM count");
  int32_t(*info)[2] = calloc((size_t)n, sizeof *info);
  if (info == NULL) return weft_error_set(weftSystemError, "out of memory");
  info[comm->rank][0] = d->dev;
  info[comm->rank][1] = sms;
  weftResult_t res = bootstrap_allgather(comm->bs, info, sizeof *info);
  int nch = (int)nch64;
  if (res == weftSuccess) {
    /* A ring's blocks wait on each other, so every rank's blocks must be on
     * their GPU at once. Counting one block per SM (what any kernel that
     * launches is sure of), the ranks sharing the busiest GPU share its SMs. */
    int most = 1, fewest_sms = sms;
    for (int i = 0; i < n; i++) {
      int same = 0;
      for (int j = 0; j < n; j++) same += info[j][0] == info[i][0];
      if (same > most) most = same;
      if (info[i][1] < fewest_sms) fewest_sms = info[i][1];
      comm->peers[i].cuda_dev = info[i][0];
    }
    int cap = fewest_sms / most > 0 ? fewest_sms / most : 1;
    if (nch > cap) nch = cap;
  }
  free(info);
  WEFT_TRY(res);
  d->nchannels = nch;

  CUDA_TRY(cudaHostAlloc((void **)&d->flags_h, 2 * sizeof(uint32_t), cudaHostAllocMapped),
           "allocating the abort flag");
  d->flags_h[0] = d->flags_h[1] = 0;
  CUDA_TRY(cudaHostGetDevicePointer((void **)&d->flags_d, d->flags_h, 0), "mapping the abort flag");
  if (n > 1) {
    const size_t per_rank = (size_t)nch * DEV_NPROTOS;
    struct conn_blob *blobs = calloc((size_t)n * per_rank, sizeof *blobs);
    if (blobs == NULL) return weft_error_set(weftSystemError, "out of memory");
    struct conn_blob *mine = blobs + (size_t)comm->rank * per_rank;
    weftResult_t local = weftSuccess;
    char why[512] = "";
    for (int c = 0; c < nch && local == weftSuccess; c++) {
      int prev = ch->ring[(ch->ring_pos + n - 1) % n];
      for (int p = 0; p < DEV_NPROTOS && local == weftSuccess; p++) {
        struct weft_conn *conn = &d->recv[c][p];
        struct conn_blob *b = &mine[c * DEV_NPROTOS + p];
        conn_shape(conn, comm, prev, p);
        b->transport = -1;
        for (int t = 0; weft_device_transports[t] != NULL && b->transport < 0; t++) {
          const struct weft_transport *tr = weft_device_transports[t];
          if (!tr->disabled() && tr->can_connect(&comm->peers[prev], &comm->peers[comm->rank]))
            b->transport = t;
        }
        if (b->transport < 0)
          local = weft_error_set(weftSystemError,
                                 "no device transport connects rank %d to rank %d (GPUs of "
                                 "one host only)",
                                 prev, comm->rank);
        else if ((local = weft_device_transports[b->transport]->recv_setup(conn, b)) ==
                 weftSuccess)
          conn->transport = weft_device_transports[b->transport];
        if (local != weftSuccess) snprintf(why, sizeof why, "%s", weft_error_text());
      }
    }
    if (local != weftSuccess)
      for (size_t i = 0; i < per_rank; i++) mine[i].transport = -2; /* tell peers */
    res = bootstrap_allgather(comm->bs, blobs, sizeof *blobs * per_rank);
    if (res == weftSuccess && local != weftSuccess) res = weft_error_set(local, "%s", why);
    for (int c = 0; c < nch && res == weftSuccess; c++) {
      int next = ch->ring[(ch->ring_pos + 1) % n];
      for (int p = 0; p < DEV_NPROTOS && res == weftSuccess; p++) {
        const struct conn_blob *b = &blobs[(size_t)next * per_rank + (size_t)c * DEV_NPROTOS + p];
        conn_shape(&d->send[c][p], comm, next, p);
        if (b->transport < 0) {
          res = weft_error_set(weftRemoteError,
                               "rank %d could not set up its device connection from rank %d",
                               next, comm->rank);
        } else if ((res = weft_device_transports[b->transport]->send_connect(&d->send[c][p],
                                                                             b)) == weftSuccess) {
          d->send[c][p].transport = weft_device_transports[b->transport];
        }
      }
    }
    free(blobs);
    WEFT_TRY(res);
    WEFT_TRY(bootstrap_barrier(comm->bs));
  }

  /* the channels as the kernels read them */
  struct dev_channel host[DEV_MAX_CHANNELS];
  int *rings = calloc((size_t)nch * (size_t)n, sizeof *rings);
  if (rings == NULL) return weft_error_set(weftSystemError, "out of memory");
  memset(host, 0, sizeof host);
  for (int c = 0; c < nch; c++) {
    memcpy(rings + (size_t)c * n, ch->ring, sizeof *rings * (size_t)n);
    host[c].ring_pos = ch->ring_pos;
    host[c].nranks = n;
    if (n > 1)
      for (int p = 0; p < DEV_NPROTOS; p++) {
        host[c].send[p] = fifo_of(&d->send[c][p]);
        host[c].recv[p] = fifo_of(&d->recv[c][p]);
      }
  }
  res = cuda_check(cudaMalloc((void **)&d->rings_d, sizeof *rings * (size_t)nch * n), "rings");
  if (res == weftSuccess)
    res = cuda_check(cudaMemcpy(d->rings_d, rings, sizeof *rings * (size_t)nch * n,
                                cudaMemcpyHostToDevice), "rings");
  free(rings);
  WEFT_TRY(res);
  for (int c = 0; c < nch; c++) host[c].ring = d->rings_d + (size_t)c * n;
  CUDA_TRY(cudaMalloc((void **)&d->channels_d, sizeof host[0] * (size_t)nch), "channels");
  CUDA_TRY(cudaMemcpy(d->channels_d, host, sizeof host[0] * (size_t)nch, cudaMemcpyHostToDevice),
           "channels");
  return weftSuccess;
}

/* The comm's device state, connected on first use. */
static weftResult_t device_comm_get(struct weftComm *comm, struct device_comm **out) {
  if (comm->device != NULL) {
    *out = comm->device;
    return weftSuccess;
  }
  int dev;
  CUDA_TRY(cudaGetDevice(&dev), "current device");
  if (comm->cuda_dev < 0) comm->cuda_dev = dev;
  struct device_comm *d = calloc(1, sizeof *d);
  if (d == NULL) return weft_error_set(weftSystemError, "out of memory");
  d->dev = comm->cuda_dev;
  /* set-up allocates and copies: let a capturing stream of this thread be */
  enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  cudaThreadExchangeStreamCaptureMode(&mode);
  comm->device = d;
  weftResult_t res = device_connect(comm, d);
  cudaThreadExchangeStreamCaptureMode(&mode);
  if (res != weftSuccess) {
    device_comm_free(comm);
    return res;
  }
  *out = d;
  return weftSuccess;
}

void device_comm_abort(struct weftComm *comm) {
  struct device_comm *d = comm->device;
  if (d != NULL && d->flags_h != NULL) __atomic_store_n(&d->flags_h[0], 1u, __ATOMIC_RELEASE);
}

weftResult_t device_comm_error(struct weftComm *comm) {
  struct device_comm *d = comm->device;
  uint32_t why = d != NULL && d->flags_h != NULL ? __atomic_load_n(&d->flags_h[1], __ATOMIC_ACQUIRE)
                                                : 0;
  if (why == 0) return weftSuccess;
  return weft_error_set(why == 1 ? weftRemoteError : weftSystemError,
                        "a device kernel of rank %d gave up: %s", comm->rank,
                        why == 1 ? "communicator was aborted"
                                 : "no progress from a peer within the timeout");
}

/* --- launching ----------------------------------------------------------- */

static const char *const dtype_names[weftNumTypes] = {
    "int8", "uint8", "int32", "uint32", "int64", "uint64",
    "float16", "float32", "float64", "bfloat16", "float8e4m3", "float8e5m2"};

static weftResult_t device_launch(struct weftComm *comm, const struct weft_plan *plan,
                                  cudaStream_t stream) {
  if (plan_is_p2p(plan))
    return weft_error_set(weftInvalidUsage, "%s on device memory is not supported yet",
                          coll_kind_name(plan->coll));
  if ((int)plan->op >= weftNumOps)
    return weft_error_set(weftInvalidUsage,
                          "%s: pre-multiply ops on device memory are not supported yet",
                          coll_kind_name(plan->coll));
  if (plan->count == 0) return weftSuccess;
  WEFT_TRY(device_comm_error(comm));
  int prev = -1;
  CUDA_TRY(cudaGetDevice(&prev), "current device");
  if (comm->cuda_dev < 0) comm->cuda_dev = prev; /* the caller's device, as NCCL */
  if (prev != comm->cuda_dev) CUDA_TRY(cudaSetDevice(comm->cuda_dev), "setting the device");
  struct device_comm *d;
  weftResult_t res = device_comm_get(comm, &d);
  if (res == weftSuccess && comm->nranks == 1) {
    /* one rank: every collective is a copy (avg divides by one) */
    size_t nbytes = plan->count * weftTypeSize(plan->datatype);
    if (plan->recvbuf != plan->sendbuf)
      res = cuda_check(cudaMemcpyAsync(plan->recvbuf, plan->sendbuf, nbytes,
                                       cudaMemcpyDeviceToDevice, stream), "copy");
  } else if (res == weftSuccess) {
    int proto = plan->proto == PROTO_LL ? DEV_PROTO_LL : DEV_PROTO_SIMPLE;
    const void *fn = weft_dev_kernels[plan->datatype][plan->op][proto];
    if (fn == NULL) {
      res = weft_error_set(weftInvalidUsage,
                           "%s: no kernel for %s with op %d in this build (device_matrix=%s; "
                           "configure with -Ddevice_matrix=full)",
                           coll_kind_name(plan->coll), dtype_names[plan->datatype], (int)plan->op,
                           weft_dev_matrix);
    } else {
      /* enough blocks to keep the GPU busy, each with a worthwhile share; every
       * rank computes the same number from the same call */
      size_t nbytes = plan->count * weftTypeSize(plan->datatype);
      size_t want = (nbytes + DEV_CHANNEL_NBYTES - 1) / DEV_CHANNEL_NBYTES;
      int nch = want < (size_t)d->nchannels ? (int)(want ? want : 1) : d->nchannels;
      struct dev_work w = {
          .channels = d->channels_d, .sendbuf = plan->sendbuf, .recvbuf = plan->recvbuf,
          .count = plan->count, .coll = (int)plan->coll, .root = plan->root,
          .nchannels = nch, .divisor = plan->op == weftAvg ? comm->nranks : 1, .proto = proto,
          .elem_nbytes = (uint32_t)weftTypeSize(plan->datatype),
          .abort_flag = d->flags_d, .error = d->flags_d + 1, .timeout_ns = comm->timeout_ns};
      void *args[] = {&w};
      dim3 grid = {(unsigned)nch, 1, 1}, block = {DEV_NTHREADS, 1, 1};
      res = cuda_check(cudaLaunchKernel(fn, grid, block, args, 0, stream), "launching a kernel");
    }
  }
  if (prev != comm->cuda_dev) cudaSetDevice(prev);
  return res;
}

weftResult_t device_enqueue(struct weftComm *comm, const struct weft_plan *plan, void *stream) {
  weftResult_t res = device_launch(comm, plan, (cudaStream_t)stream);
  if (res != weftSuccess) snprintf(comm->last_error, sizeof comm->last_error, "%s",
                                   weft_error_text());
  return res;
}

struct connect_arg {
  struct weftComm *comm;
  weftResult_t res;
  char error[512];
};

static void *connect_main(void *p) {
  struct connect_arg *a = p;
  struct device_comm *d;
  a->res = cuda_check(cudaSetDevice(a->comm->cuda_dev >= 0 ? a->comm->cuda_dev : 0), "device");
  if (a->res == weftSuccess) a->res = device_comm_get(a->comm, &d);
  if (a->res != weftSuccess) snprintf(a->error, sizeof a->error, "%s", weft_error_text());
  return NULL;
}

/* Connects the group's comms that are not yet, each on a thread of its own:
 * connecting is collective, and one caller may drive several ranks. */
static weftResult_t connect_group(struct weftComm *const *comms, size_t nops) {
  struct connect_arg *args = calloc(nops ? nops : 1, sizeof *args);
  pthread_t *tids = calloc(nops ? nops : 1, sizeof *tids);
  weftResult_t res = args && tids ? weftSuccess : weft_error_set(weftSystemError, "out of memory");
  size_t n = 0, started = 0;
  int cur = -1;
  cudaGetDevice(&cur);
  for (size_t i = 0; i < nops && res == weftSuccess; i++) {
    int seen = comms[i]->device != NULL;
    for (size_t j = 0; j < n && !seen; j++) seen = args[j].comm == comms[i];
    if (seen) continue;
    if (comms[i]->cuda_dev < 0) comms[i]->cuda_dev = cur; /* the caller's device, as NCCL */
    args[n++].comm = comms[i];
  }
  for (size_t i = 0; i < n && res == weftSuccess; i++, started++)
    if (pthread_create(&tids[i], NULL, connect_main, &args[i]) != 0)
      res = weft_error_errno(weftSystemError, "starting a connect thread");
  for (size_t i = 0; i < started; i++) pthread_join(tids[i], NULL);
  for (size_t i = 0; i < started && res == weftSuccess; i++)
    if (args[i].res != weftSuccess) res = weft_error_set(args[i].res, "%s", args[i].error);
  free(args);
  free(tids);
  return res;
}

weftResult_t device_enqueue_group(struct weftComm *const *comms,
                                  const struct weft_plan *const *plans, void *const *streams,
                                  size_t nops) {
  WEFT_TRY(connect_group(comms, nops));
  for (size_t i = 0; i < nops; i++) WEFT_TRY(device_enqueue(comms[i], plans[i], streams[i]));
  return weftSuccess;
}
