/* What the device executor's host files (device_cuda.c, device_sendrecv.c) share:
 * a comm's device state and the CUDA error conversion. CUDA builds only. */
#ifndef WEFT_DEVICE_PRIV_H
#define WEFT_DEVICE_PRIV_H

#include <pthread.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "../../../transport/cuda_ipc/cuda_fifo.h"
#include "../../../transport/base/status.h"
#include "../../../transport/transport.h"
#include "../../core/plan.h"
#include "../../core/trace.h"
#include "dev_types.h"
#include "device.h"
#include "launch_done.h"

/* mapped host memory the kernels report to: uint32 [0] abort, [1] error
 * (enum dev_give_up); uint64 [2], [3] where a send/recv block stopped; from byte
 * DEV_ENDED_OFFSET, uint64 [DEV_MAX_CHANNELS]: the launch each block index
 * last ended (launch_done.h; a launch has at most that many blocks); at
 * byte DEV_FAILED_OFFSET, uint64: the first launch that failed (dev_done); from
 * byte DEV_MISMATCH_OFFSET, struct dev_mismatch [DEV_MAX_CHANNELS]: where
 * each block index found the ranks' calls differ; from DEV_STALL_OFFSET,
 * struct dev_stall [DEV_MAX_CHANNELS]: where each timed out */
#define DEV_ENDED_OFFSET 32
#define DEV_FAILED_OFFSET (DEV_ENDED_OFFSET + 8 * DEV_MAX_CHANNELS)
#define DEV_MISMATCH_OFFSET (((DEV_FAILED_OFFSET + 8) + 63) / 64 * 64)
#define DEV_STALL_OFFSET (DEV_MISMATCH_OFFSET + sizeof(struct dev_mismatch) * DEV_MAX_CHANNELS)
#define DEV_FLAGS_NBYTES (DEV_STALL_OFFSET + sizeof(struct dev_stall) * DEV_MAX_CHANNELS)
#define DEV_FLAGS_PAGE_NBYTES 8192 /* what is allocated for them: two pages */

/* A comm's point-to-point lanes (connected per peer on first use). */
struct device_sendrecv {
  struct weft_conn (*send)[SENDRECV_MAX_LANES]; /* [nranks] */
  struct weft_conn (*recv)[SENDRECV_MAX_LANES]; /* [nranks] */
  char *known;                          /* [nranks]: the peer's GPU was exchanged */
  struct dev_sendrecv_lanes *lanes_d;        /* [nranks], device memory */
  int max_blocks;
  int nlanes; /* of SENDRECV_MAX_LANES: WEFT_P2P_LANES, agreed with each peer */
};

/* WEFT_DETERMINISTIC's scratch grows at least twofold each time: this many
 * outgrown buffers at most */
#define DET_RETIRED_MAX 24

/* What the comm's watch keeps (device_watch.c). */
struct device_watch {
  pthread_mutex_t mutex;  /* one judge at a time */
  uint64_t launched;      /* the last launch recorded in the trace << 8 | its blocks */
  uint64_t seen_newest;   /* the newest launch a block had ended, when last looked */
  int64_t since_ns;       /* when that last changed, or the comm was seen idle
                             (clock_ns) */
  int idle_seen;          /* a look found no work: the next launch sets busy_since_ns */
  int64_t busy_since_ns;  /* the first launch after that */
  int64_t checked_ns;     /* the last look */
  uint64_t next_ask_ns;   /* the stall after which the peers are asked next */
  weftResult_t verdict_res; /* a verdict found (weftSuccess: none yet), */
  char verdict[2200];       /* and its text */
};

