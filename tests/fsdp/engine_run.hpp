#pragma once
// Runs engine_check on N ranks through coshard-run, for the engine's multi-process tests.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "support/run_command.hpp"

namespace coshard::testing {

inline const std::string kRun = COSHARD_RUN_BIN;
inline const std::string kCheck = ENGINE_CHECK_BIN;

// COSHARD_TEST_DEVICE=cpu-discrete (ctest's discrete.* copies of these tests set it) runs every
// rank on the device whose memory the host cannot touch (Runtime::Options::discrete_memory).
inline std::string device_args() {
  const char* device = std::getenv("COSHARD_TEST_DEVICE");
  return device && *device ? std::string(" --device ") + device : std::string();
}

inline coshard::testing::CommandResult check(int ranks, const std::string& args) {
  return run_command(kRun + " --nproc-per-node " + std::to_string(ranks) + " -- " + kCheck + " " + args + device_args());
}

inline void expect_ok(const coshard::testing::CommandResult& r, int ranks, const std::string& mode) {
  EXPECT_EQ(r.rc, 0) << r.output;
  for (int i = 0; i < ranks; ++i) {
    EXPECT_NE(r.output.find("rank " + std::to_string(i) + ": " + mode + " ok"), std::string::npos) << r.output;
  }
}

}  // namespace coshard::testing
