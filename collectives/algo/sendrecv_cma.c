/* Single-copy sends and receives between ranks of one host.
 *
 * A send through the FIFO costs two copies: into a slot, out of it. Between
 * ranks of one host whose FIFO lies in memory both load and store, a large
 * send instead puts one slot in the FIFO, an offer: where the message lies
 * in the sender's memory and how long it is. The receiver checks the length
 * against the receive it posted, copies the message straight into its
 * buffer (a mapped weftMemAllocHost buffer of the sender's with memcpy, any
 * other through process_vm_readv), writes its answer into the slot and
 * frees it; the sender, seeing the slot freed, reads the answer:
 *
 *   copied    the send is done;
 *   refused   the kernel does not let the receiver read the sender (ptrace
 *             rules): the message follows through the FIFO as usual, and
 *             the communicator makes no more offers;
 *   mismatch  the receiver expected another size: both ends fail with
 *             weftInvalidUsage, and no byte is written;
 *   failed    the copy failed (the sender's buffer could not be read): both
 *             ends fail.
 *
 * The receiver never reads more than the sender declared, nor writes more
 * than it expects, nor reads a sender whose connection is poisoned (it may
 * have given up on the send and reused its buffer). A send offered for good
 * completes only once its receiver took it, so such offers are made only
 * where the send waits for its receiver anyway (it does not fit the FIFO);
 * any other is taken back when its receiver does not come in time, the
 * message then following through the FIFO (see sendrecv_cma_wanted). */
#include "sendrecv_cma.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include "../../transport/base/status.h"
#include "../core/mem.h"
#include "../reduce/reduce_host.h"
#include "p2p_slot.h"

struct weft_param sendrecv_cma_params[] = {
    {.name = "WEFT_P2P_CMA_MIN_NBYTES", .type = PARAM_INT, .default_str = "64K",
     .doc = "smallest send (bytes) that the receiver copies straight from the sender's buffer "
            "when both ranks are on one host and connected over shared memory: the send puts "
            "one slot in the FIFO saying where the message lies, and the receiver copies it "
            "with `memcpy` from a mapping of a `weftMemAllocHost` buffer, else with "
            "`process_vm_readv` (one copy instead of two). Only sends that wait for their "
            "receiver anyway keep their offer until it is taken: those larger than the FIFO "
            "(`WEFT_NSLOTS` x `WEFT_SLOT_BYTES`). Where the kernel does not let the receiver "
            "read the sender, the message goes through the FIFO and the communicator stops "
            "offering. Larger than any size turns it off. A send that fits the FIFO, and would "
            "complete on its own through it, is taken back when its receiver has not come "
            "within `WEFT_P2P_CMA_WITHDRAW_NS`, and then goes through the FIFO"},
    {.name = "WEFT_P2P_CMA_WITHDRAW_NS", .type = PARAM_INT, .default_str = "-1", .min = -1,
     .doc = "how long (ns) an offered send that fits the FIFO waits for its receiver to take "
            "the offer before taking it back and copying through the FIFO "
            "(`WEFT_P2P_CMA_MIN_NBYTES`): -1 about the time the FIFO's two copies take (2 us "
            "plus one ns per 8 bytes), 0 no such offers (those sends go through the FIFO, or "
            "keep their offer where their group also receives from that peer)"},
    {.name = "WEFT_P2P_CMA_PAIRED_WITHDRAW_NS", .type = PARAM_INT, .default_str = "10000000",
     .min = 0,
     .doc = "how long (ns) an offered send that fits the FIFO, in a group that also receives "
            "from that peer (as an all-to-all does), waits for its receiver before taking the "
            "offer back (`WEFT_P2P_CMA_WITHDRAW_NS`): the receiver is nearly always in the same "
            "group call, only late (with more ranks than cores, by a scheduler's time slice: "
            "hence 10 ms), and a taken-back offer costs a copy more; but where it receives only "
            "after another call whose message needs this rank past its group, the send "
            "completes through the FIFO after this time instead of waiting for good. 0: such "
            "offers are for good"},
    PARAM_END,
};

#define SENDRECV_CMA_MAGIC 0x7032702d636d6121ull /* eight ASCII bytes that mark an offer */

enum sendrecv_cma_answer {
  ANSWER_NONE,
  ANSWER_COPIED,
  ANSWER_REFUSED,
  ANSWER_MISMATCH,
  ANSWER_FAILED,
  ANSWER_TAKING,      /* the receiver has it: the final answer follows */
  ANSWER_WITHDRAWING, /* the sender took it back and copies the message's start in */
  ANSWER_WITHDRAWN    /* ... and has: the rest follows in the FIFO's next slots */
};

