// How a comm counts its kernels' ends without an event per launch
// (collectives/exec/device/launch_done.h), on a host emulation of the GPU:
// a thread per stream runs its launches in order, each launch's blocks run
// as threads of their own and report as dev_done_report does, and a gate
// waits as kernels_gate.cu does. Checked: the comm's launches run one after
// another whatever streams they go to (a block begins only once every block
// of the comm's previous counted launch has ended), captured launches are
// neither counted nor gated, and launch_done_ended says true only once
// every counted block has ended.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <functional>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

extern "C" {
#include "collectives/exec/device/launch_done.h"
}

namespace {

constexpr int kMaxBlocks = 64;

using Clock = std::chrono::steady_clock;

struct Launch {
  bool gate;            // a gate: waits for launch gate_seq's gate_nblocks blocks
  uint64_t gate_seq;
  int gate_nblocks;
  dev_done done;
  int nblocks;
  int index;       // in call order
  int sleep_us[kMaxBlocks];
};

struct Record {
  Clock::time_point begin[kMaxBlocks];
  Clock::time_point end[kMaxBlocks];
  std::atomic<int> ended{0}; // blocks
};

// One emulated stream: runs its launches in order, a launch's blocks at
// once; waits (like the GPU) before each block as the launch's dev_done says.
class Stream {
 public:
  Stream(uint64_t *ended, std::vector<Record> *records)
      : ended_(ended), records_(records), thread_([this] { run(); }) {}
  ~Stream() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void launch(const Launch &l) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      queue_.push_back(l);
    }
    cv_.notify_all();
  }

 private:
  void run() {
    for (;;) {
      Launch l;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [this] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;
        l = queue_.front();
        queue_.pop_front();
      }
      if (l.gate) { // kernels_gate.cu; a gate that would wait for ever fails the test
        const auto give_up = Clock::now() + std::chrono::seconds(20);
        for (int i = 0; i < l.gate_nblocks; i++)
          while (__atomic_load_n(&ended_[i], __ATOMIC_ACQUIRE) < l.gate_seq &&
                 Clock::now() < give_up)
            std::this_thread::yield();
        if (Clock::now() >= give_up) stuck_gates_.fetch_add(1);
        continue;
      }
      std::vector<std::thread> blocks;
      for (int b = 0; b < l.nblocks; b++)
        blocks.emplace_back([this, &l, b] { block(l, b); });
      for (auto &t : blocks) t.join();
    }
  }
  void block(const Launch &l, int b) {
    const dev_done &d = l.done;
    Record &r = (*records_)[l.index];
    r.begin[b] = Clock::now();
    std::this_thread::sleep_for(std::chrono::microseconds(l.sleep_us[b]));
    r.end[b] = Clock::now();
    r.ended.fetch_add(1);
    if (d.ended != nullptr) __atomic_store_n(&d.ended[b], d.seq, __ATOMIC_RELEASE); // report
  }

  uint64_t *ended_;
  std::vector<Record> *records_;

 public:
  std::atomic<int> stuck_gates_{0};

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Launch> queue_;
  bool stop_ = false;
  std::thread thread_;
};

