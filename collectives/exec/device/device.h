/* The device executor: collectives on CUDA device memory, as kernels enqueued
 * on the caller's CUDA stream (collectives/exec/device/device_cuda.c). A build without
 * nvcc gets device_none.c instead, whose calls say "built without CUDA". */
#ifndef WEFT_DEVICE_H
#define WEFT_DEVICE_H

#include <stdint.h>

#include "../../core/plan.h"

/* Whether this build has the device executor. */
int device_built(void);

/* Whether the buffers of plan this rank touches (uses_send, uses_recv) are
 * CUDA device memory, so that the device executor runs it (and stream is a
 * cudaStream_t): 1, also with pinned or managed memory beside device
 * memory; host memory, or no CUDA context on this thread, or managed
 * memory beside pageable memory: 0; device-only memory beside pageable
 * memory, which neither executor reaches: -1. Does not block. */
int device_plan_on_device(const struct weft_plan *plan, int uses_send, int uses_recv);

/* Checks a CUDA device ordinal (CommInitAll's devlist); weftInvalidUsage when
 * it names no device or the build has no CUDA. */
weftResult_t device_check_ordinal(int dev);

/* The device executor's refusal of plan: weftInvalidUsage with a message
 * when WEFT_ALGO excludes the ring or the build's matrix lacks the
 * (datatype, op), else weftSuccess. Decided without any CUDA call. */
weftResult_t device_plan_refusal(const struct weft_plan *plan);

/* A comm's device channels: WEFT_DEVICE_NCHANNELS (want) within
 * weftConfig_t's minChannels/maxChannels (ncclConfig_t's minCTAs/maxCTAs;
 * WEFT_CONFIG_UNDEF_INT: unbounded), at most DEV_MAX_CHANNELS, and at most
 * cap, the blocks sure to be resident at once (which wins over minChannels). */
int device_nchannels(int want, int cfg_min, int cfg_max, int cap);
#define DEV_MAX_CHANNELS 64
/* Without WEFT_DEVICE_NCHANNELS: at most one block per SM of the GPU (above). */
#define DEV_DEFAULT_CHANNELS 32

/* What ranks tell each other of their GPU at connection. A GPU is known by
 * its UUID: the device number is per process (CUDA_VISIBLE_DEVICES), so two
 * ranks' device 0 may be different GPUs, and one GPU may have two numbers. */
struct device_gpu_ident {
  uint8_t uuid[16];
  int32_t dev; /* this process's number for it */
  int32_t sms;
  int32_t blocks_per_sm; /* ring kernel blocks one SM holds at once: 1 unless the rank
                            set its channel count itself (then the kernels' occupancy) */
  int32_t want_channels; /* device_nchannels of its own settings, without the cap */
  int32_t want_interleave; /* its WEFT_DEVICE_RING_INTERLEAVE, -1 when out of range */
  int64_t bus_id;          /* its PCI address as topo.h's bus_id (-1: unknown): a
                              peer in another process whose GPU has none yet learns
                              whether the two GPUs reach each other (device_hops.c) */
};
/* How many of the n ranks share the GPU that most of them share (1 or more). */
int device_busiest_gpu(const struct device_gpu_ident *ids, int n);
/* A ring's blocks wait on each other, so every rank's blocks must be on
 * their GPU at once: the channels each rank may have, the blocks the
 * fewest-holding GPU holds at once (its SMs times blocks_per_sm) over the
 * ranks sharing the busiest GPU, at least 1. By default a rank counts one
 * block per SM (what any kernel that launches is sure of, leaving the rest
 * of each SM to the compute the collectives overlap with); a rank that sets
 * its channel count counts as many as its ring kernels' occupancy allows. */
int device_channel_cap(const struct device_gpu_ident *ids, int n);
/* The channels every rank of the comm uses: the fewest any rank wants (ranks
 * whose WEFT_DEVICE_NCHANNELS or config bounds differ still agree, since a
 * ring needs the same channels and shares on every rank), at most cap. */
int device_nchannels_agreed(const struct device_gpu_ident *ids, int n, int cap);
/* The loops a ring channel runs together (struct ring_iter): the fewest any
 * rank wants, since the order fixes which slot of a FIFO carries what, and
 * at most ring_interleave_max of the device FIFOs' slots; 1 when a rank
 * wants none. */
int device_interleave_agreed(const struct device_gpu_ident *ids, int n);

/* Enqueues plan's kernel on the CUDA stream and returns (NCCL's stream
 * semantics): the result is there once the stream reaches that point. The
 * first call on a comm connects its device channels (collective over the
 * ranks; outside graph capture, or with capture relaxed meanwhile). Only
 * stream-ordered CUDA calls follow, so graph capture records the launch.
 * Does not block on the device. */
weftResult_t device_enqueue(struct weftComm *comm, const struct weft_plan *plan, void *stream);

/* Enqueues a group's device operations, in call order, each on its stream. */
weftResult_t device_enqueue_group(struct weftComm *const *comms,
                                  const struct weft_plan *const *plans, void *const *streams,
                                  size_t nops);

/* Kernels' abort: makes running and later kernels of comm give up. */
void device_comm_abort(struct weftComm *comm);
/* A failure the kernels recorded (abort, timeout): weftSuccess or an error. */
weftResult_t device_comm_error(struct weftComm *comm);
/* device_comm_error, and, while there is none, the watch of kernels that
 * end nothing (device_watch.c): weftCommGetAsyncError's question. */
weftResult_t device_comm_watch(struct weftComm *comm);
/* Releases comm's device channels (after its streams are done with them). */
void device_comm_free(struct weftComm *comm);
/* The loops a channel of comm's device rings runs together, as its ranks
 * agreed when its device channels connected; 0 before (or without CUDA). */
int device_comm_interleave(const struct weftComm *comm);
/* The ring launches of comm that went out with programmatic dependent
 * launch (WEFT_DEVICE_PDL); 0 without CUDA. */
uint64_t device_comm_pdl_launches(const struct weftComm *comm);

/* weftMemAlloc/Free: device memory when a CUDA context is current on this
 * thread (on_device_out says which); host memory otherwise. */
weftResult_t device_mem_alloc(void **ptr, size_t nbytes, int *on_device_out);
/* Frees ptr, device memory from device_mem_alloc (the caller knows it is:
 * it lists them); 1, or 0 with the device's reason set where the free failed. */
int device_mem_free(void *ptr);
/* Whether ptr is CUDA device memory. */
int device_ptr_on_device(const void *ptr);
/* Whether ptr is device memory proper (cudaMalloc), which the host cannot
 * read; managed and host memory are not. 0 without CUDA. */
int device_ptr_device_only(const void *ptr);

/* The calling thread's current CUDA device where it has a CUDA context,
 * else -1 (asking makes no context). -1 without CUDA. */
int device_current(void);
/* CUDA devices this process sees; 0 without CUDA or a driver. */
int device_count(void);
/* Makes the primary context of the thread's current device current where
 * there is a device (what NCCL's calls that use "the current device" do
 * first); nothing without one. */
void device_ctx_make(void);

#endif
