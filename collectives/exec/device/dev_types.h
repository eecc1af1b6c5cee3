/* What the host side of the device executor hands the CUDA kernels. Plain C
 * structs, read by C (device_cuda.c) and CUDA (kernels.cuh) alike. All the
 * pointers in them are device pointers unless the comment says otherwise. */
#ifndef WEFT_DEV_TYPES_H
#define WEFT_DEV_TYPES_H

#include <stddef.h>
#include <stdint.h>

#include "../../algo/sendrecv_steps.h"
#include "../../algo/tree_steps.h"

/* Protocols of the device FIFOs. Each connection has one FIFO per protocol,
 * so an LL FIFO only ever holds LL lines and its flags can be trusted. */
enum dev_proto { DEV_PROTO_SIMPLE = 0, DEV_PROTO_LL = 1, DEV_NPROTOS = 2 };

/* Threads of a kernel block, at most (a small launch takes fewer), and the
 * 16-byte vectors each thread has in flight in a copy loop (one load at a
 * time leaves HBM idle). */
#define DEV_NTHREADS 512
#define DEV_UNROLL 4

/* Slots of every device FIFO (the host_fifo and network hops' too), and
 * a slot's size per protocol. */
#define DEV_NSLOTS 4
#define DEV_SIMPLE_SLOT_NBYTES (256u << 10)
#define DEV_LL_SLOT_NBYTES (16u << 10)

/* The kernel table's ops: weftRedOp_t's sum to avg, then every
 * weftRedOpCreatePreMulSum op (sum of inputs times the op's scalar). */
enum { DEV_OP_PREMULSUM = 5, DEV_NOPS = 6 };

/* An LL line: 16 bytes stored and loaded at once, two 4-byte data words each
 * beside a 4-byte flag (ll_line.h), so a slot of slot_nbytes carries at most
 * slot_nbytes / 2 bytes of payload (DEV_SLOT_ROOM). */
#define DEV_LL_LINE_NBYTES 16
#define DEV_LL_LINE_DATA_NBYTES 8

/* The receiver's side of a FIFO, in device memory that both ends map
 * (cudaMalloc'd by the receiver; the sender maps it through CUDA IPC or peer
 * access). */
struct dev_fifo_ctrl {
  uint64_t tail; /* slots filled, advanced by the sender (SIMPLE) */
  uint64_t pad0[7];
  uint64_t head; /* slots drained, advanced by the receiver (both protocols) */
  uint64_t pad1[7];
  /* nonzero once either end gave up (why: enum dev_give_up); every later
   * wait on the FIFO returns at once. Byte 128, as struct conn_ctrl's
   * poison, so a device network connection's proxy poison is seen too. */
  uint32_t poison;
  uint32_t pad2[15];
};
#define DEV_FIFO_POISON_OFFSET 128

/* Why a kernel block gave up (dev_work.error, a FIFO's poison): aborted, no
 * progress, a poisoned FIFO; the call's signature differs from the one its
 * peer sent (the block that compared); a FIFO poisoned by a block that gave
 * up for that reason, or for this one (the mismatch passed on). */
enum dev_give_up {
  DEV_GAVE_UP_ABORT = 1,
  DEV_GAVE_UP_TIMEOUT = 2,
  DEV_GAVE_UP_POISON = 3,
  DEV_GAVE_UP_MISMATCH = 4,
  DEV_GAVE_UP_PEER_MISMATCH = 5
};

/* The head of every ring and tree slot: the call's signature (struct
 * signature_packed, keyed with the FIFO's step as the host's SIMPLE slots
 * key it, dev_sig.h) in the call's first slot on each FIFO; the data follows.
 * SIMPLE: its bytes [0, 16), then the step it was written at (8 bytes: a
 * head an earlier step left is told from a signature that differs); LL: the
 * payload of the slot's first two lines (their flags say the step). 64
 * bytes, so that SIMPLE data keeps its alignment. */
#define DEV_SLOT_HEADER_NBYTES 64u
/* Payload bytes a ring or tree slot of slot_nbytes carries after its head
 * (LL: half of each line is flags), a multiple of 64 (the all-reduce's
 * chunks are). The kernels' geometry and the host's count of a launch's
 * slots (device_net_expect_ring) both take this. */
