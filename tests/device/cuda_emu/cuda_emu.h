/* cuda_emu: the CUDA runtime calls weft's device path makes, served on the
 * host, so that the device kernels (compiled for the host by
 * cuda_emu_kernel.h) run without a GPU: device memory is shared memory that
 * other processes map through IPC handles, a stream is a thread that runs
 * its queue in order, a kernel launch runs each block as a set of threads.
 * For tests only (-Ddevice_emulate=true, docs/cuda.md): it checks what the
 * kernels compute and how they wait, not how fast a GPU runs them.
 *
 * This header is what the kernels' host build sees of it: the launch
 * registry and each kernel thread's coordinates. */
#ifndef WEFT_CUDA_EMU_H
#define WEFT_CUDA_EMU_H

#include <stddef.h>
#include <stdint.h>

#include <vector_types.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A kernel as the runtime calls it: its parameters as cudaLaunchKernel's
 * args (each a pointer to a copy the runtime keeps for the launch). */
typedef void (*cuda_emu_run_fn)(void **args);

/* Registers the kernel whose host address is fn (what the launch names):
 * nargs parameters of sizes[i] bytes; name for messages
 * (WEFT_CUDA_EMU_LOG=1 prints each launch). apart: its threads never meet
 * (no __syncthreads, no shared memory, no waiting on one another), so every
 * thread of the launch's blockDim runs, one after another on a few host
 * threads; otherwise a block runs as WEFT_CUDA_EMU_THREADS threads at once
 * and the kernel strides by blockDim. The first registration of fn stays.
 * Returns 0. */
int cuda_emu_register(const void *fn, cuda_emu_run_fn run, int nargs, const size_t *sizes,
                      const char *name, int apart);

/* The calling kernel thread's coordinates. */
struct cuda_emu_thread {
  uint3 thread_idx, block_idx;
  dim3 block_dim, grid_dim;
  void *block; /* the block's barrier; NULL in a kernel registered apart */
  const char *kernel; /* its name, for messages */
};
struct cuda_emu_thread *cuda_emu_self(void);

/* The calling thread's block's shared memory (__shared__): nbytes, at most
 * CUDA_EMU_SHARED_NBYTES, zeroed when the block starts. One variable (a
 * struct) per kernel. */
#define CUDA_EMU_SHARED_NBYTES 16384
void *cuda_emu_shared(size_t nbytes);

/* __syncthreads_or: every thread of the block arrives; returns whether any
 * passed nonzero. */
int cuda_emu_syncthreads_or(int pred);

/* Called from each poll of a volatile word: lets the other threads (other
 * blocks, other ranks' kernels) run on a host with fewer cores than
 * threads. */
void cuda_emu_poll(void);

/* The GPU's global timer: nanoseconds. */
uint64_t cuda_emu_clock_ns(void);

#ifdef __cplusplus
}
#endif

#endif
