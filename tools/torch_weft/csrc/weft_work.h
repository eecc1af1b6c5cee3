// torch_weft: the Work objects the backend returns and the queue between
// the callers and the backend's worker thread.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <weft.h>

#include "weft_streams.h"
#include "weft_flight.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <thread>

namespace torch_weft {

// now + timeout on the steady clock; no deadline (the clock's end) for a
// timeout of 0 or less and for one past the clock's range (timedelta.max),
// which would otherwise wrap into the past.
inline std::chrono::steady_clock::time_point deadline_after(std::chrono::milliseconds timeout) {
  using clock = std::chrono::steady_clock;
  const auto now = clock::now();
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(clock::time_point::max() - now);
  if (timeout.count() <= 0 || timeout >= left) return clock::time_point::max();
  return now + std::chrono::duration_cast<clock::duration>(timeout);
}

class WeftBackend;
class p2p_op;
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
  // On a CUDA stream: the caller's current stream waits for the operation
  // (as NCCL's synchronize()); nothing else.
  void synchronize() override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  std::vector<at::Tensor> result() override { return outputs_; }

  // Recorded into a CUDA graph being captured: it runs when the graph does,
  // so nothing on the host waits for it (nor does the watchdog).
  bool captured() const {
    const gpu_end *g = gpu();
    return g != nullptr && g->captured();
  }

  // The rank a receive from any source took its message from, once done.
  int sourceRank() const override {
    TORCH_CHECK(source_ != nullptr && *source_ >= 0,
                "weft: sourceRank() is known for a completed receive from any source");
    return *source_;
  }
  void set_source(std::shared_ptr<std::atomic<int>> source) { source_ = std::move(source); }

  // A send or receive on the group's host stream: wait() runs or settles
  // it on the caller's thread (p2p_op).
  void set_p2p(const std::shared_ptr<p2p_op> &op) { p2p_ = op; }

  // The time from the operation's start to its end, in milliseconds (weft
  // times every operation; NCCL only with timing on): on the host, once it
  // is complete; on a CUDA stream, between its start and end events, once
  // the GPU is past it (waited for here).
  float getDuration() const override;
  // Called when the operation starts to run: a host one when it runs (a
  // send or receive: when it is queued on the host stream), one on a CUDA
  // stream when a look (poll_gpu) finds its start event passed.
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
  // The future first, as Gloo's: a wait() that returns finds it complete
  // (get_future().value() right after wait() asserted otherwise).
  void complete(std::exception_ptr exception) {
    ended_ns_ = now_ns();
    flight_done(exception == nullptr, host_duration_ms());
    if (exception)
      future_->setError(exception);
    else
      future_->markCompleted(c10::IValue(outputs_));
    finish(exception);
  }

  // Called once the operation is enqueued on a CUDA stream: the future is
  // complete for users on the GPU at once (they order themselves after the
  // operation); the Work completes when the GPU passes end, or fails when
  // async_error reports the communicator's failure, or after timeout.
  // blocking: wait() also waits on the host; stash: the caller's tensors,
  // kept until the operation is done or waited for (instead of
  // record_stream).
  void complete_on_gpu(std::shared_ptr<gpu_end> end, c10::intrusive_ptr<c10::ivalue::Future> fut,
                       std::function<std::exception_ptr()> async_error,
                       std::chrono::milliseconds timeout, bool blocking,
                       std::vector<at::Tensor> stash) {
    future_ = std::move(fut);
    async_error_ = std::move(async_error);
    gpu_timeout_ = timeout;
    blocking_ = blocking;
    {
      std::lock_guard<std::mutex> lk(stash_mu_);
      stash_ = std::move(stash);
    }
    gpu_ = std::move(end);
    gpu_ready_.store(true, std::memory_order_release); /* the fields above, published */
  }

  // On a CUDA stream: whether it keeps the caller's tensors (stashed), which
  // a failure leaves held until a wait orders the caller's stream after it.
  bool holds_stash() {
    if (gpu() == nullptr) return false;
    std::lock_guard<std::mutex> lk(stash_mu_);
    return !stash_.empty();
  }
  // On a CUDA stream: whether the GPU is past it (a query; true for none).
  bool gpu_passed() {
    gpu_end *g = gpu();
    return g == nullptr || g->done();
  }

