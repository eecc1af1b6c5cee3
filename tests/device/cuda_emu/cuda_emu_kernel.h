// Force-included (-include) when a device source (.cu) is compiled by the
// host's C++ compiler for cuda_emu (-Ddevice_emulate=true): the CUDA
// language the kernels use, on host threads. The sources' few PTX
// statements (prims_device.cuh) have their host forms under WEFT_CUDA_EMU.
#ifndef WEFT_CUDA_EMU_KERNEL_H
#define WEFT_CUDA_EMU_KERNEL_H

#ifndef WEFT_CUDA_EMU
#define WEFT_CUDA_EMU 1
#endif

// before the macros below (its templates name parameters gridDim, blockDim):
// what nvcc adds for host code, cudaMalloc into any pointer type included
#include <cuda_runtime.h>

#include <math.h> // nvcc's device code sees the math functions (tanhf, isfinite) unasked

#include <cmath>
#include <cstddef>
#include <tuple>
#include <utility>

#include "tests/device/cuda_emu/cuda_emu.h"

// a __shared__ variable would be each thread's own here: cuda_emu_shared()
#undef __shared__
#define __shared__ __shared___is_per_thread_under_cuda_emu_use_cuda_emu_shared

#undef __launch_bounds__
#define __launch_bounds__(...)

#define threadIdx (cuda_emu_self()->thread_idx)
#define blockIdx (cuda_emu_self()->block_idx)
#define blockDim (cuda_emu_self()->block_dim)
#define gridDim (cuda_emu_self()->grid_dim)

static inline void __syncthreads() { cuda_emu_syncthreads_or(0); }
static inline int __syncthreads_or(int pred) { return cuda_emu_syncthreads_or(pred); }
static inline void __threadfence_system() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
static inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

// atomicAdd: the host's atomics, a compare-and-swap loop for floating point.
// Returns the old value.
static inline int atomicAdd(int *p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
static inline unsigned atomicAdd(unsigned *p, unsigned v) {
  return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}
static inline unsigned long long atomicAdd(unsigned long long *p, unsigned long long v) {
  return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}
template <class F> static inline F cuda_emu_atomic_add_fp(F *p, F v) {
  F old, sum;
  __atomic_load(p, &old, __ATOMIC_RELAXED);
  do sum = old + v;
  while (!__atomic_compare_exchange(p, &old, &sum, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
  return old;
}
static inline float atomicAdd(float *p, float v) { return cuda_emu_atomic_add_fp(p, v); }
static inline double atomicAdd(double *p, double v) { return cuda_emu_atomic_add_fp(p, v); }

// The runtime's entry for kernel F: its parameters copied from a launch's
// args, F called with them.
template <auto F> struct cuda_emu_entry;
template <class... A, void (*F)(A...)> struct cuda_emu_entry<F> {
  template <std::size_t... I> static void call(void **args, std::index_sequence<I...>) {
    F(*static_cast<A *>(args[I])...);
  }
  static void run(void **args) { call(args, std::index_sequence_for<A...>{}); }
  static int reg(int apart = 0) {
    static const std::size_t sizes[] = {sizeof(A)..., 0};
    return cuda_emu_register(reinterpret_cast<const void *>(F), run, (int)sizeof...(A), sizes,
                             __PRETTY_FUNCTION__, apart);
  }
  // F<<<grid, block>>>(x...) on the legacy stream
  template <class... X> static cudaError_t launch(dim3 grid, dim3 block, X &&...x) {
    static const int registered = reg(); // where no CUDA_EMU_KERNEL* did
    (void)registered;
    std::tuple<A...> params(std::forward<X>(x)...);
    return launch_params(grid, block, params, std::index_sequence_for<A...>{});
  }
  template <std::size_t... I>
  static cudaError_t launch_params(dim3 grid, dim3 block, std::tuple<A...> &params,
                                   std::index_sequence<I...>) {
    void *args[] = {(void *)&std::get<I>(params)..., nullptr};
    return cudaLaunchKernel(reinterpret_cast<const void *>(F), grid, block, args, 0, 0);
  }
};

#define CUDA_EMU_CAT2(a, b) a##b
#define CUDA_EMU_CAT(a, b) CUDA_EMU_CAT2(a, b)
// Registers a kernel (its address as a launch names it) when the program starts.
// The launch F<<<grid, block>>>(args...) is written CUDA_EMU_LAUNCH(F, grid, block, args...).
#define CUDA_EMU_LAUNCH(F, grid, block, ...) cuda_emu_entry<&F>::launch(grid, block, __VA_ARGS__)
#define CUDA_EMU_KERNEL(...) \
  static const int CUDA_EMU_CAT(cuda_emu_reg_, __COUNTER__) = cuda_emu_entry<__VA_ARGS__>::reg();
// A kernel whose threads never meet (one thread per index, each on its own
// outputs): registered apart, so that every thread of blockDim runs
// (cuda_emu_register). __syncthreads or shared memory in it stops the program.
#define CUDA_EMU_KERNEL_APART(...) \
  static const int CUDA_EMU_CAT(cuda_emu_reg_, __COUNTER__) = cuda_emu_entry<__VA_ARGS__>::reg(1);

#endif