#define DEV_SLOT_ROOM(proto, slot_nbytes)                                                    \
  ((proto) == DEV_PROTO_LL                                                                   \
       ? ((slot_nbytes) - DEV_SLOT_HEADER_NBYTES) / DEV_LL_LINE_NBYTES *                     \
             DEV_LL_LINE_DATA_NBYTES / 64 * 64                                               \
       : ((slot_nbytes) - DEV_SLOT_HEADER_NBYTES) / 64 * 64)

/* Where a block found that its call's signature differs from what its
 * peer's slot carried, in mapped host memory: one record per block index
 * (dev_work.mismatch[blockIdx.x]), so that no two blocks write one; found is
 * stored last. The host reads the first found (device_comm_error). */
enum dev_mismatch_kind {
  DEV_MISMATCH_CALL = 0, /* a ring or tree slot's signature (mine, theirs: packed, keyed) */
  DEV_MISMATCH_P2P = 1   /* a send/recv chunk's head (mine: {nbytes, the group's op};
                            theirs: the head, {nbytes, step}) */
};
struct dev_mismatch {
  uint32_t found;     /* 1 once the record below is whole */
  int32_t peer;       /* the rank whose slot carried theirs */
  uint32_t kind;      /* enum dev_mismatch_kind */
  uint32_t pad;
  uint64_t step;      /* the FIFO step of that slot (theirs is keyed with it) */
  uint64_t their_step; /* the step the slot's head was written at */
  uint64_t mine[2];   /* this rank's signature (struct signature_packed) */
  uint64_t theirs[2]; /* the slot's head as it was, still keyed */
};

/* One end of one protocol's FIFO, as one kernel block sees it. */
struct dev_fifo {
  struct dev_fifo_ctrl *ctrl;
  char *slots;          /* nslots * slot_nbytes, 16-byte aligned */
  uint32_t nslots;
  uint32_t slot_nbytes;
  uint64_t step;        /* the next slot this end fills or drains; kept in
                           device memory between launches */
  uint64_t seen;        /* the peer's counter as a kernel last saw it (a send
                           FIFO's head, a receive FIFO's tail), kept beside
                           step: a launch whose slots it already allows reads
                           nothing across the link to start */
  uint32_t *used_nbytes; /* both ends of a network FIFO: [nslots], the bytes
                           each slot carries (struct conn_ctrl's
                           slot_used_nbytes), written by the sending kernel
                           before tail passes the slot, so that the proxy
                           moves those and not the whole slot; NULL where
                           the peer reads the slot in place */
};

/* One channel of a device communicator: a ring with a FIFO pair per protocol
 * to the next rank and from the previous one. Lives in device memory; the
 * kernel of a launch advances the steps, and the next launch on the stream
 * continues from them. */
struct dev_channel {
  struct dev_fifo send[DEV_NPROTOS];
  struct dev_fifo recv[DEV_NPROTOS];
  int ring_pos;
  int nranks;
  const int *ring; /* [nranks], device memory */
};

/* One channel of a device communicator's trees: a FIFO pair per protocol
 * with each neighbour this rank has in either tree (its parent and
 * children). Device memory, made on the first tree launch; the steps carry
 * on from launch to launch, as a ring channel's. */
struct dev_tree_channel {
  struct dev_fifo send[TREE_MAX_PEERS][DEV_NPROTOS];
  struct dev_fifo recv[TREE_MAX_PEERS][DEV_NPROTOS];
  int peer[TREE_MAX_PEERS];   /* the neighbours' ranks */
  int npeers;
  struct tree_links links[2]; /* this rank's place in tree 0 and tree 1 */
  struct tree_links link_small; /* and in the tree of small calls (comm_tree_small) */
};