/* The offer, in a slot: written by the sender, answered by the receiver. */
struct sendrecv_cma_slot {
  uint64_t magic;
  uint64_t addr;   /* the message in the sender's process */
  uint64_t nbytes; /* its length: the receiver reads no more */
  struct mem_shared_ref ref; /* the allocation holding it (fd -1: not mappable) */
  uint64_t answer;      /* enum sendrecv_cma_answer, written before head moves past the slot */
  uint64_t want_nbytes; /* with ANSWER_MISMATCH: what the receiver expected */
};

/* What sendrecv_cma keeps per communicator (comm_state_get). */
struct sendrecv_cma_comm {
  int refused; /* a receiver could not read a sender: no more offers */
  uint64_t sent, received; /* messages copied single-copy, as sender and receiver */
};

static const struct comm_state_ops sendrecv_cma_comm_ops = {
    .name = "sendrecv_cma",
    .destroy = free,
};

static int sendrecv_cma_refused(const struct weftComm *comm) {
  const struct sendrecv_cma_comm *s = comm_state_get(comm, &sendrecv_cma_comm_ops);
  return s != NULL && s->refused;
}

/* comm's state, made on first use; NULL when it cannot be (then a refusal
 * is not remembered, which only costs offers refused again, and the counts
 * stay 0). */
static struct sendrecv_cma_comm *sendrecv_cma_state(struct weftComm *comm) {
  struct sendrecv_cma_comm *s = comm_state_get(comm, &sendrecv_cma_comm_ops);
  if (s == NULL && (s = calloc(1, sizeof *s)) != NULL &&
      comm_state_set(comm, &sendrecv_cma_comm_ops, s) != weftSuccess) {
    free(s);
    s = NULL;
  }
  return s;
}

#ifdef WEFT_TEST_HOOKS
void sendrecv_cma_counts(const struct weftComm *comm, uint64_t *sent_out, uint64_t *received_out) {
  const struct sendrecv_cma_comm *s = comm_state_get(comm, &sendrecv_cma_comm_ops);
  *sent_out = s != NULL ? s->sent : 0;
  *received_out = s != NULL ? s->received : 0;
}
#endif

static struct sendrecv_cma_slot *slot_at(const struct weft_conn *c, uint64_t step) {
  return (struct sendrecv_cma_slot *)(conn_slot(c, step) + P2P_SLOT_HDR_NBYTES);
}

/* Where a withdrawn offer's slot holds the start of its message: after the
 * offer, on a cache line of its own. */
#define WITHDRAWN_AT ((P2P_SLOT_HDR_NBYTES + sizeof(struct sendrecv_cma_slot) + 63) & ~(size_t)63)

/* The slots a message of nbytes takes through the FIFO, and after a
 * withdrawn offer (its start in the offer's slot). */
static size_t fifo_slots(const struct weft_conn *c, size_t nbytes) {
  return (nbytes + c->slot_nbytes - 1) / c->slot_nbytes;
}
static size_t withdrawn_slots(const struct weft_conn *c, size_t nbytes) {
  const size_t in_offer = c->slot_nbytes - WITHDRAWN_AT;
  return 1 + (nbytes > in_offer ? fifo_slots(c, nbytes - in_offer) : 0);
}

int sendrecv_cma_wanted(const struct weftComm *comm, const struct weft_conn *c, size_t nbytes,
                        int paired) {
  int64_t min = param_int(&sendrecv_cma_params[0]);
  if (nbytes == 0 || (int64_t)nbytes < min || c->peer_pid == 0 || c->transport == NULL) return 0;
  if ((c->transport->caps & TRANSPORT_CAP_HOST_MEMORY) == 0) return 0;
  if (c->slot_nbytes < WITHDRAWN_AT + 64 || sendrecv_cma_refused(comm)) return 0;
  if (nbytes > (size_t)c->nslots * c->slot_nbytes) return SENDRECV_CMA_OFFER;
  /* A lone send, taken back, takes no more slots than through the FIFO: the
   * sends after it find the room they found before. A paired one (its group
   * waits for a receive from that peer) may take one more, as long as it
   * fits the FIFO: its peer may well receive it only after another call, its
   * own send to this rank having completed alone. */
  const size_t room = paired ? c->nslots : fifo_slots(c, nbytes);
  if (param_int(&sendrecv_cma_params[paired ? 2 : 1]) == 0 || withdrawn_slots(c, nbytes) > room)
    return paired ? SENDRECV_CMA_OFFER : 0;
  return SENDRECV_CMA_OFFER_WITHDRAWABLE;
}

