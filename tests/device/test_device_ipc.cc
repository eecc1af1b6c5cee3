// The cuda_ipc transport: ranks in separate processes sharing one GPU (which
// NCCL refuses), all-reduce and all-gather on device memory against host
// references. The parent never touches CUDA (a forked child could not use it
// then); each rank looks for a GPU itself and the test skips when none has one.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "tests/collectives/coll_ref.h"

using namespace weft_test;

namespace {

const int kNoGpu = 77;

// This rank on GPU 0: its comm and a stream. Returns 0, kNoGpu, or a failure
// code.
int open_rank(const RankCtx &ctx, weftComm_t *comm, cudaStream_t *stream) {
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) return kNoGpu;
  cudaSetDevice(0);
  if (weftCommInitRank(comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
    return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
  cudaStreamCreate(stream);
  return 0;
}

int run_rank(const RankCtx &ctx, size_t count) {
  weftComm_t comm;
  cudaStream_t stream;
  if (int rc = open_rank(ctx, &comm, &stream)) return rc;
  int rc = 0;
  const weftDataType_t types[] = {weftFloat32, weftBfloat16, weftInt32, weftFloat8e4m3};
  for (weftDataType_t t : types) {
    const size_t es = weftTypeSize(t);
    std::vector<std::vector<uint8_t>> in(ctx.nranks);
    for (int r = 0; r < ctx.nranks; r++) in[r] = make_input(t, weftSum, count, test_seed() + t, r);
    void *send, *recv, *gathered;
    cudaMalloc(&send, count * es);
    cudaMalloc(&recv, count * es);
    cudaMalloc(&gathered, count * es * ctx.nranks);
    cudaMemset(recv, 0xa5, count * es);
    cudaMemcpy(send, in[ctx.rank].data(), count * es, cudaMemcpyHostToDevice);
    if (weftAllReduce(send, recv, count, t, weftSum, comm, stream) != weftSuccess ||
        weftAllGather(send, gathered, count, t, comm, stream) != weftSuccess)
      rc = rank_fail(ctx, "enqueue: %s", weftGetLastError(comm));
    if (rc == 0 && cudaStreamSynchronize(stream) != cudaSuccess)
      rc = rank_fail(ctx, "stream: %s", cudaGetErrorString(cudaGetLastError()));
    std::vector<uint8_t> out(count * es), all(count * es * ctx.nranks);
    cudaMemcpy(out.data(), recv, out.size(), cudaMemcpyDeviceToHost);
    cudaMemcpy(all.data(), gathered, all.size(), cudaMemcpyDeviceToHost);
    std::string why;
    if (rc == 0 && !check_reduction(t, weftSum, in, out.data(), count, &why))
      rc = rank_fail(ctx, "all-reduce %s: %s", type_name(t), why.c_str());
    for (int q = 0; q < ctx.nranks && rc == 0; q++)
      if (memcmp(all.data() + q * count * es, in[q].data(), count * es) != 0)
        rc = rank_fail(ctx, "all-gather %s: block %d differs", type_name(t), q);
    cudaFree(send);
    cudaFree(recv);
    cudaFree(gathered);
    if (rc != 0) break;
  }
  cudaStreamDestroy(stream);
  weftCommDestroy(comm);
  return rc;
}

struct IpcCase {
  int nranks;
  size_t count;
};

class DeviceIpc : public testing::TestWithParam<IpcCase> {};

TEST_P(DeviceIpc, RanksInProcessesShareOneGpu) {
  const IpcCase c = GetParam();
  RunOptions opts;
  opts.timeout_s = 120;
  opts.env = {{"WEFT_TIMEOUT", "30"}};
  auto status = run_ranks(c.nranks, [&](const RankCtx &ctx) { return run_rank(ctx, c.count); },
                          opts);
  if (status[0] == kNoGpu) GTEST_SKIP() << "no CUDA device";
  for (int r = 0; r < c.nranks; r++) EXPECT_EQ(status[r], 0) << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(All, DeviceIpc,
                         testing::Values(IpcCase{2, 1}, IpcCase{2, 300007}, IpcCase{3, 4099},
                                         IpcCase{4, 1 << 20}),
                         [](const testing::TestParamInfo<IpcCase> &i) {
                           return "k" + std::to_string(i.param.nranks) + "_n" +
                                  std::to_string(i.param.count);
                         });

// Point-to-point across processes (cuda_ipc lanes): first a pipeline, each
// rank receiving from the one before and sending to the one after with lone
// calls (lanes connected with that neighbour only), then an all-to-all.
int run_sendrecv_rank(const RankCtx &ctx, size_t count) {
  weftComm_t comm;
  cudaStream_t stream;
  if (int rc = open_rank(ctx, &comm, &stream)) return rc;
  const int k = ctx.nranks, me = ctx.rank;
  const size_t nbytes = count * 4;
  std::vector<std::vector<uint8_t>> in(k);
  for (int r = 0; r < k; r++) in[r] = make_input(weftInt32, weftSum, count * k, test_seed() + 5, r);
  void *send, *recv;
  cudaMalloc(&send, nbytes * k);
  cudaMalloc(&recv, nbytes * k);
  cudaMemset(recv, 0xa5, nbytes * k);
  cudaMemcpy(send, in[me].data(), nbytes * k, cudaMemcpyHostToDevice);
  int rc = 0;
  if (me > 0 && weftRecv(recv, count, weftInt32, me - 1, comm, stream) != weftSuccess)
    rc = rank_fail(ctx, "recv: %s", weftGetLastError(comm));
  if (rc == 0 && me < k - 1 && weftSend(send, count, weftInt32, me + 1, comm, stream) != weftSuccess)
    rc = rank_fail(ctx, "send: %s", weftGetLastError(comm));
  std::vector<uint8_t> out(nbytes * k);
  if (rc == 0 && cudaStreamSynchronize(stream) != cudaSuccess)
    rc = rank_fail(ctx, "stream: %s", cudaGetErrorString(cudaGetLastError()));
  cudaMemcpy(out.data(), recv, nbytes, cudaMemcpyDeviceToHost);
  if (rc == 0 && me > 0 && memcmp(out.data(), in[me - 1].data(), nbytes) != 0)
    rc = rank_fail(ctx, "pipeline: what rank %d sent differs", me - 1);
  if (rc == 0 && weftAlltoAll(send, recv, count, weftInt32, comm, stream) != weftSuccess)
    rc = rank_fail(ctx, "all-to-all: %s", weftGetLastError(comm));
  if (rc == 0 && cudaStreamSynchronize(stream) != cudaSuccess)
    rc = rank_fail(ctx, "stream: %s", cudaGetErrorString(cudaGetLastError()));
  cudaMemcpy(out.data(), recv, nbytes * k, cudaMemcpyDeviceToHost);
  for (int q = 0; q < k && rc == 0; q++)
    if (memcmp(out.data() + q * nbytes, in[q].data() + me * nbytes, nbytes) != 0)
      rc = rank_fail(ctx, "all-to-all: block from rank %d differs", q);
  cudaFree(send);
  cudaFree(recv);
  cudaStreamDestroy(stream);
  weftCommDestroy(comm);
  return rc;
}

TEST(DeviceIpcSendrecv, PipelineThenAlltoAllAcrossProcesses) {
  for (int k : {2, 3}) {
    RunOptions opts;
    opts.timeout_s = 120;
    opts.env = {{"WEFT_TIMEOUT", "30"}};
    auto status =
        run_ranks(k, [&](const RankCtx &ctx) { return run_sendrecv_rank(ctx, 70001); }, opts);
    if (status[0] == kNoGpu) GTEST_SKIP() << "no CUDA device";
    for (int r = 0; r < k; r++) EXPECT_EQ(status[r], 0) << "k " << k << " rank " << r;
  }
}

// A peer that stops calling: the waiting rank's kernel gives up after
// WEFT_TIMEOUT, its stream completes, and the comm reports the error, naming
// the rank; never a hang.
int run_silent_peer(const RankCtx &ctx) {
  weftComm_t comm;
  cudaStream_t stream;
  if (int rc = open_rank(ctx, &comm, &stream)) return rc;
  float *buf;
  cudaMalloc((void **)&buf, 4096 * sizeof(float));
  cudaMemset(buf, 0, 4096 * sizeof(float));
  int rc = 0;
  // once together, so that both are connected
  if (weftAllReduce(buf, buf, 4096, weftFloat32, weftSum, comm, stream) != weftSuccess ||
      cudaStreamSynchronize(stream) != cudaSuccess)
    rc = rank_fail(ctx, "first all-reduce: %s", weftGetLastError(comm));
  if (rc == 0 && ctx.rank == 0) {
    auto t0 = std::chrono::steady_clock::now();
    if (weftAllReduce(buf, buf, 4096, weftFloat32, weftSum, comm, stream) != weftSuccess)
      rc = rank_fail(ctx, "enqueue: %s", weftGetLastError(comm));
    cudaStreamSynchronize(stream);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    weftResult_t async = weftSuccess;
    weftCommGetAsyncError(comm, &async);
    if (rc == 0 && async != weftSystemError)
      rc = rank_fail(ctx, "async error %d, want weftSystemError", (int)async);
    // the kernel names whom it waited on: rank 1, the only peer
    if (rc == 0 && std::string(weftGetLastError(comm)).find("no progress from rank 1") ==
                       std::string::npos)
      rc = rank_fail(ctx, "error text: %s", weftGetLastError(comm));
    if (rc == 0 && (s < 1.5 || s > 20)) rc = rank_fail(ctx, "gave up after %.1f s, want ~2 s", s);
  } else if (rc == 0) {
    sleep(6); // silent, but alive: its FIFOs stay mapped
  }
  cudaFree(buf);
  cudaStreamDestroy(stream);
  weftCommAbort(comm);
  return rc;
}

TEST(DeviceIpcFailure, SilentPeerEndsInTimeoutError) {
  RunOptions opts;
  opts.timeout_s = 60;
  opts.allow_warnings = true;
  opts.env = {{"WEFT_TIMEOUT", "2"}};
  auto status = run_ranks(2, run_silent_peer, opts);
  if (status[0] == kNoGpu) GTEST_SKIP() << "no CUDA device";
  for (int r = 0; r < 2; r++) EXPECT_EQ(status[r], 0) << "rank " << r;
}

}  // namespace
