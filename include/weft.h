/*
 * weft: collective communication for host and device memory.
 *
 * The API follows NCCL's shapes with the weft prefix: a communicator is created
 * collectively from a unique id (or from a launcher's environment), then every
 * rank calls the same collectives in the same order.
 *
 * Buffers: host pointers run on the host executor. A NULL stream means the call
 * completes before it returns.
 *
 * Errors: every call returns a weftResult_t; weftGetLastError() returns the text
 * of the last failure (per communicator, or per thread when no communicator is
 * known). Invalid arguments never crash: they return weftInvalidArgument or
 * weftInvalidUsage and leave buffers untouched. A refusal that the peers
 * cannot share (this rank's own buffers: NULL with a count, overlapping
 * without being in place) also breaks the communicator, so that the peers,
 * which would wait for this rank in the collective, fail at once naming it;
 * one of the arguments every rank passes alike (count, datatype, op, root)
 * leaves the communicator usable.
 */
#ifndef WEFT_H
#define WEFT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#define WEFT_MAJOR 0
#define WEFT_MINOR 1
#define WEFT_PATCH 0
/* Version code as weftGetVersion reports it: major*10000 + minor*100 + patch. */
#define WEFT_VERSION_CODE (WEFT_MAJOR * 10000 + WEFT_MINOR * 100 + WEFT_PATCH)

/* Status codes; the values are NCCL's, so that the NCCL-compatible library
 * passes them through unchanged. */
typedef enum {
  weftSuccess = 0,
  weftUnhandledCudaError = 1, /* a CUDA call failed */
  weftSystemError = 2,        /* a system call failed (memory, sockets, shm) */
  weftInternalError = 3,      /* a bug in weft */
  weftInvalidArgument = 4,    /* a bad pointer, count, datatype, op or rank */
  weftInvalidUsage = 5,       /* a call out of order, or ranks that disagree */
  weftRemoteError = 6,        /* a peer died, closed its connection or timed out */
  weftInProgress = 7,         /* a non-blocking operation is not finished yet */
  weftNumResults = 8
} weftResult_t;

typedef enum {
  weftInt8 = 0, weftChar = 0,
  weftUint8 = 1,
  weftInt32 = 2, weftInt = 2,
  weftUint32 = 3,
  weftInt64 = 4,
  weftUint64 = 5,
  weftFloat16 = 6, weftHalf = 6,
  weftFloat32 = 7, weftFloat = 7,
  weftFloat64 = 8, weftDouble = 8,
  weftBfloat16 = 9,
  weftFloat8e4m3 = 10, /* OCP FP8 E4M3: no infinities, saturates at +-448 */
  weftFloat8e5m2 = 11, /* OCP FP8 E5M2: saturates at +-57344 */
  weftNumTypes = 12
} weftDataType_t;

/* Reductions. Low-precision types (fp16, bf16, fp8) are combined in float and
 * rounded to nearest-even after each step. weftAvg sums, then divides by the
 * number of ranks (integer types: truncating division of the wrapped sum).
 * Ops made by weftRedOpCreatePreMulSum take values from weftNumOps up:
 * weftMaxRedOp makes every such value one the type can hold (in C++ too). */
typedef enum {
  weftSum = 0,
  weftProd = 1,
  weftMax = 2,
  weftMin = 3,
  weftAvg = 4,
  weftNumOps = 5,
  weftMaxRedOp = 0x7fffffff
} weftRedOp_t;

/* Where the scalar of a pre-multiply op lives: read when each operation runs
 * (weftScalarDevice: the pointer must stay valid), or copied at creation. */
typedef enum { weftScalarDevice = 0, weftScalarHostImmediate = 1 } weftScalarResidence_t;

/* Opaque 128-byte rendezvous handle: the root's address and a random secret.
 * Ranks holding a different id (or the right address but a wrong secret) are
 * refused by the root. Treat it as a credential. */
