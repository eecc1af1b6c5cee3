// torch_weft on CUDA tensors: what the backend needs from CUDA, behind a
// small interface so that weft_backend.cpp builds the same with and without
// torch's CUDA support (weft_cuda.cpp is built with TORCH_WEFT_CUDA when the
// installed torch has it).
//
// An operation on CUDA tensors runs on the caller's thread, on the caller's
// current CUDA stream of the tensors' device: weft enqueues its kernels
// there and returns, as NCCL does. Work on that stream before the operation
// (what produced its inputs) is ordered before it, and work after it is
// ordered after it, without events.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>

#include <functional>
#include <memory>

namespace torch_weft {

// Whether this build runs operations on CUDA tensors.
bool cuda_built();

// Calls body with the current CUDA stream of device (a cudaStream_t, as
// weft's calls take it), with device current on this thread.
void on_cuda_stream(int device, const std::function<void(void *stream)> &body);

// A point on a CUDA stream: the GPU has passed it once done() is true.
class GpuMark {
 public:
  virtual ~GpuMark() = default;
  virtual bool done() = 0;
  // Recorded while a graph captured the stream: the GPU passes it when the
  // graph runs, and nothing may ask before (an event query would break the
  // capture); done() is not to be called.
  virtual bool captured() const = 0;
  // The caller's current stream of the mark's device waits for the mark.
  virtual void stream_wait() = 0;
};

// Keeps the caching allocator from giving the memory of tensors (on device)
// to other work before stream is past its current point, as record_stream
// does: for tensors the caller made on another stream and drops after the
// call returns.
void gpu_hold(int device, void *stream, const std::vector<at::Tensor> &tensors);

// The calling thread's current stream of device (-1: the current device).
void *gpu_current_stream(int device);

// Waits on the host until stream of device (-1: the current device) is past
// what it holds.
void gpu_stream_sync(int device, void *stream);

// Marks the current point of stream on device.
std::shared_ptr<GpuMark> gpu_mark(int device, void *stream);

// A completed future of outputs whose users on device order themselves after
// stream's current point (a CUDA-aware future, as DDP's comm hooks expect).
c10::intrusive_ptr<c10::ivalue::Future> gpu_future(int device, void *stream,
                                                   const std::vector<at::Tensor> &outputs);

}  // namespace torch_weft
