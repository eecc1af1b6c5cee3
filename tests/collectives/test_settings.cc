// Settings that must be the same on every rank (the params marked .agree,
// and the channels): ranks that differ refuse the communicator together,
// at once, naming the setting and who has which value.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "harness.h"

extern "C" {
#include "collectives/api/config.h"
#include "collectives/core/text.h"
#include "transport/base/wait.h"
}

using namespace weft_test;

namespace {

// A value other than the default for every agreed setting, and how the
// message prints it.
struct Other {
  const char *value, *printed;
};
const std::map<std::string, Other> kOther = {
    {"WEFT_NSLOTS", {"4", "4"}},
    {"WEFT_SLOT_BYTES", {"64K", "65536"}},
    {"WEFT_CHECK", {"1", "1"}},
    {"WEFT_ALGO", {"ring", "\"ring\""}},
    {"WEFT_PROTO", {"ll", "\"ll\""}},
    {"WEFT_DETERMINISTIC", {"1", "1"}},
    {"WEFT_TREE_SMALL_BYTES", {"0", "0"}},
    {"WEFT_CMA_MIN_NBYTES", {"1K", "1024"}},
    {"WEFT_CMA_REDUCE_MIN_NBYTES", {"64K", "65536"}},
    {"WEFT_BULK_MIN_NBYTES", {"1M", "1048576"}},
    {"WEFT_BULK_CHUNK_NBYTES", {"512K", "524288"}},
    {"WEFT_P2P_LANES", {"2", "2"}},
};

// What each rank saw: its init's code and message, and how long it took.
struct Seen {
  int code;
  double seconds;
  char message[1024];
};

Seen *shared_seen(int nranks) {
  void *p = mmap(nullptr, sizeof(Seen) * (size_t)nranks, PROT_READ | PROT_WRITE,
                 MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? nullptr : static_cast<Seen *>(p);
}

// Runs init (and, where it succeeds, one all-reduce checked against the
// sum) on nranks ranks with env_of's variables; fills seen[rank].
void init_with(int nranks, const std::function<EnvList(int)> &env_of, Seen *seen) {
  RunOptions opts;
  opts.env = {{"WEFT_TIMEOUT", "30"}};
  opts.env_of = env_of;
  opts.timeout_s = 60;
  auto status = run_ranks(nranks, [&](const RankCtx &ctx) {
    const double t0 = now_s();
    weftComm_t comm;
    weftResult_t res = weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank);
    Seen &s = seen[ctx.rank];
    s.seconds = now_s() - t0;
    s.code = res;
    snprintf(s.message, sizeof s.message, "%s", weftGetLastError(nullptr));
    if (res != weftSuccess) return 0;
    std::vector<float> x(1000, (float)(ctx.rank + 1)), y(1000, -1.0f);
    res = weftAllReduce(x.data(), y.data(), x.size(), weftFloat32, weftSum, comm, nullptr);
    FAIL_IF(res != weftSuccess, "all-reduce: %s", weftGetLastError(comm));
    const float want = (float)(ctx.nranks * (ctx.nranks + 1) / 2);
    for (float v : y) FAIL_IF(v != want, "all-reduce: %g, not %g", v, want);
    FAIL_IF(weftCommDestroy(comm) != weftSuccess, "destroy");
    return 0;
  }, opts);
  for (int r = 0; r < nranks; r++) ASSERT_EQ(status[r], 0) << "rank " << r;
}

// Every rank refused with weftInvalidUsage, the same message naming each of
// needles, well before WEFT_TIMEOUT.
void expect_refused(const Seen *seen, int nranks, const std::vector<std::string> &needles,
                    const std::string &what) {
  for (int r = 0; r < nranks; r++) {
    SCOPED_TRACE(what + ", rank " + std::to_string(r));
    EXPECT_EQ(seen[r].code, weftInvalidUsage) << seen[r].message;
    EXPECT_STREQ(seen[r].message, seen[0].message);
    for (const auto &n : needles)
      EXPECT_NE(std::string(seen[r].message).find(n), std::string::npos)
          << "no \"" << n << "\" in: " << seen[r].message;
    EXPECT_LT(seen[r].seconds, 5.0) << "refused after " << seen[r].seconds << " s";
  }
}

// Every agreed setting has a value in kOther, and the list fits the
// exchange.
TEST(Settings, EveryAgreedSettingIsCovered) {
  int n = 0;
  for (const weft_param *p; (p = param_agreed(weft_param_tables, n)) != nullptr; n++)
    EXPECT_TRUE(kOther.count(p->name)) << p->name << " is agreed but has no case here";
  EXPECT_EQ((size_t)n, kOther.size()) << "a case here names a setting that is not agreed";
  EXPECT_LE(n, PARAM_AGREE_MAX);
}

// One rank (seeded) with another value of each setting in turn, at 2-4
// ranks: every rank refuses, naming it, the odd rank and its value.
TEST(Settings, OneRankDifferentRefusedEverywhere) {
  Rng rng{test_seed() ^ 0x5e771e5ull};
  Seen *seen = shared_seen(4);
  ASSERT_NE(seen, nullptr);
  int i = 0;
  for (const auto &kv : kOther) {
    const int nranks = 2 + i++ % 3;
    const int odd = (int)(rng.next() % (uint64_t)nranks);
    memset((void *)seen, 0, sizeof(Seen) * 4);
    printf("%s=%s on rank %d of %d\n", kv.first.c_str(), kv.second.value, odd, nranks);
    init_with(nranks, [&](int rank) {
      return rank == odd ? EnvList{{kv.first, kv.second.value}} : EnvList{};
    }, seen);
    const std::string who = "rank " + std::to_string(odd) + " has " + kv.second.printed;
    expect_refused(seen, nranks, {"settings that must be the same on every rank differ: " +
                                  kv.first + ": ", who},
                   kv.first);
  }
  munmap(seen, sizeof(Seen) * 4);
}

// Several settings and three values at once: each named, the ranks grouped
// by value; the channels too.
TEST(Settings, GroupsOfRanksNamed) {
  Seen *seen = shared_seen(4);
  ASSERT_NE(seen, nullptr);
  init_with(4, [](int rank) {
    EnvList e;
    if (rank == 1) e.push_back({"WEFT_ALGO", "ring"});
    if (rank == 2) e.push_back({"WEFT_ALGO", "tree"});
    if (rank == 3) e.push_back({"WEFT_NCHANNELS", "2"});
    return e;
  }, seen);
  expect_refused(seen, 4,
                 {"channels (WEFT_NCHANNELS within the config's minChannels and maxChannels): "
                  "ranks 0-2 have 1, rank 3 has 2",
                  "WEFT_ALGO: ranks 0,3 have it unset, rank 1 has \"ring\", rank 2 has \"tree\""},
                 "three ranks differ");
  munmap(seen, sizeof(Seen) * 4);
}

// The same values on every rank, none the default: the comm forms and
// works; WEFT_ALGO and WEFT_PROTO agree by what they allow, however written
// (an empty one is as unset), and differ where what they allow does.
TEST(Settings, SameMeaningsForm) {
  Seen *seen = shared_seen(3);
  ASSERT_NE(seen, nullptr);
  init_with(3, [](int rank) {
    const char *algo[] = {"ring,tree", "TREE,ring", "ring,tree;"};
    const char *proto[] = {"", "simple,ll", "LL,Simple"};
    return EnvList{{"WEFT_CHECK", "1"}, {"WEFT_NCHANNELS", "2"}, {"WEFT_TREE_SMALL_BYTES", "0"},
                   {"WEFT_ALGO", algo[rank]}, {"WEFT_PROTO", proto[rank]}};
  }, seen);
  for (int r = 0; r < 3; r++) EXPECT_EQ(seen[r].code, weftSuccess) << seen[r].message;
  init_with(3, [](int rank) {
    return EnvList{{"WEFT_ALGO", rank == 1 ? "" : "ring"}};
  }, seen);
  expect_refused(seen, 3, {"WEFT_ALGO: ranks 0,2 have \"ring\", rank 1 has it unset"},
                 "an empty WEFT_ALGO against ring");
  munmap(seen, sizeof(Seen) * 3);
}

// A rank whose own setting is bad fails with its own error, and the others
// learn of it at once (it joins to say so) rather than at WEFT_TIMEOUT.
TEST(Settings, ABadValueOnOneRankFailsEveryRankAtOnce) {
  Seen *seen = shared_seen(3);
  ASSERT_NE(seen, nullptr);
  for (const auto &bad : std::vector<std::pair<std::string, std::string>>{
           {"WEFT_SLOT_BYTES", "100"}, {"WEFT_NSLOTS", "1"}, {"WEFT_TREE_SMALL_BYTES", "-1"},
           {"WEFT_DETERMINISTIC", "2"}}) {
    memset((void *)seen, 0, sizeof(Seen) * 3);
    init_with(3, [&](int rank) { return rank == 1 ? EnvList{bad} : EnvList{}; }, seen);
    const std::string what = bad.first + "=" + bad.second;
    EXPECT_EQ(seen[1].code, weftInvalidArgument) << what << ": " << seen[1].message;
    EXPECT_NE(std::string(seen[1].message).find(what), std::string::npos) << seen[1].message;
    for (int r : {0, 2}) {
      EXPECT_EQ(seen[r].code, weftRemoteError) << what << ", rank " << r << ": " << seen[r].message;
      EXPECT_NE(std::string(seen[r].message).find("rank 1 refused the communicator: " + what),
                std::string::npos)
          << seen[r].message;
    }
    for (int r = 0; r < 3; r++)
      EXPECT_LT(seen[r].seconds, 5.0) << what << ", rank " << r << " after " << seen[r].seconds;
  }
  munmap(seen, sizeof(Seen) * 3);
}

// WEFT_TIMEOUT in seconds: a value past 2^63 ns (584 years) waits forever
// as 0 does, rather than wrapping to a deadline of a fraction of a second.
TEST(Settings, TimeoutPastTheClockWaitsForever) {
  for (const auto &c : std::vector<std::pair<std::string, uint64_t>>{
           {"600", 600000000000ull}, {"0", UINT64_MAX / 2}, {"-1", UINT64_MAX / 2},
           {"9223372036", 9223372036000000000ull}, {"18446744074", UINT64_MAX / 2},
           {"9223372036854775807", UINT64_MAX / 2}}) {
    RunOptions opts;
    opts.env = {{"WEFT_TIMEOUT", c.first}};
    const uint64_t want = c.second;
    auto status = run_ranks(1, [&](const RankCtx &) {
      weft_params_reset();
      return wait_default_timeout_ns() == want ? 0 : 1;
    }, opts);
    EXPECT_EQ(status[0], 0) << "WEFT_TIMEOUT=" << c.first;
  }
}

// The agreed params of a table of this test's own, as a rank whose
// WEFT_TEST_A is a has them.
struct weft_param test_table[] = {
    {.name = "WEFT_TEST_A", .type = PARAM_STR, .doc = "a", .agree = 1},
    {.name = "WEFT_TEST_B", .type = PARAM_INT, .default_str = "7", .doc = "b", .agree = 1},
    {.name = "WEFT_TEST_C", .type = PARAM_STR, .doc = "c"},
    PARAM_END,
};
struct weft_param *const test_tables[] = {test_table, nullptr};

void agreement_with(const std::string &a, struct param_agreement *out) {
  auto *shared = static_cast<struct param_agreement *>(mmap(
      nullptr, sizeof *out, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(shared, MAP_FAILED);
  RunOptions opts;
  opts.env = {{"WEFT_TEST_A", a}};
  auto status = run_ranks(1, [&](const RankCtx &) {
    param_tables_reset(test_tables);
    param_agreement_fill(test_tables, shared);
    return 0;
  }, opts);
  ASSERT_EQ(status[0], 0);
  *out = *shared;
  munmap(shared, sizeof *out);
}

// The exchanged text: longer strings cut with "..." and named with their
// hash too, never a false match (the hash is of the whole text); an empty
// string as unset.
TEST(Settings, LongTextsCutButCompared) {
  const std::string a(70, 'x');
  struct param_agreement one, two, empty;
  agreement_with(a + "1", &one);
  agreement_with(a + "2", &two);
  agreement_with("", &empty);
  EXPECT_EQ(one.count, 2);
  EXPECT_NE(one.value[0], two.value[0]);
  EXPECT_EQ(one.value[1], 7);
  EXPECT_EQ(empty.value[0], 0);
  char buf[128];
  param_agreement_format(test_tables, &one, 0, buf, sizeof buf);
  char hash[32];
  snprintf(hash, sizeof hash, "%016llx", (unsigned long long)one.value[0]);
  EXPECT_EQ(std::string(buf), "\"" + std::string(PARAM_AGREE_TEXT - 4, 'x') + "...\" (hash " +
                                  hash + ")");
  param_agreement_format(test_tables, &one, 1, buf, sizeof buf);
  EXPECT_STREQ(buf, "7");
  param_agreement_format(test_tables, &empty, 0, buf, sizeof buf);
  EXPECT_STREQ(buf, "it unset");
  EXPECT_EQ(param_agreed(test_tables, 2), nullptr);
}

// The messages' builder: ranks as ranges, groups by value in the order of
// their lowest entry, given rank numbers, and a full buffer ending in "...".
int64_t digit_of(const void *ctx, int i) { return static_cast<const char *>(ctx)[i] - '0'; }
void digit_format(const void *ctx, int i, char *buf, size_t n) {
  snprintf(buf, n, "v%c", static_cast<const char *>(ctx)[i]);
}

TEST(Text, RanksGroupsAndTheCut) {
  char buf[256] = "";
  struct text t = {buf, sizeof buf, 0};
  const int ranks[] = {0, 1, 2, 5, 7, 8};
  text_ranks(&t, ranks, 6);
  EXPECT_STREQ(buf, "ranks 0-2,5,7,8");
  t = {buf, sizeof buf, 0};
  const char *values = "1211131";  // entries 0..6
  int members[8];
  text_groups(&t, 7, nullptr, digit_of, digit_format, values, 1, members);
  EXPECT_STREQ(buf, "ranks 0,2-4,6 have v1, rank 1 has v2, rank 5 has v3");
  t = {buf, sizeof buf, 0};
  const int named[] = {3, 4, 5, 9};  // entry i is rank named[i]
  text_groups(&t, 4, named, digit_of, digit_format, "1112", 0, members);
  EXPECT_STREQ(buf, "ranks 3-5 v1, rank 9 v2");
  char small[12];
  t = {small, sizeof small, 0};
  text_add(&t, "%s", "a long line of text");
  EXPECT_STREQ(small, "a long l...");
  text_add(&t, "more");  // full: nothing more
  EXPECT_STREQ(small, "a long l...");
  char tiny[3];
  t = {tiny, sizeof tiny, 0};
  text_add(&t, "abc");
  EXPECT_STREQ(tiny, "ab");
}

}  // namespace