#define WEFT_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[WEFT_UNIQUE_ID_BYTES];
} weftUniqueId;

typedef struct weftComm *weftComm_t;

/* A stream: NULL runs the operation synchronously on the calling thread; a
 * host stream from weftStreamCreate queues it (see "Host streams" below). */
typedef void *weftStream_t;

/* Configuration for weftCommInitRankConfig. Always initialise with
 * WEFT_CONFIG_INITIALIZER, then set fields: size/magic/version let later
 * versions of weft add fields without breaking binaries built against this one.
 * A field left at WEFT_CONFIG_UNDEF_INT takes its default (or its WEFT_* env).
 * A field out of its range below makes the call that takes the config (init,
 * split, shrink) return weftInvalidArgument, its text naming the field and
 * the range. */
#define WEFT_CONFIG_UNDEF_INT ((int)0x80000000)
#define WEFT_CONFIG_MAGIC 0x77656674u /* "weft" */
typedef struct {
  size_t size;           /* sizeof(weftConfig_t) as the caller compiled it */
  unsigned int magic;    /* WEFT_CONFIG_MAGIC */
  unsigned int version;  /* WEFT_VERSION_CODE the caller compiled against */
  int blocking;          /* 0, or 1 (the default): with 0, weftCommInitRankConfig and
                            weftCommInitFromEnv return weftInProgress with the comm,
                            which joins and connects on a thread of its own (FromEnv
                            once the launcher's rendezvous is known: under torchrun's
                            store, ranks other than 0 first wait for rank 0's id);
                            weftCommGetAsyncError writes weftInProgress until it is
                            ready, then weftSuccess or the creation's error (the comm
                            is still to be destroyed or aborted). Other calls refuse
                            it until then; destroy waits for it, abort does not. weft's inits run at the call
                            in a group too (the NCCL drop-in's group records them and
                            creates them at its end). Split and shrink block either
                            way */
  int minChannels;       /* lower bound on channels, 1 or more; a value above what an
                            executor has is lowered to it (host rings: 16; device
                            channels, a kernel block each: 64) */
  int maxChannels;       /* upper bound on channels (host rings and device channels),
                            1 or more, and at least minChannels; lowered as minChannels */
  int timeoutMs;         /* per-wait timeout, 1 or more; default WEFT_TIMEOUT (seconds) */
  const char *commName;  /* name shown in logs and errors; may be NULL */
} weftConfig_t;

#define WEFT_CONFIG_INITIALIZER                                                  \
  {                                                                              \
    sizeof(weftConfig_t), WEFT_CONFIG_MAGIC, WEFT_VERSION_CODE,                  \
        WEFT_CONFIG_UNDEF_INT, WEFT_CONFIG_UNDEF_INT, WEFT_CONFIG_UNDEF_INT,     \
        WEFT_CONFIG_UNDEF_INT, NULL                                              \
  }

/* --- Versions and errors ------------------------------------------------ */

/* Writes WEFT_VERSION_CODE of the loaded library. */
weftResult_t weftGetVersion(int *version);

/* A static, human-readable name for a status code. Never NULL. */
const char *weftGetErrorString(weftResult_t result);

/* The message of the last failure on comm, or of the calling thread's last
 * failure when comm is NULL (for example a failed init). Never NULL; "" when
 * there was none. The text is the calling thread's copy: any thread may ask
 * while another fails a call on comm, and it stays valid until this
 * thread's next weft call. */
const char *weftGetLastError(weftComm_t comm);

/* --- Communicators ------------------------------------------------------ */

/* Creates a unique id and starts a rendezvous service for it in a background
 * thread of the calling process, which must stay alive until every rank has
 * joined. Call on one process and send the id to the others. Does not block. */
weftResult_t weftGetUniqueId(weftUniqueId *uniqueId);

