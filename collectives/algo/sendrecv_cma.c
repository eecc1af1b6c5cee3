/* Single-copy sends and receives between ranks of one host.
 *
 * A send through the FIFO costs two copies: into a slot, out of it. Between
 * ranks of one host whose FIFO lies in memory both load and store, a large
 * send instead makes an offer: where the message lies in the sender's memory
 * and how long it is, in the connection's control block, and one slot in
 * the FIFO that says so. The receiver checks the length against the receive
 * it posted, copies the message straight into its buffer (a mapped
 * weftMemAllocHost buffer of the sender's with memcpy, any other through
 * process_vm_readv), writes its answer and frees the slot; the sender,
 * seeing the slot freed, reads the answer:
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
 * any other is taken back when its receiver does not come in time: the
 * sender fills the offer's slot with the message's start and the next slots
 * with the rest, as the FIFO would have (see sendrecv_cma_wanted). */
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
            "`process_vm_readv` (one copy instead of two). A send larger than the FIFO "
            "(`WEFT_NSLOTS` x `WEFT_SLOT_BYTES`), which waits for its receiver anyway, keeps "
            "its offer until it is taken; one that fits the FIFO, and so would complete on its "
            "own through it, is taken back when its receiver has not come within "
            "`WEFT_P2P_CMA_WITHDRAW_NS` (`WEFT_P2P_CMA_PAIRED_WITHDRAW_NS` in a group that "
            "also receives from that peer), and then fills the slots it would have filled. "
            "Messages that fit one slot with its header (4 KiB at most) are never offered. "
            "Where the kernel does not let the receiver read the sender, the message goes "
            "through the FIFO and the communicator stops offering. Larger than any size turns "
            "it off"},
    {.name = "WEFT_P2P_CMA_WITHDRAW_NS", .type = PARAM_INT, .default_str = "-1", .min = -1,
     .max = INT64_MAX,
     .doc = "how long (ns) an offered send that fits the FIFO, in a group that does not "
            "receive from that peer, waits for its receiver to take the offer before taking it "
            "back and copying through the FIFO (`WEFT_P2P_CMA_MIN_NBYTES`): -1 about the time "
            "the FIFO's two copies take (2 us plus one ns per 8 bytes), 0 no such offers (those "
            "sends go through the FIFO)"},
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

enum sendrecv_cma_answer {
  ANSWER_NONE,
  ANSWER_COPIED,
  ANSWER_REFUSED,
  ANSWER_MISMATCH,
  ANSWER_FAILED,
  ANSWER_TAKING,      /* the receiver has it: the final answer follows */
  ANSWER_WITHDRAWING, /* the sender took it back and fills the offer's slot */
  ANSWER_WITHDRAWN    /* ... and has: the slot holds what withdrawn_used says, the
                         message's start, and the rest follows in the next slots */
};

/* The offer, in the connection's control block (conn_ctrl.p2p_offer): written
 * by the sender before it publishes the offer's slot, answered by the
 * receiver, and the sender's again once head has passed that slot (it makes
 * no other offer before: p2p_offer_end). Its slot holds a header alone, so
 * that a message taken back fills the slots as it would through the FIFO. */
struct sendrecv_cma_offer {
  uint64_t answer;      /* enum sendrecv_cma_answer, final before head moves past the slot */
  uint64_t want_nbytes; /* with ANSWER_MISMATCH: what the receiver expected */
  uint64_t addr;        /* the message in the sender's process */
  uint64_t nbytes;      /* its length: the receiver reads no more */
  uint32_t withdrawn_used; /* with ANSWER_WITHDRAWN: the slot's used bytes and flags now */
  uint32_t pad;
  struct mem_shared_ref ref; /* the allocation holding it (fd -1: not mappable) */
};
static_assert(sizeof(struct sendrecv_cma_offer) <= sizeof(((struct conn_ctrl *)0)->p2p_offer),
              "the offer fits the control block's area");

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

