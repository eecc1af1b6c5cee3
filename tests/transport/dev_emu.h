// A host emulation of the device kernels' slot protocol (prims_device.cuh,
// SIMPLE): a host thread plays one kernel block on the FIFOs of device
// network connections, with the same layout (struct dev_fifo_ctrl: tail at
// byte 0, head at byte 64; then the slots) and the same order of loads and
// stores: a sender waits for a free slot (step - head < nslots), fills it and
// publishes tail = step + 1 (on a network FIFO, after writing the bytes the
// slot carries in its used word); a receiver waits for tail > step, drains the
// slot and returns the credit head = step + 1. A message of nbytes takes
// ceil(nbytes / slot_nbytes) slots, and at least one. A sender fills the rest
// of each slot with kEmuSlotFiller, which no receiver may get: the proxy
// moves the used bytes only.
//
// Like the kernel, it gives up when the abort flag is raised (here by the
// emulated host executor: some connection's proxy poisoned it), when the
// poison word (byte 128 of struct dev_fifo_ctrl, where the proxy's struct
// conn_ctrl has it) of a FIFO it waits on is set, or when no slot moved for
// timeout_ns.
#ifndef WEFT_TESTS_DEV_EMU_H
#define WEFT_TESTS_DEV_EMU_H

#include <sched.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include <functional>
#include <vector>

extern "C" {
#include "collectives/exec/device/dev_types.h"
#include "transport/net_dev.h"
}

namespace weft_test {

// The kernel's view of one FIFO end (struct dev_fifo).
struct EmuFifo {
  dev_fifo_ctrl *ctrl;
  uint32_t *used_nbytes; // the slots' used words (network FIFOs), else null
  char *slots;
  uint32_t nslots;
  size_t slot_nbytes;
  uint64_t step = 0;

  explicit EmuFifo(const net_dev_fifo &f)
      : ctrl(static_cast<dev_fifo_ctrl *>(f.ctrl)), used_nbytes(f.used_nbytes), slots(f.slots),
        nslots(f.nslots),
        slot_nbytes(f.slot_nbytes) {}
  char *slot() const { return slots + (step % nslots) * slot_nbytes; }
};

// One message through one FIFO end: sent from src or received into dst.
struct EmuMsg {
  EmuFifo *fifo;
  bool send;
  char *buf;
  size_t nbytes;
  size_t done = 0;      // bytes moved
  bool started = false; // at least one slot moved (an empty message moves one)
  // sends: called after each slot (a test may kill the rank mid-stream)
  std::function<void(size_t done)> after_slot;

  bool finished() const { return started && done >= nbytes; }
};

const char kEmuSlotFiller = 0x5a;

// EMU_WHOLE_SLOT: a network FIFO's received slot holds the sender's filler
// right past its bytes, so the proxy moved the whole slot.
enum EmuResult {
  EMU_OK = 0,
  EMU_ABORTED = 1,
  EMU_TIMED_OUT = 2,
  EMU_POISONED = 3,
  EMU_WHOLE_SLOT = 4
};

// Whether the bytes right past a received slot's chunk are all the sender's
// filler (at most 64 of them looked at).
inline bool emu_filler_follows(const char *slot, size_t chunk, size_t slot_nbytes) {
  size_t n = slot_nbytes - chunk < 64 ? slot_nbytes - chunk : 64;
  if (n == 0) return false;
  for (size_t i = 0; i < n; i++)
    if (slot[chunk + i] != kEmuSlotFiller) return false;
  return true;
}

inline uint64_t emu_now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

// Moves every message to its end, a slot at a time on whichever is ready
// (the blocks of one kernel run side by side). aborted() plays the host's
// abort flag.
inline EmuResult emu_kernel_run(std::vector<EmuMsg> &msgs, const std::function<bool()> &aborted,
                                uint64_t timeout_ns) {
  uint64_t last_progress = emu_now_ns();
  for (uint32_t spins = 0;; spins++) {
    bool all_done = true, moved = false;
    for (EmuMsg &m : msgs) {
      if (m.finished()) continue;
      all_done = false;
      EmuFifo &f = *m.fifo;
      size_t chunk = m.nbytes - m.done < f.slot_nbytes ? m.nbytes - m.done : f.slot_nbytes;
      if (m.send) {
        if (f.step - __atomic_load_n(&f.ctrl->head, __ATOMIC_ACQUIRE) >= f.nslots) continue;
        memcpy(f.slot(), m.buf + m.done, chunk);
        memset(f.slot() + chunk, kEmuSlotFiller, f.slot_nbytes - chunk);
        if (f.used_nbytes != nullptr) f.used_nbytes[f.step % f.nslots] = (uint32_t)chunk;
        __atomic_store_n(&f.ctrl->tail, f.step + 1, __ATOMIC_RELEASE);
      } else {
        if (__atomic_load_n(&f.ctrl->tail, __ATOMIC_ACQUIRE) <= f.step) continue;
        memcpy(m.buf + m.done, f.slot(), chunk);
        if (f.used_nbytes != nullptr && emu_filler_follows(f.slot(), chunk, f.slot_nbytes))
          return EMU_WHOLE_SLOT;
        __atomic_store_n(&f.ctrl->head, f.step + 1, __ATOMIC_RELEASE);
      }
      f.step++;
      m.done += chunk;
      m.started = true;
      moved = true;
      if (m.send && m.after_slot) m.after_slot(m.done);
    }
    if (all_done) return EMU_OK;
    if (moved) {
      last_progress = emu_now_ns();
      continue;
    }
    if (spins % 64 == 0) {
      if (aborted()) return EMU_ABORTED;
      for (const EmuMsg &m : msgs)
        if (!m.finished() && __atomic_load_n(&m.fifo->ctrl->poison, __ATOMIC_ACQUIRE) != 0)
          return EMU_POISONED;
      if (emu_now_ns() - last_progress > timeout_ns) return EMU_TIMED_OUT;
      sched_yield();
    }
  }
}

}  // namespace weft_test

#endif
