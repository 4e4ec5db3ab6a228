#pragma once
// What the gpt2-train tests share: starting a job through coshard-run, a scratch folder per test
// (removed after it),
// and the step records rank 0 logs with --log-json -.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

namespace coshard::testing::train {

namespace fs = std::filesystem;
using nlohmann::json;

inline const std::string kRun = COSHARD_RUN_BIN;
inline const std::string kTrain = GPT2_TRAIN_BIN;

// COSHARD_TEST_DEVICE=cpu-discrete (ctest's discrete.* copies of the trainer tests set it) trains
// every job on the device whose memory the host cannot touch, unless the test names a device.
inline std::string device_args(const std::string& args) {
  const char* device = std::getenv("COSHARD_TEST_DEVICE");
  if (!device || !*device || args.find("--device") != std::string::npos) return {};
  return std::string(" --device ") + device;
}

inline std::string launch(int ranks, const std::string& args) {
  return kRun + " --nproc-per-node " + std::to_string(ranks) + " -- " + kTrain + " --metrics-port 0 --samples 0 " + args +
         device_args(args);
}

// A test's scratch folder, removed when the test ends: a checkpoint test writes up to 1.6 GB, and
// left behind they filled the disk after a few dozen runs. A failed test keeps its folder and says
// where, for the post-mortem.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& name)
      : path_(fs::path(::testing::TempDir()) / ("coshard-train-" + name + "-" + std::to_string(::getpid()))) {
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~ScratchDir() {
    if (::testing::Test::HasFailure()) {
      std::fprintf(stderr, "kept %s for the failed test\n", path_.c_str());
      return;
    }
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  operator const fs::path&() const noexcept { return path_; }
  fs::path operator/(const fs::path& p) const { return path_ / p; }
  std::string string() const { return path_.string(); }

 private:
  fs::path path_;
};

inline ScratchDir temp_dir(const std::string& name) { return ScratchDir(name); }

// The JSON step records rank 0 wrote to stdout (--log-json -), in order.
inline std::vector<json> step_records(const std::string& output) {
  std::vector<json> out;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);) {
    auto at = line.find("{\"step\":");
    if (at == std::string::npos) continue;
    out.push_back(json::parse(line.substr(at)));
  }
  return out;
}

// Both jobs logged `steps` steps with the same losses, within `relative`.
inline void expect_same_step_losses(const std::string& want, const std::string& got, std::size_t steps, double relative) {
  auto a = step_records(want), b = step_records(got);
  ASSERT_EQ(a.size(), steps) << want;
  ASSERT_EQ(b.size(), steps) << got;
  for (std::size_t i = 0; i < steps; ++i) {
    const double x = a[i]["loss"], y = b[i]["loss"];
    EXPECT_NEAR(x, y, relative * std::abs(x)) << "step " << i + 1;
  }
}

}  // namespace coshard::testing::train
