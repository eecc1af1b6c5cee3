// Environment parameters and logging.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "harness.h"

extern "C" {
#include "collectives/api/config.h"
#include "collectives/core/params.h"
#include "transport/base/log.h"
#include "transport/base/param.h"
#include "transport/cuda_ipc/cuda_params.h"
#include "collectives/exec/device/device_params.h"
#include "transport/bootstrap/bootstrap.h"
}

namespace {

struct weft_param test_params[] = {
    {"WEFT_TEST_INT", PARAM_INT, "64K", "an integer", 0, 0, NULL},
    {"WEFT_TEST_STR", PARAM_STR, NULL, "a string", 0, 0, NULL},
    PARAM_END,
};
struct weft_param *const test_tables[] = {test_params, NULL};

struct weft_param ranged_params[] = {
    {.name = "WEFT_TEST_REFUSED", .type = PARAM_INT, .default_str = "4", .doc = "1 to 8",
     .min = 1, .max = 8},
    {.name = "WEFT_TEST_CLAMPED", .type = PARAM_INT, .default_str = "4", .doc = "1 to 8",
     .min = 1, .max = 8, .out_of_range = PARAM_RANGE_CLAMP},
    PARAM_END,
};
struct weft_param *const ranged_tables[] = {ranged_params, NULL};

std::vector<std::pair<int, std::string>> captured;
void capture(int level, const char *line, void *) { captured.push_back({level, line}); }

// Tests change the environment only where no other thread may be reading it:
// with a second thread alive, env_set_alone refuses and changes nothing.
TEST(Param, EnvSetAloneRefusesWhileAnotherThreadRuns) {
  ASSERT_TRUE(weft_test::env_set_alone("WEFT_TEST_STR", "before"));
  std::atomic<bool> go{false};
  std::thread other([&] {
    while (!go) std::this_thread::yield();
  });
  bool refused = !weft_test::env_set_alone("WEFT_TEST_STR", "during");
  go = true;
  other.join();
  EXPECT_TRUE(refused);
  EXPECT_STREQ(getenv("WEFT_TEST_STR"), "before");
  ASSERT_TRUE(weft_test::env_set_alone("WEFT_TEST_STR", nullptr));
  EXPECT_EQ(getenv("WEFT_TEST_STR"), nullptr);
}

TEST(Param, DefaultsSuffixesAndCache) {
  ASSERT_TRUE(weft_test::env_set_alone("WEFT_TEST_INT", nullptr));
  ASSERT_TRUE(weft_test::env_set_alone("WEFT_TEST_STR", nullptr));
  param_tables_reset(test_tables);
  EXPECT_EQ(param_int(&test_params[0]), 64 * 1024);
  EXPECT_EQ(param_str(&test_params[1]), nullptr);
  ASSERT_TRUE(weft_test::env_set_alone("WEFT_TEST_INT", "3M"));
  EXPECT_EQ(param_int(&test_params[0]), 64 * 1024) << "cached after the first read";
  param_tables_reset(test_tables);
  EXPECT_EQ(param_int(&test_params[0]), 3 * 1024 * 1024);
  ASSERT_TRUE(weft_test::env_set_alone("WEFT_TEST_INT", "0x10"));
  param_tables_reset(test_tables);
  EXPECT_EQ(param_int(&test_params[0]), 16);
  ASSERT_TRUE(weft_test::env_set_alone("WEFT_TEST_INT", nullptr));
}

TEST(Param, GarbageFallsBackToDefaultWithWarning) {
  captured.clear();
  weft_log_set_sink(capture, nullptr);
  ASSERT_TRUE(weft_test::env_set_alone("WEFT_TEST_INT", "12parsecs"));
  param_tables_reset(test_tables);
  EXPECT_EQ(param_int(&test_params[0]), 64 * 1024);
  weft_log_set_sink(nullptr, nullptr);
  ASSERT_EQ(captured.size(), 1u);
  EXPECT_EQ(captured[0].first, LOG_WARN);
  EXPECT_NE(captured[0].second.find("WEFT_TEST_INT=12parsecs"), std::string::npos);
  ASSERT_TRUE(weft_test::env_set_alone("WEFT_TEST_INT", nullptr));
}

// A value out of an entry's range is refused by param_int_checked, naming
// the range, or takes the range's nearest end; one in range passes.
TEST(Param, RangesRefuseOrClamp) {
  ASSERT_TRUE(weft_test::env_set_alone("WEFT_TEST_REFUSED", "9"));
  ASSERT_TRUE(weft_test::env_set_alone("WEFT_TEST_CLAMPED", "9"));
  param_tables_reset(ranged_tables);
  int64_t v = -1;
  EXPECT_EQ(param_int_checked(&ranged_params[0], &v), weftInvalidArgument);
  EXPECT_EQ(v, -1);
  EXPECT_NE(std::string(weft_error_text()).find("WEFT_TEST_REFUSED=9: must be 1 to 8"),
            std::string::npos)
      << weft_error_text();
  EXPECT_EQ(param_int(&ranged_params[1]), 8);
  ASSERT_TRUE(weft_test::env_set_alone("WEFT_TEST_REFUSED", "8"));
  ASSERT_TRUE(weft_test::env_set_alone("WEFT_TEST_CLAMPED", "-3"));
  param_tables_reset(ranged_tables);
  EXPECT_EQ(param_int_checked(&ranged_params[0], &v), weftSuccess);
  EXPECT_EQ(v, 8);
  EXPECT_EQ(param_int(&ranged_params[1]), 1);
  ASSERT_TRUE(weft_test::env_set_alone("WEFT_TEST_REFUSED", nullptr));
  ASSERT_TRUE(weft_test::env_set_alone("WEFT_TEST_CLAMPED", nullptr));
}

// A string with a list of names takes them in any case and refuses any
// other, naming the list; unset passes. So do weft's own tables: a typo in
// WEFT_TRANSPORT and an on/off setting of 2 are refused, not a failed
// connection or a silent "on".
const char *const colours[] = {"red", "green", NULL};
struct weft_param choice_params[] = {
    {.name = "WEFT_TEST_COLOUR", .type = PARAM_STR, .doc = "red or green", .choices = colours},
    PARAM_END,
};
struct weft_param *const choice_tables[] = {choice_params, NULL};

TEST(Param, NamesAreCheckedIgnoringCase) {
  ASSERT_TRUE(weft_test::env_set_alone("WEFT_TEST_COLOUR", nullptr));
  param_tables_reset(choice_tables);
  EXPECT_EQ(param_tables_check(choice_tables), weftSuccess);
  ASSERT_TRUE(weft_test::env_set_alone("WEFT_TEST_COLOUR", "GrEeN"));
  param_tables_reset(choice_tables);
  EXPECT_EQ(param_tables_check(choice_tables), weftSuccess);
  ASSERT_TRUE(weft_test::env_set_alone("WEFT_TEST_COLOUR", "blue"));
  param_tables_reset(choice_tables);
  EXPECT_EQ(param_tables_check(choice_tables), weftInvalidArgument);
  EXPECT_NE(std::string(weft_error_text())
                .find("WEFT_TEST_COLOUR=blue: unknown; must be one of red, green"),
            std::string::npos)
      << weft_error_text();
  ASSERT_TRUE(weft_test::env_set_alone("WEFT_TEST_COLOUR", nullptr));
  struct Case {
    const char *var, *value, *said;
  };
  for (const Case &c : {Case{"WEFT_TRANSPORT", "tcp", "WEFT_TRANSPORT=tcp: unknown; must be one of shm, socket, ucx"},
                        Case{"WEFT_TRANSPORT", "Shm", nullptr},
                        Case{"WEFT_CHECK", "2", "WEFT_CHECK=2: must be 0 to 1"},
                        Case{"WEFT_SHM_DISABLE", "-1", "WEFT_SHM_DISABLE=-1: must be 0 to 1"},
                        Case{"WEFT_CHECK", "1", nullptr}}) {
    ASSERT_TRUE(weft_test::env_set_alone(c.var, c.value));
    weft_params_reset();
    weftResult_t res = param_tables_check(weft_param_tables);
    if (c.said == nullptr) {
      EXPECT_EQ(res, weftSuccess) << c.var << "=" << c.value << ": " << weft_error_text();
    } else {
      EXPECT_EQ(res, weftInvalidArgument) << c.var << "=" << c.value;
      EXPECT_NE(std::string(weft_error_text()).find(c.said), std::string::npos)
          << weft_error_text();
    }
    ASSERT_TRUE(weft_test::env_set_alone(c.var, nullptr));
  }
  weft_params_reset();
}

// torchrun's MASTER_PORT is parsed whole and range-checked: a clear error,
// never a port made of its leading digits.
TEST(Launcher, MasterPortIsRangeChecked) {
  for (const char *port : {"70000", "0", "29500x", "port"}) {
    ASSERT_TRUE(weft_test::env_set_alone("RANK", "0"));
    ASSERT_TRUE(weft_test::env_set_alone("WORLD_SIZE", "2"));
    ASSERT_TRUE(weft_test::env_set_alone("MASTER_ADDR", "127.0.0.1"));
    ASSERT_TRUE(weft_test::env_set_alone("MASTER_PORT", port));
    struct bootstrap_env env;
    EXPECT_EQ(bootstrap_env_read(&env), weftInvalidArgument) << port;
    EXPECT_NE(std::string(weft_error_text()).find(std::string("MASTER_PORT=") + port +
                                                  ": must be a port, 1 to 65535"),
              std::string::npos)
        << weft_error_text();
  }
  for (const char *var : {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"})
    ASSERT_TRUE(weft_test::env_set_alone(var, nullptr));
}

TEST(Log, LevelsSubsystemsAndPrefix) {
  captured.clear();
  weft_log_set_sink(capture, nullptr);
  ASSERT_TRUE(weft_test::env_set_alone("WEFT_DEBUG", "INFO"));
  ASSERT_TRUE(weft_test::env_set_alone("WEFT_DEBUG_SUBSYS", "^NET"));
  weft_params_reset();
  WEFT_INFO(LOG_SHM, "shm says %d", 1);
  WEFT_INFO(LOG_NET, "net says %d", 2);  // excluded
  WEFT_TRACE(LOG_SHM, "too detailed");   // above INFO
  WEFT_WARN(LOG_COLL, "coll warns");
  ASSERT_EQ(captured.size(), 2u);
  EXPECT_NE(captured[0].second.find(" weft INFO SHM shm says 1"), std::string::npos)
      << captured[0].second;
  EXPECT_NE(captured[0].second.find(":" + std::to_string(getpid()) + ":"), std::string::npos);
  EXPECT_NE(captured[1].second.find("WARN COLL coll warns"), std::string::npos);
  // warnings pass whatever the subsystems (a typo there hid them all)
  ASSERT_TRUE(weft_test::env_set_alone("WEFT_DEBUG_SUBSYS", "INTI"));
  weft_params_reset();
  captured.clear();
  WEFT_INFO(LOG_INIT, "init says");  // INTI names nothing
  WEFT_WARN(LOG_NET, "net warns");
  ASSERT_EQ(captured.size(), 2u);
  EXPECT_NE(captured[0].second.find("WEFT_DEBUG_SUBSYS=INTI: unknown names ignored"),
            std::string::npos)
      << captured[0].second;
  EXPECT_NE(captured[1].second.find("WARN NET net warns"), std::string::npos);
  // a level that is none of weft's is said, and WARN taken
  ASSERT_TRUE(weft_test::env_set_alone("WEFT_DEBUG_SUBSYS", nullptr));
  ASSERT_TRUE(weft_test::env_set_alone("WEFT_DEBUG", "DEBUG"));
  weft_params_reset();
  captured.clear();
  WEFT_INFO(LOG_INIT, "not at WARN");
  ASSERT_EQ(captured.size(), 1u);
  EXPECT_NE(captured[0].second.find("WEFT_DEBUG=DEBUG: not NONE, WARN, INFO or TRACE: WARN"),
            std::string::npos)
      << captured[0].second;
  ASSERT_TRUE(weft_test::env_set_alone("WEFT_DEBUG", "NONE"));
  weft_params_reset();
  captured.clear();
  WEFT_WARN(LOG_COLL, "silenced");
  EXPECT_EQ(captured.size(), 0u);
  weft_log_set_sink(nullptr, nullptr);
  ASSERT_TRUE(weft_test::env_set_alone("WEFT_DEBUG", nullptr));
  ASSERT_TRUE(weft_test::env_set_alone("WEFT_DEBUG_SUBSYS", nullptr));
  weft_params_reset();
}

TEST(Param, ConfigPrintListsEveryTable) {
  char *text = nullptr;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  weftConfigPrint(f);
  fclose(f);
  std::string s(text, len);
  free(text);
  for (struct weft_param *const *t = weft_param_tables; *t; t++)
    for (struct weft_param *p = *t; p->name; p++)
      EXPECT_NE(s.find(p->name), std::string::npos) << p->name;
}

// weftConfigPrint's listing shows each value as weft takes it: an integer
// parsed (64K as 65536), and what became of a value not taken as written.
static std::string printed_line(struct weft_param *const *tables, const char *name) {
  char *text = nullptr;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  param_tables_print(tables, f);
  fclose(f);
  std::string s(text, len);
  free(text);
  const size_t at = s.find(std::string(name) + " ");
  if (at == std::string::npos) return "";
  return s.substr(at, s.find('\n', at) - at);
}

TEST(Param, ConfigPrintShowsEffectiveValues) {
  struct {
    const char *name, *env, *want;
  } cases[] = {
      {"WEFT_TEST_INT", nullptr, "= 65536 "},
      {"WEFT_TEST_INT", "2K", "= 2048 (set to 2K)"},
      {"WEFT_TEST_INT", "12", "= 12 "},
      {"WEFT_TEST_INT", "lots", "= 65536 (set to \"lots\": not an integer, the default taken)"},
      {"WEFT_TEST_STR", nullptr, "= (unset)"},
      {"WEFT_TEST_STR", "abc", "= abc "},
      {"WEFT_TEST_REFUSED", "9", "= 9 (out of 1 to 8: a communicator refuses to form)"},
      {"WEFT_TEST_REFUSED", "3", "= 3 "},
      {"WEFT_TEST_CLAMPED", "0", "= 1 (set to 0, out of 1 to 8: the nearest end taken)"},
  };
  for (const auto &c : cases) {
    ASSERT_TRUE(weft_test::env_set_alone(c.name, c.env));
    param_tables_reset(test_tables);
    param_tables_reset(ranged_tables);
    const bool ranged = strncmp(c.name, "WEFT_TEST_RE", 12) == 0 ||
                        strncmp(c.name, "WEFT_TEST_CL", 12) == 0;
    const std::string line = printed_line(ranged ? ranged_tables : test_tables, c.name);
    EXPECT_NE(line.find(c.want), std::string::npos)
        << c.name << "=" << (c.env ? c.env : "(unset)") << " printed: " << line;
    ASSERT_TRUE(weft_test::env_set_alone(c.name, nullptr));
  }
  param_tables_reset(test_tables);
  param_tables_reset(ranged_tables);
  weft_params_reset();
}

// The device transports' and the device executor's tables are indexed by
// enums: every index names its entry (a hole would end the table early,
// hiding the rest from weftConfigPrint), and each table ends right after
// its last.
TEST(Param, DeviceTablesHaveEveryIndexedEntry) {
  const char *const transport_names[CUDA_P_NUM] = {
      "WEFT_CUDA_IPC_DISABLE", "WEFT_P2P_DISABLE", "WEFT_NET_GDR",
      "WEFT_DEVICE_HOST_FIFO_DISABLE"};
  for (int i = 0; i < CUDA_P_NUM; i++) {
    ASSERT_NE(cuda_transport_params[i].name, nullptr) << "entry " << i;
    EXPECT_STREQ(cuda_transport_params[i].name, transport_names[i]) << "entry " << i;
  }
  EXPECT_EQ(cuda_transport_params[CUDA_P_NUM].name, nullptr);
  const char *const executor_names[DEVICE_P_NUM] = {
      "WEFT_DEVICE_NCHANNELS", "WEFT_P2P_LANES", "WEFT_DEVICE_RING_INTERLEAVE",
      "WEFT_DEVICE_PDL", "WEFT_DEVICE_PTR_CACHE"};
  for (int i = 0; i < DEVICE_P_NUM; i++) {
    ASSERT_NE(device_params[i].name, nullptr) << "entry " << i;
    EXPECT_STREQ(device_params[i].name, executor_names[i]) << "entry " << i;
  }
  EXPECT_EQ(device_params[DEVICE_P_NUM].name, nullptr);
}

}  // namespace
