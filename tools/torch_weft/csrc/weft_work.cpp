// torch_weft: Work objects (weft_work.h).
#include "weft_work.h"

#include <thread>

namespace torch_weft {

void WeftWork::release_held() {
  if (held_) queue_->release_held();
}

// For an operation on a CUDA stream: whether it is done (or failed), and
// the Work finished if so.
bool WeftWork::poll_gpu() {
  if (Work::isCompleted()) return true;
  if (gpu_->done()) {
    finish_once(nullptr);
    return true;
  }
  if (std::exception_ptr e = async_error_()) {
    finish_once(e);
    return true;
  }
  return false;
}

bool WeftWork::isCompleted() {
  release_held();
  if (gpu_) poll_gpu();
  return Work::isCompleted();
}

// On a CUDA stream, waits on the host until the GPU is past the operation
// (so that a failure raises here) and orders the caller's current stream
// after it.
bool WeftWork::wait(std::chrono::milliseconds timeout) {
  release_held();
  if (gpu_) {
    const auto limit = timeout == kNoTimeout ? gpu_timeout_ : timeout;
    const auto start = std::chrono::steady_clock::now();
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
    if (exception() == nullptr) gpu_->stream_wait();
  }
  return Work::wait(timeout);
}

c10::intrusive_ptr<c10::ivalue::Future> WeftWork::getFuture() {
  release_held();
  return future_;
}

}  // namespace torch_weft