/* How a launch tells its comm that it ended (launch_done.h). */
struct dev_done {
  uint64_t *ended; /* the comm's mapped host words, [block]: the number of the
                      last launch whose block of that index ended; NULL:
                      report nothing (a launch captured into a graph) */
  uint64_t *failed; /* the comm's mapped host word: the first launch a block of
                       which ended with the error word set (0: none yet); NULL
                       with ended */
  const uint32_t *error; /* the comm's error word (enum dev_give_up) */
  uint64_t seq;    /* this launch's number */
};

/* One launch: a ring collective over every channel, one block per channel
 * (or a tree all-reduce over the tree channels). */
struct dev_work {
  struct dev_channel *channels; /* [nchannels], device memory */
  struct dev_tree_channel *trees; /* [nchannels] of a tree launch, device memory */
  int tree_small;      /* a tree launch runs the tree of small calls, link_small, on one
                          channel (comm_tree_small) */
  const void *sendbuf;
  void *recvbuf;
  size_t count;        /* the plan's count */
  int coll;            /* enum ring_coll */
  int root;            /* broadcast and reduce, else -1 */
  int nchannels;
  int interleave;      /* loops a channel runs together (struct ring_iter) */
  int pdl;             /* launched to overlap the stream's previous kernel
                          (WEFT_DEVICE_PDL): wait for it first */
  int divisor;         /* nranks for avg, else 1 */
  int proto;           /* enum dev_proto */
  uint32_t elem_nbytes;
  volatile uint32_t *abort_flag; /* host memory mapped for the device; set on abort */
  uint32_t *error;     /* host memory mapped for the device: 1 aborted, 2 timed out */
  uint64_t timeout_ns; /* a block that waits this long without progress gives up; 0: never */
  /* pre-multiply sum: each rank's input times the scalar, read by the kernel
   * from scalar_ptr (device memory, weftScalarDevice) or else scalar_bits */
  const void *scalar_ptr;
  uint64_t scalar_bits;
  struct dev_done done;
  uint64_t sig[2];     /* the call's signature (struct signature_packed) */
  struct dev_mismatch *mismatch; /* [DEV_MAX_CHANNELS] of mapped host memory */
  struct dev_stall *stall;       /* [DEV_MAX_CHANNELS] of mapped host memory */
  int comm_nchannels;  /* the comm's channels (ring or tree, as the launch's):
                          a block that finds a mismatch poisons them all */
};

/* Where a block waited when it gave up for want of progress (mapped host
 * memory, one per block index, dev_work.stall[blockIdx.x]): the peer it
 * waited on, for what, and the connection's step; found is stored last. */
enum dev_stall_dir { DEV_STALL_RECV = 1, DEV_STALL_SEND = 2 };
struct dev_stall {
  uint32_t found;
  int32_t peer;
  uint32_t dir;  /* enum dev_stall_dir: its data (recv), or a credit for its slot (send) */
  uint32_t pad;
  uint64_t step; /* the FIFO's step it waited at */
};

/* The point-to-point lanes to and from one peer (device memory, one entry
 * per peer; the steps carry on from launch to launch). */
struct dev_sendrecv_lanes {
  struct dev_fifo send[SENDRECV_MAX_LANES];
  struct dev_fifo recv[SENDRECV_MAX_LANES];
};

/* One launch of point-to-point: a group's sends and receives on one comm,
 * scheduled by sendrecv_steps.h. Passed by value (kernel parameters: under 4 KiB). */
struct dev_sendrecv_work {
  struct dev_sendrecv_lanes *peers; /* [nranks], device memory */
  volatile uint32_t *abort_flag;
  uint32_t *error;             /* as dev_work's */
  struct dev_mismatch *mismatch; /* as dev_work's: a chunk whose head differs */
  uint64_t *stopped;           /* mapped host memory: [0] op + 1, [1] chunks done, where a
                                  block gave up (the first to record it) */
  uint64_t timeout_ns;
  uint64_t chunk_nbytes;       /* a slot less its head (sendrecv_chunk_room) */
  int nops;
  int nblocks;
  int nlanes;                  /* lanes per peer and direction (the comm's) */
  struct dev_done done;
  struct sendrecv_op ops[SENDRECV_MAX_OPS];
  void *bufs[SENDRECV_MAX_OPS];
};

#endif
