/* Single-copy collectives between ranks of one host: ranks pass their
 * buffer addresses through the point-to-point FIFOs and then read and write
 * each other's buffers directly, so every byte crosses memory once instead
 * of going through a FIFO slot. Used for large all-reduce, all-gather,
 * reduce-scatter, broadcast and reduce when every rank shares this host.
 *
 * A peer's buffer from weftMemAllocHost is mapped into this process
 * (collectives/core/mem.c) and copied with plain loads and streaming stores; any
 * other buffer is reached through the kernel's cross-memory attach
 * (process_vm_readv and process_vm_writev).
 *
 *   all-gather:     exchange addresses; copy each peer's input into its block
 *                   of the output; barrier (peers are done reading ours).
 *   reduce-scatter: exchange addresses; for this rank's block, piece by
 *                   piece, reduce each peer's share into the output; barrier.
 *   all-reduce:     the reduce-scatter on block `rank`, each reduced piece
 *                   written (from cache) into every rank's output; barrier.
 *                   No rank reads block `rank` of an input but its owner, so
 *                   in place is safe.
 *   broadcast:      block `rank` of the root's input copied (read once) into
 *                   every rank's output; barrier. Every rank copies a share,
 *                   the root too.
 *   reduce:         the all-reduce's blocks, each written to the root's
 *                   output only; barrier.
 *
 * Each block is reduced by one rank only, so all ranks hold the same bits.
 *
 * The address exchange also carries each rank's signature of the call
 * (collective, count, datatype, op, root) and the bytes of each buffer the
 * call covers. Every rank holds every rank's descriptor, so every rank finds
 * a mismatch, the same one, before any byte moves, and the call fails on all
 * of them with the same message (the comm goes on working). Each copy from
 * or to a peer is also held to the length that peer declared.
 *
 * The first call probes that the kernel lets ranks read each other (ptrace
 * rules, containers); the ranks agree on the answer, and where it fails the
 * tuner stops picking cma and this call runs the ring instead. */
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "../../transport/base/status.h"
#include "../../transport/base/wait.h"
#include "../core/signature.h"
#include "cma.h"
#include "../core/mem.h"
#include "../core/plan.h"
#include "../exec/host/prims_peer.h"
#include "../reduce/reduce_host.h"
#include "algo.h"
#include "copy_stream.h"

struct weft_param cma_params[] = {
    {.name = "WEFT_CMA_MIN_NBYTES", .type = PARAM_INT, .default_str = "64K", .min = 0,
     .max = INT64_MAX,
     .doc = "smallest all-reduce, all-gather, reduce-scatter, broadcast or reduce (bytes over "
            "all ranks: the gathered or scattered buffer, else the buffer) that runs "
            "single-copy: ranks on one host, connected over shared memory, read and write each "
            "other's buffers directly, through a mapping of the peer's buffer when it came from "
            "`weftMemAllocHost` (64 KiB and up), else with cross-memory attach "
            "(`process_vm_readv`). The first such call checks that the kernel allows it (ptrace "
            "rules, containers); if any rank may not be read, every rank keeps to the ring. "
            "`WEFT_ALGO` calls it `cma` (`WEFT_ALGO=^cma` turns it off; `WEFT_ALGO=cma` uses it "
            "at every size); larger than any size turns it off", .agree = 1},
    {.name = "WEFT_CMA_MAP", .type = PARAM_INT, .min = 0, .max = 1,
     .out_of_range = PARAM_RANGE_ERROR, .default_str = "1",
     .doc = "1: single-copy collectives map peers' `weftMemAllocHost` buffers (opened through "
            "`/proc/<pid>/fd`, once per communicator) and copy in user space; where a buffer "
            "cannot be opened, that communicator copies through the kernel from then on (an "
            "info line says why). 0: always cross-memory attach"},
    {.name = "WEFT_CMA_REDUCE_MIN_NBYTES", .type = PARAM_INT, .default_str = "1M", .min = 0,
     .max = INT64_MAX,
     .doc = "smallest reduce that runs single-copy (and at least `WEFT_CMA_MIN_NBYTES`), on "
            "buffers every rank took from `weftMemAllocHost` (see `WEFT_CMA_REDUCE_KERNEL`). "
            "A reduce that finds a buffer it cannot map runs the ring after the address "
            "exchange, which costs the ring's overlap of one call with the next: 1.65x the "
            "ring's time at 256 KiB, 1.1x at 1 MiB, nothing at 16 MiB (2 ranks), where mapped "
            "buffers gain 2x and 2.6x", .agree = 1},
    {.name = "WEFT_CMA_REDUCE_KERNEL", .type = PARAM_INT, .min = 0, .max = 1,
     .out_of_range = PARAM_RANGE_ERROR, .default_str = "0",
     .doc = "1 (on every rank): a single-copy reduce whose buffers are not all from "
            "`weftMemAllocHost` copies through the kernel (each rank reads its block of every "
            "other rank's input, and a non-root writes its reduced block to the root: more "
            "passes over its share than the ring's chain makes, 0.6-0.8 of the ring's speed at "
            "16 MiB); 0: such a reduce runs the ring, decided alike on every rank from the "
            "address exchange"},
    PARAM_END,
};

