/* Point-to-point on device memory as a schedule: one source for the kernel
 * and for the host's tests of it.
 *
 * A group's sends and receives on one comm run as one kernel. Between two
 * ranks, each direction has nlanes FIFOs (lanes; WEFT_P2P_LANES, the same on
 * every rank of a comm). A message is cut into chunks of one slot's room
 * (the slot less its head, below); chunk j
 * travels on lane j % nlanes. Both ends know
 * the message's size and its place among the messages of that pair and
 * direction, so they agree on every chunk's lane without talking, and since
 * each lane is a FIFO that both ends walk in posting order, messages between
 * a pair arrive in the order they were posted (NCCL's rule).
 *
 * Which kernel block drives which lane is the sender's or receiver's own
 * affair: the (peer, direction) pairs of the launch are numbered in order of
 * first use, and lane l of pair q goes to block (q * nlanes + l) % nblocks.
 * A block owns every item (message, lane) on its lanes, keeps them in
 * posting order per lane, and moves one chunk at a time on whichever of its
 * lanes is ready, so no order of sends and receives can deadlock as long as
 * every rank's blocks run at once.
 *
 * Every chunk's slot starts with a head of SENDRECV_HEAD_NBYTES, the chunk's
 * data after it: the message's size and the lane's step the slot was
 * written at (sendrecv_head_put). A receiver takes a chunk only when the
 * head holds its own message's size and the step it reads
 * (sendrecv_head_ok): a send and a receive of different sizes (neither
 * empty), or a lane whose steps no longer pair up, are refused at the
 * receiver's first chunk on each lane rather than read past or into the
 * next message.
 *
 * A message of 0 bytes moves nothing (the API drops empty sends and
 * receives before they get here, on both ends alike when they agree; an
 * empty receive against a send leaves the send's chunks to that peer's next
 * receive, whose head then refuses them unless it has the same size).
 * Sends and receives to this rank itself
 * do not use FIFOs: the k-th send to self is copied into the k-th receive
 * from self (sendrecv_self_match).
 *
 * Compiles as C11, C++ and CUDA (host and device). */
#ifndef WEFT_SENDRECV_STEPS_H
#define WEFT_SENDRECV_STEPS_H

#include <stddef.h>
#include <stdint.h>

#if defined(__CUDACC__)
#define SENDRECV_HD static __host__ __device__ __forceinline__
#else
#define SENDRECV_HD static inline
#endif

#define SENDRECV_MAX_LANES 8     /* FIFOs per peer and direction, at most */
#define SENDRECV_DEFAULT_LANES 2 /* ... unless WEFT_P2P_LANES says otherwise */
#define SENDRECV_MAX_OPS 128     /* sends and receives of one comm in one launch */
#define SENDRECV_MAX_ITEMS (SENDRECV_MAX_OPS * SENDRECV_MAX_LANES)

/* A slot's head: 16 bytes used of 64, so that the data after it keeps the
 * slot's alignment. */
#define SENDRECV_HEAD_NBYTES 64

/* The data one chunk carries in a slot of slot_nbytes. */
SENDRECV_HD uint64_t sendrecv_chunk_room(uint64_t slot_nbytes) {
  return slot_nbytes - SENDRECV_HEAD_NBYTES;
}

/* The head a sender writes into the slot of lane step `step` for a message
 * of nbytes: the size, then the step. */
SENDRECV_HD void sendrecv_head_put(uint64_t head[2], uint64_t nbytes, uint64_t step) {
  head[0] = nbytes;
  head[1] = step;
}
/* Whether a receiver of a message of nbytes at lane step `step` may take the
 * slot whose head is head: the same size, written at this step (a head an
 * earlier step left says another). */
SENDRECV_HD int sendrecv_head_ok(const uint64_t head[2], uint64_t nbytes, uint64_t step) {
  return head[0] == nbytes && head[1] == step;
}

/* One send or receive of a launch, as the kernel reads it. */
struct sendrecv_op {
  uint64_t nbytes;
  int32_t peer;
  uint8_t send;  /* 1: send to peer, 0: receive from peer */
  uint8_t self;  /* peer is this rank: copied by the host, not scheduled */
  uint16_t pair; /* the (peer, direction) pair's number, in order of first use */
};

/* Chunks of a message (0 for 0 bytes). */
SENDRECV_HD uint64_t sendrecv_nchunks(uint64_t nbytes, uint64_t chunk_nbytes) {
  return (nbytes + chunk_nbytes - 1) / chunk_nbytes;
}

/* Chunks of a message that travel on lane l of nlanes. */
SENDRECV_HD uint64_t sendrecv_lane_nchunks(uint64_t nbytes, uint64_t chunk_nbytes, int lane,
                                           int nlanes) {
  uint64_t n = sendrecv_nchunks(nbytes, chunk_nbytes);
  return n > (uint64_t)lane ? (n - (uint64_t)lane + (uint64_t)nlanes - 1) / (uint64_t)nlanes : 0;
}

/* The k-th chunk on lane l of nlanes: its byte offset in the message and its
 * size. */
