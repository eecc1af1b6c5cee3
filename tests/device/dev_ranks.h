// The device suites' fixture: whether there is a GPU, and n ranks sharing
// GPU 0 in one process (weftCommInitAll), a CUDA stream each.
#ifndef WEFT_TESTS_DEV_RANKS_H
#define WEFT_TESTS_DEV_RANKS_H

#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <vector>

#include "weft.h"

// Whether this process sees a CUDA device.
inline bool have_gpu() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return n > 0;
}

#define REQUIRE_GPU() \
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device"

struct Ranks {
  std::vector<weftComm_t> comms;
  std::vector<cudaStream_t> streams;
  explicit Ranks(int n) : comms(n), streams(n) {
    std::vector<int> devs(n, 0);
    cudaSetDevice(0);
    EXPECT_EQ(weftCommInitAll(comms.data(), n, devs.data()), weftSuccess)
        << weftGetLastError(nullptr);
    for (auto &s : streams) cudaStreamCreate(&s);
  }
  ~Ranks() {
    for (auto &s : streams) cudaStreamDestroy(s);
    for (auto c : comms) weftCommDestroy(c);
  }
  void sync() {
    for (auto &s : streams) ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  }
};

#endif
