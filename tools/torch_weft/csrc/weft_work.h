// torch_weft: the Work objects the backend returns and the queue between
// the callers and the backend's worker thread.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <weft.h>

#include "weft_cuda.h"
#include "weft_flight.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

namespace torch_weft {

class WeftBackend;
struct queue_state;

class WeftWork : public c10d::Work {
 public:
  WeftWork(int rank, c10d::OpType type, const char *title, std::vector<at::Tensor> outputs,
           std::shared_ptr<queue_state> q)
      : Work(rank, type, title),
        outputs_(std::move(outputs)),
        future_(c10::make_intrusive<c10::ivalue::Future>(
            c10::ListType::create(c10::TensorType::get()))),
        queue_(std::move(q)) {}

  // For the Work of a coalescing block: whether the block is still open
  // (its operations run when it ends).
  void set_block_open(bool open) { block_open_ = open; }

  bool isCompleted() override;
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  void synchronize() override {}
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  std::vector<at::Tensor> result() override { return outputs_; }

  // Recorded into a CUDA graph being captured: it runs when the graph does,
  // so nothing on the host waits for it (nor does the watchdog).
  bool captured() const { return gpu_ && gpu_->captured(); }

  // The rank a receive from any source took its message from, once done.
  int sourceRank() const override {
    TORCH_CHECK(source_ != nullptr && *source_ >= 0,
                "weft: sourceRank() is known for a completed receive from any source");
    return *source_;
  }
  void set_source(std::shared_ptr<std::atomic<int>> source) { source_ = std::move(source); }

  // The time from the operation's start to its end, in milliseconds, once
  // it is complete (weft times every operation; NCCL only with timing on).
  float getDuration() const override;
  // Called when the operation starts to run (a send or receive: when it is
  // queued on the host stream).
  void mark_started() {
    if (started_ns_.load() == 0) {
      started_ns_ = now_ns();
      flight_recorder::get().started(flight_ids_);
    }
  }
  // The flight recorder's entries of the operation (weft_flight.h), whose
  // state follows the Work's; added before the Work is handed to a thread
  // that runs it.
  void add_flight(int64_t id) {
    if (id >= 0) flight_ids_.push_back(id);
  }
  static int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

  // Called by the worker once the operation has run (exception: its failure).
  void complete(std::exception_ptr exception) {
    ended_ns_ = now_ns();
    flight_done(exception == nullptr);
    finish(exception);
    if (exception)
      future_->setError(exception);
    else
      future_->markCompleted(c10::IValue(outputs_));
  }

  // Called once the operation is enqueued on a CUDA stream: the future is
  // complete for users on the GPU at once (they order themselves after the
  // operation); the Work completes when the GPU passes mark, or fails when
  // async_error reports the communicator's failure, or after timeout.
  void complete_on_gpu(std::shared_ptr<GpuMark> mark, c10::intrusive_ptr<c10::ivalue::Future> fut,
                       std::function<std::exception_ptr()> async_error,
                       std::chrono::milliseconds timeout) {
    future_ = std::move(fut);
    async_error_ = std::move(async_error);
    gpu_timeout_ = timeout;
    gpu_ = std::move(mark);
  }

 private:
  bool poll_gpu();
  void flight_done(bool ok) {
    if (flight_ids_.empty()) return;
    const int64_t started = started_ns_.load();
    flight_recorder::get().completed(
        flight_ids_, ok, started != 0 ? (float)(ended_ns_.load() - started) / 1e6f : -1.0f);
  }
  std::vector<int64_t> flight_ids_;
  void finish_once(std::exception_ptr exception) {
    if (!finished_.exchange(true)) {
      ended_ns_ = now_ns();
      flight_done(exception == nullptr);
      finish(exception);
    }
  }
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::shared_ptr<queue_state> queue_;
  std::shared_ptr<GpuMark> gpu_; /* set for an operation on a CUDA stream */
  std::function<std::exception_ptr()> async_error_;
  std::chrono::milliseconds gpu_timeout_{0};
  std::atomic<bool> finished_{false};
  std::atomic<bool> block_open_{false};
  std::shared_ptr<std::atomic<int>> source_; /* a receive from any source: its sender */
  std::atomic<int64_t> started_ns_{0}, ended_ns_{0};
};

// One weft call (or several that belong together), split in two: issue runs
// inside the weft group when the operation is coalesced with others, finish
// runs after the group (copies out of staging buffers, local reductions).
// release runs once the group has ended, whether it succeeded or not: what
// issue made that weft reads until then (a pre-multiply op is looked up when
// the group launches, not when the call is recorded).
struct op_step {
  std::function<weftResult_t()> issue;
  std::function<void()> finish;
  std::function<void()> release;
};

struct task {
  const char *name;
  std::vector<op_step> steps;
  std::vector<c10::intrusive_ptr<WeftWork>> works;
  int device = -1;         /* CUDA device of its tensors; -1: host memory */
  void *stream = nullptr;  /* the CUDA stream it ran on */
  /* the caller's tensors it reads and writes: on a GPU, their memory is not
   * reused until the stream is past the operation (record_stream) */
  std::vector<at::Tensor> tensors;
  /* a send or receive on host memory outside a coalescing block: queued on
   * the group's weft host stream for them (p2p_lane), not run here */
  bool p2p = false;
};

// Sends and receives on host memory run on a weft host stream of the group,
// where those queued back to back advance together while the caller goes
// on (weft.h, "Host streams"); an event recorded after each says when it is
// done. This thread waits for the events in order, then finishes the
// operations (copies out of staging buffers) and completes their Works.
struct p2p_lane {
  struct entry {
    weftEvent_t done;
    std::vector<op_step> steps;
    std::vector<c10::intrusive_ptr<WeftWork>> works;
  };
  // error: the communicator's failure once an operation is done, or null
  explicit p2p_lane(std::function<std::exception_ptr()> error);
  // Finishes what was added, then stops.
  ~p2p_lane();
  void add(entry e);
  bool on_thread() const { return std::this_thread::get_id() == thread_.get_id(); }
  // For a stop on the lane's own thread (a Work's callback ends the group):
  // the lane finishes what was added, then frees itself.
  void detach();

 private:
  void loop();
  bool detached_ = false;
  std::function<std::exception_ptr()> error_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<entry> entries_;
  bool stop_ = false;
  std::thread thread_;
};

// The queue between callers and the worker thread.
struct queue_state {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<task> tasks;
  bool stop = false;
  bool busy = false; /* a task is running, on the worker or on a caller's thread */
  /* for GPU Works asking for the communicator's asynchronous error: NULL once
   * the group shuts down or aborts */
  weftComm_t comm = nullptr;
  bool aborted = false;
  /* the group was stopped from the worker thread itself (a Work's
   * callback): the worker returns once that task is done, touching nothing
   * of the backend, which may be gone by then */
  bool worker_detached = false;

  // false, queuing nothing, once the group is stopping: checked under the
  // lock that the stop takes, so no task lands behind the last one run
  bool push(task t) {
    std::lock_guard<std::mutex> lk(mu);
    if (stop) return false;
    tasks.push_back(std::move(t));
    cv.notify_all();
    return true;
  }
};

}  // namespace torch_weft
