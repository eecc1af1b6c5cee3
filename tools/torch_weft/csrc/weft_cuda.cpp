// torch_weft on CUDA tensors (weft_cuda.h).
#include "weft_cuda.h"

#include "weft_streams.h"

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

static_assert((int)cudaStreamCaptureModeGlobal == gpu_layer::capture_global &&
                  (int)cudaStreamCaptureModeThreadLocal == gpu_layer::capture_thread_local &&
                  (int)cudaStreamCaptureModeRelaxed == gpu_layer::capture_relaxed,
              "gpu_layer::capture_mode takes cudaStreamCaptureMode's values");

class cuda_layer final : public gpu_layer {
 public:
  void *current_stream(int device) override {
    return c10::cuda::getCurrentCUDAStream((c10::DeviceIndex)device).stream();
  }
  // from torch's pool, as ProcessGroupNCCL takes its streams: torch knows
  // them (a CUDA-aware future, record_stream)
  void *stream_create(int device, bool high_priority) override {
    return c10::cuda::getStreamFromPool(high_priority, (c10::DeviceIndex)device).stream();
  }
  void *event_create(int device, bool timing) override {
    c10::cuda::CUDAGuard guard((c10::DeviceIndex)device);
    cudaEvent_t e = nullptr;
    cuda_check(cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming),
               "cudaEventCreate");
    return e;
  }
  // Never throws (a Work dropped at exit, when CUDA may be unloading, would
  // end the process): no guard, which throws on a CUDA error; an event needs
  // no current device to be destroyed, and errors are dropped.
  void event_destroy(int, void *e) override {
    if (e != nullptr && cudaEventDestroy((cudaEvent_t)e) != cudaSuccess)
      (void)cudaGetLastError(); // ours: not to be reported by torch's next check
  }
  void event_record(int device, void *e, void *s) override {
    c10::cuda::CUDAGuard guard((c10::DeviceIndex)device);
    cuda_check(cudaEventRecord((cudaEvent_t)e, (cudaStream_t)s), "cudaEventRecord");
  }
  void stream_wait(int device, void *s, void *e) override {
    c10::cuda::CUDAGuard guard((c10::DeviceIndex)device);
    cuda_check(cudaStreamWaitEvent((cudaStream_t)s, (cudaEvent_t)e, 0), "cudaStreamWaitEvent");
  }
  bool event_query(int device, void *e) override {
    c10::cuda::CUDAGuard guard((c10::DeviceIndex)device);
    cudaError_t err = cudaEventQuery((cudaEvent_t)e);
    if (err == cudaErrorNotReady) {
      (void)cudaGetLastError(); // not ready is no error: do not leave it behind
      return false;
    }
    cuda_check(err, "cudaEventQuery");
    return true;
  }
  void event_synchronize(int device, void *e) override {
    c10::cuda::CUDAGuard guard((c10::DeviceIndex)device);
    cuda_check(cudaEventSynchronize((cudaEvent_t)e), "cudaEventSynchronize");
  }
  float event_elapsed_ms(int device, void *start, void *end) override {
    c10::cuda::CUDAGuard guard((c10::DeviceIndex)device);
    float ms = 0;
    cuda_check(cudaEventElapsedTime(&ms, (cudaEvent_t)start, (cudaEvent_t)end),
               "cudaEventElapsedTime");
    return ms;
  }
  // the thread's own setting: no device, no context needed
  capture_mode exchange_capture_mode(capture_mode mode) override {
    cudaStreamCaptureMode m = (cudaStreamCaptureMode)mode;
    cuda_check(cudaThreadExchangeStreamCaptureMode(&m), "cudaThreadExchangeStreamCaptureMode");
    return (capture_mode)m;
  }
  bool capturing(int device, void *s) override {
    c10::cuda::CUDAGuard guard((c10::DeviceIndex)device);
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    cuda_check(cudaStreamIsCapturing((cudaStream_t)s, &status), "cudaStreamIsCapturing");
    return status != cudaStreamCaptureStatusNone;
  }
  void hold(int device, void *s, const std::vector<at::Tensor> &tensors) override {
    const c10::cuda::CUDAStream stream =
        c10::cuda::getStreamFromExternal((cudaStream_t)s, (c10::DeviceIndex)device);
    // a no-op for memory allocated on the stream itself, or not by the
    // caching allocator
    for (const auto &t : tensors)
      if (t.defined() && t.is_cuda() && t.has_storage())
        c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), stream);
  }
  c10::intrusive_ptr<c10::ivalue::Future> future(int device, void *s,
                                                 const std::vector<at::Tensor> &outputs) override {
    const c10::Device dev(c10::DeviceType::CUDA, (c10::DeviceIndex)device);
    auto fut = c10::make_intrusive<c10::ivalue::Future>(
        c10::ListType::create(c10::TensorType::get()), std::vector<c10::Device>{dev});
    // the future records its events on the current stream: make it s
    c10::cuda::CUDAStreamGuard guard(
        c10::cuda::getStreamFromExternal((cudaStream_t)s, (c10::DeviceIndex)device));
    fut->markCompleted(c10::IValue(outputs));
    return fut;
  }
  void on_stream(int device, void *s, const std::function<void()> &body) override {
    c10::cuda::CUDAGuard guard((c10::DeviceIndex)device);
    c10::cuda::CUDAStreamGuard stream_guard(
        c10::cuda::getStreamFromExternal((cudaStream_t)s, (c10::DeviceIndex)device));
    body();
  }
};

}  // namespace

bool cuda_built() { return true; }

gpu_layer *gpu_real_layer() {
  static cuda_layer layer;
  return &layer;
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

#else

bool cuda_built() { return false; }

gpu_layer *gpu_real_layer() { return nullptr; }

[[noreturn]] static void no_cuda() {
  TORCH_CHECK(false, "weft: this torch_weft was built without CUDA support");
}

void *gpu_current_stream(int) { no_cuda(); }
void gpu_stream_sync(int, void *) { no_cuda(); }

#endif

}  // namespace torch_weft
