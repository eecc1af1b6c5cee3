// A host emulation of the device point-to-point kernel (device/kernels_sendrecv.cuh):
// each kernel block is a host thread that runs the schedule of
// collectives/algo/sendrecv_steps.h on FIFOs in host memory laid out as the
// device's (struct dev_fifo_ctrl, then the slots), with the kernel's order of
// loads and stores: a sender waits for a credit (step - head < nslots), fills
// the slot (its head, sendrecv_head_put, then the chunk) and publishes
// tail = step + 1; a receiver waits for tail > step, checks the head
// (sendrecv_head_ok), drains the slot and returns head = step + 1. A block
// that gives up (abort, no progress within the timeout, a head that
// differs) poisons every lane it drives and keeps the steps it reached; a
// block that sees poison on a lane gives up at once.
#ifndef WEFT_TESTS_SENDRECV_EMU_H
#define WEFT_TESTS_SENDRECV_EMU_H

#include <sched.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include <atomic>
#include <functional>
#include <memory>
#include <vector>

extern "C" {
#include "collectives/algo/sendrecv_steps.h"
#include "collectives/exec/device/dev_types.h"
}

namespace weft_test {

inline uint64_t sendrecv_emu_now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

// The lanes of every ordered pair of nranks ranks: fifo(a, b, l) is the
// receiver b's FIFO from a on lane l, of which a keeps the sending end and b
// the receiving end (each with its own step, as in device memory).
struct SendrecvEmuNet {
  int nranks;
  int nlanes; // per pair and direction, as WEFT_P2P_LANES
  uint32_t nslots;
  uint32_t slot_nbytes; // a chunk's data; each slot is its head and this
  std::vector<std::unique_ptr<char[]>> mem;
  std::vector<dev_fifo> send_end, recv_end; // [a][b][lane]