/* weft extension, for launchers that serve the rendezvous themselves
 * (weftGetUniqueId in the launcher's process, as weftrun): process pid of
 * this host is to join as rank. Should it end before it joins (an exit of
 * any status, a signal), the ranks waiting in the rendezvous fail at once
 * with weftRemoteError naming it, instead of at their timeout; once it has
 * joined, its end is the communicator's business. weftInvalidArgument where
 * this process serves no rendezvous of uniqueId (or it has ended). */
weftResult_t weftUniqueIdWatchRank(const weftUniqueId *uniqueId, int rank, int pid);

/* Joins rank `rank` of `nranks` to the communicator named by commId. Blocks
 * until all ranks have joined and connections are set up, or until the
 * timeout (WEFT_TIMEOUT), which is an error. */
weftResult_t weftCommInitRank(weftComm_t *comm, int nranks, weftUniqueId commId, int rank);

/* As weftCommInitRank, with a configuration (may be NULL for defaults); with
 * config->blocking = 0 it returns weftInProgress at once instead of blocking
 * (weftConfig_t.blocking). */
weftResult_t weftCommInitRankConfig(weftComm_t *comm, int nranks, weftUniqueId commId,
                                    int rank, weftConfig_t *config);

/* Creates ndev communicators of one clique in the calling process, one rank
 * per entry (rank i gets devlist[i], or -1 for host-only ranks when devlist is
 * NULL). Collectives on them must be issued inside weftGroupStart/End. */
weftResult_t weftCommInitAll(weftComm_t *comms, int ndev, const int *devlist);

/* weft extension: joins the job described by the launcher's environment, tried
 * in this order:
 *   weft (weftrun):  WEFT_RANK, WEFT_NRANKS, WEFT_UNIQUE_ID (hex) or WEFT_COMM_ID
 *   torchrun:        RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
 *   Open MPI:        OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, plus an address
 *   Slurm:           SLURM_PROCID, SLURM_NTASKS, plus an address
 * The address for the last two is WEFT_COMM_ID=host:port, else MASTER_ADDR and
 * MASTER_PORT. With an address, rank 0 serves the rendezvous on it. The secret
 * is WEFT_SECRET when set; without it, any process that knows the address and
 * the world size may join. With none of these variables, creates a 1-rank
 * communicator. config may be NULL. */
weftResult_t weftCommInitFromEnv(weftComm_t *comm, weftConfig_t *config);

/* The color of a rank that joins no communicator in weftCommSplit. */
#define WEFT_SPLIT_NOCOLOR (-1)

/* Collective over comm: every rank must call it. Ranks passing the same color
 * (>= 0) form a new communicator, ranked by key, then by their rank in comm;
 * it is written to *newcomm. A rank passing WEFT_SPLIT_NOCOLOR takes part but
 * gets *newcomm = NULL. config may be NULL: the new communicator then takes
 * comm's channels, timeout and name. Blocks until every new communicator is
 * connected, or the timeout (WEFT_TIMEOUT). The new communicator is
 * independent of comm: either may be destroyed first. A weftCommAbort of comm
 * waits for a split in progress to return. */
weftResult_t weftCommSplit(weftComm_t comm, int color, int key, weftComm_t *newcomm,
                           weftConfig_t *config);

/* Waits for outstanding operations on comm (queued on host streams) to
 * finish, and returns the comm's asynchronous error. After it, only
 * weftCommDestroy may be called. */
weftResult_t weftCommFinalize(weftComm_t comm);

/* Frees comm's resources. Call after weftCommFinalize (if not called, destroy
 * does it first). Not collective: does not wait for peers. On a comm still
 * being created (config blocking = 0) it first waits for the creation to end. */
weftResult_t weftCommDestroy(weftComm_t comm);

/* Aborts comm: any thread waiting in one of comm's operations returns
 * weftRemoteError promptly, peers waiting on this rank see an error, and the
 * comm's resources are freed. Safe to call from any thread while another is
 * blocked in comm. On a comm still being created (config blocking = 0) it
 * returns at once and the handle is dead: the creation runs to its end on
 * its own thread, then aborts and frees what it made (peers that joined it
 * see an error). */