struct device_comm {
  int dev;
  int ring_ready; /* the ring channels below are connected */
  int kernels_loaded; /* device_kernels_load ran for it (comm_connect) */
  int crosses_hosts; /* device_comm_crosses_hosts, asked once when made */
  int nchannels;
  int interleave; /* loops a ring channel runs together, agreed by the ranks */
  int pdl;        /* WEFT_DEVICE_PDL, where the GPU and the kernels' build have it */
  uint64_t pdl_launches; /* launches that went out so (device_comm_pdl_launches) */
  struct weft_conn send[DEV_MAX_CHANNELS][DEV_NPROTOS];
  struct weft_conn recv[DEV_MAX_CHANNELS][DEV_NPROTOS];
  struct dev_channel *channels_d; /* [nchannels] */
  int *rings_d;                   /* [nchannels][nranks] */
  uint32_t *flags_h;              /* DEV_FLAGS_NBYTES of mapped host memory */
  uint32_t *flags_d;
  struct device_sendrecv sendrecv;
  /* the tree all-reduce's channels (device_tree.c), connected on first use */
  int tree_ready;
  int tree_nchannels;
  struct weft_conn (*tree_send)[TREE_MAX_PEERS][DEV_NPROTOS]; /* [tree_nchannels] */
  struct weft_conn (*tree_recv)[TREE_MAX_PEERS][DEV_NPROTOS];
  struct dev_tree_channel *trees_d;                          /* [tree_nchannels] */
  struct launch_done done; /* the launches made, which destroy and abort wait for */
  uint64_t stream_checked; /* the key of the last stream found on the comm's device */
  /* the stream of the call being launched, as its launches are counted:
   * device_stream_key's key and device_stream_thread's thread (comm_launch) */
  uint64_t call_stream;
  uintptr_t call_thread;
  /* WEFT_DETERMINISTIC's scratch (device_det.c), and the ones it outgrew */
  void *det_scratch;
  size_t det_nbytes;
  void *det_retired[DET_RETIRED_MAX];
  int det_nretired;
  cudaEvent_t det_done; /* recorded after each call outside a graph */
  /* where det_done was last recorded: after the comm's launch det_done_seq
   * (d->done.seq then), on stream det_done_stream (thread det_done_thread,
   * as call_stream and call_thread). A reduce-scatter's last kernel, its
   * reduction, is no launch the comm counts: a call on another stream
   * while no launch followed it waits for the event (comm_gate). */
  uint64_t det_done_seq;
  uint64_t det_done_stream;
  uintptr_t det_done_thread;
  struct device_watch watch;
};

/* The comm's device state, made on first use (local); and with its ring
 * channels connected (collective over the comm's ranks, on first use). */
weftResult_t device_comm_get(struct weftComm *comm, struct device_comm **out);
weftResult_t device_ring_get(struct weftComm *comm, struct device_comm **out);
/* The comm's ended words (launch_done.h), as the host reads them and as
 * its kernels write them. */
static inline uint64_t *device_ended_h(const struct device_comm *d) {
  return (uint64_t *)((char *)d->flags_h + DEV_ENDED_OFFSET);
}
static inline uint64_t *device_ended_d(const struct device_comm *d) {
  return (uint64_t *)((char *)d->flags_d + DEV_ENDED_OFFSET);
}
/* Its failed word (dev_done), likewise. */
static inline const uint64_t *device_failed_h(const struct device_comm *d) {
  return (const uint64_t *)((char *)d->flags_h + DEV_FAILED_OFFSET);
}
static inline uint64_t *device_failed_d(const struct device_comm *d) {
  return (uint64_t *)((char *)d->flags_d + DEV_FAILED_OFFSET);
}
/* The comm's mismatch records, as the host reads them and as its kernels
 * write them. */
static inline const struct dev_mismatch *device_mismatch_h(const struct device_comm *d) {
  return (const struct dev_mismatch *)((char *)d->flags_h + DEV_MISMATCH_OFFSET);
}
static inline struct dev_mismatch *device_mismatch_d(const struct device_comm *d) {
  return (struct dev_mismatch *)((char *)d->flags_d + DEV_MISMATCH_OFFSET);
}
static inline const struct dev_stall *device_stall_h(const struct device_comm *d) {
  return (const struct dev_stall *)((char *)d->flags_h + DEV_STALL_OFFSET);
}
static inline struct dev_stall *device_stall_d(const struct device_comm *d) {
  return (struct dev_stall *)((char *)d->flags_d + DEV_STALL_OFFSET);
}
/* A kernel launch's dev_done, filled before it goes out, and counted once
 * it did (launch_done.h): destroy and abort wait for what was counted. */
static inline void device_done_fill(const struct device_comm *d, int captured,
                                    struct dev_done *out) {
  launch_done_fill(&d->done, device_ended_d(d), device_failed_d(d), d->flags_d + 1, captured,
                   out);
}
/* For the per-thread stream, the calling thread, as a number no other
 * thread of the process ever gets (a pthread_t is reused once its thread
 * ends); 0 for every other stream (device_driver.c). */