#define CMA_PIECE_NBYTES (256 * 1024) /* reduce in pieces that stay in cache */

/* What one rank tells the others about a call. */
struct cma_desc {
  uint64_t flags;       /* CMA_DESC_*: this rank's settings that every rank must share */
  uint64_t send_addr;
  uint64_t send_nbytes; /* bytes from send_addr that peers may read */
  uint64_t recv_addr;
  uint64_t recv_nbytes; /* bytes from recv_addr that peers may write */
  uint64_t probe_addr;  /* a word holding CMA_PROBE_VALUE */
  struct mem_shared_ref send_ref, recv_ref; /* fd -1 where not mappable */
  struct signature_packed sig; /* the call as this rank made it: last, as in every signed slot */
};
_Static_assert(offsetof(struct cma_desc, sig) + sizeof(struct signature_packed) ==
                   sizeof(struct cma_desc),
               "a descriptor ends with its signature, as every signed slot does");

/* Where this rank reaches one rank's buffers: mapped here, or NULL where the
 * kernel copies (own buffers: the buffers themselves). */
struct cma_view {
  const char *send;
  char *recv;
};
#define CMA_DESC_REDUCE_KERNEL 1ull /* WEFT_CMA_REDUCE_KERNEL=1 */
#define CMA_PROBE_VALUE 0x636d612d70726f62ull /* "cma-prob" */
static const volatile uint64_t cma_probe_word = CMA_PROBE_VALUE;

/* What cma keeps per communicator (comm_state_get). */
struct cma_comm {
  int usable;    /* cross-memory attach: 0 untried, 1 works, -1 refused */
  void *scratch; /* a piece read through the kernel, a staged piece, small exchanges */
  uint64_t ran;  /* calls that copied single-copy (not the ring after the exchange) */
};

static void cma_comm_scratch_release(void *state) {
  struct cma_comm *c = state;
  free(c->scratch);
  c->scratch = NULL;
}

static uint64_t cma_comm_scratch_nbytes(const void *state) {
  const struct cma_comm *c = state;
  return c->scratch != NULL ? malloc_usable_size(c->scratch) : 0;
}

static void cma_comm_destroy(void *state) {
  cma_comm_scratch_release(state);
  free(state);
}

static const struct comm_state_ops cma_comm_ops = {
    .name = "cma",
    .destroy = cma_comm_destroy,
    .scratch_nbytes = cma_comm_scratch_nbytes,
    .scratch_release = cma_comm_scratch_release,
};

static struct cma_comm *cma_comm_of(const struct weftComm *comm) {
  return comm_state_get(comm, &cma_comm_ops);
}

int cma_comm_usable(const struct weftComm *comm) {
  const struct cma_comm *c = cma_comm_of(comm);
  return c != NULL ? __atomic_load_n(&c->usable, __ATOMIC_RELAXED) : 0; /* a hint to planners */
}

size_t cma_min_nbytes(enum coll_kind coll) {
  int64_t v = param_int(&cma_params[0]);
  if (coll == COLL_REDUCE) {
    const int64_t reduce_min = param_int(&cma_params[2]);
    if (reduce_min > v) v = reduce_min;
  }
  return v > 0 ? (size_t)v : 0;
}

#ifdef WEFT_TEST_HOOKS
uint64_t cma_ran_count(const struct weftComm *comm) {
  const struct cma_comm *c = cma_comm_of(comm);
  return c != NULL ? c->ran : 0;
}
#endif

int cma_possible(const struct weftComm *comm) {
  if (cma_comm_usable(comm) < 0 || comm->nranks < 2 || comm->network || comm->peers == NULL) return 0;
  if (comm->slot_nbytes < sizeof(struct cma_desc)) return 0; /* a descriptor takes one slot */
  for (int r = 0; r < comm->nranks; r++)
    if (comm->peers[r].host_hash != comm->peers[comm->rank].host_hash) return 0;
  /* only where the ring itself runs over host memory the ranks share (not
   * WEFT_TRANSPORT=socket) */
  const struct weft_transport *t = comm->channels[0].send.transport;
  return t != NULL && (t->caps & TRANSPORT_CAP_HOST_MEMORY) != 0;
}

/* The error of a cross-memory copy with rank peer that failed with err (0:
 * no bytes moved). A peer that died, is dying or has failed its
 * connections makes it weftRemoteError; a peer that lives on leaves a
 * system error. */