weftResult_t weftCommAbort(weftComm_t comm);

/* Revokes comm (revokeFlags must be 0): any thread waiting in one of comm's
 * operations returns an error promptly, peers waiting on this rank see an
 * error (and revoke in turn), and every later operation on comm is refused
 * with weftInvalidUsage. Unlike weftCommAbort, comm stays valid: it can be
 * split, shrunk, destroyed or aborted. Returns once no thread is in one of
 * comm's operations. Safe to call from any thread while another is blocked
 * in comm, so a caller may revoke, wait for its own threads to leave, then
 * free comm. A second revoke (from another thread too) returns once the
 * first is done; weftCommDestroy and weftCommAbort called while a revoke
 * runs on another thread wait for it. */
weftResult_t weftCommRevoke(weftComm_t comm, int revokeFlags);

/* Writes the comm's asynchronous error: weftSuccess, or the error that broke
 * it (a dead peer, a timeout, an abort); for a comm created with config
 * blocking = 0, weftInProgress until it is connected, then weftSuccess or the
 * creation's error. Returns weftSuccess where comm is one. */
weftResult_t weftCommGetAsyncError(weftComm_t comm, weftResult_t *asyncError);

/* Called by the ranks of comm that remain (not by the nexclude ranks in
 * excludeRanks, which may be dead): makes a communicator of them, ranked in
 * their order in comm, written to *newcomm. Waits on no excluded rank and
 * uses none of comm's connections, so it works on a comm broken by a failed
 * peer. config may be NULL: the new communicator then takes comm's channels,
 * timeout and name. Blocks until connected, or the timeout. */
weftResult_t weftCommShrink(weftComm_t comm, const int *excludeRanks, int nexclude,
                            weftComm_t *newcomm, weftConfig_t *config);

/* weft extension: sets comm's per-wait timeout (as weftConfig_t's timeoutMs,
 * > 0) for the waits that begin after the call; a wait already under way
 * keeps the one it began with. Safe to call from any thread. */
weftResult_t weftCommSetTimeout(weftComm_t comm, int timeoutMs);

weftResult_t weftCommCount(const weftComm_t comm, int *count);
weftResult_t weftCommUserRank(const weftComm_t comm, int *rank);
/* The CUDA device of comm, or -1 for a communicator of host ranks. */
weftResult_t weftCommCuDevice(const weftComm_t comm, int *device);

/* --- Groups ------------------------------------------------------------- */

/* Between weftGroupStart and weftGroupEnd, calls only record their operation;
 * weftGroupEnd runs them all, concurrently across communicators (required
 * when one thread drives several ranks, as after weftCommInitAll), in call
 * order within one communicator. Groups nest; the outermost End runs them. */
weftResult_t weftGroupStart(void);
weftResult_t weftGroupEnd(void);
/* Ends the group like weftGroupEnd but runs nothing: the recorded operations
 * are dropped, and *estimatedUs (may be NULL) gets the tuner's estimate of
 * how long they would have taken, in microseconds. Inside an outer group it
 * closes one level, as a nested weftGroupEnd (and NCCL's nested
 * ncclGroupSimulateEnd): *estimatedUs gets the estimate of the operations
 * recorded so far, which are not dropped: the outermost end runs them. A
 * call that failed while recording is returned instead, with no estimate. */
weftResult_t weftGroupSimulateEnd(float *estimatedUs);

/* --- Collectives -------------------------------------------------------- */

/* recvbuff[i] = op over ranks of sendbuff[i], on every rank. count is in
 * elements. sendbuff == recvbuff is in-place. */
weftResult_t weftAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                           weftDataType_t datatype, weftRedOp_t op, weftComm_t comm,
                           weftStream_t stream);

/* recvbuff[r*sendcount + i] = sendbuff of rank r [i]: recvbuff holds nranks *
 * sendcount elements. In place when sendbuff == recvbuff + rank*sendcount. */
