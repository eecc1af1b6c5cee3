// The device suites' fixture: whether there is a GPU, n ranks sharing GPU 0
// in one process (weftCommInitAll), a CUDA stream each; and WEFT_* settings
// for one test (ScopedEnv).
#ifndef WEFT_TESTS_DEV_RANKS_H
#define WEFT_TESTS_DEV_RANKS_H

#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <cstdlib>
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "weft.h"
extern "C" {
#include "collectives/core/params.h"
#include "transport/base/param.h"
#include "transport/cuda_ipc/cuda_params.h"
#include "collectives/exec/device/device_params.h"
#include "transport/base/wait.h"
}

// Whether this process sees a CUDA device.
inline bool have_gpu() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return n > 0;
}

// How much longer than on a GPU a bound on time is: 4 where the kernels run
// on host threads (tests/device/cuda_emu, a device named so), whose blocks
// share two cores with every rank's others; 1 on a GPU.
inline double gpu_time_scale() {
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
    cudaGetLastError();
    return 1.0;
  }
  return std::string(prop.name).rfind("cuda_emu", 0) == 0 ? 4.0 : 1.0;
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

// Sets WEFT_* variables for one test and puts back what was there after,
// forgetting the cached values both times (the device and wait tables).
struct ScopedEnv {
  std::vector<std::pair<std::string, std::optional<std::string>>> saved; // name, old value
  ScopedEnv(std::initializer_list<std::pair<const char *, const char *>> vars) {
    for (auto &[name, value] : vars) {
      const char *old = getenv(name);
      saved.emplace_back(name, old ? std::optional<std::string>(old) : std::nullopt);
      setenv(name, value, 1);
    }
    reset();
  }
  ~ScopedEnv() {
    for (auto &[name, old] : saved) {
      if (old) setenv(name.c_str(), old->c_str(), 1);
      else unsetenv(name.c_str());
    }
    reset();
  }
  static void reset() {
    struct weft_param *const tables[] = {cuda_transport_params, device_params, wait_params,
                                         coll_params, NULL};
    param_tables_reset(tables);
  }
};

#endif