  SendrecvEmuNet(int n, uint32_t slots, uint32_t slot_bytes, int lanes = SENDRECV_DEFAULT_LANES)
      : nranks(n), nlanes(lanes), nslots(slots), slot_nbytes(slot_bytes) {
    size_t nf = (size_t)n * n * lanes;
    send_end.resize(nf);
    recv_end.resize(nf);
    for (size_t f = 0; f < nf; f++) {
      const uint32_t stride = slot_bytes + SENDRECV_HEAD_NBYTES;
      mem.emplace_back(new char[sizeof(dev_fifo_ctrl) + (size_t)slots * stride]());
      dev_fifo x = {reinterpret_cast<dev_fifo_ctrl *>(mem.back().get()),
                    mem.back().get() + sizeof(dev_fifo_ctrl), slots, stride, 0};
      send_end[f] = recv_end[f] = x;
    }
  }
  size_t index(int from, int to, int lane) const {
    return ((size_t)from * nranks + to) * nlanes + lane;
  }
  // rank's end of the lane that op uses
  dev_fifo *end(int rank, const sendrecv_op &op, int lane) {
    return op.send ? &send_end[index(rank, op.peer, lane)]
                   : &recv_end[index(op.peer, rank, lane)];
  }
};

enum SendrecvEmuResult { SENDRECV_EMU_OK = 0, SENDRECV_EMU_ABORTED = 1, SENDRECV_EMU_TIMED_OUT = 2,
                    SENDRECV_EMU_POISONED = 3, SENDRECV_EMU_MISMATCH = 4,
                    SENDRECV_EMU_PEER_MISMATCH = 5 };

// What one block of one rank's launch did.
struct SendrecvEmuBlockOut {
  int result = SENDRECV_EMU_OK;
  uint64_t chunks = 0;
  uint64_t their_nbytes = 0; // SENDRECV_EMU_MISMATCH: the head's size
};

// Runs block b of rank's launch (ops with bufs[i] the message's buffer).
// after_chunk, if set, is called after each chunk a send moves. rank_error,
// if set, is the rank's error word, shared by its blocks: a block that
// refuses a head sets it, and the others give up when they see it.
inline SendrecvEmuBlockOut sendrecv_emu_block(
    SendrecvEmuNet &net, int rank, const std::vector<sendrecv_op> &ops,
    const std::vector<char *> &bufs, int nblocks, int b, const std::atomic<int> *abort_flag,
    uint64_t timeout_ns, const std::function<void(uint64_t)> &after_chunk = nullptr,
    std::atomic<int> *rank_error = nullptr) {
  SendrecvEmuBlockOut out;
  auto blk = std::make_unique<sendrecv_block>();
  const uint64_t chunk = net.slot_nbytes;
  const int nops = (int)ops.size();
  sendrecv_block_init(blk.get(), ops.data(), nops, chunk, net.nlanes, nblocks, b);
  uint64_t last = sendrecv_emu_now_ns();
  for (uint32_t spins = 1; !sendrecv_block_finished(blk.get(), ops.data(), chunk); spins++) {
    bool moved = false, mismatched = false;
    uint32_t poisoned = 0;
    for (int t = 0; t < blk->nitems && !moved; t++) {
      int k = (blk->next + t) % blk->nitems;
      if (!sendrecv_item_eligible(blk.get(), ops.data(), chunk, k)) continue;
      const sendrecv_op &o = ops[blk->op[k]];
      dev_fifo *f = net.end(rank, o, blk->lane[k]);
      poisoned = __atomic_load_n(&f->ctrl->poison, __ATOMIC_ACQUIRE);
      if (poisoned != 0) break; // the kernel checks before it waits or moves
      uint64_t off, size;
      sendrecv_lane_chunk(o.nbytes, chunk, blk->lane[k], net.nlanes, blk->done[k], &off, &size);
      char *slot = f->slots + (f->step % f->nslots) * f->slot_nbytes;
      uint64_t head[2];
      if (o.send) {
        if (f->step - __atomic_load_n(&f->ctrl->head, __ATOMIC_ACQUIRE) >= f->nslots) continue;
        sendrecv_head_put(head, o.nbytes, f->step);
        memcpy(slot, head, sizeof head);
        memcpy(slot + SENDRECV_HEAD_NBYTES, bufs[blk->op[k]] + off, size);
        __atomic_store_n(&f->ctrl->tail, f->step + 1, __ATOMIC_RELEASE);
      } else {
        if (__atomic_load_n(&f->ctrl->tail, __ATOMIC_ACQUIRE) <= f->step) continue;
        memcpy(head, slot, sizeof head);
        if (!sendrecv_head_ok(head, o.nbytes, f->step)) {
          mismatched = true;
          out.their_nbytes = head[0];
          if (rank_error != nullptr) rank_error->store(SENDRECV_EMU_MISMATCH);
          for (int l = 0; l < net.nlanes; l++) // every lane from that peer
            __atomic_store_n(&net.recv_end[net.index(o.peer, rank, l)].ctrl->poison,
                             (uint32_t)SENDRECV_EMU_MISMATCH, __ATOMIC_RELEASE);
          break;
        }
        memcpy(bufs[blk->op[k]] + off, slot + SENDRECV_HEAD_NBYTES, size);
        __atomic_store_n(&f->ctrl->head, f->step + 1, __ATOMIC_RELEASE);
      }
      f->step++;
      blk->done[k]++;
      blk->next = k + 1;
      moved = true;
      out.chunks++;
      if (o.send && after_chunk) after_chunk(out.chunks);
    }
    if (moved) last = sendrecv_emu_now_ns();
    int why = SENDRECV_EMU_OK;
    // as the kernel: poison left by a refusal (or passed on from one) is a
    // peer's mismatch; the rank's error word is looked at only while
    // nothing is ready
    if (mismatched) why = SENDRECV_EMU_MISMATCH;
    else if (poisoned != 0)
      why = poisoned == SENDRECV_EMU_MISMATCH || poisoned == SENDRECV_EMU_PEER_MISMATCH
                ? SENDRECV_EMU_PEER_MISMATCH
                : SENDRECV_EMU_POISONED;
    else if (spins % 64 == 0 && abort_flag != nullptr && abort_flag->load() != 0)
      why = SENDRECV_EMU_ABORTED;
    else if (!moved && spins % 64 == 0 && rank_error != nullptr &&
             rank_error->load() == SENDRECV_EMU_MISMATCH)
      why = SENDRECV_EMU_MISMATCH; // another block of this rank refused
    else if (!moved && spins % 64 == 0 && sendrecv_emu_now_ns() - last > timeout_ns)
      why = SENDRECV_EMU_TIMED_OUT;
    if (why != SENDRECV_EMU_OK) {
      // as the kernel: poison every lane this block drives, keep the steps
      for (int k = 0; k < blk->nitems; k++) {
        dev_fifo *f = net.end(rank, ops[blk->op[k]], blk->lane[k]);
        __atomic_store_n(&f->ctrl->poison, (uint32_t)why, __ATOMIC_RELEASE);
      }
      out.result = why;
      return out;
    }
    if (!moved) sched_yield();
  }
  return out;
}

}  // namespace weft_test

#endif