static struct sendrecv_cma_offer *offer_of(const struct weft_conn *c) {
  return (struct sendrecv_cma_offer *)c->ctrl->p2p_offer;
}

int sendrecv_cma_wanted(const struct weftComm *comm, const struct weft_conn *c, size_t nbytes,
                        int paired) {
  int64_t min = param_int(&sendrecv_cma_params[0]);
  if (nbytes == 0 || (int64_t)nbytes < min || c->peer_pid == 0 || c->transport == NULL) return 0;
  if ((c->transport->caps & TRANSPORT_CAP_HOST_MEMORY) == 0) return 0;
  /* one slot with a header: a copy of a few cache lines */
  if (p2p_slot_hdr_fits(c, nbytes) || sendrecv_cma_refused(comm)) return 0;
  if (nbytes > (size_t)c->nslots * c->slot_nbytes) return SENDRECV_CMA_OFFER;
  /* Taken back, the message fills the slots it takes through the FIFO, so
   * the sends after it find the room they found before. A paired send (its
   * group waits for a receive from that peer) is taken back too, later: its
   * peer may receive it only after another call, its own send to this rank
   * having completed alone. */
  if (param_int(&sendrecv_cma_params[paired ? 2 : 1]) == 0)
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
  /* the control block's offer area is the last offer's until its slot is drained */
  if (c->head_seen < c->p2p_offer_end) {
    c->head_seen = __atomic_load_n(&c->ctrl->head, __ATOMIC_ACQUIRE);
    if (c->head_seen < c->p2p_offer_end) return -1;
  }
  struct sendrecv_cma_offer *offer = offer_of(c);
  offer->addr = (uintptr_t)buf;
  offer->nbytes = nbytes;
  offer->want_nbytes = 0;
  offer->withdrawn_used = 0;
  mem_shared_find(buf, nbytes, &offer->ref);
  __atomic_store_n(&offer->answer, ANSWER_NONE, __ATOMIC_RELAXED);
  *step_out = c->step;
  c->p2p_offer_end = c->step + 1;
  /* the header's and tail's release stores publish the offer */
  p2p_slot_publish(c, (uint32_t)P2P_SLOT_HDR_NBYTES | SENDRECV_CMA_SLOT_OFFER);
  return 1;
}