 private:
  // The operation's end on the GPU once complete_on_gpu has published it
  // (the watchdog's thread looks at the Work from its issue on), else NULL.
  gpu_end *gpu() const {
    return gpu_ready_.load(std::memory_order_acquire) ? gpu_.get() : nullptr;
  }
  bool poll_gpu();
  // The operation's time on the host, from its start to its end (-1: it
  // did not start).
  float host_duration_ms() const {
    const int64_t started = started_ns_.load();
    return started != 0 ? (float)(ended_ns_.load() - started) / 1e6f : -1.0f;
  }
  void flight_done(bool ok, float duration_ms) {
    if (flight_ids_.empty()) return;
    flight_recorder::get().completed(flight_ids_, ok, duration_ms);
  }
  std::vector<int64_t> flight_ids_;
  void finish_once(std::exception_ptr exception) {
    if (!finished_.exchange(true)) {
      ended_ns_ = now_ns();
      // on a CUDA stream, once the GPU is past it: its time there
      float ms = -1.0f;
      gpu_end *g = gpu();
      if (g == nullptr) {
        ms = host_duration_ms();
      } else if (exception == nullptr && g->timed()) {
        try {
          ms = g->elapsed_ms();
        } catch (const std::exception &) { /* a CUDA error: the recorder goes without */
        }
      }
      flight_done(exception == nullptr, ms);
      finish(exception);
    }
    // after a failure (the communicator's error, a wait's timeout) the GPU
    // may not be past the operation: what it reads and writes stays held
    // until a wait orders the caller's stream after it, or the Work goes
    if (exception == nullptr || gpu() == nullptr) drop_stash();
  }
  // The caller's stream waits for the operation: the stashed tensors are
  // ordered on it from there.
  void stream_wait_and_drop() {
    gpu_->stream_wait();
    drop_stash();
  }
  void drop_stash() {
    std::vector<at::Tensor> gone;
    std::lock_guard<std::mutex> lk(stash_mu_);
    gone.swap(stash_);
  }
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::shared_ptr<queue_state> queue_;
  std::shared_ptr<gpu_end> gpu_; /* set for an operation on a CUDA stream: read through gpu() */
  std::atomic<bool> gpu_ready_{false};
  bool blocking_ = false;
  std::mutex stash_mu_;
  std::vector<at::Tensor> stash_; /* the caller's tensors, until done (avoid_record_streams) */
  std::function<std::exception_ptr()> async_error_;
  std::chrono::milliseconds gpu_timeout_{0};
  std::atomic<bool> finished_{false};
  std::atomic<bool> block_open_{false};
  std::shared_ptr<std::atomic<int>> source_; /* a receive from any source: its sender */
  std::weak_ptr<p2p_op> p2p_; /* a send or receive on the host stream, until settled */
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
  /* buffers the step made when it was submitted (on the caller's current
   * stream) that the communication stream reads or writes: on a GPU they
   * are kept as the caller's tensors are (task::tensors), so that their
   * memory is not given to the caller's stream while the operation runs */
  std::vector<at::Tensor> held;
  /* a send or receive on host memory: it runs on the group's communicator
   * for them (WeftBackend::pcomm_), after the ones issued before it */
  bool p2p = false;
};

struct task {
  const char *name;
  std::vector<op_step> steps;
  std::vector<c10::intrusive_ptr<WeftWork>> works;
  int device = -1;         /* CUDA device of its tensors; -1: host memory */
  /* the device of the stream logic: device, or 0 for host tensors while the
   * fake CUDA layer is on; -1: none */
  int sdev = -1;
  comm_streams::launch launch; /* the streams it ran on */
  /* the caller's tensors it reads and writes: on a GPU, their memory is not
   * reused until the stream is past the operation (record_stream) */
  std::vector<at::Tensor> tensors;
  /* sends and receives on host memory alone (one, or a coalescing block of
   * them): queued on the group's weft host stream for them (p2p_lane), not
   * run here */
  bool p2p = false;
  /* a task with a send or receive run on the worker (a block of both kinds,
   * a receive from any source): its number among them, from 1; 0: none */
  uint64_t holder = 0;
  /* on a CUDA stream, once run there: its end, whether its Works keep the
   * tensors (stash), and a future per Work (none after a failure) */
  std::shared_ptr<gpu_end> end;
  bool stash = false;
  std::vector<c10::intrusive_ptr<c10::ivalue::Future>> futures;
  // Whether a step is a send or receive on host memory (op_step::p2p).
  bool has_p2p() const {
    for (const auto &s : steps)
      if (s.p2p) return true;
    return false;
  }
};

// The group's weft host stream for sends and receives, as its p2p_ops see
// it: NULL once destroyed, which takes mu exclusively (a waiter holds it
// shared while it may run the stream's work).
struct p2p_stream_ref {
  std::shared_mutex mu;
  weftStream_t stream = nullptr;
};

