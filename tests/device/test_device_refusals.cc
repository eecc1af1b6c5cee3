// What the device executor refuses, checked without a GPU: the decision is
// made from the plan, WEFT_ALGO and the build's kernel table before any CUDA
// call (collectives/exec/device/device_refuse.c), so device_plan_refusal runs
// here as it runs in front of every launch.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "harness.h"

#include "weft.h"
#include "weft_build_config.h"
extern "C" {
#include "collectives/api/config.h"
#include "collectives/core/comm.h"
#include "transport/base/status.h"
#include "collectives/algo/ring_steps.h"
#include "collectives/exec/device/dev_types.h"
#include "collectives/exec/device/device.h"
}

namespace {

weft_plan plan_of(coll_kind coll, weftDataType_t t, weftRedOp_t op) {
  weft_plan p = {};
  p.coll = coll;
  p.count = 1000;
  p.datatype = t;
  p.op = op;
  p.root = coll == COLL_SEND || coll == COLL_RECV ? 1 : -1;
  return p;
}

// Sets WEFT_ALGO for one test (unset after), with the parameter cache reset;
// the process has no other thread (env_set_alone).
struct AlgoEnv {
  explicit AlgoEnv(const char *v) {
    EXPECT_TRUE(weft_test::env_set_alone("WEFT_ALGO", v));
    weft_params_reset();
  }
  ~AlgoEnv() {
    EXPECT_TRUE(weft_test::env_set_alone("WEFT_ALGO", nullptr));
    weft_params_reset();
  }
};

std::string check_text(const weft_plan &p, weftResult_t *res) {
  weft_error_clear();
  *res = device_plan_refusal(&p);
  return *res == weftSuccess ? "" : weft_error_text();
}

#if WEFT_HAVE_CUDA
extern "C" const char weft_dev_matrix[];

TEST(DeviceRefusals, HostOnlyAlgorithmIsRefusedWithAMessageNotIgnored) {
  AlgoEnv env("rd");
  weftResult_t res;
  std::string text = check_text(plan_of(COLL_ALLREDUCE, weftFloat32, weftSum), &res);
  EXPECT_EQ(res, weftInvalidUsage);
  EXPECT_NE(text.find("WEFT_ALGO=rd"), std::string::npos) << text;
  EXPECT_NE(text.find("ring"), std::string::npos) << text;
  // sends and receives have no algorithm to choose
  weft_plan send = plan_of(COLL_SEND, weftInt8, weftSum);
  EXPECT_EQ(device_plan_refusal(&send), weftSuccess) << weft_error_text();
}

TEST(DeviceRefusals, RingAmongOthersOrPerCollective) {
  {
    AlgoEnv env("ring,tree");
    weft_plan p = plan_of(COLL_ALLREDUCE, weftFloat32, weftSum);
    EXPECT_EQ(device_plan_refusal(&p), weftSuccess) << weft_error_text();
  }
  {
    AlgoEnv env("allreduce:rd");
    weftResult_t res;
    check_text(plan_of(COLL_ALLREDUCE, weftFloat32, weftSum), &res);
    EXPECT_EQ(res, weftInvalidUsage);
    weft_plan ag = plan_of(COLL_ALLGATHER, weftFloat32, weftSum);
    EXPECT_EQ(device_plan_refusal(&ag), weftSuccess) << weft_error_text();
  }
  {
    // all-reduce has the tree on device memory too; the other collectives do not
    AlgoEnv env("tree");
    weft_plan ar = plan_of(COLL_ALLREDUCE, weftFloat32, weftSum);
    EXPECT_EQ(device_plan_refusal(&ar), weftSuccess) << weft_error_text();
    weftResult_t res;
    std::string text = check_text(plan_of(COLL_ALLGATHER, weftFloat32, weftSum), &res);
    EXPECT_EQ(res, weftInvalidUsage);
    EXPECT_NE(text.find("WEFT_ALGO=tree"), std::string::npos) << text;
  }
  {
    AlgoEnv env("^ring");
    weftResult_t res;
    check_text(plan_of(COLL_BROADCAST, weftInt32, weftSum), &res);
    EXPECT_EQ(res, weftInvalidUsage);
  }
}

// A refused device call leaves the comm idle: it once ended an operation
// it had not begun, and the comm then counted as in use for ever (destroy
// refused it as busy, abort would have waited without end).
TEST(DeviceRefusals, RefusalLeavesTheCommIdle) {
  AlgoEnv env("rd");
  weftUniqueId id;
  ASSERT_EQ(weftGetUniqueId(&id), weftSuccess);
  weftComm_t comm;
  ASSERT_EQ(weftCommInitRank(&comm, 1, id, 0), weftSuccess) << weftGetLastError(nullptr);
  weft_plan p = plan_of(COLL_ALLREDUCE, weftFloat32, weftSum);
  for (int i = 0; i < 3; i++) EXPECT_EQ(device_enqueue(comm, &p, nullptr), weftInvalidUsage);
  EXPECT_NE(std::string(weftGetLastError(comm)).find("WEFT_ALGO=rd"), std::string::npos)
      << weftGetLastError(comm);
  EXPECT_EQ(__atomic_load_n(&comm->active, __ATOMIC_ACQUIRE), 0u);
  EXPECT_EQ(weftCommDestroy(comm), weftSuccess) << weftGetLastError(nullptr);
}

TEST(DeviceRefusals, OpOutsideTheBuiltMatrixNamesTheOption) {
  const bool small = std::string(weft_dev_matrix) == "small";
  weftResult_t res;
  std::string text = check_text(plan_of(COLL_ALLREDUCE, weftInt32, weftProd), &res);
  if (!small) {
    EXPECT_EQ(res, weftSuccess) << text;
    return;
  }
  EXPECT_EQ(res, weftInvalidUsage);
  EXPECT_NE(text.find("int32"), std::string::npos) << text;
  EXPECT_NE(text.find("prod"), std::string::npos) << text;
  EXPECT_NE(text.find("device_matrix=small"), std::string::npos) << text;
  // a pre-multiply sum op (values from weftNumOps up): float32 is in every
  // matrix, int32 only in the full one
  text = check_text(plan_of(COLL_ALLREDUCE, weftInt32, (weftRedOp_t)weftNumOps), &res);
  EXPECT_EQ(res, weftInvalidUsage);
  EXPECT_NE(text.find("premulsum"), std::string::npos) << text;
  check_text(plan_of(COLL_REDUCESCATTER, weftFloat32, (weftRedOp_t)(weftNumOps + 3)), &res);
  EXPECT_EQ(res, weftSuccess);
  // what the small matrix holds passes
  for (int t = 0; t < weftNumTypes; t++) {
    check_text(plan_of(COLL_REDUCE, (weftDataType_t)t, weftSum), &res);
    EXPECT_EQ(res, weftSuccess) << "datatype " << t;
  }
  for (int o = 0; o < weftNumOps; o++) {
    check_text(plan_of(COLL_ALLREDUCE, weftFloat32, (weftRedOp_t)o), &res);
    EXPECT_EQ(res, weftSuccess) << "op " << o;
  }
}

// Under WEFT_DETERMINISTIC=1 a reduction runs as exchanges and a kernel
// outside the matrix (device_det.c): no op or datatype of it is refused for
// the build's matrix, nor for a WEFT_ALGO naming a host algorithm (which
// does not apply to it); an all-gather under that WEFT_ALGO still is, and a
// bad datatype still is.
TEST(DeviceRefusals, DeterministicReductionsNeedNoMatrixKernelNorTheRing) {
  ASSERT_TRUE(weft_test::env_set_alone("WEFT_DETERMINISTIC", "1"));
  weft_params_reset();
  {
    AlgoEnv env("rd");
    weftResult_t res;
    for (coll_kind coll : {COLL_ALLREDUCE, COLL_REDUCESCATTER, COLL_REDUCE})
      for (int t = 0; t < weftNumTypes; t++)
        for (int o = 0; o <= weftNumOps; o++) {
          std::string text =
              check_text(plan_of(coll, (weftDataType_t)t, (weftRedOp_t)o), &res);
          EXPECT_EQ(res, weftSuccess) << "collective " << coll << " datatype " << t << " op " << o
                                      << ": " << text;
        }
    std::string text = check_text(plan_of(COLL_ALLGATHER, weftFloat32, weftSum), &res);
    EXPECT_EQ(res, weftInvalidUsage) << "all-gather moves no arithmetic: WEFT_ALGO applies";
    EXPECT_NE(text.find("WEFT_ALGO=rd"), std::string::npos) << text;
    check_text(plan_of(COLL_ALLREDUCE, (weftDataType_t)weftNumTypes, weftSum), &res);
    EXPECT_EQ(res, weftInvalidArgument);
  }
  ASSERT_TRUE(weft_test::env_set_alone("WEFT_DETERMINISTIC", nullptr));
  weft_params_reset();
  // without it, the matrix and WEFT_ALGO apply again
  AlgoEnv env("rd");
  weftResult_t res;
  check_text(plan_of(COLL_ALLREDUCE, weftFloat32, weftSum), &res);
  EXPECT_EQ(res, weftInvalidUsage);
}

// ncclConfig_t's minCTAs/maxCTAs (weftConfig_t's min/maxChannels) bound the
// device channels; the blocks sure to be resident at once bound them more.
TEST(DeviceChannels, ConfigBoundsThenResidency) {
  const int U = WEFT_CONFIG_UNDEF_INT;
  EXPECT_EQ(device_nchannels(32, U, U, 66), 32);
  EXPECT_EQ(device_nchannels(32, U, 8, 66), 8);
  EXPECT_EQ(device_nchannels(4, 16, U, 66), 16);
  EXPECT_EQ(device_nchannels(32, 40, U, 33), 33) << "residency wins over minCTAs";
  EXPECT_EQ(device_nchannels(32, U, 100, 66), 32);
  EXPECT_EQ(device_nchannels(32, 100, U, 200), DEV_MAX_CHANNELS);
  EXPECT_EQ(device_nchannels(32, 2, 2, 66), 2);
  EXPECT_EQ(device_nchannels(32, U, U, 0), 1);
}

// Ranks whose settings ask for different device channel counts agree on
// the fewest (a ring needs the same channels and shares on every rank),
// and the residency cap still applies on top.
TEST(DeviceChannels, RanksAgreeOnTheFewestAsked) {
  std::vector<device_gpu_ident> ids(3);
  for (auto &g : ids) memset(&g, 0, sizeof g);
  const int asks[3] = {32, 8, 64};
  for (int r = 0; r < 3; r++) ids[r].want_channels = asks[r];
  EXPECT_EQ(device_nchannels_agreed(ids.data(), 3, 66), 8);
  EXPECT_EQ(device_nchannels_agreed(ids.data(), 3, 5), 5) << "the cap below every ask";
  ids[1].want_channels = 40;
  EXPECT_EQ(device_nchannels_agreed(ids.data(), 3, 66), 32);
  EXPECT_EQ(device_nchannels_agreed(ids.data(), 3, 0), 1) << "never no channel";
  for (auto &g : ids) g.want_channels = device_nchannels(32, 40, WEFT_CONFIG_UNDEF_INT, DEV_MAX_CHANNELS);
  EXPECT_EQ(device_nchannels_agreed(ids.data(), 3, 132), 40) << "minCTAs above the default";
}

// Ranks whose WEFT_DEVICE_RING_INTERLEAVE differs agree on the fewest (it
// orders every FIFO's slots), never above what the FIFOs' slots allow.
TEST(DeviceChannels, RanksAgreeOnTheFewestLoopsTogether) {
  std::vector<device_gpu_ident> ids(3);
  for (auto &g : ids) memset(&g, 0, sizeof g);
  const int asks[3] = {3, 2, 3};
  for (int r = 0; r < 3; r++) ids[r].want_interleave = asks[r];
  EXPECT_EQ(device_interleave_agreed(ids.data(), 3), 2);
  ids[1].want_interleave = 3;
  EXPECT_EQ(device_interleave_agreed(ids.data(), 3), 3);
  EXPECT_EQ(ring_interleave_max(DEV_NSLOTS), 3) << "4 slots, one loop fewer";
  ids[0].want_interleave = 1;
  EXPECT_EQ(device_interleave_agreed(ids.data(), 3), 1);
  for (auto &g : ids) g.want_interleave = 9; // refused before, capped all the same
  EXPECT_EQ(device_interleave_agreed(ids.data(), 3), ring_interleave_max(DEV_NSLOTS));
}

// A config's bounds above the host's 16 rings still make a comm (its host
// rings clamped), and reach the device executor whole.
TEST(DeviceChannels, CommKeepsTheConfigsBounds) {
  weftConfig_t cfg = WEFT_CONFIG_INITIALIZER;
  cfg.minChannels = 40;
  cfg.maxChannels = 48;
  weftUniqueId id;
  ASSERT_EQ(weftGetUniqueId(&id), weftSuccess);
  weftComm_t comm;
  ASSERT_EQ(weftCommInitRankConfig(&comm, 1, id, 0, &cfg), weftSuccess) << weftGetLastError(nullptr);
  EXPECT_EQ(comm->nchannels, 16);
  EXPECT_EQ(comm->cfg_min_channels, 40);
  EXPECT_EQ(comm->cfg_max_channels, 48);
  EXPECT_EQ(device_nchannels(32, comm->cfg_min_channels, comm->cfg_max_channels, 132), 40);
  EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
}

// A device operation holds the comm active and asks its state after taking
// its hold, before any CUDA call: an abort on another thread either sees the
// hold and waits, or the operation sees the comm aborted and stops.
TEST(DeviceActive, AbortedCommRefusedBeforeCudaAndHoldReleased) {
  weftComm_t comm;
  ASSERT_EQ(weftCommInitAll(&comm, 1, nullptr), weftSuccess);
  weft_plan p = plan_of(COLL_ALLREDUCE, weftFloat32, weftSum);
  float x[4] = {1, 2, 3, 4};
  p.sendbuf = x;
  p.recvbuf = x;
  comm_life_abort(comm);
  weft_error_clear();
  EXPECT_EQ(device_enqueue(comm, &p, nullptr), weftRemoteError);
  EXPECT_NE(std::string(weft_error_text()).find("aborted"), std::string::npos)
      << weft_error_text();
  EXPECT_EQ(__atomic_load_n(&comm->active, __ATOMIC_ACQUIRE), 0u) << "the hold is released";
  EXPECT_EQ(comm->device, nullptr) << "nothing was set up for an aborted comm";
  EXPECT_EQ(x[3], 4.0f);
  EXPECT_EQ(weftCommAbort(comm), weftSuccess) << "abort does not wait on a released hold";
}

// GPUs are told apart by UUID: ranks that each see their own GPU as device 0
// share nothing, and one GPU under two device numbers is shared.
TEST(DeviceChannels, BusiestGpuCountsByIdentityNotNumber) {
  auto ident = [](uint8_t gpu, int dev) {
    device_gpu_ident x = {};
    for (int i = 0; i < 16; i++) x.uuid[i] = (uint8_t)(gpu * 37 + i);
    x.dev = dev;
    x.sms = 132;
    return x;
  };
  std::vector<device_gpu_ident> own = {ident(1, 0), ident(2, 0), ident(3, 0), ident(4, 0)};
  EXPECT_EQ(device_busiest_gpu(own.data(), 4), 1) << "each rank alone on its GPU";
  std::vector<device_gpu_ident> renumbered = {ident(1, 0), ident(1, 1), ident(2, 1)};
  EXPECT_EQ(device_busiest_gpu(renumbered.data(), 3), 2) << "one GPU under two numbers";
  std::vector<device_gpu_ident> shared = {ident(5, 0), ident(6, 1), ident(5, 0), ident(5, 2),
                                          ident(6, 1)};
  EXPECT_EQ(device_busiest_gpu(shared.data(), 5), 3);
  EXPECT_EQ(device_busiest_gpu(shared.data(), 1), 1);
  // the channels each rank may have: the fewest-holding GPU over the busiest
  for (auto &x : shared) x.blocks_per_sm = 1;
  EXPECT_EQ(device_channel_cap(shared.data(), 5), 44) << "132 SMs over 3 ranks";
  shared[1].blocks_per_sm = 4; // a rank that set its channels counts occupancy
  shared[4].blocks_per_sm = 4;
  EXPECT_EQ(device_channel_cap(shared.data(), 5), 44) << "the fewest-holding GPU decides";
  for (auto &x : shared) x.blocks_per_sm = 2;
  EXPECT_EQ(device_channel_cap(shared.data(), 5), 88);
  shared[0].sms = 2;
  EXPECT_EQ(device_channel_cap(shared.data(), 5), 1) << "never no channel";
}
#else
TEST(DeviceRefusals, WithoutCudaEveryDevicePlanSaysSo) {
  weftResult_t res;
  std::string text = check_text(plan_of(COLL_ALLREDUCE, weftFloat32, weftSum), &res);
  EXPECT_EQ(res, weftInvalidUsage);
  EXPECT_NE(text.find("built without CUDA"), std::string::npos) << text;
}
#endif

}  // namespace
