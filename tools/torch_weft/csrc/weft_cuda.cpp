// torch_weft on CUDA tensors (weft_cuda.h).
#include "weft_cuda.h"

#ifdef TORCH_WEFT_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

namespace torch_weft {

#ifdef TORCH_WEFT_CUDA

namespace {

void cuda_check(cudaError_t err, const char *what) {
  TORCH_CHECK(err == cudaSuccess, "weft: ", what, ": ", cudaGetErrorString(err));
}

class CudaMark final : public GpuMark {
 public:
  CudaMark(int device, void *stream) : device_(device) {
    c10::cuda::CUDAGuard guard((c10::DeviceIndex)device);
    cuda_check(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "cudaEventCreate");
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    cuda_check(cudaStreamIsCapturing((cudaStream_t)stream, &capture), "cudaStreamIsCapturing");
    captured_ = capture != cudaStreamCaptureStatusNone;
    cuda_check(cudaEventRecord(event_, (cudaStream_t)stream), "cudaEventRecord");
  }
  // Never throws (a Work dropped at exit, when CUDA may be unloading, would
  // end the process): no guard, which throws on a CUDA error; an event needs
  // no current device to be destroyed, and errors are dropped.
  ~CudaMark() override {
    if (event_ != nullptr && cudaEventDestroy(event_) != cudaSuccess)
      (void)cudaGetLastError(); // ours: not to be reported by torch's next check
  }
  bool done() override {
    c10::cuda::CUDAGuard guard((c10::DeviceIndex)device_);
    cudaError_t err = cudaEventQuery(event_);
    if (err == cudaErrorNotReady) {
      (void)cudaGetLastError(); // not ready is no error: do not leave it behind
      return false;
    }
    cuda_check(err, "cudaEventQuery");
    return true;
  }
  bool captured() const override { return captured_; }
  void stream_wait() override {
    c10::cuda::CUDAGuard guard((c10::DeviceIndex)device_);
    cudaStream_t cur = c10::cuda::getCurrentCUDAStream((c10::DeviceIndex)device_).stream();
    cuda_check(cudaStreamWaitEvent(cur, event_, 0), "cudaStreamWaitEvent");
  }

 private:
  int device_;
  cudaEvent_t event_ = nullptr;
  bool captured_ = false;
};

}  // namespace

bool cuda_built() { return true; }

void on_cuda_stream(int device, const std::function<void(void *stream)> &body) {
  c10::cuda::CUDAGuard guard((c10::DeviceIndex)device);
  body(c10::cuda::getCurrentCUDAStream((c10::DeviceIndex)device).stream());
}

void gpu_hold(int device, void *stream, const std::vector<at::Tensor> &tensors) {
  const c10::cuda::CUDAStream s =
      c10::cuda::getStreamFromExternal((cudaStream_t)stream, (c10::DeviceIndex)device);
  // a no-op for memory allocated on s itself, or not by the caching allocator
  for (const auto &t : tensors)
    if (t.defined() && t.is_cuda() && t.has_storage())
      c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), s);
}

void *gpu_current_stream(int device) {
  if (device < 0) device = c10::cuda::current_device();
  return c10::cuda::getCurrentCUDAStream((c10::DeviceIndex)device).stream();
}

void gpu_stream_sync(int device, void *stream) {
  if (device < 0) device = c10::cuda::current_device();
  c10::cuda::CUDAGuard guard((c10::DeviceIndex)device);
  cuda_check(cudaStreamSynchronize((cudaStream_t)stream), "cudaStreamSynchronize");
}

std::shared_ptr<GpuMark> gpu_mark(int device, void *stream) {
  return std::make_shared<CudaMark>(device, stream);
}

c10::intrusive_ptr<c10::ivalue::Future> gpu_future(int device, void *stream,
                                                   const std::vector<at::Tensor> &outputs) {
  const c10::Device dev(c10::DeviceType::CUDA, (c10::DeviceIndex)device);
  auto fut = c10::make_intrusive<c10::ivalue::Future>(
      c10::ListType::create(c10::TensorType::get()), std::vector<c10::Device>{dev});
  // the future records its events on the current stream: make it stream
  c10::cuda::CUDAStreamGuard guard(
      c10::cuda::getStreamFromExternal((cudaStream_t)stream, (c10::DeviceIndex)device));
  fut->markCompleted(c10::IValue(outputs));
  return fut;
}

#else

bool cuda_built() { return false; }

[[noreturn]] static void no_cuda() {
  TORCH_CHECK(false, "weft: this torch_weft was built without CUDA support");
}

void on_cuda_stream(int, const std::function<void(void *)> &) { no_cuda(); }
void gpu_hold(int, void *, const std::vector<at::Tensor> &) { no_cuda(); }
void *gpu_current_stream(int) { no_cuda(); }
void gpu_stream_sync(int, void *) { no_cuda(); }
std::shared_ptr<GpuMark> gpu_mark(int, void *) { no_cuda(); }
c10::intrusive_ptr<c10::ivalue::Future> gpu_future(int, void *, const std::vector<at::Tensor> &) {
  no_cuda();
}

#endif

}  // namespace torch_weft