size_t sendrecv_cma_withdraw(struct weft_conn *c, uint64_t step, const void *buf, size_t nbytes,
                             int *withdrawn_out) {
  struct sendrecv_cma_offer *offer = offer_of(c);
  uint64_t none = ANSWER_NONE;
  *withdrawn_out = __atomic_compare_exchange_n(&offer->answer, &none, ANSWER_WITHDRAWING, 0,
                                               __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
  if (!*withdrawn_out) return 0;
  /* the slot as the FIFO would have filled it: raw, whole (the header's
   * place too: offers are only of messages that take no header) */
  const size_t n = nbytes < c->slot_nbytes ? nbytes : c->slot_nbytes;
  memcpy(conn_slot(c, step), buf, n);
  offer->withdrawn_used = (uint32_t)n | (n == nbytes ? SLOT_LAST : 0);
  __atomic_store_n(&offer->answer, ANSWER_WITHDRAWN, __ATOMIC_RELEASE);
  return n;
}

weftResult_t sendrecv_cma_answer(struct weftComm *comm, struct weft_conn *c, uint64_t step,
                                 size_t nbytes, int *copied_out) {
  if (__atomic_load_n(&c->ctrl->head, __ATOMIC_ACQUIRE) <= step) return weftInProgress;
  const struct sendrecv_cma_offer *offer = offer_of(c);
  struct sendrecv_cma_comm *state;
  switch (__atomic_load_n(&offer->answer, __ATOMIC_RELAXED)) {
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
                            c->peer_rank, (unsigned long long)offer->want_nbytes, nbytes);
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
                                      const struct sendrecv_cma_offer *offer, void *dst,
                                      int stream, int *refused) {
  const struct mem_shared_ref *ref = &offer->ref;
  if (ref->fd >= 0 && offer->addr >= ref->base && offer->nbytes <= ref->nbytes &&
      offer->addr - ref->base <= ref->nbytes - offer->nbytes) {
    const char *base = mem_peer_map(comm, c->peer_rank, ref);
    if (base != NULL) {
      if (stream) copy_host_stream(dst, base + (offer->addr - ref->base), offer->nbytes);
      else memcpy(dst, base + (offer->addr - ref->base), offer->nbytes);
      return weftSuccess;
    }
  }
  return sendrecv_cma_read(c, dst, offer->addr, offer->nbytes, refused);
}

/* The receiver's answer, final: the sender may be looking (a withdrawal's
 * compare-and-swap that fails). */
static void answer_set(struct sendrecv_cma_offer *offer, uint64_t answer) {
  __atomic_store_n(&offer->answer, answer, __ATOMIC_RELEASE);
}

static weftResult_t size_mismatch(const struct weft_conn *c, uint64_t offered, size_t nbytes) {
  return weft_error_set(weftInvalidUsage,
                        "recv from rank %d: the message of %llu bytes does not match the %zu "
                        "bytes expected (sender and receiver must use the same count and "
                        "datatype)",
                        c->peer_rank, (unsigned long long)offered, nbytes);
}

weftResult_t sendrecv_cma_take(struct weftComm *comm, struct weft_conn *c, void *dst, size_t nbytes,
                               size_t done_nbytes, int stream, size_t *taken_out,
                               uint32_t *withdrawn_used_out) {
  struct sendrecv_cma_offer *offer = offer_of(c);
  weftResult_t res = weftSuccess;
  int refused = 0;
  *taken_out = 0;
  *withdrawn_used_out = 0;
  uint64_t seen = ANSWER_NONE;
  if (!__atomic_compare_exchange_n(&offer->answer, &seen, ANSWER_TAKING, 0, __ATOMIC_ACQ_REL,
                                   __ATOMIC_ACQUIRE)) {
    if (seen == ANSWER_WITHDRAWING) return weftInProgress; /* the slot is being filled */
    if (seen != ANSWER_WITHDRAWN)
      return weft_error_set(weftInternalError, "recv from rank %d: a malformed offer",
                            c->peer_rank);
    /* the slot now holds the message's start, as through the FIFO: the
     * caller takes it so (the offer's size, the sender's until head passes
     * the slot, names a mismatch) */
    if (offer->nbytes != nbytes || done_nbytes != 0) return size_mismatch(c, offer->nbytes, nbytes);
    *withdrawn_used_out = offer->withdrawn_used;
    return weftSuccess;
  }
  /* a sender that failed (a timeout, an abort) poisons the connection before
   * its caller may reuse or free the buffer: its offer is void from then on,
   * looked at before the copy (dst is left as it was) and after it (a copy
   * that ends after the poison, or fails on a buffer freed meanwhile). The
   * fences order the look with the copy's loads where the processor would
   * not (the sender's store, then its caller's writes to the buffer) */
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  if (offer->nbytes != nbytes || done_nbytes != 0) {
    offer->want_nbytes = nbytes;
    answer_set(offer, ANSWER_MISMATCH);
    res = size_mismatch(c, offer->nbytes, nbytes);
  } else if (__atomic_load_n(&c->ctrl->poison, __ATOMIC_ACQUIRE) != 0) {
    answer_set(offer, ANSWER_FAILED);
    res = weft_error_set(weftRemoteError, "recv from rank %d: it failed before this receive "
                         "took its message", c->peer_rank);
  } else {
    res = sendrecv_cma_copy(comm, c, offer, dst, stream, &refused);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    if (__atomic_load_n(&c->ctrl->poison, __ATOMIC_ACQUIRE) != 0)
      res = weft_error_set(weftRemoteError, "recv from rank %d: it failed while this receive "
                           "copied its message", c->peer_rank);
    answer_set(offer, res != weftSuccess ? ANSWER_FAILED
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
