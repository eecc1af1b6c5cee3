// A host emulation of the device point-to-point kernel (device/kernels_p2p.cuh):
// each kernel block is a host thread that runs the schedule of
// collectives/algo/p2p_steps.h on FIFOs in host memory laid out as the
// device's (struct dev_fifo_ctrl, then the slots), with the kernel's order of
// loads and stores: a sender waits for a credit (step - head < nslots), fills
// the slot and publishes tail = step + 1; a receiver waits for tail > step,
// drains the slot and returns head = step + 1. A block that gives up (abort
// or no progress within the timeout) poisons every lane it drives and keeps
// the steps it reached; a block that sees poison on a lane gives up at once.
#ifndef WEFT_TESTS_P2P_EMU_H
#define WEFT_TESTS_P2P_EMU_H

#include <sched.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include <atomic>
#include <functional>
#include <memory>
#include <vector>

extern "C" {
#include "collectives/algo/p2p_steps.h"
#include "collectives/exec/device/dev_types.h"
}

namespace weft_test {

inline uint64_t p2p_emu_now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

// The lanes of every ordered pair of nranks ranks: fifo(a, b, l) is the
// receiver b's FIFO from a on lane l, of which a keeps the sending end and b
// the receiving end (each with its own step, as in device memory).
struct P2pEmuNet {
  int nranks;
  int nlanes; // per pair and direction, as WEFT_P2P_LANES
  uint32_t nslots;
  uint32_t slot_nbytes;
  std::vector<std::unique_ptr<char[]>> mem;
  std::vector<dev_fifo> send_end, recv_end; // [a][b][lane]

  P2pEmuNet(int n, uint32_t slots, uint32_t slot_bytes, int lanes = P2P_DEFAULT_LANES)
      : nranks(n), nlanes(lanes), nslots(slots), slot_nbytes(slot_bytes) {
    size_t nf = (size_t)n * n * lanes;
    send_end.resize(nf);
    recv_end.resize(nf);
    for (size_t f = 0; f < nf; f++) {
      mem.emplace_back(new char[sizeof(dev_fifo_ctrl) + (size_t)slots * slot_bytes]());
      dev_fifo x = {reinterpret_cast<dev_fifo_ctrl *>(mem.back().get()),
                    mem.back().get() + sizeof(dev_fifo_ctrl), slots, slot_bytes, 0};
      send_end[f] = recv_end[f] = x;
    }
  }
  size_t index(int from, int to, int lane) const {
    return ((size_t)from * nranks + to) * nlanes + lane;
  }
  // rank's end of the lane that op uses
  dev_fifo *end(int rank, const p2p_op &op, int lane) {
    return op.send ? &send_end[index(rank, op.peer, lane)]
                   : &recv_end[index(op.peer, rank, lane)];
  }
};

enum P2pEmuResult { P2P_EMU_OK = 0, P2P_EMU_ABORTED = 1, P2P_EMU_TIMED_OUT = 2,
                    P2P_EMU_POISONED = 3 };

// What one block of one rank's launch did.
struct P2pEmuBlockOut {
  int result = P2P_EMU_OK;
  uint64_t chunks = 0;
};

// Runs block b of rank's launch (ops with bufs[i] the message's buffer).
// after_chunk, if set, is called after each chunk a send moves.
inline P2pEmuBlockOut p2p_emu_block(P2pEmuNet &net, int rank, const std::vector<p2p_op> &ops,
                                    const std::vector<char *> &bufs, int nblocks, int b,
                                    const std::atomic<int> *abort_flag, uint64_t timeout_ns,
                                    const std::function<void(uint64_t)> &after_chunk = nullptr) {
  P2pEmuBlockOut out;
  auto blk = std::make_unique<p2p_block>();
  const uint64_t chunk = net.slot_nbytes;
  const int nops = (int)ops.size();
  p2p_block_init(blk.get(), ops.data(), nops, chunk, net.nlanes, nblocks, b);
  uint64_t last = p2p_emu_now_ns();
  for (uint32_t spins = 1; !p2p_block_finished(blk.get(), ops.data(), chunk); spins++) {
    bool moved = false, poisoned = false;
    for (int t = 0; t < blk->nitems && !moved; t++) {
      int k = (blk->next + t) % blk->nitems;
      if (!p2p_item_eligible(blk.get(), ops.data(), chunk, k)) continue;
      const p2p_op &o = ops[blk->op[k]];
      dev_fifo *f = net.end(rank, o, blk->lane[k]);
      if (__atomic_load_n(&f->ctrl->poison, __ATOMIC_ACQUIRE) != 0) {
        poisoned = true; // the kernel checks before it waits or moves
        break;
      }
      uint64_t off, size;
      p2p_lane_chunk(o.nbytes, chunk, blk->lane[k], net.nlanes, blk->done[k], &off, &size);
      char *slot = f->slots + (f->step % f->nslots) * f->slot_nbytes;
      if (o.send) {
        if (f->step - __atomic_load_n(&f->ctrl->head, __ATOMIC_ACQUIRE) >= f->nslots) continue;
        memcpy(slot, bufs[blk->op[k]] + off, size);
        __atomic_store_n(&f->ctrl->tail, f->step + 1, __ATOMIC_RELEASE);
      } else {
        if (__atomic_load_n(&f->ctrl->tail, __ATOMIC_ACQUIRE) <= f->step) continue;
        memcpy(bufs[blk->op[k]] + off, slot, size);
        __atomic_store_n(&f->ctrl->head, f->step + 1, __ATOMIC_RELEASE);
      }
      f->step++;
      blk->done[k]++;
      blk->next = k + 1;
      moved = true;
      out.chunks++;
      if (o.send && after_chunk) after_chunk(out.chunks);
    }
    if (moved) last = p2p_emu_now_ns();
    int why = P2P_EMU_OK;
    if (poisoned) why = P2P_EMU_POISONED;
    else if (spins % 64 == 0 && abort_flag != nullptr && abort_flag->load() != 0)
      why = P2P_EMU_ABORTED;
    else if (!moved && spins % 64 == 0 && p2p_emu_now_ns() - last > timeout_ns)
      why = P2P_EMU_TIMED_OUT;
    if (why != P2P_EMU_OK) {
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
