/* Connections: one direction between two ranks on one channel. The receiver
 * owns a FIFO of slots; the sender fills slot (step % nslots) and advances
 * tail; the receiver drains it and advances head, which returns the credit.
 * Memory transports (shm) place the FIFO where both ranks load and store
 * directly, so the algorithms above see one kind of connection. */
#ifndef WEFT_TRANSPORT_H
#define WEFT_TRANSPORT_H

#include <assert.h>
#include <stdarg.h>
#include <stdalign.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "../include/weft.h"
#include "base/param_load.h"
#include "bootstrap/bootstrap.h"

/* The transports' choice (WEFT_TRANSPORT, transport.c) and the shared-memory
 * transport's settings (shm/shm_conn.c). */
extern struct weft_param transport_params[];
extern struct weft_param shm_params[];

#define CONN_BLOB_BYTES 256

#define CONN_MAX_SLOTS 64

/* Shared between both ends, at the start of the FIFO's memory. */
struct conn_ctrl {
  alignas(64) uint64_t tail;   /* slots filled, advanced by the sender */
  alignas(64) uint64_t head;   /* slots drained, advanced by the receiver */
  alignas(64) uint32_t poison; /* set by either end when it fails or aborts */
  /* bytes the sender put in each slot, written before tail moves past it */
  alignas(64) uint32_t slot_used_nbytes[CONN_MAX_SLOTS];
  /* the point-to-point algorithm's (collectives/algo/sendrecv_cma.c): the
   * offer of a message the receiver may copy from the sender's memory, with
   * its answer, outside the slots so that the message fills them whole when
   * the offer is taken back */
  alignas(64) unsigned char p2p_offer[128];
};

struct weft_transport;

/* A bulk transfer in flight (struct weft_bulk_ops). */
struct weft_bulk_req {
  void *handle; /* the transport's */
  size_t nbytes;
};

struct weft_conn {
  struct conn_ctrl *ctrl;
  char *slots;         /* nslots * slot_nbytes bytes */
  uint32_t nslots;
  size_t slot_nbytes;
  uint64_t step;       /* the next slot number this end will fill or drain */
  uint64_t head_seen;  /* sender: ctrl->head as last loaded (conn_send_ready) */
  /* receiver, point-to-point (collectives/algo/p2p_slot.h): the slots whose
   * last content was a header it took, and the step after that one */
  uint64_t p2p_clean, p2p_end;
  /* sender, point-to-point: the step after the last offer's slot (the
   * control block's offer area is that offer's until head passes it) */
  uint64_t p2p_offer_end;
  int peer_rank;
  pid_t peer_pid;      /* watched while waiting, when the peer shares the host */
  const struct weft_transport *transport;
  void *priv;          /* the transport's own state */
  struct bootstrap *bs; /* the communicator's: transports may exchange set-up data */
  const struct proxy_fifo_mem *fifo_mem; /* network transports: FIFO memory (NULL: private) */
};

/* step % nslots: the slot of a FIFO that a step lands in, without a
 * division where nslots is a power of two (the default, 8): a 64-bit
 * division takes tens of cycles, and a small call works out several. */
static inline uint64_t slot_index(uint64_t step, uint32_t nslots) {
  return __builtin_expect((nslots & (nslots - 1)) == 0, 1) ? step & (nslots - 1)
                                                             : step % nslots;
}

/* Whether the sender may fill the slot at c->step: the receiver has drained
 * enough of the slots before it. ctrl->head is loaded only when the value seen
 * last leaves no room: the receiver writes that line on every slot, and a
 * load that misses holds back the stores after it (the slot's data and tail)
 * until the line arrives, one cache-line transfer more before the receiver
 * sees them. head only grows, so an old value errs on the safe side. */
static inline int conn_send_ready(struct weft_conn *c) {
  if (c->step - c->head_seen < c->nslots) return 1;
  c->head_seen = __atomic_load_n(&c->ctrl->head, __ATOMIC_ACQUIRE);
  return c->step - c->head_seen < c->nslots;
}

/* The slot that step lands in. */
static inline char *conn_slot(const struct weft_conn *c, uint64_t step) {
  return c->slots + slot_index(step, c->nslots) * c->slot_nbytes;
}

/* Sender: hands the slot at c->step to the receiver with used (its bytes
 * and the algorithm's flags) and moves on: slot_used_nbytes, then tail. */
static inline void conn_send_post(struct weft_conn *c, uint32_t used) {
  c->ctrl->slot_used_nbytes[slot_index(c->step, c->nslots)] = used;
  c->step++;
  __atomic_store_n(&c->ctrl->tail, c->step, __ATOMIC_RELEASE);
}

/* What the receiver sends the sender so it can attach: opaque per transport. */
struct conn_blob {
  int32_t transport; /* index in weft_transports, or -1: no transport fits */
  uint32_t reserved;
  uint8_t data[CONN_BLOB_BYTES - 8];
};
static_assert(sizeof(struct conn_blob) == CONN_BLOB_BYTES, "conn blob size");

/* What a transport can do (struct weft_transport's caps): the layers above
 * test these, never a transport's name. */
enum transport_cap {
  /* The FIFO is host memory that both ranks load and store directly: the
   * ranks share a host, and may also reach each other's memory. */
  TRANSPORT_CAP_HOST_MEMORY = 1u << 0,
  /* bulk.progress on any connection moves every connection's transfers of
   * this process (one worker per process), so one call per pass is enough. */
  TRANSPORT_CAP_PROGRESS_ALL = 1u << 1,
  /* The FIFO is GPU memory that device kernels load and store. */
  TRANSPORT_CAP_DEVICE_MEMORY = 1u << 2,
  /* A device kernel's FIFO in pinned host memory that the kernels of both
   * ranks map (struct weft_conn's fifo_mem). */
  TRANSPORT_CAP_PINNED_FIFO = 1u << 3,
};

