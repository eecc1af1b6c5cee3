// torch_weft: Work objects (weft_work.h).
#include "weft_work.h"

#include <ATen/core/grad_mode.h>

#include <cstdlib>
#include <cstring>
#include <thread>

namespace torch_weft {

void p2p_op::wait_and_settle(bool run) {
  // the stream reaches its events in order; an operation that fails (a dead
  // peer, the timeout, an abort) is done too, failed
  if (run) {
    std::shared_lock<std::shared_mutex> lk(stream_->mu);
    if (stream_->stream != nullptr) weftEventSynchronizeOnStream(done_, stream_->stream);
  }
  weftEventSynchronize(done_);
  settle();
}

// Completing a Work runs its future's callbacks, which may end the group
// (and join the lane's thread): nothing is held meanwhile.
void p2p_op::settle() {
  if (claimed_.exchange(true)) return;
  std::exception_ptr err = (*error_)();
  if (!err) {
    try {
      at::NoGradGuard no_grad; /* they write the caller's tensors, as Gloo does */
      for (auto &s : steps_)
        if (s.finish) s.finish();
    } catch (...) {
      err = std::current_exception();
    }
  }
  for (auto &w : works_) w->complete(err);
  works_.clear();
  steps_.clear();
}

p2p_lane::p2p_lane() : thread_([this] { loop(); }) {}

p2p_lane::~p2p_lane() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
    cv_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
}

void p2p_lane::detach() {
  std::lock_guard<std::mutex> lk(mu_);
  stop_ = true;
  detached_ = true;
  thread_.detach();
}

void p2p_lane::add(std::shared_ptr<p2p_op> op) {
  std::lock_guard<std::mutex> lk(mu_);
  ops_.push_back(std::move(op));
  cv_.notify_all();
}

void p2p_lane::loop() {
  for (;;) {
    std::shared_ptr<p2p_op> op;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [this] { return stop_ || !ops_.empty(); });
      if (ops_.empty()) { /* stopped and drained */
        if (detached_) {
          lk.unlock();
          delete this;
        }
        return;
      }
      op = std::move(ops_.front());
      ops_.pop_front();
    }
    op->wait_and_settle(false);
  }
}

// For an operation on a CUDA stream: whether it is done (or failed), and
// the Work finished if so. A kernel that gives up (a peer's timeout, an
// abort) returns like one that succeeded, as do the kernels queued behind
// it: the GPU passing the operation says nothing of how it went, so the
// communicator's error is asked either way (an error found after an
// operation that did succeed fails it too, as a watchdog would).
bool WeftWork::poll_gpu() {
  if (Work::isCompleted()) return true;
  const bool done = gpu_->done();
  // the flight recorder's "started": once the GPU has reached it
  if (!done && started_ns_.load() == 0 && gpu_->started()) mark_started();
  if (std::exception_ptr e = async_error_()) {
    finish_once(e);
    return true;
  }
  if (done) finish_once(nullptr);
  return done;
}

bool WeftWork::isCompleted() {
  const gpu_end *g = gpu();
  if (g != nullptr && !g->captured()) poll_gpu();
  return Work::isCompleted();
}

// On a CUDA stream, orders the caller's current stream after the operation
// and returns, as NCCL's wait() does, so that the host queues what follows
// while the GPU communicates (FSDP2's blocking all-gathers and
// reduce-scatters, say); a failure already known raises here, a later one
// at the next operation (weft refuses it), at is_completed() or, after the
// last, as a warning at shutdown. With a blocking wait (the group's
// stream_options), or a timeout given, waits on the host until the GPU is
// past it (so that a failure raises here) first.
bool WeftWork::wait(std::chrono::milliseconds timeout) {
  // an operation inside a coalescing block that is still open (a blocking
  // call there waits on the block's Work) runs when the block ends: waiting
  // for it now would wait forever, so the wait returns, as NCCL's does
  // there; the Work the block's end returns waits for all of it
  if (block_open_) return true;
  // a send or receive on the host stream: this thread runs it when the
  // stream's thread is idle, and settles it once the stream is past it,
  // rather than waking when the lane's thread has (with a timeout, the lane
  // settles it and the wait below bounds it)
  if (timeout == kNoTimeout && !Work::isCompleted())
    if (std::shared_ptr<p2p_op> op = p2p_.lock()) op->wait_and_settle(true);
  if (gpu() == nullptr) return Work::wait(timeout);
  if (gpu()->captured()) {
    // recorded into a graph being captured: it runs when the graph does, so
    // the caller's stream is ordered after it (the communication stream
    // joins the capture back) and nothing is waited for on the host (the
    // capture forbids asking), as NCCL's wait does there
    stream_wait_and_drop();
    return true;
  }
  // Work::wait() ends with synchronize(), which orders the caller's stream
  if (!blocking_ && timeout == kNoTimeout) {
    poll_gpu(); // one look: an error the communicator has reported raises below
    if (exception() == nullptr && !Work::isCompleted()) {
      stream_wait_and_drop();
      return true;
    }
    return Work::wait(timeout);
  }
  const auto limit = timeout == kNoTimeout ? gpu_timeout_ : timeout;
  const auto start = std::chrono::steady_clock::now();
  if (limit.count() <= 0 && async_error_() == nullptr) gpu_->synchronize(); /* no deadline */
  while (!poll_gpu()) {
    if (limit.count() > 0 && std::chrono::steady_clock::now() - start > limit) {
      try {
        C10_THROW_ERROR(DistBackendError,
                        c10::str("weft: ", opTypeToString(opType_), " on rank ", rank_,
                                 ": the GPU has not finished it after ", limit.count(), " ms"));
      } catch (...) {
        finish_once(std::current_exception());
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  return Work::wait(timeout);
}

void WeftWork::synchronize() {
  if (block_open_ || gpu() == nullptr) return;
  stream_wait_and_drop();
}

c10::intrusive_ptr<c10::ivalue::Future> WeftWork::getFuture() { return future_; }

float WeftWork::getDuration() const {
  gpu_end *g = gpu();
  if (g == nullptr) {
    const int64_t start = started_ns_.load(), end = ended_ns_.load();
    TORCH_CHECK(end != 0 && start != 0, "weft: get_duration() is known once the work has ",
                "completed (wait() for it first)");
    return (float)(end - start) / 1e6f;
  }
  TORCH_CHECK(!g->captured(), "weft: get_duration() of an operation captured ",
              "into a CUDA graph: it runs, and is timed, when the graph does");
  TORCH_CHECK(g->timed(), "weft: get_duration() needs timing: set TORCH_NCCL_ENABLE_TIMING=1 ",
              "(or TORCH_WEFT_ENABLE_TIMING=1), or keep the flight recorder on");
  TORCH_CHECK(!(finished_.load() && exception() != nullptr), "weft: get_duration() of an ",
              "operation that failed");
  // the GPU's time between its start and end events, once it is past both
  g->synchronize();
  return g->elapsed_ms();
}

}  // namespace torch_weft
