#pragma once
// What the gpt2-train tests share: starting a job through coshard-run, a scratch folder per test,
// and the step records rank 0 logs with --log-json -.
#include <gtest/gtest.h>
#include <unistd.h>

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

inline std::string launch(int ranks, const std::string& args) {
  return kRun + " --nproc-per-node " + std::to_string(ranks) + " -- " + kTrain + " --metrics-port 0 --samples 0 " + args;
}

inline fs::path temp_dir(const std::string& name) {
  fs::path d = fs::path(::testing::TempDir()) / ("coshard-train-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

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

}  // namespace coshard::testing::train