uintptr_t device_stream_thread(cudaStream_t stream);
/* A key for stream that no other stream of the process ever has: a made
 * stream's unique id (cudaStreamGetId; a destroyed stream's handle comes
 * back for the next one made), 3 and up; the NULL, legacy and per-thread
 * handles (0, 1, 2), which are never destroyed, as they are. Not to be
 * asked of a stream a graph captures. */
uint64_t device_stream_key(cudaStream_t stream);
/* Counts a launch on the call's stream (d->call_stream, d->call_thread). */
static inline void device_done_commit(struct device_comm *d, const struct dev_done *done,
                                      int nblocks) {
  launch_done_commit(&d->done, done, (uintptr_t)d->call_stream, d->call_thread, nblocks);
}
/* Refuses a stream of another device than the comm's (a kernel launched
 * through the driver runs in its stream's context: device_kernel_launch);
 * asked again only when the stream changes, and not while a graph captures
 * it (the question would break a global-mode capture). */
weftResult_t device_comm_stream_check(struct device_comm *d, cudaStream_t stream, uint64_t key);

/* The comm's watch (device_watch.c): made with its device state before
 * that is published (init), read by the trace once the words the kernels
 * report in exist (open), no longer read once they may go (close), then
 * freed (fini). */
void device_watch_init(struct device_comm *d);
void device_watch_open(struct weftComm *comm, struct device_comm *d);
void device_watch_close(struct weftComm *comm, struct device_comm *d);
void device_watch_fini(struct device_comm *d);
/* Records plan in comm's trace (comm->trace not NULL), enqueued with
 * result res as the launches l (NULL: none): it follows them from then on
 * (a call that launched nothing has the launch before it, with first past
 * last); one without (refused, the comm's first that launched nothing) is
 * recorded done with res. */
void device_trace_call(struct weftComm *comm, const struct weft_plan *plan,
                       const struct trace_launch *l, weftResult_t res);
/* The verdict a watch or a failure found before, again as the error
 * (weftSuccess: none). */
weftResult_t device_watch_kept(struct device_comm *d);
/* A kernel of comm gave up for why, which the host's error res (its text
 * the thread's) says: the verdict on the oldest unfinished call, from the
 * peers' answers, as the error (weftInvalidUsage where they are in another
 * collective under its number), once; the trace dumped. */
weftResult_t device_watch_failure(struct weftComm *comm, struct device_comm *d, uint32_t why,
                                  weftResult_t res);
/* weftCommGetAsyncError's watch of comm's kernels (no failure yet): where
 * they have work and have ended nothing for WEFT_HANG_ASK_MS (then twice as
 * long, and so on), asks the peers; a different collective under the
 * oldest unfinished call's number breaks the comm and stops its kernels:
 * weftInvalidUsage. Else weftSuccess. */
weftResult_t device_watch_stall(struct weftComm *comm, struct device_comm *d);

/* Threads of a block that moves nbytes at a time, per_thread bytes a
 * thread in one pass of its copy loop: from one warp up to DEV_NTHREADS, so
 * that a small message's block gathers few warps at each barrier. */
static inline unsigned device_block_threads(uint64_t nbytes, uint64_t per_thread) {
  uint64_t want = (nbytes + per_thread - 1) / per_thread;
  want = (want + 31) / 32 * 32;
  return want < 32 ? 32u : want > DEV_NTHREADS ? DEV_NTHREADS : (unsigned)want;
}

/* Launches a group of this comm's own sends and receives (plans[0..n), on
 * device memory) on stream as one kernel, connected beforehand; nothing
 * when n is 0 (device_launch.c's, handed to device_det.c). */
typedef weftResult_t (*device_p2p_fn)(struct weftComm *comm, const struct weft_plan *const *plans,
                                      size_t n, cudaStream_t stream);
/* WEFT_DETERMINISTIC's reduction of plan (two or more ranks, count > 0) on
 * stream, which a graph captures or not, its exchanges through p2p
 * (device_det.c). Its scratch and event are struct device_comm's, freed
 * with it. */
weftResult_t device_det_launch(struct weftComm *comm, const struct weft_plan *plan,
                               cudaStream_t stream, int captured, device_p2p_fn p2p);

/* The kernel table's op for a weftRedOp_t (device_refuse.c). */
int device_op_index(weftRedOp_t op);

static inline weftResult_t device_cuda_check(cudaError_t err, const char *what) {
  if (err == cudaSuccess) return weftSuccess;
  cudaGetLastError();
  return weft_error_set(weftSystemError, "cuda: %s: %s", what, cudaGetErrorString(err));
}
#define CUDA_TRY(call, what) WEFT_TRY(device_cuda_check((call), (what)))

