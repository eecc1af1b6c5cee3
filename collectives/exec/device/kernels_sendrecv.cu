// The point-to-point kernel: one launch runs a group's sends and receives on
// one comm. Block b drives the lanes collectives/algo/sendrecv_steps.h gives it;
// thread 0 picks a ready lane (round robin over the block's items, posting
// order kept per lane), the block copies one chunk through the lane's slot,
// and thread 0 publishes it (tail for a send, head for a receive), with the
// ring kernels' SIMPLE fences. Each slot's head carries the message's size
// and the lane's step (sendrecv_steps.h), checked by the receiver before it
// copies. A block that gives up (abort, timeout, poison, a head that
// differs) poisons every lane it drives and records where it stopped; the
// steps it reached stay in device memory, so nothing runs on stale counters.
#include "collectives/exec/device/prims_device.cuh"

// Plain bytes for dev_reduce_copy: copy only.
struct dev_copy_bytes {
  typedef uint8_t T;
  static __device__ __forceinline__ T op(T a, T) { return a; }
  static __device__ __forceinline__ T div(T a, int) { return a; }
  static __device__ __forceinline__ T mul(T a, T) { return a; }
  static const bool premul = false;
};

enum { PICK_DONE = -1, PICK_GAVE_UP = -2 };

__device__ __forceinline__ dev_fifo *sendrecv_lane(const dev_sendrecv_work &w, const sendrecv_op &o,
                                                   int lane) {
  return o.send ? &w.peers[o.peer].send[lane] : &w.peers[o.peer].recv[lane];
}

__device__ __forceinline__ bool sendrecv_lane_ready(const dev_fifo *f, bool send) {
  return send ? f->step - dev_ld_volatile_u64(&f->ctrl->head) < f->nslots
              : dev_ld_volatile_u64(&f->ctrl->tail) > f->step;
}

// Thread 0: the block's next item to move, waiting until one is ready.
// Sets *why when it gives up.
__device__ int sendrecv_pick(const dev_sendrecv_work &w, sendrecv_block &blk, uint32_t *why) {
  // compares no signature here; where it stopped is w.stopped's
  const dev_watch watch = {w.abort_flag, w.timeout_ns, w.error, NULL, NULL};
  uint64_t start = dev_clock_ns();
  for (uint32_t spins = 0;;) {
    if (sendrecv_block_finished(&blk, w.ops, w.chunk_nbytes)) return PICK_DONE;
    for (int t = 0; t < blk.nitems; t++) {
      int k = (blk.next + t) % blk.nitems;
      if (!sendrecv_item_eligible(&blk, w.ops, w.chunk_nbytes, k)) continue;
      const sendrecv_op &o = w.ops[blk.op[k]];
      dev_fifo *f = sendrecv_lane(w, o, blk.lane[k]);
      const uint32_t poison = *(volatile uint32_t *)&f->ctrl->poison;
      if (poison != 0) {
        *why = dev_poison_why(poison);
        return PICK_GAVE_UP;
      }
      if (sendrecv_lane_ready(f, o.send)) return k;
    }
    if (dev_watch_expired(watch, start, &spins)) {
      *why = *w.error;
      return PICK_GAVE_UP;
    }
  }
}

// Thread 0, giving up: poison the block's lanes and say where it stopped.
__device__ void sendrecv_give_up(const dev_sendrecv_work &w, const sendrecv_block &blk,
                                 uint32_t why) {
  if (*(volatile uint32_t *)w.error == 0) *(volatile uint32_t *)w.error = why;
  __threadfence_system(); // our reason is recorded before a peer can see the poison
  for (int k = 0; k < blk.nitems; k++)
    *(volatile uint32_t *)&sendrecv_lane(w, w.ops[blk.op[k]], blk.lane[k])->ctrl->poison = why;
  // the first unfinished item (blocks racing here each leave a true answer;
  // mapped host memory, so plain stores rather than atomics)
  volatile uint64_t *stopped = w.stopped;
  for (int k = 0; k < blk.nitems; k++)
    if (!sendrecv_item_finished(&blk, w.ops, w.chunk_nbytes, k)) {
      if (stopped[0] == 0) {
        stopped[1] = blk.done[k];
        stopped[0] = (uint64_t)blk.op[k] + 1;
      }
      break;
    }
  __threadfence_system();
}

