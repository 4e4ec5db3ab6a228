// gpt2-train's flags as wrappers use them: scripts/demo, an sbatch script or a coshard-run template
// sets defaults, and its user's flags, given after, override them.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "support/run_command.hpp"
#include "train/trainer_support.hpp"

namespace {

using coshard::testing::run_command;
using namespace coshard::testing::train;
namespace fs = std::filesystem;

const std::string kSource = COSHARD_SOURCE_DIR;
const std::string kBuild = COSHARD_BUILD_DIR;

TEST(TrainerFlags, AFlagGivenTwiceTakesItsLastValue) {
  // Refused before: "--steps: At Most 1 required but received 2", in the parser library's words.
  auto r = run_command(kTrain + " --metrics-port 0 --samples 0 --log-json - --steps 5 --seq 8 --steps 3 --seq 16");
  ASSERT_EQ(r.rc, 0) << r.output;
  const auto steps = step_records(r.output);
  ASSERT_EQ(steps.size(), 3u) << r.output;
  EXPECT_NE(r.output.find("trained 3 steps"), std::string::npos) << r.output;
  // And each value given is still checked, the one overridden too.
  r = run_command(kTrain + " --steps 0 --steps 3");
  EXPECT_EQ(r.rc, 2) << r.output;
  EXPECT_NE(r.output.find("--steps"), std::string::npos) << r.output;
}

TEST(TrainerFlags, WhereTheModelStartsCannotBeGivenTwice) {
  auto d = temp_dir("twice");
  fs::create_directories(d / "a");
  fs::create_directories(d / "b");
  for (const char* flag : {"--resume", "--init"}) {
    auto r = run_command(kTrain + " " + flag + " " + (d / "a").string() + " " + flag + " " + (d / "b").string());
    EXPECT_EQ(r.rc, 2) << r.output;
    EXPECT_NE(r.output.find("gpt2-train: " + std::string(flag) + " given 2 times ('" + (d / "a").string() + "', then '" +
                            (d / "b").string() + "')"),
              std::string::npos)
        << r.output;
  }
}

// The README's first command with an override after --, as a new user tries it first.
TEST(TrainerDemo, FlagsAfterTheDashOverrideTheDemosOwn) {
  auto d = temp_dir("demo");
  auto r = run_command("COSHARD_BUILD_DIR=" + kBuild + " COSHARD_OUT_DIR=" + d.string() + " " + kSource +
                       "/scripts/demo --no-setup --no-build -- --steps 50");
  ASSERT_EQ(r.rc, 0) << r.output;
  EXPECT_NE(r.output.find("trained 50 steps"), std::string::npos) << r.output;
  std::ifstream log(d / "train-log.jsonl");
  int lines = 0;
  for (std::string line; std::getline(log, line);) ++lines;
  EXPECT_EQ(lines, 50) << r.output;
  EXPECT_TRUE(fs::exists(d / "gpt2-tiny.safetensors")) << r.output;
}

}  // namespace