weftResult_t weftAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                           weftDataType_t datatype, weftComm_t comm, weftStream_t stream);

/* recvbuff[i] = op over ranks r of (sendbuff of r)[rank*recvcount + i]: sendbuff
 * holds nranks * recvcount elements. In place when recvbuff == sendbuff +
 * rank*recvcount. */
weftResult_t weftReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                               weftDataType_t datatype, weftRedOp_t op, weftComm_t comm,
                               weftStream_t stream);

/* Copies root's sendbuff into every rank's recvbuff. sendbuff is read on the
 * root only (others may pass NULL). */
weftResult_t weftBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                           weftDataType_t datatype, int root, weftComm_t comm,
                           weftStream_t stream);

/* In-place broadcast of buff (the older NCCL form). */
weftResult_t weftBcast(void *buff, size_t count, weftDataType_t datatype, int root,
                       weftComm_t comm, weftStream_t stream);

/* recvbuff on root = op over ranks of sendbuff. recvbuff is written on the
 * root only (others may pass NULL). */
weftResult_t weftReduce(const void *sendbuff, void *recvbuff, size_t count,
                        weftDataType_t datatype, weftRedOp_t op, int root, weftComm_t comm,
                        weftStream_t stream);

/* Makes a reduction op for comm: each rank's input times *scalar (of
 * datatype, in that type's arithmetic), then summed. Use it with datatype
 * only; destroy it with weftRedOpDestroy, which may come as soon as the last
 * call given the op returns (inside a group too: each call keeps the scalar
 * it was given, or with weftScalarDevice the pointer, read when it runs).
 * Ops are values >= weftNumOps. */
weftResult_t weftRedOpCreatePreMulSum(weftRedOp_t *op, void *scalar, weftDataType_t datatype,
                                      weftScalarResidence_t residence, weftComm_t comm);
weftResult_t weftRedOpDestroy(weftRedOp_t op, weftComm_t comm);

/* --- Point-to-point ------------------------------------------------------ */

/* Sends count elements to peer, which must call weftRecv with the same count
 * and datatype. Inside a group, every send and receive of the group advances
 * together, so any order of calls completes; messages between two ranks keep
 * their order. Outside a group a send returns once its data is queued (it may
 * wait for the receiver when the data exceeds the connection's buffer). A
 * rank may send to itself inside a group (a copy). A send or receive of no
 * elements does nothing: on any stream (a CUDA stream too, in a CUDA build),
 * with any buffer, NULL included; elements with a NULL buffer are
 * weftInvalidArgument. */
weftResult_t weftSend(const void *sendbuff, size_t count, weftDataType_t datatype, int peer,
                      weftComm_t comm, weftStream_t stream);
/* Receives count elements from peer. A message of another size is an error
 * (weftInvalidUsage) that leaves the communicator broken. */
weftResult_t weftRecv(void *recvbuff, size_t count, weftDataType_t datatype, int peer,
                      weftComm_t comm, weftStream_t stream);

/* Block p of sendbuff (count elements) goes to rank p; block p of recvbuff
 * comes from rank p. A group of sends and receives; not in place. */
weftResult_t weftAlltoAll(const void *sendbuff, void *recvbuff, size_t count,
                          weftDataType_t datatype, weftComm_t comm, weftStream_t stream);
/* Root receives every rank's sendbuff (count elements) into block r of recvbuff.
 * In place when, on the root, sendbuff == recvbuff + root*count; the root's
 * buffers may not overlap otherwise (weftInvalidArgument). */
weftResult_t weftGather(const void *sendbuff, void *recvbuff, size_t count,
                        weftDataType_t datatype, int root, weftComm_t comm, weftStream_t stream);
/* Rank r receives block r of root's sendbuff (count elements) into recvbuff.
 * In place when, on the root, recvbuff == sendbuff + root*count; the root's
 * buffers may not overlap otherwise (weftInvalidArgument). */
