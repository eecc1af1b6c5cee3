// The LL line format of the device kernels (collectives/exec/device/ll_line.h)
// on the host: a line packs and unpacks its payload; a line with either half
// from another step is not taken; and an emulated LL FIFO between a writer
// and a reader thread, where each 8-byte half of a line lands on its own (the
// most the hardware promises), the high half first and late, moves every
// payload word intact over thousands of steps and across the flag's wrap
// near step 2^32, slots reused as the credits allow and steps using lines
// their slot never held before.
#include <gtest/gtest.h>

#include <sched.h>

#include <atomic>
#include <thread>
#include <vector>

#include "harness.h"
extern "C" {
#include "collectives/exec/device/dev_types.h"
#include "collectives/exec/device/ll_line.h"
}

using namespace weft_test;

namespace {

TEST(LlLine, PacksAndTakesOnlyWholeLinesOfItsStep) {
  Rng rng(11);
  for (int i = 0; i < 1000; i++) {
    uint64_t data = rng.next(), step = rng.next();
    uint32_t flag = ll_flag(step), line[4];
    ASSERT_NE(flag, 0u) << "a zeroed FIFO must match no step";
    ll_line_pack(data, flag, line);
    ASSERT_TRUE(ll_line_ready(line, flag));
    ASSERT_EQ(ll_line_data(line), data);
    uint32_t torn[4];
    ll_line_pack(data, flag, torn);
    torn[1] = flag - 4; // the low half from the slot's use 4 steps before
    EXPECT_FALSE(ll_line_ready(torn, flag));
    ll_line_pack(data, flag, torn);
    torn[3] = flag - 4;
    EXPECT_FALSE(ll_line_ready(torn, flag));
    uint32_t zero[4] = {0, 0, 0, 0};
    EXPECT_FALSE(ll_line_ready(zero, flag));
  }
}

// Around every wrap of the flag: no step's flag is 0 (a line no step wrote
// yet), and a slot (4 of them) never sees the flag of its use 2^32 steps or
// one use before.
TEST(LlLine, FlagsAroundTheWrap) {
  const uint32_t zero[4] = {0, 0, 0, 0};
  for (uint64_t wrap : {1ull << 32, 2ull << 32, 0xffffffffull, 2 * 0xffffffffull, 4 * 0xffffffffull})
    for (uint64_t s = wrap - 8; s < wrap + 8; s++) {
      EXPECT_FALSE(ll_line_ready(zero, ll_flag(s))) << "step " << s;
      EXPECT_NE(ll_flag(s), ll_flag(s - 4)) << "step " << s;
      if (s >= (1ull << 32)) {
        EXPECT_NE(ll_flag(s), ll_flag(s - (1ull << 32))) << "step " << s;
      }
    }
}

// Lines step s moves: one or two, and all of a slot's every 256 steps (in
// slot 1) and at step 2^32 - 1 (slot 3, where the flag once was 0), so that
// steps use lines their slot never held before.
uint32_t step_lines(uint64_t s, uint32_t max) {
  if (s == 0xffffffffull || s % 256 == 1) return max;
  return (uint32_t)(1 + s % 2 < max ? 1 + s % 2 : max);
}

// One LL FIFO in host memory: nslots slots of nlines lines, a head counter.
struct LlFifo {
  uint32_t nslots, nlines;
  std::vector<std::atomic<uint64_t>> halves; // [slot][line][2]
  std::atomic<uint64_t> head{0};
  LlFifo(uint32_t slots, uint32_t lines)
      : nslots(slots), nlines(lines), halves((size_t)slots * lines * 2) {
    for (auto &h : halves) h.store(0);
  }
  std::atomic<uint64_t> *line(uint64_t step, uint32_t l) {
    return &halves[((size_t)(step % nslots) * nlines + l) * 2];
  }
};

uint64_t payload(uint64_t step, uint32_t l) { return step * 0x9e3779b97f4a7c15ull ^ l; }

// Writer: per step, waits for a credit, then stores each line's two halves
// apart (high first, with a pause now and then in between).
void ll_write(LlFifo &f, uint64_t first, uint64_t nsteps) {
  Rng rng(first);
  for (uint64_t s = first; s < first + nsteps; s++) {
    while (s - first - f.head.load(std::memory_order_acquire) >= f.nslots) sched_yield();
    for (uint32_t l = 0; l < step_lines(s, f.nlines); l++) {
      uint32_t w[4];
      ll_line_pack(payload(s, l), ll_flag(s), w);
      std::atomic<uint64_t> *h = f.line(s, l);
      h[1].store((uint64_t)w[2] | (uint64_t)w[3] << 32, std::memory_order_relaxed);
      if (rng.next() % 8 == 0) sched_yield();
      h[0].store((uint64_t)w[0] | (uint64_t)w[1] << 32, std::memory_order_relaxed);
      // the reader runs ahead onto lines not yet written
      if (l < 2 && f.nlines > 2) sched_yield();
    }
  }
}

// Reader: per step, polls each line (both halves loaded apart) until it is
// that step's, checks its payload, then returns the credit. Counts bad words.
uint64_t ll_read(LlFifo &f, uint64_t first, uint64_t nsteps) {
  uint64_t bad = 0;
  for (uint64_t s = first; s < first + nsteps; s++) {
    for (uint32_t l = 0; l < step_lines(s, f.nlines); l++) {
      std::atomic<uint64_t> *h = f.line(s, l);
      uint32_t w[4];
      do {
        uint64_t lo = h[0].load(std::memory_order_relaxed);
        uint64_t hi = h[1].load(std::memory_order_relaxed);
        w[0] = (uint32_t)lo, w[1] = (uint32_t)(lo >> 32);
        w[2] = (uint32_t)hi, w[3] = (uint32_t)(hi >> 32);
      } while (!ll_line_ready(w, ll_flag(s)));
      bad += ll_line_data(w) != payload(s, l);
    }
    f.head.store(s - first + 1, std::memory_order_release);
  }
  return bad;
}

TEST(LlLine, EmulatedFifoMovesEveryWordAcrossTheFlagWrap) {
  // slots of 1 to 64 lines; the first step 2^32 - 1500 puts the flag's wrap
  // (and its step with flag 0) halfway through
  for (uint32_t nlines : {1u, 7u, 64u}) {
    const uint64_t first = (1ull << 32) - 1500, nsteps = 3000;
    LlFifo f(4, nlines);
    uint64_t bad = 0;
    std::thread reader([&] { bad = ll_read(f, first, nsteps); });
    ll_write(f, first, nsteps);
    reader.join();
    EXPECT_EQ(bad, 0u) << nlines << " lines a slot";
  }
}

}  // namespace
