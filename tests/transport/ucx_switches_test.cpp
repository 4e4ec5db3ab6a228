// The UCX backend's COSHARD_UCX_* switches: a value that is set but unreadable ends the group's
// creation with an error naming the variable and what it takes, never a silent default.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "coshard/transport/process_group.hpp"

using namespace coshard;
using namespace coshard::transport;
using namespace coshard::launch;

namespace {

class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) { ::setenv(name, value, 1); }
  ~ScopedEnv() { ::unsetenv(name_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
};

struct BadSwitch {
  const char* name;
  const char* value;
  const char* says;
  friend void PrintTo(const BadSwitch& b, std::ostream* os) { *os << b.name << "=" << b.value; }
};

class UcxSwitches : public ::testing::TestWithParam<BadSwitch> {};

TEST_P(UcxSwitches, AnUnreadableValueIsABadConfigErrorNamingTheVariable) {
  const auto& p = GetParam();
  ScopedEnv env(p.name, p.value);
  Runtime rt({});
  try {
    rt.scheduler().sync_wait(ProcessGroup::create(rt, LaunchEnv{}, ProcessGroupOptions{}));
    ADD_FAILURE() << p.name << "=" << p.value << " was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::bad_config) << e.what();
    EXPECT_NE(std::string(e.what()).find(std::string(p.name) + "='" + p.value + "'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(p.says), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(
    Values, UcxSwitches,
    ::testing::Values(BadSwitch{"COSHARD_UCX_HIERARCHY", "maybe", "is not one of 0, 1"},
                      BadSwitch{"COSHARD_UCX_HIERARCHY_MIN_BYTES", "16k", "is not a byte count"},
                      BadSwitch{"COSHARD_UCX_HIERARCHY_CHUNK_BYTES", "-1", "is not a byte count"},
                      BadSwitch{"COSHARD_UCX_HIERARCHY_CHUNK_BYTES", "99999999999999999999999", "is not a byte count"},
                      // Past 2^63 the peers' identities would carry it as negative: -1 is "no hierarchy".
                      BadSwitch{"COSHARD_UCX_HIERARCHY_MIN_BYTES", "18446744073709551615", "is not a byte count"},
                      BadSwitch{"COSHARD_UCX_MESH_MAX_BYTES", "8 KiB", "is not a byte count"},
                      BadSwitch{"COSHARD_UCX_MESH_MAX_BYTES", "2097152", "is above the mesh's limit"},
                      BadSwitch{"COSHARD_UCX_ERROR_MODE", "fast", "is not one of peer, none, auto"},
                      // strtoull read these as 32 and as 0 ("never stream"), silently.
                      BadSwitch{"COSHARD_UCX_STREAM_MIN_BYTES", "32MiB", "is not a byte count"},
                      BadSwitch{"COSHARD_UCX_STREAM_MIN_BYTES", "abc", "is not a byte count"}),
    [](const ::testing::TestParamInfo<BadSwitch>& p) { return std::to_string(p.index); });

}  // namespace