weftResult_t weftScatter(const void *sendbuff, void *recvbuff, size_t count,
                         weftDataType_t datatype, int root, weftComm_t comm, weftStream_t stream);

/* --- Host streams (a weft extension) ------------------------------------- */

/* A host stream runs the operations queued on it in order, on a thread of its
 * own: a collective called with a host stream checks its arguments, queues
 * itself and returns at once, so the caller computes while it runs. Buffers
 * must stay valid and untouched until the stream is synchronized. A group
 * whose operations name a stream runs as one item of that stream; one
 * communicator's operations in a group must all name the same stream. Use one
 * stream per communicator when one thread drives several ranks.
 * Sends and receives of one communicator queued back to back (with event
 * records between them) advance together, as a group's do: a send queued
 * while an earlier receive waits for its peer starts at once, and no order
 * of them deadlocks; an event recorded among them is reached once everything
 * queued before it is done. A collective or an event wait ends such a run,
 * and so does a send or receive whose buffer an earlier one not yet done
 * writes (or, for a receive, reads): it starts once those are done, so a
 * receive then a send of what it received keep the stream's order. */
weftResult_t weftStreamCreate(weftStream_t *stream);
/* Blocks until everything queued on stream has run. Returns the first error
 * of those operations since the last synchronize (its text in
 * weftGetLastError(NULL)), or weftSuccess. */
weftResult_t weftStreamSynchronize(weftStream_t stream);
/* Does not block: weftInProgress while work is queued or running, else as
 * weftStreamSynchronize. */
weftResult_t weftStreamQuery(weftStream_t stream);
/* Waits for the queued work, then frees the stream. */
weftResult_t weftStreamDestroy(weftStream_t stream);

/* --- Host events (a weft extension) -------------------------------------- */

/* An event marks a point in a stream's queue. weftEventRecord queues the
 * mark (on the NULL stream it is complete at once); weftEventSynchronize blocks
 * the caller, and weftStreamWaitEvent blocks a stream, until the stream has
 * run everything queued before the last record. An event never recorded is
 * complete. Record, query and synchronize do not block except as said. */
typedef void *weftEvent_t;
weftResult_t weftEventCreate(weftEvent_t *event);
weftResult_t weftEventRecord(weftEvent_t event, weftStream_t stream);
/* Blocks until the last record is reached. */
weftResult_t weftEventSynchronize(weftEvent_t event);
/* Blocks as weftEventSynchronize, for an event last recorded on the host
 * stream `stream`; while the stream's thread is not running an item, the
 * item at its head is sends and receives and the record is the last thing
 * queued, the calling thread runs them (and what is queued meanwhile, until
 * the record is reached) itself, as the stream's thread would have: a send
 * or receive queued and then waited for needs no thread switch. What was
 * queued behind the record is left to the stream's thread: the call returns
 * once the record is reached, though a receive queued after it waits for
 * what the caller does next. */
weftResult_t weftEventSynchronizeOnStream(weftEvent_t event, weftStream_t stream);
/* Does not block: weftInProgress until the last record is reached. */
weftResult_t weftEventQuery(weftEvent_t event);
/* Work queued on stream after this call starts once event's last record (as
 * of this call) is reached, whatever records follow it, on any stream.
 * Does not block, except on the NULL stream. */
weftResult_t weftStreamWaitEvent(weftStream_t stream, weftEvent_t event);
/* Waits for a pending last record to be reached, then frees the event; waits
 * queued on streams for an earlier record keep what they need, and still
 * pass once that record is reached. */
weftResult_t weftEventDestroy(weftEvent_t event);

/* --- Memory and registration -------------------------------------------- */

/* Allocates nbytes that collectives can move with fewer copies: device memory
 * (IPC-exportable) on the current CUDA device when weft is built with CUDA and
 * a device is present, else host memory as from weftMemAllocHost. Free with
 * weftMemFree. 0 bytes: *ptr is NULL (as cudaMalloc's and NCCL's). */
