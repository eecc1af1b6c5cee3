// torch_weft on CUDA tensors: the real CUDA layer of the stream logic
// (weft_streams.h, gpu_real_layer), over c10::cuda and the CUDA runtime,
// and what the barrier needs; weft_cuda.cpp is built with TORCH_WEFT_CUDA
// when the installed torch has CUDA, and without it every entry says so.
#pragma once

#include <ATen/ATen.h>

namespace torch_weft {

class gpu_layer;

// Whether this build runs operations on CUDA tensors.
bool cuda_built();

// The layer over CUDA; null in a build without it.
gpu_layer *gpu_real_layer();

// The calling thread's current stream of device (-1: the current device).
void *gpu_current_stream(int device);

// Waits on the host until stream of device (-1: the current device) is past
// what it holds.
void gpu_stream_sync(int device, void *stream);

}  // namespace torch_weft
