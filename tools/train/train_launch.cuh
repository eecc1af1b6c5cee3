// weft-train's kernel launches (train_kernels.cu, train_gpt_kernels.cu):
// one thread per index of a total, in blocks of kTrainThreads.
#ifndef WEFT_TRAIN_LAUNCH_CUH
#define WEFT_TRAIN_LAUNCH_CUH

#include <cuda_runtime.h>

#include <utility>

constexpr int kTrainThreads = 128;

// Each kernel of weft-train is one thread per index, its threads apart: so
// registered for the host build of the device path (tests/device/cuda_emu).
// Written TRAIN_KERNEL_APART(k); as a declaration.
#ifdef WEFT_CUDA_EMU
#define TRAIN_KERNEL_APART(kernel) CUDA_EMU_KERNEL_APART(&kernel) static_assert(true, "")
#else
#define TRAIN_KERNEL_APART(kernel) static_assert(true, "")
#endif

inline unsigned train_blocks_for(size_t n) {
  return (unsigned)((n + kTrainThreads - 1) / kTrainThreads);
}

// One thread per element of total on stream, returning the launch's own
// status from cudaLaunchKernel: an error the caller left pending is neither
// cleared nor taken for the launch's (cudaGetLastError around a <<<>>>
// launch does both).
template <typename... Param, typename... Arg>
inline int train_launch(void (*kernel)(Param...), size_t total, void *stream, Arg &&...args) {
  if (total == 0) return 0;
  const bool pending = cudaPeekAtLastError() != cudaSuccess;
  const cudaError_t err = [&](Param... param) {
    void *argv[] = {(void *)&param...};
    return cudaLaunchKernel((const void *)kernel, dim3(train_blocks_for(total)),
                            dim3(kTrainThreads), argv, 0, (cudaStream_t)stream);
  }(std::forward<Arg>(args)...);
  // the launch's own error is returned, not left for the caller's next look
  if (err != cudaSuccess && !pending) (void)cudaGetLastError();
  return (int)err;
}

#endif