/* Whether this thread has a CUDA context (device_driver.c): without one, no
 * buffer it holds can be device memory it allocated, and asking would
 * create a context. */
int device_ctx_current(void);
/* CUDA device dev's PCI address as topo.h's bus_id (function 0); -1 when
 * CUDA cannot say. */
int64_t device_bus_id(int dev);
/* The thread's current CUDA context, saved before a call that sets the
 * device and put back after: as it was, none included (cudaSetDevice back
 * to the device cudaGetDevice said would make device 0's context on a
 * thread that had none). */
struct device_ctx_saved {
  void *ctx; /* CUcontext; NULL: none */
  int dev;   /* its device, for a driver without cuCtxSetCurrent */
};
void device_ctx_save(struct device_ctx_saved *s);
void device_ctx_restore(const struct device_ctx_saved *s);
/* This thread's current context as a number no other context of the
 * process gets (cuCtxGetId, plus one); 0 without a context, or where the
 * driver has no ids. */
uint64_t device_ctx_key(void);
/* device_ctx_key and device_ctx_current in one look at the thread's
 * context: the key, and *current_out whether there is a context. */
uint64_t device_ctx_key_current(int *current_out);
/* The allocation ptr lies in, as the driver has it: 1 and its first byte
 * and size, or 0 where the driver cannot say. */
int device_mem_range(const void *ptr, uintptr_t *base_out, size_t *nbytes_out);

/* Launches kernel fn (its host stub) of grid x block on stream through the
 * driver's entry, with programmatic stream serialization allowed when pdl
 * is set; *handle caches the kernel's handle (zero before the first launch,
 * a static of the caller's per kernel). NULL, or what went wrong (nothing
 * is left in the runtime's last error). */
const char *device_kernel_launch(const void *fn, cudaKernel_t *handle, dim3 grid, dim3 block,
                                 void **args, cudaStream_t stream, int pdl);

/* Loads kernel fn (its host stub) into the current context now. Under the
 * runtime's lazy loading (CUDA_MODULE_LOADING=LAZY, the default since CUDA
 * 12.2) a kernel's first launch loads it, and loading waits for the
 * context's running kernels: ranks that share a process (and a context)
 * would wait forever where one rank's second kernel of a call loads behind
 * its first, which waits for a peer not launched yet. A failure is left to
 * the launch to report. */
void device_kernel_load(const void *fn);

/* Loads every kernel a comm's calls launch: the ring and tree matrix
 * (device_ring_kernels_load, device_cuda.c), the gate, the send/recv kernel
 * and WEFT_DETERMINISTIC's reduction (device_launch.c), into the device's
 * primary context, where a comm's calls launch; a comm's first connect
 * (comm_connect) calls it, with the comm's device current. Not the ZeRO layer's
 * kernels: they launch between collectives, never between two kernels of
 * one call; loading one waits for every kernel of the process, which ends
 * as long as each rank sharing the process has a thread of its own (as
 * every caller of the ZeRO layer does). */
void device_kernels_load(void);
/* The ring and tree kernels of the build's matrix, each loaded. */
void device_ring_kernels_load(void);
void device_sendrecv_load(void); /* device_sendrecv.c */
void device_det_load(void);      /* device_det.c */

/* Whether stream is surely not being captured into a graph (a failed
 * question counts as captured, and is cleared). */
static inline int device_stream_uncaptured(cudaStream_t stream) {
  enum cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &cap) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return cap == cudaStreamCaptureStatusNone;
}

/* A device connection's shape before set-up. */
static inline void device_conn_shape(struct weft_conn *c, struct weftComm *comm, int peer,
                                     int proto) {
  memset(c, 0, sizeof *c);
  c->nslots = DEV_NSLOTS;
  c->slot_nbytes = proto == DEV_PROTO_LL ? DEV_LL_SLOT_NBYTES : DEV_SIMPLE_SLOT_NBYTES;
  c->peer_rank = peer;
  c->peer_pid = comm->peers[peer].pid;
}

/* A connected device connection as the kernels see it (step 0). */
static inline struct dev_fifo device_fifo_of(const struct weft_conn *c) {
  struct dev_fifo f = {.ctrl = cuda_fifo_ctrl(c), .slots = c->slots, .nslots = c->nslots,
                       .slot_nbytes = (uint32_t)c->slot_nbytes, .step = 0};
  return f;
}