uint64_t sendrecv_cma_withdraw_ns(size_t nbytes, int paired) {
  if (paired) return (uint64_t)param_int(&sendrecv_cma_params[2]);
  const int64_t ns = param_int(&sendrecv_cma_params[1]);
  return ns >= 0 ? (uint64_t)ns : 2000 + nbytes / 8;
}

int sendrecv_cma_offer(struct weft_conn *c, const void *buf, size_t nbytes, uint64_t *step_out) {
  if (!conn_send_ready(c)) return 0;
  struct sendrecv_cma_slot *slot = slot_at(c, c->step);
  *slot = (struct sendrecv_cma_slot){
      .magic = SENDRECV_CMA_MAGIC, .addr = (uintptr_t)buf, .nbytes = nbytes,
      .answer = ANSWER_NONE};
  mem_shared_find(buf, nbytes, &slot->ref);
  *step_out = c->step;
  p2p_slot_publish(c, (uint32_t)(P2P_SLOT_HDR_NBYTES + sizeof *slot) | SENDRECV_CMA_SLOT_OFFER);
  return 1;
}

size_t sendrecv_cma_withdraw(struct weft_conn *c, uint64_t step, const void *buf, size_t nbytes,
                             int *withdrawn_out) {
  struct sendrecv_cma_slot *slot = slot_at(c, step);
  uint64_t none = ANSWER_NONE;
  *withdrawn_out = __atomic_compare_exchange_n(&slot->answer, &none, ANSWER_WITHDRAWING, 0,
                                               __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
  if (!*withdrawn_out) return 0;
  size_t n = c->slot_nbytes - WITHDRAWN_AT;
  if (n > nbytes) n = nbytes;
  memcpy(conn_slot(c, step) + WITHDRAWN_AT, buf, n);
  __atomic_store_n(&slot->answer, ANSWER_WITHDRAWN, __ATOMIC_RELEASE);
  return n;
}

weftResult_t sendrecv_cma_answer(struct weftComm *comm, struct weft_conn *c, uint64_t step,
                                 size_t nbytes, int *copied_out) {
  if (__atomic_load_n(&c->ctrl->head, __ATOMIC_ACQUIRE) <= step) return weftInProgress;
  const struct sendrecv_cma_slot *slot = slot_at(c, step);
  struct sendrecv_cma_comm *state;
  switch (slot->answer) {
    case ANSWER_COPIED:
      if ((state = sendrecv_cma_state(comm)) != NULL) state->sent++;
      *copied_out = 1;
      return weftSuccess;
    case ANSWER_REFUSED:
      if ((state = sendrecv_cma_state(comm)) != NULL) state->refused = 1;
      *copied_out = 0;
      return weftSuccess;
    case ANSWER_MISMATCH:
      return weft_error_set(weftInvalidUsage,
                            "send to rank %d: the receiver expects %llu bytes, the message has "
                            "%zu (sender and receiver must use the same count and datatype)",
                            c->peer_rank, (unsigned long long)slot->want_nbytes, nbytes);
    default:
      return weft_error_set(weftRemoteError, "send to rank %d: the receiver could not copy the "
                            "%zu-byte message", c->peer_rank, nbytes);
  }
}

/* Copies the sender's nbytes at addr into dst through the kernel. Sets
 * *refused when the kernel does not let this process read the sender. */
static weftResult_t sendrecv_cma_read(const struct weft_conn *c, void *dst, uint64_t addr,
                                      size_t nbytes, int *refused) {
  size_t done = 0;
  while (done < nbytes) {
    struct iovec local = {.iov_base = (char *)dst + done, .iov_len = nbytes - done};
    struct iovec remote = {.iov_base = (void *)(uintptr_t)(addr + done), .iov_len = nbytes - done};
    ssize_t n = process_vm_readv(c->peer_pid, &local, 1, &remote, 1, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && done == 0 && (errno == EPERM || errno == ENOSYS)) {
      *refused = 1;
      return weftSuccess;
    }
    if (n <= 0)
      return weft_error_set(n < 0 && errno == ESRCH ? weftRemoteError : weftSystemError,
                            "recv from rank %d (pid %d): reading %zu bytes of its message: %s",
                            c->peer_rank, (int)c->peer_pid, nbytes - done,
                            n < 0 ? strerror(errno) : "no progress");
    done += (size_t)n;
  }
  return weftSuccess;
}

/* Copies the offered message into dst: from the sender's allocation
 * mapped here where it has one (past the caches with stream set), else
 * through the kernel. */
static weftResult_t sendrecv_cma_copy(struct weftComm *comm, const struct weft_conn *c,
                                      const struct sendrecv_cma_slot *slot, void *dst, int stream,
                                      int *refused) {
  const struct mem_shared_ref *ref = &slot->ref;
  if (ref->fd >= 0 && slot->addr >= ref->base && slot->nbytes <= ref->nbytes &&
      slot->addr - ref->base <= ref->nbytes - slot->nbytes) {
    const char *base = mem_peer_map(comm, c->peer_rank, ref);
    if (base != NULL) {
      if (stream) copy_host_stream(dst, base + (slot->addr - ref->base), slot->nbytes);
      else memcpy(dst, base + (slot->addr - ref->base), slot->nbytes);
      return weftSuccess;
    }
  }
  return sendrecv_cma_read(c, dst, slot->addr, slot->nbytes, refused);
}

/* The receiver's answer, final: the sender may be looking (a withdrawal's
 * compare-and-swap that fails). */
static void answer_set(struct sendrecv_cma_slot *slot, uint64_t answer) {
  __atomic_store_n(&slot->answer, answer, __ATOMIC_RELEASE);
}

/* A withdrawn offer: the start of the message, in its slot, goes to dst. */
static weftResult_t take_withdrawn(struct weft_conn *c, const struct sendrecv_cma_slot *slot,
                                   void *dst, size_t nbytes, size_t done_nbytes,
                                   size_t *taken_out) {
  if (slot->magic != SENDRECV_CMA_MAGIC)
    return weft_error_set(weftInternalError, "recv from rank %d: a malformed offer", c->peer_rank);
  if (slot->nbytes != nbytes || done_nbytes != 0)
    return weft_error_set(weftInvalidUsage,
                          "recv from rank %d: the message of %llu bytes does not match the %zu "
                          "bytes expected (sender and receiver must use the same count and "
                          "datatype)",
                          c->peer_rank, (unsigned long long)slot->nbytes, nbytes);
  size_t n = c->slot_nbytes - WITHDRAWN_AT;
  if (n > nbytes) n = nbytes;
  memcpy(dst, conn_slot(c, c->step) + WITHDRAWN_AT, n);
  *taken_out = n;
  return weftSuccess;
}

weftResult_t sendrecv_cma_take(struct weftComm *comm, struct weft_conn *c, void *dst, size_t nbytes,
                               size_t done_nbytes, int stream, size_t *taken_out) {
  struct sendrecv_cma_slot *slot = slot_at(c, c->step);
  weftResult_t res = weftSuccess;
  int refused = 0;
  *taken_out = 0;
  uint64_t seen = ANSWER_NONE;
  if (!__atomic_compare_exchange_n(&slot->answer, &seen, ANSWER_TAKING, 0, __ATOMIC_ACQ_REL,
                                   __ATOMIC_ACQUIRE)) {
    if (seen == ANSWER_WITHDRAWING) return weftInProgress; /* its start is being copied in */
    res = seen == ANSWER_WITHDRAWN
              ? take_withdrawn(c, slot, dst, nbytes, done_nbytes, taken_out)
              : weft_error_set(weftInternalError, "recv from rank %d: a malformed offer",
                               c->peer_rank);
    p2p_slot_taken(c, P2P_USED_HDR);
    return res;
  }
  if (slot->magic != SENDRECV_CMA_MAGIC) {
    answer_set(slot, ANSWER_FAILED);
    res = weft_error_set(weftInternalError, "recv from rank %d: a malformed offer", c->peer_rank);
  } else if (slot->nbytes != nbytes || done_nbytes != 0) {
    slot->want_nbytes = nbytes;
    answer_set(slot, ANSWER_MISMATCH);
    res = weft_error_set(weftInvalidUsage,
                         "recv from rank %d: the message of %llu bytes does not match the %zu "
                         "bytes expected (sender and receiver must use the same count and "
                         "datatype)",
                         c->peer_rank, (unsigned long long)slot->nbytes, nbytes);
  } else {
    res = sendrecv_cma_copy(comm, c, slot, dst, stream, &refused);
    /* a sender that failed (a timeout, an abort) poisons the connection before
     * its caller may reuse the buffer: a copy that ends after that is void */
    if (res == weftSuccess && __atomic_load_n(&c->ctrl->poison, __ATOMIC_ACQUIRE) != 0)
      res = weft_error_set(weftRemoteError, "recv from rank %d: it failed while this receive "
                           "copied its message", c->peer_rank);
    answer_set(slot, res != weftSuccess ? ANSWER_FAILED
                     : refused          ? ANSWER_REFUSED
                                        : ANSWER_COPIED);
  }
  p2p_slot_taken(c, P2P_USED_HDR);
  if (res == weftSuccess && !refused) {
    *taken_out = nbytes;
    struct sendrecv_cma_comm *state = sendrecv_cma_state(comm);
    if (state != NULL) state->received++;
  }
  return res;
}
