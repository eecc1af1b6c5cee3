// The device executor's order and refusals on a GPU: CUDA graph capture of
// a group of collectives (a comm's first call inside a capture too), one
// comm on several streams (the gate between them, a new stream with a
// destroyed one's handle), destroy waiting for the comm's own kernels, and
// buffers that neither executor reaches. Skips without a GPU; part of the
// test_device binary (test_device.cc has the collectives' matrix).
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <cstdio>
#include <string>
#include <unistd.h>
#include <vector>

#include "tests/device/dev_ranks.h"
#include "weft.h"

namespace {

// A group of all-reduces captured into one CUDA graph per rank, replayed with
// new inputs: each replay reduces what the buffers hold then.
TEST(DeviceGraph, CapturedAllReduceReplays) {
  REQUIRE_GPU();
  const int k = 3;
  const size_t n = 100003;
  Ranks ranks(k);
  std::vector<float *> buf(k);
  for (int r = 0; r < k; r++)
    ASSERT_EQ(cudaMalloc((void **)&buf[r], n * sizeof(float)), cudaSuccess);
  // connect outside capture once, as a program's first call usually is
  ASSERT_EQ(weftGroupStart(), weftSuccess);
  for (int r = 0; r < k; r++)
    ASSERT_EQ(weftAllReduce(buf[r], buf[r], n, weftFloat32, weftSum, ranks.comms[r], ranks.streams[r]), weftSuccess);
  ASSERT_EQ(weftGroupEnd(), weftSuccess);
  ranks.sync();

  std::vector<cudaGraph_t> graphs(k);
  std::vector<cudaGraphExec_t> execs(k);
  for (int r = 0; r < k; r++)
    ASSERT_EQ(cudaStreamBeginCapture(ranks.streams[r], cudaStreamCaptureModeThreadLocal), cudaSuccess);
  ASSERT_EQ(weftGroupStart(), weftSuccess);
  for (int r = 0; r < k; r++)
    ASSERT_EQ(weftAllReduce(buf[r], buf[r], n, weftFloat32, weftSum, ranks.comms[r], ranks.streams[r]), weftSuccess);
  ASSERT_EQ(weftGroupEnd(), weftSuccess);
  // every capture ends before any graph is instantiated: instantiating is not
  // permitted while this thread still captures a stream
  for (int r = 0; r < k; r++)
    ASSERT_EQ(cudaStreamEndCapture(ranks.streams[r], &graphs[r]), cudaSuccess);
  for (int r = 0; r < k; r++) {
    cudaError_t e = cudaGraphInstantiate(&execs[r], graphs[r], 0);
    ASSERT_EQ(e, cudaSuccess) << "rank " << r << ": " << cudaGetErrorString(e);
  }
  for (int replay = 0; replay < 3; replay++) {
    std::vector<std::vector<float>> in(k, std::vector<float>(n));
    for (int r = 0; r < k; r++) {
      for (size_t i = 0; i < n; i++) in[r][i] = (float)((i * 7 + r * 13 + replay * 5) % 101);
      ASSERT_EQ(cudaMemcpy(buf[r], in[r].data(), n * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    }
    for (int r = 0; r < k; r++) ASSERT_EQ(cudaGraphLaunch(execs[r], ranks.streams[r]), cudaSuccess);
    ranks.sync();
    for (int r = 0; r < k; r++) {
      std::vector<float> out(n);
      ASSERT_EQ(cudaMemcpy(out.data(), buf[r], n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
      for (size_t i = 0; i < n; i += 997)
        ASSERT_EQ(out[i], in[0][i] + in[1][i] + in[2][i]) << "replay " << replay << " rank " << r << " i " << i;
    }
  }
  for (int r = 0; r < k; r++) {
    cudaGraphExecDestroy(execs[r]);
    cudaGraphDestroy(graphs[r]);
    cudaFree(buf[r]);
  }
}

// A comm's first collective inside a capture (global mode, blocking
// streams): set-up allocates and copies on a stream of its own, so the
// capture survives, and the graph replays with the right sums.
TEST(DeviceGraph, FirstCallConnectsInsideCapture) {
  REQUIRE_GPU();
  const int k = 2;
  const size_t n = 70001;
  Ranks ranks(k);
  std::vector<float *> buf(k);
  for (int r = 0; r < k; r++)
    ASSERT_EQ(cudaMalloc((void **)&buf[r], n * sizeof(float)), cudaSuccess);
  std::vector<cudaGraph_t> graphs(k);
  for (int r = 0; r < k; r++)
    ASSERT_EQ(cudaStreamBeginCapture(ranks.streams[r], cudaStreamCaptureModeGlobal), cudaSuccess);
  ASSERT_EQ(weftGroupStart(), weftSuccess);
  for (int r = 0; r < k; r++)
    ASSERT_EQ(weftAllReduce(buf[r], buf[r], n, weftFloat32, weftSum, ranks.comms[r], ranks.streams[r]),
              weftSuccess);
  EXPECT_EQ(weftGroupEnd(), weftSuccess) << weftGetLastError(nullptr);
  for (int r = 0; r < k; r++) {
    cudaError_t e = cudaStreamEndCapture(ranks.streams[r], &graphs[r]);
    ASSERT_EQ(e, cudaSuccess) << "rank " << r << ": " << cudaGetErrorString(e);
  }
  std::vector<cudaGraphExec_t> execs(k);
  for (int r = 0; r < k; r++) ASSERT_EQ(cudaGraphInstantiate(&execs[r], graphs[r], 0), cudaSuccess);
  std::vector<std::vector<float>> in(k, std::vector<float>(n));
  for (int r = 0; r < k; r++) {
    for (size_t i = 0; i < n; i++) in[r][i] = (float)((i * 3 + (size_t)r * 17) % 89);
    ASSERT_EQ(cudaMemcpy(buf[r], in[r].data(), n * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  }
  for (int r = 0; r < k; r++) ASSERT_EQ(cudaGraphLaunch(execs[r], ranks.streams[r]), cudaSuccess);
  ranks.sync();
  for (int r = 0; r < k; r++) {
    std::vector<float> out(n);
    ASSERT_EQ(cudaMemcpy(out.data(), buf[r], n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    for (size_t i = 0; i < n; i++) ASSERT_EQ(out[i], in[0][i] + in[1][i]) << "rank " << r << " i " << i;
    cudaGraphExecDestroy(execs[r]);
    cudaGraphDestroy(graphs[r]);
    cudaFree(buf[r]);
  }
}


// One comm used on two streams, as a caller may (PyTorch's streams, a side
// stream for one bucket): each launch continues the FIFO steps the comm's
// previous one left, so it must follow that launch whatever the stream.
// Rank 0's main stream is held up 20 ms (a host function) before each even
// round, so that its next round, on the side stream, would run first if
// nothing ordered it: it would then meet rank 1's earlier round, whose
// inputs differ, or run beside rank 0's own round on the same counters.
// Every result is checked.
TEST(DeviceStreams, OneCommOnTwoStreamsKeepsItsOrder) {
  REQUIRE_GPU();
  ScopedEnv env({{"WEFT_TIMEOUT", "20"}});
  const int k = 2, rounds = 6;
  const size_t n = 1 << 20;
  Ranks ranks(k);
  std::vector<cudaStream_t> side(k);
  std::vector<std::vector<float *>> buf(k, std::vector<float *>(rounds));
  auto input = [](int r, int j, size_t i) { return (float)((i * 7 + (size_t)r * 29) % 113 + j * 1000); };
  std::vector<float> h(n);
  for (int r = 0; r < k; r++) {
    ASSERT_EQ(cudaStreamCreateWithFlags(&side[r], cudaStreamNonBlocking), cudaSuccess);
    for (int j = 0; j < rounds; j++) {
      for (size_t i = 0; i < n; i++) h[i] = input(r, j, i);
      ASSERT_EQ(cudaMalloc((void **)&buf[r][j], n * sizeof(float)), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(buf[r][j], h.data(), n * sizeof(float), cudaMemcpyHostToDevice),
                cudaSuccess);
    }
  }
  for (int j = 0; j < rounds; j++) {
    if (j % 2 == 0) {
      ASSERT_EQ(cudaLaunchHostFunc(ranks.streams[0], [](void *) { usleep(20000); }, nullptr),
                cudaSuccess);
    }
    ASSERT_EQ(weftGroupStart(), weftSuccess);
    for (int r = 0; r < k; r++)
      ASSERT_EQ(weftAllReduce(buf[r][j], buf[r][j], n, weftFloat32, weftSum, ranks.comms[r],
                              j % 2 == 0 ? ranks.streams[r] : side[r]),
                weftSuccess);
    ASSERT_EQ(weftGroupEnd(), weftSuccess) << weftGetLastError(nullptr);
  }
  ranks.sync();
  for (int r = 0; r < k; r++) ASSERT_EQ(cudaStreamSynchronize(side[r]), cudaSuccess);
  for (int r = 0; r < k; r++)
    for (int j = 0; j < rounds; j++) {
      ASSERT_EQ(cudaMemcpy(h.data(), buf[r][j], n * sizeof(float), cudaMemcpyDeviceToHost),
                cudaSuccess);
      for (size_t i = 0; i < n; i++)
        ASSERT_EQ(h[i], input(0, j, i) + input(1, j, i)) << "rank " << r << " round " << j << " i " << i;
      cudaFree(buf[r][j]);
    }
  for (int r = 0; r < k; r++) cudaStreamDestroy(side[r]);
}

// Destroy waits for the comm's own kernels (the ends they report:
// launch_done.h) before it frees their FIFOs, even where the calls went to
// streams destroyed since: a comm destroyed right after its launches of
// 64 MiB all-reduces (still running), its results whole after. Then the
// same after a switch of streams (a gate: kernels_gate.cu) and an abort.
TEST(DeviceStreams, DestroyWaitsForItsOwnKernels) {
  REQUIRE_GPU();
  ScopedEnv env({{"WEFT_TIMEOUT", "60"}});
  const int k = 2;
  const size_t n = 16 << 20; // 64 MiB: kernels that run a while
  cudaSetDevice(0);
  std::vector<int> devs(k, 0);
  std::vector<float> h(n);
  std::vector<float *> buf(k);
  for (int r = 0; r < k; r++)
    ASSERT_EQ(cudaMalloc((void **)&buf[r], n * sizeof(float)), cudaSuccess);
  for (bool abort_it : {false, true}) {
    std::vector<weftComm_t> a(k);
    ASSERT_EQ(weftCommInitAll(a.data(), k, devs.data()), weftSuccess) << weftGetLastError(nullptr);
    for (int r = 0; r < k; r++) {
      for (size_t i = 0; i < n; i++) h[i] = (float)((i * 13 + (size_t)r * 5) % 97);
      ASSERT_EQ(cudaMemcpy(buf[r], h.data(), n * sizeof(float), cudaMemcpyHostToDevice),
                cudaSuccess);
    }
    // three calls: the first two on one stream per rank, the third on
    // another (behind a gate while the second runs); every stream
    // destroyed before the comm
    std::vector<cudaStream_t> s1(k), s2(k);
    for (int r = 0; r < k; r++) {
      ASSERT_EQ(cudaStreamCreateWithFlags(&s1[r], cudaStreamNonBlocking), cudaSuccess);
      ASSERT_EQ(cudaStreamCreateWithFlags(&s2[r], cudaStreamNonBlocking), cudaSuccess);
    }
    for (int j = 0; j < 3; j++) {
      ASSERT_EQ(weftGroupStart(), weftSuccess);
      for (int r = 0; r < k; r++)
        ASSERT_EQ(weftAllReduce(buf[r], buf[r], n, weftFloat32, weftSum, a[r],
                                j < 2 ? s1[r] : s2[r]),
                  weftSuccess);
      ASSERT_EQ(weftGroupEnd(), weftSuccess) << weftGetLastError(nullptr);
    }
    for (int r = 0; r < k; r++) {
      ASSERT_EQ(cudaStreamDestroy(s1[r]), cudaSuccess);
      ASSERT_EQ(cudaStreamDestroy(s2[r]), cudaSuccess);
    }
    if (abort_it) {
      for (int r = 0; r < k; r++) ASSERT_EQ(weftCommAbort(a[r]), weftSuccess);
      continue; // the results of aborted calls are not defined
    }
    for (int r = 0; r < k; r++) ASSERT_EQ(weftCommDestroy(a[r]), weftSuccess);
    for (int r = 0; r < k; r++) {
      ASSERT_EQ(cudaMemcpy(h.data(), buf[r], n * sizeof(float), cudaMemcpyDeviceToHost),
                cudaSuccess);
      for (size_t i = 0; i < n; i += 4099) { // three sums of the two ranks' inputs, in place
        float x = (float)((i * 13) % 97) + (float)((i * 13 + 5) % 97);
        ASSERT_EQ(h[i], 4 * x) << "rank " << r << " i " << i;
      }
    }
  }
  for (int r = 0; r < k; r++) cudaFree(buf[r]);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// A stream destroyed while the comm's launch on it runs, and a new one made
// at once, which CUDA tends to give the same handle: the comm still sees a
// switch of streams (it keys streams by id, not handle) and puts the next
// call behind a gate. Rank 0's destroyed stream is held up 30 ms first, so
// that without the gate the next call would run beside the first on the
// same FIFO steps. Both rounds' results are checked.
TEST(DeviceStreams, ANewStreamWithAnOldHandleIsStillAnotherStream) {
  REQUIRE_GPU();
  ScopedEnv env({{"WEFT_TIMEOUT", "20"}});
  const int k = 2;
  const size_t n = 4 << 20;
  Ranks ranks(k);
  auto input = [](int r, int j, size_t i) { return (float)((i * 11 + (size_t)r * 17) % 101 + j * 500); };
  std::vector<std::vector<float *>> buf(k, std::vector<float *>(2));
  std::vector<float> h(n);
  for (int r = 0; r < k; r++)
    for (int j = 0; j < 2; j++) {
      for (size_t i = 0; i < n; i++) h[i] = input(r, j, i);
      ASSERT_EQ(cudaMalloc((void **)&buf[r][j], n * sizeof(float)), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(buf[r][j], h.data(), n * sizeof(float), cudaMemcpyHostToDevice),
                cudaSuccess);
    }
  std::vector<cudaStream_t> a(k), b(k);
  for (int r = 0; r < k; r++)
    ASSERT_EQ(cudaStreamCreateWithFlags(&a[r], cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaLaunchHostFunc(a[0], [](void *) { usleep(30000); }, nullptr), cudaSuccess);
  ASSERT_EQ(weftGroupStart(), weftSuccess);
  for (int r = 0; r < k; r++)
    ASSERT_EQ(weftAllReduce(buf[r][0], buf[r][0], n, weftFloat32, weftSum, ranks.comms[r], a[r]),
              weftSuccess);
  ASSERT_EQ(weftGroupEnd(), weftSuccess) << weftGetLastError(nullptr);
  int reused = 0;
  for (int r = 0; r < k; r++) {
    ASSERT_EQ(cudaStreamDestroy(a[r]), cudaSuccess); // its work goes on
    ASSERT_EQ(cudaStreamCreateWithFlags(&b[r], cudaStreamNonBlocking), cudaSuccess);
    reused += b[r] == a[r];
  }
  printf("new streams with a destroyed one's handle: %d of %d\n", reused, k);
  ASSERT_EQ(weftGroupStart(), weftSuccess);
  for (int r = 0; r < k; r++)
    ASSERT_EQ(weftAllReduce(buf[r][1], buf[r][1], n, weftFloat32, weftSum, ranks.comms[r], b[r]),
              weftSuccess);
  ASSERT_EQ(weftGroupEnd(), weftSuccess) << weftGetLastError(nullptr);
  for (int r = 0; r < k; r++) ASSERT_EQ(cudaStreamSynchronize(b[r]), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (int r = 0; r < k; r++)
    for (int j = 0; j < 2; j++) {
      ASSERT_EQ(cudaMemcpy(h.data(), buf[r][j], n * sizeof(float), cudaMemcpyDeviceToHost),
                cudaSuccess);
      for (size_t i = 0; i < n; i++)
        ASSERT_EQ(h[i], input(0, j, i) + input(1, j, i)) << "rank " << r << " round " << j << " i " << i;
      cudaFree(buf[r][j]);
    }
  for (int r = 0; r < k; r++) cudaStreamDestroy(b[r]);
  if (reused == 0) GTEST_SKIP() << "CUDA gave the new streams new handles: both rounds right, "
                                   "but the reused handle this test is for did not happen";
}

// Device memory beside pageable host memory, which neither executor
// reaches: a device input with a pageable output (and the reverse) is
// refused with an error that says so, before either executor touches them;
// pinned host memory beside device memory runs on the device; a non-root
// reduce, which writes no output, runs on the device whatever its unused
// output pointer is.
TEST(DeviceRefusals, MixedDeviceAndHostBuffers) {
  REQUIRE_GPU();
  ScopedEnv env({{"WEFT_TIMEOUT", "20"}});
  const int k = 2;
  const size_t n = 1000;
  std::vector<float *> d(k);
  std::vector<std::vector<float>> host(k, std::vector<float>(n, -1.0f));
  for (int r = 0; r < k; r++) {
    ASSERT_EQ(cudaMalloc((void **)&d[r], n * sizeof(float)), cudaSuccess);
    std::vector<float> h(n, (float)(r + 1));
    ASSERT_EQ(cudaMemcpy(d[r], h.data(), n * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  }
  for (bool device_input : {true, false}) {
    Ranks ranks(k);
    ASSERT_EQ(weftGroupStart(), weftSuccess);
    for (int r = 0; r < k; r++) {
      const void *in = device_input ? (const void *)d[r] : (const void *)host[r].data();
      void *out = device_input ? (void *)host[r].data() : (void *)d[r];
      EXPECT_EQ(weftAllReduce(in, out, n, weftFloat32, weftSum, ranks.comms[r], ranks.streams[r]),
                weftInvalidArgument);
      EXPECT_NE(std::string(weftGetLastError(ranks.comms[r])).find("different memories"),
                std::string::npos)
          << weftGetLastError(ranks.comms[r]);
    }
    weftGroupEnd();
    for (int r = 0; r < k; r++) EXPECT_EQ(host[r][0], -1.0f) << "a refused call wrote its output";
  }
  {
    // pinned host input, device output: the kernels read the input
    Ranks pinned_ranks(k);
    std::vector<float *> pin(k), out(k);
    for (int r = 0; r < k; r++) {
      ASSERT_EQ(cudaMallocHost((void **)&pin[r], n * sizeof(float)), cudaSuccess);
      for (size_t i = 0; i < n; i++) pin[r][i] = (float)(10 * (r + 1));
      ASSERT_EQ(cudaMalloc((void **)&out[r], n * sizeof(float)), cudaSuccess);
    }
    ASSERT_EQ(weftGroupStart(), weftSuccess);
    for (int r = 0; r < k; r++)
      ASSERT_EQ(weftAllReduce(pin[r], out[r], n, weftFloat32, weftSum, pinned_ranks.comms[r],
                              pinned_ranks.streams[r]),
                weftSuccess)
          << weftGetLastError(pinned_ranks.comms[r]);
    ASSERT_EQ(weftGroupEnd(), weftSuccess) << weftGetLastError(nullptr);
    pinned_ranks.sync();
    for (int r = 0; r < k; r++) {
      std::vector<float> h(n);
      ASSERT_EQ(cudaMemcpy(h.data(), out[r], n * sizeof(float), cudaMemcpyDeviceToHost),
                cudaSuccess);
      EXPECT_EQ(h[0], 30.0f);
      EXPECT_EQ(h[n - 1], 30.0f);
      cudaFreeHost(pin[r]);
      cudaFree(out[r]);
    }
  }
  // reduce to rank 1: rank 0 passes a host pointer it never writes
  Ranks ranks(k);
  float unused = -2.0f;
  ASSERT_EQ(weftGroupStart(), weftSuccess);
  for (int r = 0; r < k; r++)
    ASSERT_EQ(weftReduce(d[r], r == 1 ? (void *)d[r] : (void *)&unused, n, weftFloat32, weftSum, 1,
                         ranks.comms[r], ranks.streams[r]),
              weftSuccess)
        << weftGetLastError(ranks.comms[r]);
  ASSERT_EQ(weftGroupEnd(), weftSuccess) << weftGetLastError(nullptr);
  ranks.sync();
  std::vector<float> h(n);
  ASSERT_EQ(cudaMemcpy(h.data(), d[1], n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  for (size_t i = 0; i < n; i++) ASSERT_EQ(h[i], 3.0f) << "i " << i;
  EXPECT_EQ(unused, -2.0f);
  for (int r = 0; r < k; r++) cudaFree(d[r]);
}

}  // namespace