/* One device connection (device_hops.c). The receiver picks the hop's
 * transport (transport_select: peer_access, cuda_ipc, host_fifo, or the network to
 * another host), sets up its FIFO and describes it in b; the sender
 * attaches to what b describes; the receiver then completes it once every
 * sender has attached. None blocks. */
weftResult_t device_hop_recv_setup(struct weftComm *comm, int dev, struct weft_conn *c,
                                   int from, int proto, struct conn_blob *b);
weftResult_t device_hop_send_connect(struct weftComm *comm, struct weft_conn *c, int to,
                                     int proto, const struct conn_blob *b);
weftResult_t device_hop_recv_connect(struct weft_conn *c);
/* The kernels' view of a connected hop (step 0), whatever its transport;
 * weftInternalError for a hop that is not set up (a kernel handed a NULL
 * FIFO would fault). */
weftResult_t device_hop_fifo(const struct weft_conn *c, struct dev_fifo *fifo_out);
/* Whether the comm's ranks are on more than one host: its rings then cross
 * a network, which carries SIMPLE slots only (every rank decides alike). */
int device_comm_crosses_hosts(const struct weftComm *comm);

/* The protocols whose FIFOs the comm's ring connects: a ring that crosses
 * hosts runs SIMPLE only (a network proxy cannot see an LL slot complete),
 * so it connects no LL FIFOs (network connections and pinned memory that
 * nothing would use); theirs stay zero, which the kernels take as absent. */
static inline int device_ring_nprotos(const struct device_comm *d) {
  return d->crosses_hosts ? DEV_PROTO_SIMPLE + 1 : DEV_NPROTOS;
}
/* Before a launch on a comm that crosses hosts: the proxies of its network
 * connections poll without sleeping a while (net_dev_conn_kick), since the
 * kernels fill slots without telling the host. */
void device_net_kick(const struct weftComm *comm, const struct device_comm *d);
/* After a ring kernel of plan launched on nch channels (outside graph
 * capture, on a comm that crosses hosts): tells the proxy of each network
 * hop how many slots the kernel will fill (send) or drain (receive)
 * (net_dev_conn_expect), so that it polls until they are, however late the
 * kernel starts. */
void device_net_expect_ring(const struct weftComm *comm, const struct device_comm *d,
                            const struct weft_plan *plan, int nch);

/* The tree all-reduce's channels: at most this many (each holds a FIFO pair
 * per protocol with every neighbour in either tree: about 1 MiB a
 * neighbour, a few neighbours a rank). */
#define DEV_TREE_MAX_CHANNELS 8
/* Whether plan runs as the tree all-reduce on device memory: the tuner
 * chose the tree, on one host (the trees' device links are memory hops; a
 * comm across hosts runs the ring). */
static inline int device_plan_tree(const struct weftComm *comm, const struct device_comm *d,
                                   const struct weft_plan *plan) {
  return plan->coll == COLL_ALLREDUCE && plan->algo == ALGO_TREE && comm->nranks > 1 &&
         plan->count > 0 && !d->crosses_hosts;
}
/* The comm's tree channels, connected (collective over the comm's ranks, on
 * first use; the ring channels first, whose count they follow). */
weftResult_t device_tree_get(struct weftComm *comm, struct device_comm *d);
/* Closes the tree channels and frees them (after the comm's kernels are done). */
void device_tree_close(struct device_comm *d);

/* Point-to-point (device_sendrecv.c): connects the peers that plans[0..nops)
 * name and are not yet connected (pairwise, with those peers only). */
weftResult_t device_sendrecv_connect(struct weftComm *comm, struct device_comm *d,
                                     const struct weft_plan *const *plans, size_t nops);
/* Enqueues the sends and receives among plans[0..nops) as one kernel on
 * stream (the copies to self before it). Connected beforehand. captured: a
 * graph captures stream (device_done_fill). announce:
 * the launch runs as it is (not captured) on a comm that crosses hosts: the
 * proxies of its network lanes learn how many slots it fills or drains
 * (net_dev_conn_expect). */
weftResult_t device_sendrecv_launch(struct weftComm *comm, struct device_comm *d,
                                    const struct weft_plan *const *plans, size_t nops,
                                    cudaStream_t stream, int captured, int announce);
/* Closes the lanes and frees them (after the comm's kernels are done). */
void device_sendrecv_free(struct device_sendrecv *p, int nranks);

#endif