SENDRECV_HD void sendrecv_lane_chunk(uint64_t nbytes, uint64_t chunk_nbytes, int lane, int nlanes,
                                     uint64_t k, uint64_t *offset, uint64_t *size) {
  uint64_t off = ((uint64_t)lane + k * (uint64_t)nlanes) * chunk_nbytes;
  *offset = off;
  *size = nbytes - off < chunk_nbytes ? nbytes - off : chunk_nbytes;
}

/* Numbers the (peer, direction) pairs of ops in order of first use (self ops
 * get none) and returns how many there are. Host side, before the launch. */
SENDRECV_HD int sendrecv_assign_pairs(struct sendrecv_op *ops, int nops) {
  int npairs = 0;
  for (int i = 0; i < nops; i++) {
    if (ops[i].self) continue;
    int q = -1;
    for (int j = 0; j < i && q < 0; j++)
      if (!ops[j].self && ops[j].peer == ops[i].peer && ops[j].send == ops[i].send)
        q = ops[j].pair;
    ops[i].pair = (uint16_t)(q >= 0 ? q : npairs++);
  }
  return npairs;
}

/* Blocks a launch with npairs pairs of nlanes lanes uses, at most max_blocks. */
SENDRECV_HD int sendrecv_nblocks(int npairs, int nlanes, int max_blocks) {
  int want = npairs * nlanes;
  return want < max_blocks ? (want > 0 ? want : 1) : max_blocks;
}

/* The block that drives lane l of pair q. */
SENDRECV_HD int sendrecv_block_of(int pair, int lane, int nlanes, int nblocks) {
  return (pair * nlanes + lane) % nblocks;
}

/* One block's share of a launch: its items (message, lane) in posting order
 * and the chunks each has moved. */
struct sendrecv_block {
  int nlanes;
  int nitems;
  uint16_t op[SENDRECV_MAX_ITEMS];
  uint8_t lane[SENDRECV_MAX_ITEMS];
  uint32_t done[SENDRECV_MAX_ITEMS];
  int next; /* where the round-robin search starts */
};

SENDRECV_HD void sendrecv_block_init(struct sendrecv_block *blk, const struct sendrecv_op *ops,
                                     int nops, uint64_t chunk_nbytes, int nlanes, int nblocks,
                                     int b) {
  blk->nlanes = nlanes;
  blk->nitems = 0;
  blk->next = 0;
  for (int i = 0; i < nops; i++)
    for (int l = 0; l < nlanes; l++) {
      if (ops[i].self || sendrecv_lane_nchunks(ops[i].nbytes, chunk_nbytes, l, nlanes) == 0)
        continue;
      if (sendrecv_block_of(ops[i].pair, l, nlanes, nblocks) != b) continue;
      blk->op[blk->nitems] = (uint16_t)i;
      blk->lane[blk->nitems] = (uint8_t)l;
      blk->done[blk->nitems] = 0;
      blk->nitems++;
    }
}

SENDRECV_HD int sendrecv_item_finished(const struct sendrecv_block *blk,
                                       const struct sendrecv_op *ops, uint64_t chunk_nbytes,
                                       int k) {
  return blk->done[k] >=
         sendrecv_lane_nchunks(ops[blk->op[k]].nbytes, chunk_nbytes, blk->lane[k], blk->nlanes);
}

/* Whether item k may move now: unfinished, and every earlier item on its
 * lane (same peer, direction and lane) finished, so a lane carries its
 * messages in posting order. */
SENDRECV_HD int sendrecv_item_eligible(const struct sendrecv_block *blk,
                                       const struct sendrecv_op *ops, uint64_t chunk_nbytes,
                                       int k) {
  if (sendrecv_item_finished(blk, ops, chunk_nbytes, k)) return 0;
  const struct sendrecv_op *o = &ops[blk->op[k]];
  for (int j = 0; j < k; j++) {
    const struct sendrecv_op *e = &ops[blk->op[j]];
    if (blk->lane[j] == blk->lane[k] && e->peer == o->peer && e->send == o->send &&
        !sendrecv_item_finished(blk, ops, chunk_nbytes, j))
      return 0;
  }
  return 1;
}

/* Whether every item of the block is finished. */
SENDRECV_HD int sendrecv_block_finished(const struct sendrecv_block *blk,
                                        const struct sendrecv_op *ops, uint64_t chunk_nbytes) {
  for (int k = 0; k < blk->nitems; k++)
    if (!sendrecv_item_finished(blk, ops, chunk_nbytes, k)) return 0;
  return 1;
}

/* The index of the receive from self that the send ops[i] (to self) fills:
 * the k-th send to self goes to the k-th receive from self. -1 if none. */
SENDRECV_HD int sendrecv_self_match(const struct sendrecv_op *ops, int nops, int i) {
  int k = 0;
  for (int j = 0; j < i; j++) k += ops[j].self && ops[j].send;
  for (int j = 0; j < nops; j++)
    if (ops[j].self && !ops[j].send && k-- == 0) return j;
  return -1;
}

#endif