// A send or receive on host memory queued on the group's weft host stream
// (p2p_lane): the event recorded after it, and what is left to do once the
// stream is past it: the steps' finishes (copies out of staging buffers)
// and its Works to complete. The first thread to see the event reached
// settles it: the lane's, in issue order, or a caller waiting on one of its
// Works (wait()), which then returns without waiting for the lane's thread
// to be scheduled; a caller that finds the stream's thread idle runs the
// operation itself (weftEventSynchronizeOnStream). is_completed() only
// looks (the watchdog calls it holding its lock, where callbacks must not run).
class p2p_op {
 public:
  using error_fn = std::function<std::exception_ptr()>;
  // error: the communicator's failure once the operation is done, or null
  p2p_op(weftEvent_t done, std::shared_ptr<p2p_stream_ref> stream, std::vector<op_step> steps,
         std::vector<c10::intrusive_ptr<WeftWork>> works, std::shared_ptr<const error_fn> error)
      : done_(done),
        stream_(std::move(stream)),
        steps_(std::move(steps)),
        works_(std::move(works)),
        error_(std::move(error)) {}
  ~p2p_op() { weftEventDestroy(done_); }
  p2p_op(const p2p_op &) = delete;
  p2p_op &operator=(const p2p_op &) = delete;
  // Blocks until the stream is past the operation (done or failed), then
  // settles it unless another thread has begun to (whose Works may still be
  // completing on return). run: run the stream's work on this thread while
  // the stream's thread is idle (a caller's wait, not the lane's).
  void wait_and_settle(bool run);

 private:
  void settle();
  weftEvent_t done_;
  std::shared_ptr<p2p_stream_ref> stream_;
  std::atomic<bool> claimed_{false}; /* a thread settles it, or has */
  std::vector<op_step> steps_;
  std::vector<c10::intrusive_ptr<WeftWork>> works_; /* dropped once settled */
  std::shared_ptr<const error_fn> error_;
};

// Sends and receives on host memory run on a weft host stream of the group,
// where those queued back to back advance together while the caller goes
// on (weft.h, "Host streams"). This thread waits for their events in order
// and settles each operation that no caller has settled first, so that a
// Work nobody waits on completes (its future's callbacks run) too.
struct p2p_lane {
  p2p_lane();
  // Finishes what was added, then stops.
  ~p2p_lane();
  void add(std::shared_ptr<p2p_op> op);
  bool on_thread() const { return std::this_thread::get_id() == thread_.get_id(); }
  // For a stop on the lane's own thread (a Work's callback ends the group):
  // the lane finishes what was added, then frees itself.
  void detach();

 private:
  void loop();
  bool detached_ = false;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<p2p_op>> ops_;
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
  /* Tasks with a send or receive on host memory that run on the worker or a
   * caller's thread (task::holder), queued or running: while there are
   * any, a send or receive issued (a task::p2p) waits in held, each after
   * the last holder issued before it, and is issued on the host stream as
   * soon as that one has run, whatever collectives are queued; else it is
   * issued at once, ahead of the collectives queued. */
  int p2p_tasks = 0;
  uint64_t holders = 0;      /* holder numbers given */
  uint64_t holders_done = 0; /* holders run (in order: one thread runs tasks at a time) */
  std::deque<std::pair<uint64_t, task>> held;
  /* for GPU Works asking for the communicator's asynchronous error: NULL once
   * the group shuts down or aborts */
  weftComm_t comm = nullptr;
  bool aborted = false;
  /* the backend revoked the communicator (the watchdog's handling 2,
   * shrink_group's SHRINK_ABORT): what that cut short failed, though weft's
   * asynchronous error reads clean after a revoke */
  bool revoked = false;
  /* the group was stopped from the worker thread itself (a Work's
   * callback): the worker returns once that task is done, touching nothing
   * of the backend, which may be gone by then */
  bool worker_detached = false;

  // Numbers t as a holder (under mu).
  void hold(task &t) {
    t.holder = ++holders;
    p2p_tasks++;
  }
  // false, queuing nothing, once the group is stopping: checked under the
  // lock that the stop takes, so no task lands behind the last one run
  bool push(task t) {
    std::lock_guard<std::mutex> lk(mu);
    if (stop) return false;
    if (t.has_p2p()) hold(t);
    tasks.push_back(std::move(t));
    cv.notify_all();
    return true;
  }
};

}  // namespace torch_weft
