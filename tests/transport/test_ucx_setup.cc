// The UCX transport's set-up order (transport/ucx/ucx_conn.c): a rank's init
// returns only once every receiver of its send ends has made its endpoint,
// so that no peer makes an endpoint to a rank that has left set-up (and may
// die: UCX 1.13 then ends the peer's process on an assertion). This binary
// wraps ucp_ep_create (weft is linked in statically, so the wrapper is what
// it calls) to make one rank's endpoints late, and checks that its sender's
// init returned after the late rank's last endpoint was made. Without the
// order, the sender returns about a delay before it.
#include <gtest/gtest.h>

#include <dlfcn.h>
#include <sys/mman.h>
#include <unistd.h>

#include "harness.h"
#include "weft_build_config.h"

#if WEFT_HAVE_UCX
#include <ucp/api/ucp.h>
#endif

using namespace weft_test;

namespace {

constexpr int kDelayMs = 300;  // each ucp_ep_create of the late rank

// Written by the ranks, read by the test (shared across fork).
struct Shared {
  int late_rank;            // -1: no delay
  double ep_made_s[2];      // when each rank's last ucp_ep_create returned
  double init_returned_s[2];
};
Shared *g_shared = nullptr;
int g_rank = -1;

}  // namespace

#if WEFT_HAVE_UCX
extern "C" ucs_status_t ucp_ep_create(ucp_worker_h worker, const ucp_ep_params_t *params,
                                      ucp_ep_h *ep_p) {
  using Fn = ucs_status_t (*)(ucp_worker_h, const ucp_ep_params_t *, ucp_ep_h *);
  static Fn real = (Fn)dlsym(RTLD_NEXT, "ucp_ep_create");
  if (g_shared != nullptr && g_rank >= 0 && g_rank == g_shared->late_rank) usleep(kDelayMs * 1000);
  ucs_status_t st = real(worker, params, ep_p);
  if (g_shared != nullptr && g_rank >= 0) g_shared->ep_made_s[g_rank] = now_s();
  return st;
}
#endif

namespace {

// Two ranks over UCX's TCP, rank late making its endpoints late; then an
// all-reduce on random data shows the connections work.
void run_with_late_rank(int late) {
  g_shared = (Shared *)mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE,
                            MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(g_shared, MAP_FAILED);
  memset(g_shared, 0, sizeof *g_shared);
  g_shared->late_rank = late;
  RunOptions o;
  o.env = {{"WEFT_TRANSPORT", "ucx"}, {"UCX_TLS", "tcp"}};
  uint64_t seed = test_seed() + (uint64_t)late;
  std::vector<int> rc = run_ranks(2, [&](const RankCtx &ctx) {
    g_rank = ctx.rank;
    weftComm_t comm;
    FAIL_IF(weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess, "init: %s",
            weftGetLastError(nullptr));
    g_shared->init_returned_s[ctx.rank] = now_s();
    const size_t count = 1009;
    std::vector<int32_t> buf(count), want(count);
    for (size_t i = 0; i < count; i++) {
      Rng a(seed + i), b(seed + i + 1000003);
      int32_t mine[2] = {(int32_t)(a.next() % 1000000), (int32_t)(b.next() % 1000000)};
      buf[i] = mine[ctx.rank];
      want[i] = mine[0] + mine[1];
    }
    FAIL_IF(weftAllReduce(buf.data(), buf.data(), count, weftInt32, weftSum, comm, nullptr) !=
                weftSuccess,
            "all-reduce: %s", weftGetLastError(comm));
    for (size_t i = 0; i < count; i++)
      FAIL_IF(buf[i] != want[i], "element %zu: %d, expected %d", i, buf[i], want[i]);
    weftCommDestroy(comm);
    return 0;
  }, o);
  EXPECT_EQ(rc, std::vector<int>({0, 0}));
  int sender = 1 - late;  // in a two-rank ring, the late rank's only sender
  double lead_s = g_shared->ep_made_s[late] - g_shared->init_returned_s[sender];
  printf("rank %d's init returned %.3f s after rank %d's last endpoint was made\n", sender,
         -lead_s, late);
  EXPECT_GT(g_shared->ep_made_s[late], 0.0) << "the wrapper never ran";
  EXPECT_LE(lead_s, 0.0) << "rank " << sender << " left set-up " << lead_s
                         << " s before rank " << late << " had made its endpoints";
  munmap(g_shared, sizeof *g_shared);
  g_shared = nullptr;
}

TEST(UcxSetupOrder, InitReturnsAfterTheReceiversEndpoint) {
  if (!WEFT_HAVE_UCX) GTEST_SKIP() << "weft was built without UCX (libucx-dev)";
  for (int late = 0; late < 2; late++) {
    SCOPED_TRACE("late rank " + std::to_string(late));
    run_with_late_rank(late);
  }
}

}  // namespace