// One block's share of the launch.
__device__ __forceinline__ void sendrecv_kernel_run(const dev_sendrecv_work &w) {
  // what thread 0 picks for the block: in shared memory
  struct shared_state {
    sendrecv_block blk;
    int cur;
    char *in, *out;
    uint64_t size;
  };
#ifdef WEFT_CUDA_EMU
  shared_state &sh = *static_cast<shared_state *>(cuda_emu_shared(sizeof(shared_state)));
#else
  __shared__ shared_state sh;
#endif
  sendrecv_block &blk = sh.blk;
  int &cur = sh.cur;
  char *&in = sh.in, *&out = sh.out;
  uint64_t &size = sh.size;
  if (threadIdx.x == 0)
    sendrecv_block_init(&blk, w.ops, w.nops, w.chunk_nbytes, w.nlanes, w.nblocks, blockIdx.x);
  for (;;) {
    if (threadIdx.x == 0) {
      uint32_t why = 0;
      cur = sendrecv_pick(w, blk, &why);
      if (cur == PICK_GAVE_UP) sendrecv_give_up(w, blk, why);
      if (cur >= 0) {
        const sendrecv_op &o = w.ops[blk.op[cur]];
        dev_fifo *f = sendrecv_lane(w, o, blk.lane[cur]);
        uint64_t off;
        sendrecv_lane_chunk(o.nbytes, w.chunk_nbytes, blk.lane[cur], w.nlanes, blk.done[cur], &off,
                            &size);
        char *slot = f->slots + (f->step % f->nslots) * f->slot_nbytes;
        char *buf = static_cast<char *>(w.bufs[blk.op[cur]]) + off;
        in = o.send ? buf : slot + SENDRECV_HEAD_NBYTES;
        out = o.send ? slot + SENDRECV_HEAD_NBYTES : buf;
        // acquire: what the peer did before the tail (head) we saw, before
        // the block touches the slot (the barrier below passes it on)
        dev_fence_acq_rel_sys();
        // the slot's head: the sender's message size and the lane's step
        // (published with the chunk); the receiver takes the chunk only
        // where both are its own (sendrecv_steps.h)
        uint64_t head[2];
        if (o.send) {
          sendrecv_head_put(head, o.nbytes, f->step);
          const uint4 h = {(uint32_t)head[0], (uint32_t)(head[0] >> 32), (uint32_t)head[1],
                           (uint32_t)(head[1] >> 32)};
          dev_st_volatile_line(reinterpret_cast<uint4 *>(slot), h);
        } else {
          const uint4 h = dev_ld_volatile_line(reinterpret_cast<const uint4 *>(slot));
          head[0] = (uint64_t)h.x | (uint64_t)h.y << 32;
          head[1] = (uint64_t)h.z | (uint64_t)h.w << 32;
          if (!sendrecv_head_ok(head, o.nbytes, f->step)) {
            const uint64_t mine[2] = {o.nbytes, (uint64_t)blk.op[cur]};
            dev_mismatch_record(w.mismatch != NULL ? w.mismatch + blockIdx.x : NULL, w.error,
                                DEV_MISMATCH_P2P, o.peer, f->step, head[1], mine, head);
            // every lane from that peer, also those no block of this rank
            // drives here (the sender's message may span more of them)
            for (int l = 0; l < w.nlanes; l++)
              *(volatile uint32_t *)&w.peers[o.peer].recv[l].ctrl->poison = DEV_GAVE_UP_MISMATCH;
            sendrecv_give_up(w, blk, DEV_GAVE_UP_MISMATCH);
            cur = PICK_GAVE_UP;
          }
        }
      }
    }
    __syncthreads();
    if (cur < 0) return;
    dev_reduce_copy<dev_copy_bytes>(reinterpret_cast<const uint8_t *>(in), NULL,
                                    reinterpret_cast<uint8_t *>(out), NULL, size, 1);
    __syncthreads();
    if (threadIdx.x == 0) {
      // release: every thread's accesses to the slot (ordered before this by
      // the barrier), and a network FIFO's used word for it, are visible
      // system-wide before the counter moves
      const sendrecv_op &o = w.ops[blk.op[cur]];
      dev_fifo *f = sendrecv_lane(w, o, blk.lane[cur]);
      if (o.send && f->used_nbytes != NULL)
        f->used_nbytes[f->step % f->nslots] = (uint32_t)(SENDRECV_HEAD_NBYTES + size);
      dev_fence_acq_rel_sys();
      dev_st_volatile_u64(o.send ? &f->ctrl->tail : &f->ctrl->head, f->step + 1);
      f->step++;
      blk.done[cur]++;
      blk.next = cur + 1;
    }
    __syncthreads();
  }
}

extern "C" __global__ void __launch_bounds__(DEV_NTHREADS)
    weft_sendrecv_kernel(dev_sendrecv_work w) {
  sendrecv_kernel_run(w);
  dev_done_report(w.done);
}

#ifdef WEFT_CUDA_EMU // the host build for tests (tests/device/cuda_emu)
CUDA_EMU_KERNEL(&weft_sendrecv_kernel)
#endif