weftResult_t weftMemAlloc(void **ptr, size_t nbytes);
/* weft extension: always host memory, page aligned (2 MiB aligned from
 * 2 MiB). From 64 KiB it is shared memory that peers on the same host map
 * (once per communicator) and copy to and from directly in single-copy
 * all-reduce, all-gather and reduce-scatter; other buffers there go through
 * the kernel's cross-memory attach. Allocate such buffers once and reuse
 * them, as registered memory: a new one costs each peer an open and a
 * mapping on first use. A child forked afterwards gets the buffer as it gets
 * malloc's memory: what it writes stays its own (the buffer is mapped again,
 * copy-on-write, in the child, which no longer offers it to peers; until it
 * writes a page it may still see the parent's later writes to that page).
 * The child frees it with weftMemFree as usual. Each shareable buffer keeps a
 * file descriptor open; they take at most half of RLIMIT_NOFILE, and past
 * that weftMemAllocHost returns private memory. */
weftResult_t weftMemAllocHost(void **ptr, size_t nbytes);
/* Frees memory from weftMemAlloc or weftMemAllocHost; NULL is a no-op. */
weftResult_t weftMemFree(void *ptr);
/* Registers [buff, buff + nbytes) with comm so that collectives naming it
 * may use single-copy paths; the handle is passed to weftCommDeregister.
 * Any memory may be registered; memory from weftMemAlloc gains the most. */
weftResult_t weftCommRegister(const weftComm_t comm, void *buff, size_t nbytes, void **handle);
weftResult_t weftCommDeregister(const weftComm_t comm, void *handle);

/* --- Utilities ---------------------------------------------------------- */

/* Size in bytes of one element of datatype, or 0 for an invalid type. */
size_t weftTypeSize(weftDataType_t datatype);

/* weft extension: prints every WEFT_* environment parameter with its current
 * value, default and meaning (out may be NULL for stdout). */
void weftConfigPrint(FILE *out);

/* weft extension (the weft-topo tool): prints the topology of this machine,
 * or of the hwloc XML file xmlPath when not NULL, then the plan weft would
 * make for nranks ranks on nhosts such hosts: each rank's place, the
 * transport between each pair of ranks, the ring and the two trees. Ranks go
 * to hosts in blocks of consecutive ranks (or round-robin with
 * WEFT_TOPO_ROUND_ROBIN), to NUMA nodes in blocks, and with WEFT_TOPO_GPUS
 * each rank drives a GPU (local rank i the i-th, in bus order). nranks 0:
 * one rank per GPU, or per core, of each host. out may be NULL for stdout. */
#define WEFT_TOPO_GPUS 1
#define WEFT_TOPO_ROUND_ROBIN 2
weftResult_t weftTopoPrint(FILE *out, const char *xmlPath, int nranks, int nhosts, int flags);

/* --- Diagnosis (docs/diagnosis.md) --------------------------------------- */

/* weft extension: writes comm's trace, its last WEFT_TRACE_ENTRIES
 * collectives, sends and receives with their sequence numbers, sizes, types,
 * states and times, as JSON to out (NULL: stdout). Any thread, also while a
 * call of comm runs. weftInvalidUsage when tracing is off
 * (WEFT_TRACE_ENTRIES=0). */
weftResult_t weftCommTraceDump(weftComm_t comm, FILE *out);

/* weft extension (weft-info --trace): reads the traces the ranks of one or
 * more jobs dumped into dir (WEFT_TRACE_DIR) and prints, per job, which
 * collective did not complete, which ranks never called it and what each
 * did last, which ranks left no trace: the verdict a timed-out rank's error
 * gives. weftInvalidArgument when dir holds no trace. out may be NULL for
 * stdout. */
weftResult_t weftTraceDiagnose(const char *dir, FILE *out);

#ifdef __cplusplus
}
#endif
#endif /* WEFT_H */
