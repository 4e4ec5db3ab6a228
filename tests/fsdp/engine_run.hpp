#pragma once
// Runs engine_check on N ranks through coshard-run, for the engine's multi-process tests.
#include <gtest/gtest.h>

#include <string>

#include "support/run_command.hpp"

namespace coshard::testing {

inline const std::string kRun = COSHARD_RUN_BIN;
inline const std::string kCheck = ENGINE_CHECK_BIN;

inline coshard::testing::CommandResult check(int ranks, const std::string& args) {
  return run_command(kRun + " --nproc-per-node " + std::to_string(ranks) + " -- " + kCheck + " " + args);
}

inline void expect_ok(const coshard::testing::CommandResult& r, int ranks, const std::string& mode) {
  EXPECT_EQ(r.rc, 0) << r.output;
  for (int i = 0; i < ranks; ++i) {
    EXPECT_NE(r.output.find("rank " + std::to_string(i) + ": " + mode + " ok"), std::string::npos) << r.output;
  }
}

}  // namespace coshard::testing
