// Shared-memory segments: private, unlinked once attached, shared for real.
#include <gtest/gtest.h>

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "harness.h"

extern "C" {
#include "transport/base/shm_segment.h"
}

using namespace weft_test;

namespace {

std::string dev_shm_path(const char *name) { return std::string("/dev/shm") + name; }

// Names in /dev/shm that a process with this pid created.
int segments_of(pid_t pid) {
  std::string prefix = "weft-" + std::to_string(pid) + "-";
  int n = 0;
  DIR *d = opendir("/dev/shm");
  if (d == nullptr) return 0;
  while (dirent *e = readdir(d))
    if (strncmp(e->d_name, prefix.c_str(), prefix.size()) == 0) n++;
  closedir(d);
  return n;
}

TEST(ShmSegment, PrivateAndUnlinkedOnAttach) {
  shm_segment seg;
  ASSERT_EQ(shm_segment_create(1 << 16, NULL, &seg), weftSuccess);
  struct stat st;
  ASSERT_EQ(stat(dev_shm_path(seg.name).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_GE((size_t)st.st_size, (size_t)1 << 16);

  shm_segment other;
  ASSERT_EQ(shm_segment_attach(seg.name, 1 << 16, &other), weftSuccess);
  EXPECT_NE(access(dev_shm_path(seg.name).c_str(), F_OK), 0) << "name survives the attach";
  // the two mappings are one memory
  memset(seg.base, 0x3c, 1 << 16);
  EXPECT_EQ(((unsigned char *)other.base)[12345], 0x3c);
  shm_segment_close(&other);
  shm_segment_close(&seg);
}

TEST(ShmSegment, OwnerUnlinksWhenNobodyAttached) {
  shm_segment seg;
  ASSERT_EQ(shm_segment_create(4096, NULL, &seg), weftSuccess);
  std::string path = dev_shm_path(seg.name);
  ASSERT_EQ(access(path.c_str(), F_OK), 0);
  shm_segment_close(&seg);
  EXPECT_NE(access(path.c_str(), F_OK), 0);
}

TEST(ShmSegment, AttachErrors) {
  shm_segment seg;
  EXPECT_EQ(shm_segment_attach("/weft-does-not-exist", 4096, &seg), weftSystemError);
  shm_segment small;
  ASSERT_EQ(shm_segment_create(4096, NULL, &small), weftSuccess);
  EXPECT_EQ(shm_segment_attach(small.name, 1 << 20, &seg), weftInternalError);
  shm_segment_close(&small);
}

// After init no segment name is left for anyone else to open.
TEST(ShmComm, NoNamesLeftAfterInit) {
  auto status = run_ranks(3, [](const RankCtx &ctx) {
    weftComm_t comm;
    if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
      return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
    int left = segments_of(getpid());
    float x = 1, y = 0;
    weftResult_t res = weftAllReduce(&x, &y, 1, weftFloat32, weftSum, comm, nullptr);
    weftCommDestroy(comm);
    if (left != 0) return rank_fail(ctx, "%d segment names left in /dev/shm", left);
    return res == weftSuccess && y == 3 ? 0 : rank_fail(ctx, "allreduce");
  });
  for (int s : status) EXPECT_EQ(s, 0);
}

TEST(ShmComm, DisabledMeansNoTransport) {
  RunOptions opts;
  // shm is the only transport allowed, and it is disabled
  opts.env = {{"WEFT_SHM_DISABLE", "1"}, {"WEFT_TRANSPORT", "shm"}, {"WEFT_TIMEOUT", "10"}};
  auto status = run_ranks(2, [](const RankCtx &ctx) {
    weftComm_t comm;
    weftResult_t res = weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank);
    if (res == weftSuccess) return rank_fail(ctx, "init succeeded without a transport");
    // each rank names the problem, or the peer that had it
    std::string msg = weftGetLastError(nullptr);
    if (msg.find("no transport") == std::string::npos &&
        msg.find("could not set up") == std::string::npos)
      return rank_fail(ctx, "unclear message: %s", msg.c_str());
    return 0;
  }, opts);
  for (int s : status) EXPECT_EQ(s, 0);
}

}  // namespace