/* What a connection is asked to carry, beside its two ends. */
enum transport_mem {
  TRANSPORT_MEM_HOST,   /* the host executor's FIFO (host buffers) */
  TRANSPORT_MEM_DEVICE, /* a device kernel's FIFO (device buffers) */
};
struct transport_need {
  enum transport_mem mem;
  /* device memory on one host: the sender's GPU reaches the memory of the
   * receiver's GPU (one GPU, or peer access between the two) */
  int peer_access;
};

struct weft_transport {
  const char *name;
  unsigned caps; /* enum transport_cap */
  /* The variable that turns this transport off, for messages. */
  const char *disable_env;
  /* Whether the environment turned this transport off (disable_env). */
  int (*disabled)(void);
  /* Whether this transport can carry data from sender to receiver as need
   * asks; where it cannot, a short reason in why (when why_nbytes > 0). */
  int (*can_connect)(const struct peer_info *sender, const struct peer_info *receiver,
                     const struct transport_need *need, char *why, size_t why_nbytes);
  /* Receiver: allocates the FIFO (conn->nslots and slot_nbytes are set) and
   * describes it in blob. Does not block. */
  weftResult_t (*recv_setup)(struct weft_conn *conn, struct conn_blob *blob_out);
  /* Sender: attaches to the receiver's FIFO described by blob. Does not block. */
  weftResult_t (*send_connect)(struct weft_conn *conn, const struct conn_blob *blob);
  /* Receiver: called once every sender has attached. Does not block. */
  weftResult_t (*recv_connect)(struct weft_conn *conn);
  /* Either end: releases the connection. Never fails. */
  void (*close)(struct weft_conn *conn);
  /* Optional (transports whose slots a thread of their own moves): a rank is
   * about to use conn, so that thread polls without sleeping a while and is
   * woken if it sleeps; now_ns is clock_ns(). Cheap while it is kept busy. */
  void (*kick)(const struct weft_conn *conn, uint64_t now_ns);
  /* Optional (network transports): whole buffers moved outside the slots,
   * straight from the sender's memory into the receiver's. The transport
   * keeps referring to buf until the request completes. */
  struct weft_bulk_ops {
    /* Sends of more bytes than this may be read by the peer's process
     * after the send was given up (cancel): a rendezvous that the peer
     * answers late, which nothing can take back. The caller sends such
     * messages only from memory it keeps mapped while the transport may
     * hold them, never from a buffer its caller may free. Smaller sends
     * the transport copies out or finishes on this end alone. */
    size_t (*peer_reads_above)(const struct weft_conn *conn);
    /* A send (on a send end) or a receive (on a receive end) of exactly
     * nbytes, matched with the peer's by id. Does not block. */
    weftResult_t (*post)(struct weft_conn *conn, void *buf, size_t nbytes, uint32_t id,
                         struct weft_bulk_req *req);
    /* weftInProgress, or how req ended (then the transport has let go of it;
     * a receive of other than nbytes is an error). */
    weftResult_t (*test)(struct weft_conn *conn, struct weft_bulk_req *req);
    /* Moves the conn's transfers along once. */
    void (*progress)(struct weft_conn *conn);
    /* Ends req early: the connection fails (it is of no further use), and
     * the transport lets go of req's buffer. Then test says how it ended. */
    void (*cancel)(struct weft_conn *conn, struct weft_bulk_req *req);
    /* Optional: bracket a bulk call. In between, the calling thread keeps
     * calling progress, which then does all of the transport's background
     * work, so that a thread of the transport's own can wait meanwhile
     * rather than take turns with the caller on its core. */
    void (*begin)(struct weft_conn *conn);
    void (*end)(struct weft_conn *conn);
  } bulk;
};

/* Every transport, host and device memory alike, in order of preference
 * (transport.c). NULL-terminated. A blob's transport indexes it. */
extern const struct weft_transport *const weft_transports[];

/* Marks in info->transports_off the transports this rank's settings turn
 * off (WEFT_TRANSPORT naming another, or its own disable setting). */
void transport_peer_info(struct peer_info *info);

/* The index in weft_transports of the first transport that is off on
 * neither end (transports_off of each, and this rank's settings) and whose
 * can_connect carries what need asks from sender to receiver; else -1, with
 * a message that names both ranks and why each transport cannot in why
 * (why_nbytes > 0). */
int transport_select(const struct peer_info *sender, const struct peer_info *receiver,
                     const struct transport_need *need, char *why, size_t why_nbytes);

/* A transport's reason for can_connect's why: formats into why when there
 * is room, and returns 0 (cannot connect). */
int transport_refuse(char *why, size_t why_nbytes, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Checks that the peer's FIFO (peer_fifo_nbytes of slots) has this end's
 * shape: every transport refuses ranks whose WEFT_NSLOTS/WEFT_SLOT_BYTES differ. */
weftResult_t transport_check_fifo(int peer_rank, uint32_t nslots, size_t slot_nbytes,
                                  uint64_t peer_fifo_nbytes);

/* Connections of this process whose kick does something (those a proxy
 * thread moves: transport/proxy.c counts them as they join and leave a
 * proxy). While there are none, a rank about to use its connections need
 * not ask each of them. */
extern uint32_t transport_kickable_conns;
static inline int transport_kicks_matter(void) {
  return __atomic_load_n(&transport_kickable_conns, __ATOMIC_RELAXED) != 0;
}

/* Marks a connection failed so that the peer's waits end with an error. */
static inline void conn_poison(struct weft_conn *conn) {
  if (conn->ctrl != NULL) __atomic_store_n(&conn->ctrl->poison, 1u, __ATOMIC_RELEASE);
}

#endif