TEST(LaunchDone, LaunchesEndInOrderAcrossStreamsAndEndedMeansEnded) {
  const unsigned seed = (unsigned)std::random_device{}();
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  constexpr int kLaunches = 160, kStreams = 3;
  alignas(8) uint64_t ended[kMaxBlocks] = {};
  std::vector<Record> records(kLaunches);
  std::vector<Launch> launches(kLaunches);
  std::vector<int> stream_of(kLaunches), captured(kLaunches);
  struct launch_done t = {};
  uint64_t counted = 0;
  int false_while_running = 0, gates = 0;
  {
    std::vector<std::unique_ptr<Stream>> streams;
    // kStreams streams, then the per-thread streams of two threads: one
    // handle for both, told apart by the calling thread
    for (int s = 0; s < kStreams + 2; s++) streams.emplace_back(new Stream(ended, &records));
    for (int i = 0; i < kLaunches; i++) {
      // mostly one stream, as most callers; sometimes another, a few captured
      int s = rng() % 4 == 0 ? (int)(rng() % (kStreams + 2)) : 0;
      stream_of[i] = s;
      captured[i] = rng() % 10 == 0;
      Launch &l = launches[i];
      l.index = i;
      l.nblocks = 1 + (int)(rng() % (rng() % 2 ? 8 : kMaxBlocks));
      for (int b = 0; b < l.nblocks; b++) l.sleep_us[b] = (int)(rng() % 300);
      const uintptr_t handle = s < kStreams ? 0x1000 + (uintptr_t)s : 2;
      const uintptr_t thread = s < kStreams ? 0 : (uintptr_t)(s - kStreams + 1);
      l.gate = false;
      if (launch_done_gated(&t, ended, handle, thread, captured[i])) { // comm_gate
        Launch g = {};
        g.gate = true;
        g.gate_seq = t.seq;
        g.gate_nblocks = t.nblocks;
        streams[s]->launch(g);
        gates++;
      }
      launch_done_fill(&t, ended, nullptr, nullptr, captured[i], &l.done);
      if (captured[i]) EXPECT_EQ(l.done.ended, nullptr);
      else EXPECT_EQ(l.done.seq, counted + 1);
      streams[s]->launch(l);
      launch_done_commit(&t, &l.done, handle, thread, l.nblocks);
      if (!captured[i]) counted++;
      EXPECT_EQ(t.seq, counted);
      // ended says true only where every counted block so far has ended
      if (rng() % 3 == 0) {
        bool said = launch_done_ended(&t, ended);
        int running = 0;
        for (int k = 0; k <= i; k++)
          if (!captured[k] && records[k].ended.load() < launches[k].nblocks) running++;
        if (said) EXPECT_EQ(running, 0) << "launch " << i << ": ended with counted blocks running";
        else false_while_running++;
      }
    }
    // the destroy's wait: ends, and then every counted block has ended
    auto give_up = Clock::now() + std::chrono::seconds(30);
    while (!launch_done_ended(&t, ended) && Clock::now() < give_up)
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    ASSERT_TRUE(launch_done_ended(&t, ended));
    for (auto &st : streams) EXPECT_EQ(st->stuck_gates_.load(), 0) << "a gate waited for ever";
    for (int k = 0; k < kLaunches; k++) {
      if (!captured[k]) {
        EXPECT_EQ(records[k].ended.load(), launches[k].nblocks) << "launch " << k;
      }
    }
  } // the streams drain (captured launches may still run) and stop
  // counted launches ran one after another: each block of one began after
  // every block of the counted launch before it ended
  int prev = -1, switches = 0;
  for (int k = 0; k < kLaunches; k++) {
    if (captured[k]) continue;
    if (prev >= 0) {
      if (stream_of[k] != stream_of[prev]) switches++;
      for (int b = 0; b < launches[k].nblocks; b++)
        for (int pb = 0; pb < launches[prev].nblocks; pb++)
          ASSERT_GE(records[k].begin[b], records[prev].end[pb])
              << "launch " << k << " (stream " << stream_of[k] << ") block " << b
              << " began before launch " << prev << " (stream " << stream_of[prev]
              << ") block " << pb << " ended";
    }
    prev = k;
  }
  std::printf("%llu counted launches, %d stream switches, %d gates, %d polls said not yet\n",
              (unsigned long long)counted, switches, gates, false_while_running);
  EXPECT_GT(gates, 0);
  EXPECT_GT(false_while_running, 0); // the polls met running launches, so they checked something
}

// When a call goes behind a gate: another stream (or the per-thread stream
// of another thread) while the comm's last counted launch runs; never on its own stream, once
// that launch ended, before any launch, or while a graph captures.
TEST(LaunchDone, GateOnlyBehindAnUnendedLaunchOnAnotherStream) {
  alignas(8) uint64_t ended[kMaxBlocks] = {};
  struct launch_done t = {};
  dev_done d;
  EXPECT_FALSE(launch_done_gated(&t, ended, 2, 0, 0)); // nothing launched yet
  EXPECT_TRUE(launch_done_ended(&t, ended));
  launch_done_fill(&t, ended, nullptr, nullptr, 0, &d); // the first launch
  EXPECT_EQ(d.seq, 1u);
  EXPECT_EQ(d.ended, ended);
  launch_done_commit(&t, &d, 1, 0, 3);
  EXPECT_FALSE(launch_done_ended(&t, ended));
  EXPECT_FALSE(launch_done_gated(&t, ended, 1, 0, 0)); // same stream: stream order
  EXPECT_TRUE(launch_done_gated(&t, ended, 2, 0, 0));  // another, launch 1 running
  EXPECT_FALSE(launch_done_gated(&t, ended, 2, 0, 1)); // captured: the graph's order
  EXPECT_TRUE(launch_done_gated(&t, ended, 1, 7, 0));  // the handle of another thread's own
  ended[0] = ended[1] = 1; // two of three blocks ended
  EXPECT_FALSE(launch_done_ended(&t, ended));
  EXPECT_TRUE(launch_done_gated(&t, ended, 2, 0, 0));
  ended[2] = 1;
  EXPECT_TRUE(launch_done_ended(&t, ended));
  EXPECT_FALSE(launch_done_gated(&t, ended, 2, 0, 0)); // ended: no gate
  launch_done_fill(&t, ended, nullptr, nullptr, 0, &d);
  EXPECT_EQ(d.seq, 2u);
  launch_done_commit(&t, &d, 2, 0, 1); // launch 2, one block, on stream 2
  EXPECT_FALSE(launch_done_ended(&t, ended));
  ended[0] = 2; // blocks 1 and 2 keep launch 1's number: only block 0 counts now
  EXPECT_TRUE(launch_done_ended(&t, ended));
  launch_done_fill(&t, ended, nullptr, nullptr, 1, &d); // captured: not counted
  EXPECT_EQ(d.ended, nullptr);
  launch_done_commit(&t, &d, 3, 0, 64);
  EXPECT_EQ(t.seq, 2u);
  EXPECT_EQ(t.stream, 2u);
  EXPECT_EQ(t.nblocks, 1);
}

} // namespace