static weftResult_t cma_copy_error(struct weftComm *comm, int peer, const char *what,
                                   size_t nbytes, int err) {
  const pid_t pid = comm->peers[peer].pid;
  const struct conn_ctrl *in = comm->recv_conns[peer].ctrl, *out = comm->send_conns[peer].ctrl;
  const int failed = (in != NULL && __atomic_load_n(&in->poison, __ATOMIC_ACQUIRE) != 0) ||
                     (out != NULL && __atomic_load_n(&out->poison, __ATOMIC_ACQUIRE) != 0);
  if (err == ESRCH || failed || pid_gone(pid, 1))
    return weft_error_set(weftRemoteError, "cma: rank %d (pid %d) %s while %s %zu bytes%s%s",
                          peer, (int)pid, failed ? "failed" : "died", what, nbytes,
                          err != 0 ? ": " : "", err != 0 ? strerror(err) : "");
  return weft_error_set(weftSystemError, "cma: %s %zu bytes of rank %d (pid %d): %s", what,
                        nbytes, peer, (int)pid, err != 0 ? strerror(err) : "no progress");
}

/* Reads nbytes at remote address addr of rank peer into dst. */
static weftResult_t cma_read(struct weftComm *comm, int peer, void *dst, uint64_t addr,
                             size_t nbytes) {
  pid_t pid = comm->peers[peer].pid;
  while (nbytes > 0) {
    struct iovec local = {.iov_base = dst, .iov_len = nbytes};
    struct iovec remote = {.iov_base = (void *)(uintptr_t)addr, .iov_len = nbytes};
    ssize_t n = process_vm_readv(pid, &local, 1, &remote, 1, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return cma_copy_error(comm, peer, "reading", nbytes, n < 0 ? errno : 0);
    dst = (char *)dst + n;
    addr += (uint64_t)n;
    nbytes -= (size_t)n;
  }
  return weftSuccess;
}

/* Writes nbytes from src to remote address addr of rank peer. */
static weftResult_t cma_write(struct weftComm *comm, int peer, uint64_t addr, const void *src,
                              size_t nbytes) {
  pid_t pid = comm->peers[peer].pid;
  while (nbytes > 0) {
    struct iovec local = {.iov_base = (void *)src, .iov_len = nbytes};
    struct iovec remote = {.iov_base = (void *)(uintptr_t)addr, .iov_len = nbytes};
    ssize_t n = process_vm_writev(pid, &local, 1, &remote, 1, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return cma_copy_error(comm, peer, "writing", nbytes, n < 0 ? errno : 0);
    src = (const char *)src + n;
    addr += (uint64_t)n;
    nbytes -= (size_t)n;
  }
  return weftSuccess;
}

/* Sends msg (nbytes) to every peer, then receives one from each into
 * msgs[peer]. The FIFOs hold several slots, so the sends never wait on a
 * peer that is itself sending. */
static weftResult_t cma_alltoall_small(struct weftComm *comm, const void *msg, void *msgs,
                                       size_t nbytes) {
  const int n = comm->nranks, rank = comm->rank;
  for (int j = 1; j < n; j++) {
    int peer = (rank + j) % n;
    WEFT_TRY(peer_send(comm, &comm->send_conns[peer], msg, nbytes));
  }
  for (int j = 1; j < n; j++) {
    int peer = (rank - j + n) % n;
    WEFT_TRY(peer_recv(comm, &comm->recv_conns[peer], (char *)msgs + (size_t)peer * nbytes,
                       nbytes));
  }
  return weftSuccess;
}

/* The scratch space: two piece buffers, then a word per rank for small
 * messages. */
static uint64_t *cma_words(struct weftComm *comm) {
  return (uint64_t *)((char *)cma_comm_of(comm)->scratch + 2 * CMA_PIECE_NBYTES);
}

static weftResult_t cma_barrier(struct weftComm *comm) {
  /* the exchange is the barrier; the token is not read (comm->seq would
   * race with a caller enqueueing the next call) */
  uint64_t token = (uint64_t)comm->rank, *tokens = cma_words(comm);
  return cma_alltoall_small(comm, &token, tokens, sizeof token);
}

/* Bytes of rank r's send and receive buffer that plan touches: a
 * broadcast reads the root's input only, a reduce writes the root's output
 * only. */
static void cma_buffer_nbytes(const struct weftComm *comm, const struct weft_plan *plan, int r,
                              size_t *send_out, size_t *recv_out) {
  const size_t nbytes = plan->count * weftTypeSize(plan->datatype), n = (size_t)comm->nranks;
  *send_out = plan->coll == COLL_REDUCESCATTER ? n * nbytes : nbytes;
  *recv_out = plan->coll == COLL_ALLGATHER ? n * nbytes : nbytes;
  if (plan->coll == COLL_BROADCAST && r != plan->root) *send_out = 0;
  if (plan->coll == COLL_REDUCE && r != plan->root) *recv_out = 0;
}

/* Each rank's buffers as this rank reaches them (see struct cma_view). */
static void cma_views(struct weftComm *comm, const struct weft_plan *plan,
                      const struct cma_desc *descs, struct cma_view *views) {
  for (int r = 0; r < comm->nranks; r++) {
    if (r == comm->rank) {
      views[r] = (struct cma_view){.send = plan->sendbuf, .recv = plan->recvbuf};
      continue;
    }
    const struct cma_desc *d = &descs[r];
    char *send = mem_peer_map(comm, r, &d->send_ref);
    char *recv = mem_peer_map(comm, r, &d->recv_ref);
    views[r].send = send ? send + (d->send_addr - d->send_ref.base) : NULL;
    views[r].recv = recv ? recv + (d->recv_addr - d->recv_ref.base) : NULL;
  }
}

/* Copies nbytes, past the caches with stream set. */
static void cma_copy(void *dst, const void *src, size_t nbytes, int stream) {
  if (stream) copy_host_stream(dst, src, nbytes);
  else memcpy(dst, src, nbytes);
}

/* Checks that every rank's descriptor describes this call: the same
 * signature, and buffers of the sizes it touches. descs are the same on every
 * rank, and so is the verdict. */
static weftResult_t cma_descs_check(struct weftComm *comm, const struct weft_plan *plan,
                                    const struct cma_desc *descs) {
  const int n = comm->nranks;
  struct signature sigs[n];
  for (int r = 0; r < n; r++) signature_unpack(&sigs[r], &descs[r].sig);
  if (signature_compare(sigs, n, "ranks disagree on a collective") != weftSuccess) {
    char cause[768];
    snprintf(cause, sizeof cause, "%s", weft_error_text()); /* the text is overwritten next */
    weft_error_set(weftInvalidUsage,
                   "%s (seen in the single-copy address exchange; nothing was copied)", cause);
    /* every rank sees the same: out of step, each breaks its comm */
    if (signature_out_of_step(sigs, n)) return comm_fail_alone(comm, weftInvalidUsage);
    return weftInvalidUsage;
  }
  for (int r = 0; r < n; r++) {
    size_t send_nbytes, recv_nbytes;
    cma_buffer_nbytes(comm, plan, r, &send_nbytes, &recv_nbytes);
    if (descs[r].send_nbytes != send_nbytes || descs[r].recv_nbytes != recv_nbytes)
      return weft_error_set(weftInvalidUsage,
                            "%s: rank %d declared buffers of %llu and %llu bytes where this call "
                            "covers %zu and %zu (nothing was copied)",
                            coll_kind_name((enum coll_kind)sigs[0].coll), r,
                            (unsigned long long)descs[r].send_nbytes,
                            (unsigned long long)descs[r].recv_nbytes, send_nbytes, recv_nbytes);
  }
  return weftSuccess;
}

/* Whether a reduce runs the ring after the exchange: some rank offers a
 * buffer it touches for no mapping, and not every rank allows the kernel's
 * copies (descs: the same on every rank, and so is the answer). */
static int cma_reduce_takes_ring(const struct weftComm *comm, const struct weft_plan *plan,
                                 const struct cma_desc *descs) {
  int kernel = 1, shared = 1;
  for (int r = 0; r < comm->nranks; r++) {
    size_t send_nbytes, recv_nbytes;
    cma_buffer_nbytes(comm, plan, r, &send_nbytes, &recv_nbytes);
    kernel &= (descs[r].flags & CMA_DESC_REDUCE_KERNEL) != 0;
    shared &= (send_nbytes == 0 || descs[r].send_ref.fd >= 0) &&
              (recv_nbytes == 0 || descs[r].recv_ref.fd >= 0);
  }
  return !kernel && !shared;
}

/* Whether [at, at + nbytes) lies within the declared bytes; else an
 * internal error naming the rank (a copy that would leave its buffer). */
static weftResult_t cma_range(int peer, const char *which, uint64_t at, size_t nbytes,
                              uint64_t declared) {
  if (at <= declared && nbytes <= declared - at) return weftSuccess;
  return weft_error_set(weftInternalError,
                        "cma: bytes [%llu, %llu) of rank %d's %s buffer lie outside the %llu it "
                        "declared",
                        (unsigned long long)at, (unsigned long long)(at + nbytes), peer, which,
                        (unsigned long long)declared);
}

/* Connects to every peer, allocates the scratch space, exchanges the
 * descriptors (which carry the call's signature and name the mappable
 * allocations holding the bytes of each buffer the plan touches),
 * checks that every rank made the same call (weftInvalidUsage on every rank
 * when not), and on the first call probes and agrees whether cross-memory
 * attach works. Returns weftSuccess with *usable_out 0 when it does not
 * (every rank gets the same answer). */
static weftResult_t cma_setup(struct weftComm *comm, const struct weft_plan *plan,
                              struct cma_desc *descs, int *usable_out) {
  const int n = comm->nranks, rank = comm->rank;
  size_t send_nbytes, recv_nbytes;
  cma_buffer_nbytes(comm, plan, rank, &send_nbytes, &recv_nbytes);
  struct cma_comm *state = cma_comm_of(comm);
  if (state == NULL) {
    state = calloc(1, sizeof *state);
    if (state == NULL) return weft_error_set(weftSystemError, "cma: out of memory");
    weftResult_t res = comm_state_set(comm, &cma_comm_ops, state);
    if (res != weftSuccess) {
      free(state);
      return res;
    }
  }
  if (state->scratch == NULL) {
    size_t nbytes = 2 * CMA_PIECE_NBYTES + (size_t)n * sizeof(uint64_t);
    if (posix_memalign(&state->scratch, 4096, nbytes) != 0)
      return weft_error_set(weftSystemError, "cma: cannot allocate %zu bytes", nbytes);
  }
  int peers[n > 1 ? n - 1 : 1];
  for (int j = 1; j < n; j++) peers[j - 1] = (rank + j) % n;
  WEFT_TRY(peer_connect(comm, peers, n - 1));
  struct cma_desc self = {.flags = param_int(&cma_params[3]) != 0 ? CMA_DESC_REDUCE_KERNEL : 0,
                          .send_addr = (uintptr_t)plan->sendbuf,
                          .send_nbytes = send_nbytes,
                          .recv_addr = (uintptr_t)plan->recvbuf,
                          .recv_nbytes = recv_nbytes,
                          .probe_addr = (uintptr_t)&cma_probe_word};
  signature_pack(&self.sig, plan);
  self.send_ref.fd = self.recv_ref.fd = -1;
  if (param_int(&cma_params[1]) != 0) {
    if (send_nbytes > 0) mem_shared_find(plan->sendbuf, send_nbytes, &self.send_ref);
    if (recv_nbytes > 0) mem_shared_find(plan->recvbuf, recv_nbytes, &self.recv_ref);
  }
  /* the descriptors, as cma_alltoall_small; a slot of another size is a
   * rank in another algorithm, which its signature names */
  const size_t unsigned_nbytes = offsetof(struct cma_desc, sig);
  for (int j = 1; j < n; j++) {
    int peer = (rank + j) % n;
    struct weft_conn *conn = &comm->send_conns[peer];
    char *slot;
    WEFT_TRY(peer_send_wait(comm, conn, &slot));
    memcpy(slot, &self, unsigned_nbytes);
    peer_send_post_signed(conn, unsigned_nbytes, &self.sig);
  }
  for (int j = 1; j < n; j++) {
    int peer = (rank - j + n) % n;
    struct weft_conn *conn = &comm->recv_conns[peer];
    const char *in;
    WEFT_TRY(peer_recv_signed_wait(comm, conn, sizeof self, &self.sig, 0, &in));
    memcpy(&descs[peer], in, unsigned_nbytes);
    peer_slot_signature(&descs[peer].sig, in + unsigned_nbytes, conn->step);
    peer_recv_done(conn);
  }
  descs[rank] = self;
  WEFT_TRY(cma_descs_check(comm, plan, descs));
  if (state->usable == 0) {
    uint64_t ok = 1, word = 0, *oks = cma_words(comm);
    for (int j = 1; j < n && ok; j++) {
      int peer = (rank + j) % n;
      struct iovec local = {.iov_base = &word, .iov_len = sizeof word};
      struct iovec remote = {.iov_base = (void *)(uintptr_t)descs[peer].probe_addr,
                             .iov_len = sizeof word};
      ok = process_vm_readv(comm->peers[peer].pid, &local, 1, &remote, 1, 0) == sizeof word &&
           word == CMA_PROBE_VALUE;
      if (!ok)
        WEFT_INFO(LOG_COLL, "cma: cannot read rank %d (pid %d): %s; using the ring", peer,
                  (int)comm->peers[peer].pid, strerror(errno));
    }
    WEFT_TRY(cma_alltoall_small(comm, &ok, oks, sizeof ok));
    for (int r = 0; r < n; r++)
      if (r != rank) ok &= oks[r];
    __atomic_store_n(&state->usable, ok ? 1 : -1, __ATOMIC_RELAXED);
  }
  *usable_out = state->usable > 0;
  return weftSuccess;
}

/* Where a reduced block goes besides dst (this rank's output, NULL for
 * none): the same elements of the receive buffers of ranks to[0..nto). */
struct cma_targets {
  const int *to;
  int nto;
};

/* Elements [off, off + count) of every rank's buffers, where every peer's
 * send buffer (and every target's receive buffer) is mapped here and the
 * outputs go past the caches: reduced a few lines at a time into scratch
 * that stays in the first-level cache, and each reduced chunk stored at
 * once to dst and every target's receive buffer, each source line loaded
 * once; where reduce_host_stream_fn
 * has a loop, the last reduction stores to the outputs itself. Reducing a
 * whole piece first and copying it out to one destination after another
 * moved a third less (2 ranks, 64 MiB, AMD EPYC); the fused loop moves
 * about a tenth more than the staged chunks. */
#define CMA_CHUNK_NBYTES 2048

static weftResult_t cma_reduce_block_mapped(struct weftComm *comm, const struct weft_plan *plan,
                                            const struct cma_desc *descs,
                                            const struct cma_view *views, size_t off,
                                            size_t count, char *dst, struct cma_targets tg) {
  const int n = comm->nranks, rank = comm->rank;
  const size_t esize = weftTypeSize(plan->datatype);
  const weft_reduce_fn reduce = reduce_host_fn(plan->datatype, plan->op);
  const int divisor = plan->op == weftAvg ? n : 1;
  const size_t chunk = CMA_CHUNK_NBYTES / esize > 0 ? CMA_CHUNK_NBYTES / esize : 1;
  const size_t at0 = off * esize;
  for (int j = 1; j < n; j++) {
    int peer = (rank + j) % n;
    WEFT_TRY(cma_range(peer, "send", at0, count * esize, descs[peer].send_nbytes));
  }
  for (int i = 0; i < tg.nto; i++)
    WEFT_TRY(cma_range(tg.to[i], "receive", at0, count * esize, descs[tg.to[i]].recv_nbytes));
  char *stage = (char *)cma_comm_of(comm)->scratch + CMA_PIECE_NBYTES;
  /* out of place only (cma_run): where the CPU has a loop that reduces
   * straight to several outputs, the last peer's reduction stores the result
   * (2 ranks: the whole block in one go, nothing staged) */
  const weft_reduce_stream_fn fused = reduce_host_stream_fn(plan->datatype, plan->op);
  const size_t step = fused != NULL && n == 2 ? count : chunk;
  void *outs[n + 1];
  for (size_t base = 0; base < count; base += step) {
    const size_t m = count - base < step ? count - base : step;
    const size_t at = at0 + base * esize; /* in every rank's buffer */
    const char *acc = (const char *)plan->sendbuf + at;
    const int last = fused != NULL ? n - 2 : n - 1; /* peers reduced here */
    for (int j = 1; j <= last; j++) {
      int peer = (rank + j) % n;
      reduce(stage, NULL, acc, views[peer].send + at, m, j == n - 1 ? divisor : 1);
      acc = stage;
    }
    int nouts = 0;
    if (dst != NULL) outs[nouts++] = dst + base * esize;
    for (int i = 0; i < tg.nto; i++) outs[nouts++] = views[tg.to[i]].recv + at;
    if (fused != NULL)
      fused(outs, nouts, acc, views[(rank + n - 1) % n].send + at, m, divisor);
    else
      copy_host_stream_to(outs, nouts, stage, m * esize);
  }
  copy_host_stream_fence();
  return weftSuccess;
}

/* dst = own input op every peer's input, elements [off, off + count) of each
 * rank's send buffer; dst may be src exactly (in place), or NULL (no output
 * here). Each reduced piece, still in cache, is also written to the same
 * elements of every target's receive buffer (all-reduce: every peer; a
 * reduce: the root). stream: copies out bypass the caches. */
static weftResult_t cma_reduce_block(struct weftComm *comm, const struct weft_plan *plan,
                                     const struct cma_desc *descs, const struct cma_view *views,
                                     size_t off, size_t count, char *dst, struct cma_targets tg,
                                     int stream) {
  const int n = comm->nranks, rank = comm->rank;
  int mapped = stream;
  for (int j = 1; j < n && mapped; j++) mapped = views[(rank + j) % n].send != NULL;
  for (int i = 0; i < tg.nto && mapped; i++) mapped = views[tg.to[i]].recv != NULL;
  if (mapped) return cma_reduce_block_mapped(comm, plan, descs, views, off, count, dst, tg);
  const size_t esize = weftTypeSize(plan->datatype);
  const weft_reduce_fn reduce = reduce_host_fn(plan->datatype, plan->op);
  const int divisor = plan->op == weftAvg ? n : 1;
  const size_t piece = CMA_PIECE_NBYTES / esize;
  char *tmp = cma_comm_of(comm)->scratch; /* a peer's piece read through the kernel */
  /* Out of place, a piece that is also shared is reduced into the second
   * scratch buffer and copied out in one go: stores into output lines that
   * are not in cache cost a read of each line first, a bulk copy does not,
   * and the writes to the peers then read the piece from cache. With no
   * output here the piece is staged too: a target's output may be the
   * input a later peer's turn reads (a reduce's root in place). */
  const int staged =
      tg.nto > 0 && (dst == NULL || (const char *)plan->sendbuf + off * esize != dst);
  char *stage = tmp + CMA_PIECE_NBYTES;
  for (size_t base = 0; base < count; base += piece) {
    const size_t m = count - base < piece ? count - base : piece;
    const size_t at = (off + base) * esize; /* in every rank's buffer */
    const char *acc = (const char *)plan->sendbuf + at;
    char *out = dst != NULL ? dst + base * esize : NULL;
    char *red = staged ? stage : out;
    for (int j = 1; j < n; j++) {
      int peer = (rank + j) % n;
      WEFT_TRY(cma_range(peer, "send", at, m * esize, descs[peer].send_nbytes));
      const char *theirs = views[peer].send ? views[peer].send + at : tmp;
      if (theirs == tmp) WEFT_TRY(cma_read(comm, peer, tmp, descs[peer].send_addr + at, m * esize));
      reduce(red, NULL, acc, theirs, m, j == n - 1 ? divisor : 1);
      acc = red;
    }
    if (staged && out != NULL) cma_copy(out, red, m * esize, stream);
    for (int i = 0; i < tg.nto; i++) {
      const int peer = tg.to[i];
      WEFT_TRY(cma_range(peer, "receive", at, m * esize, descs[peer].recv_nbytes));
      if (views[peer].recv) cma_copy(views[peer].recv + at, red, m * esize, stream);
      else WEFT_TRY(cma_write(comm, peer, descs[peer].recv_addr + at, red, m * esize));
    }
  }
  return weftSuccess;
}

/* Bytes [off, off + nbytes) of the root's input into every rank's output,
 * a piece at a time: read once (the root's own, a mapping of it, or read
 * through the kernel into this rank's output) and written to every other
 * output from cache, streamed together where mapped. */
static weftResult_t cma_broadcast_block(struct weftComm *comm, const struct weft_plan *plan,
                                        const struct cma_desc *descs,
                                        const struct cma_view *views, size_t off, size_t nbytes,
                                        int stream) {
  const int n = comm->nranks, rank = comm->rank, root = plan->root;
  const int root_in_place = descs[root].send_addr == descs[root].recv_addr;
  char *own = plan->recvbuf;
  void *outs[n];
  for (size_t at = off; at < off + nbytes; at += CMA_PIECE_NBYTES) {
    const size_t m = off + nbytes - at < CMA_PIECE_NBYTES ? off + nbytes - at : CMA_PIECE_NBYTES;
    WEFT_TRY(cma_range(root, "send", at, m, descs[root].send_nbytes));
    const char *src;
    if (rank == root) src = (const char *)plan->sendbuf + at;
    else if (views[root].send != NULL) src = views[root].send + at;
    else {
      WEFT_TRY(cma_range(rank, "receive", at, m, descs[rank].recv_nbytes));
      WEFT_TRY(cma_read(comm, root, own + at, descs[root].send_addr + at, m));
      src = own + at;
    }
    int nouts = 0; /* mapped outputs, streamed together */
    for (int j = 0; j < n; j++) {
      const int peer = (rank + j) % n;
      if (peer == root && root_in_place) continue; /* its input is its output */
      char *dst = views[peer].recv != NULL ? views[peer].recv + at : NULL;
      if (dst == src) continue; /* read into this rank's own output */
      WEFT_TRY(cma_range(peer, "receive", at, m, descs[peer].recv_nbytes));
      if (dst != NULL && stream) outs[nouts++] = dst;
      else if (dst != NULL) memcpy(dst, src, m);
      else WEFT_TRY(cma_write(comm, peer, descs[peer].recv_addr + at, src, m));
    }
    copy_host_stream_to(outs, nouts, src, m);
  }
  if (stream) copy_host_stream_fence();
  return weftSuccess;
}

weftResult_t cma_run(struct weftComm *comm, const struct weft_plan *plan) {
  const int n = comm->nranks, rank = comm->rank;
  struct cma_desc descs[n];
  int usable = 0;
  WEFT_TRY(cma_setup(comm, plan, descs, &usable));
  if (!usable || (plan->coll == COLL_REDUCE && cma_reduce_takes_ring(comm, plan, descs))) {
    return ring_run(comm, &comm->channels[0], plan, 0, plan->count);
  }
  cma_comm_of(comm)->ran++;
  const size_t esize = weftTypeSize(plan->datatype);
  struct cma_view views[n];
  cma_views(comm, plan, descs, views);
  const size_t out_nbytes = plan->count * esize * (plan->coll == COLL_ALLGATHER ? (size_t)n : 1);
  /* outputs larger than the caches are written past them, except a
   * reduction's in place: there every output line is one the reduction has
   * just read, already in this core's cache, so a plain store reads nothing
   * more and a streaming one only pushes the line out (in place 2-rank
   * all-reduce 1.6x faster at 256 MiB without it, 4x at 2 MiB, Intel Xeon).
   * A reduce's output is the root's, in place as the root made it. */
  const char *own_block = (const char *)plan->sendbuf +
                          (plan->coll == COLL_REDUCESCATTER ? (size_t)rank * out_nbytes : 0);
  int reduced_in_place = (plan->coll == COLL_ALLREDUCE || plan->coll == COLL_REDUCESCATTER) &&
                         own_block == (const char *)plan->recvbuf;
  if (plan->coll == COLL_REDUCE)
    reduced_in_place = descs[plan->root].send_addr == descs[plan->root].recv_addr;
  const int stream = out_nbytes >= copy_stream_min_nbytes(n) && !reduced_in_place;
  char *recv = plan->recvbuf;
  /* the all-reduce's and reduce's block r: elements [r * block, (r + 1) *
   * block), 64-byte aligned; the broadcast's, bytes */
  const size_t align = 64 / esize > 0 ? 64 / esize : 1;
  size_t block = (plan->count + (size_t)n - 1) / (size_t)n;
  block = (block + align - 1) / align * align;
#define BLOCK_OFF(r) ((size_t)(r) * block < plan->count ? (size_t)(r) * block : plan->count)
#define BLOCK_LEN(r) (BLOCK_OFF((r) + 1) - BLOCK_OFF(r))
  int peers[n > 1 ? n - 1 : 1];
  for (int j = 1; j < n; j++) peers[j - 1] = (rank + j) % n;
  weftResult_t res;
  switch (plan->coll) {
    case COLL_ALLGATHER: {
      /* this rank's input goes to its block of every rank's output, a piece
       * at a time: read from memory once, the piece is written n times from
       * cache ((n + 1) x the gathered size through memory, all ranks
       * together, where pulling every block would read each one n times) */
      const size_t nbytes = plan->count * esize, at = (size_t)rank * nbytes;
      const char *mine = plan->sendbuf;
      void *outs[n];
      for (size_t off = 0; off < nbytes; off += CMA_PIECE_NBYTES) {
        const size_t m = nbytes - off < CMA_PIECE_NBYTES ? nbytes - off : CMA_PIECE_NBYTES;
        int nouts = 0; /* mapped blocks, streamed together */
        for (int j = 0; j < n; j++) {
          int peer = (rank + j) % n;
          char *block = views[peer].recv ? views[peer].recv + at + off : NULL;
          if (block == mine + off) continue; /* own block, in place */
          WEFT_TRY(cma_range(peer, "receive", at + off, m, descs[peer].recv_nbytes));
          if (block && stream) outs[nouts++] = block;
          else if (block) memcpy(block, mine + off, m);
          else WEFT_TRY(cma_write(comm, peer, descs[peer].recv_addr + at + off, mine + off, m));
        }
        copy_host_stream_to(outs, nouts, mine + off, m);
      }
      if (stream) copy_host_stream_fence();
      return cma_barrier(comm);
    }
    case COLL_REDUCESCATTER:
      res = cma_reduce_block(comm, plan, descs, views, (size_t)rank * plan->count, plan->count,
                             recv, (struct cma_targets){0}, stream);
      break;
    case COLL_ALLREDUCE:
      res = cma_reduce_block(comm, plan, descs, views, BLOCK_OFF(rank), BLOCK_LEN(rank),
                             recv + BLOCK_OFF(rank) * esize,
                             (struct cma_targets){.to = peers, .nto = n - 1}, stream);
      break;
    case COLL_REDUCE: /* the root's output only: the root's block in place there */
      if (rank == plan->root)
        res = cma_reduce_block(comm, plan, descs, views, BLOCK_OFF(rank), BLOCK_LEN(rank),
                               recv + BLOCK_OFF(rank) * esize, (struct cma_targets){0}, stream);
      else
        res = cma_reduce_block(comm, plan, descs, views, BLOCK_OFF(rank), BLOCK_LEN(rank), NULL,
                               (struct cma_targets){.to = &plan->root, .nto = 1}, stream);
      break;
    case COLL_BROADCAST:
      res = cma_broadcast_block(comm, plan, descs, views, BLOCK_OFF(rank) * esize,
                                BLOCK_LEN(rank) * esize, stream);
      break;
    default:
      return weft_error_set(weftInternalError, "cma: no single-copy %s",
                            coll_kind_name(plan->coll));
  }
#undef BLOCK_OFF
#undef BLOCK_LEN
  WEFT_TRY(res);
  return cma_barrier(comm);
}
