// gpt2-train with --model llama-*: the trainer is one for both families, so Llama gets the engine's
// features through it as GPT-2 does: strategies and world sizes, resharded resumes, bf16 and
// offload on the cpu-discrete device, and a restart after a rank is killed.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "support/run_command.hpp"
#include "train/trainer_support.hpp"

namespace {

using coshard::testing::run_command;
using namespace coshard::testing::train;
namespace fs = std::filesystem;

std::vector<double> losses_from(const std::string& output, int from) {
  std::vector<double> out;
  for (const auto& s : step_records(output)) {
    if (s["step"].get<int>() >= from) out.push_back(s["loss"].get<double>());
  }
  return out;
}

TEST(TrainerLlama, LearnsTheEmbeddedCorpus) {
  auto r = run_command(launch(2, "--model llama-tiny --steps 60 --log-json -"));
  ASSERT_EQ(r.rc, 0) << r.output;
  const auto losses = losses_from(r.output, 1);
  ASSERT_EQ(losses.size(), 60u) << r.output;
  EXPECT_NEAR(losses.front(), std::log(256.0), 0.3);
  EXPECT_LT(losses.back(), 0.5 * losses.front()) << r.output;
  EXPECT_NE(r.output.find("trained 60 steps"), std::string::npos) << r.output;
}

// A checkpoint of 2 ranks resumed on 4 (hybrid) and on 1 (no_shard) logs the uninterrupted losses.
TEST(TrainerLlama, ResumedAtOtherWorldSizesAndStrategiesLogsTheUninterruptedLosses) {
  auto d = temp_dir("llama-resume");
  const std::string common = "--model llama-tiny --steps 8 --seq 32 --lr-schedule cosine --warmup-steps 2 "
                             "--weight-decay 0.1 --clip 1 --shuffle --log-json - ";
  auto whole = run_command(launch(2, common + "--batch 4 --checkpoint-dir " + (d / "a").string() + " --checkpoint-every 4"));
  ASSERT_EQ(whole.rc, 0) << whole.output;
  const auto want = losses_from(whole.output, 5);
  ASSERT_EQ(want.size(), 4u) << whole.output;
  for (const auto& [ranks, extra] : std::vector<std::pair<int, std::string>>{
           {4, "--batch 2 --strategy hybrid_shard --shard-group 2"}, {1, "--batch 8 --strategy no_shard"}}) {
    const fs::path dir = d / ("r" + std::to_string(ranks));
    fs::create_directories(dir);
    fs::copy(d / "a" / "step-00000004", dir / "step-00000004", fs::copy_options::recursive);
    auto resumed = run_command(launch(ranks, common + extra + " --checkpoint-dir " + dir.string() + " --resume auto"));
    ASSERT_EQ(resumed.rc, 0) << resumed.output;
    const auto got = losses_from(resumed.output, 1);
    ASSERT_EQ(got.size(), want.size()) << resumed.output;
    for (std::size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5 * want[i]) << ranks << " ranks, step " << i + 5;
  }
}

// The device whose memory the host cannot touch, as a GPU's: the same losses, bf16 and offload too.
TEST(TrainerLlama, OnTheCpuDiscreteDeviceTheLossesAreTheCpuDevices) {
  const std::string common = "--model llama-tiny --steps 5 --seq 32 --log-json - ";
  for (const std::string extra : {"", "--mixed-precision bf16 --offload --strategy shard_grad_op"}) {
    auto cpu = run_command(launch(2, common + extra + " --device cpu"));
    ASSERT_EQ(cpu.rc, 0) << cpu.output;
    auto discrete = run_command(launch(2, common + extra + " --device cpu-discrete"));
    ASSERT_EQ(discrete.rc, 0) << discrete.output;
    const auto want = losses_from(cpu.output, 1);
    ASSERT_EQ(want.size(), 5u) << cpu.output;
    EXPECT_EQ(losses_from(discrete.output, 1), want) << extra;
  }
}

TEST(TrainerLlama, AKilledRankIsRestartedAndTheRunContinuesFromItsCheckpoint) {
  auto d = temp_dir("llama-restart");
  const std::string common = "--model llama-tiny --steps 24 --seq 32 --checkpoint-every 4 --log-json - ";
  auto whole = run_command(launch(2, common + "--checkpoint-dir " + (d / "whole").string()));
  ASSERT_EQ(whole.rc, 0) << whole.output;
  const std::string dir = (d / "killed").string();
  coshard::testing::CommandResult job;
  std::thread runner([&] {
    job = run_command(kRun + " --max-restarts 1 --nproc-per-node 2 -- " + kTrain + " --metrics-port 0 --samples 0 " +
                      common + "--checkpoint-dir " + dir + " --resume auto" + device_args(common));
  });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (!fs::exists(fs::path(dir) / "step-00000008" / "manifest.json") && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const bool killed = run_command("pkill -9 -n -f -- '[g]pt2-train .*" + dir + "'").rc == 0;
  runner.join();
  ASSERT_TRUE(killed) << "no rank to kill, or the checkpoint never came: " << job.output;
  ASSERT_EQ(job.rc, 0) << job.output;
  EXPECT_NE(job.output.find("coshard-run: restart 1 of 1"), std::string::npos) << job.output;
  const auto want = step_records(whole.output), got = step_records(job.output);
  ASSERT_EQ(want.size(), 24u);
  ASSERT_GE(got.size(), 8u) << job.output;
  for (std::size_t i = 0; i < 8; ++i) {
    const auto& w = want[want.size() - 8 + i];
    const auto& g = got[got.size() - 8 + i];
    ASSERT_EQ(g["step"], w["step"]) << job.output;
    EXPECT_NEAR(g["loss"].get<double>(), w["loss"].get<double>(), 1e-6 * w["loss"].get<double>()) << "step " << w["step"];
  }
}

// --save-hf writes a LlamaForCausalLM directory, and --init DIR reads it back with no --model: the
// directory says what model it is. Its first loss is that of the same weights from --save's file
// under the --model spec; a --model that disagrees with the directory names both.
TEST(TrainerLlama, HuggingFaceDirectoriesBothWaysGiveTheModel) {
  auto d = temp_dir("llama-hf");
  const std::string spec = "llama-tiny,kv_heads=1,vocab=300,ffn=100";
  const auto hf = (d / "hf").string(), file = (d / "w.safetensors").string();
  auto r = run_command(launch(2, "--model " + spec + " --steps 3 --seq 32 --save " + file + " --save-hf " + hf));
  ASSERT_EQ(r.rc, 0) << r.output;
  EXPECT_NE(r.output.find("(Hugging Face: LlamaForCausalLM.from_pretrained)"), std::string::npos) << r.output;
  const auto first_loss = [&](const std::string& args) {
    auto run = run_command(launch(2, "--steps 1 --seq 32 --log-json - " + args));
    EXPECT_EQ(run.rc, 0) << run.output;
    const auto s = step_records(run.output);
    return s.empty() ? -1.0 : s[0]["loss"].get<double>();
  };
  const double from_dir = first_loss("--init " + hf), from_file = first_loss("--model " + spec + " --init " + file);
  EXPECT_GT(from_dir, 0.0);
  EXPECT_EQ(from_dir, from_file);
  EXPECT_EQ(first_loss("--model " + spec + " --init " + hf), from_file);  // a --model that agrees

  r = run_command(kTrain + " --model llama-tiny --init " + hf);
  EXPECT_EQ(r.rc, 2) << r.output;
  EXPECT_NE(r.output.find("--model llama-tiny is llama layers=2,heads=4,kv_heads=2"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("holds llama layers=2,heads=4,kv_heads=1,width=64,ffn=100"), std::string::npos) << r.output;
}

// GPT-2's directories say what they are too: --init DIR trains without --model; another
// model_type is refused naming it.
TEST(TrainerLlama, AGpt2DirectoryGivesItsModelAndOtherTypesAreNamed) {
  auto d = temp_dir("gpt2-hf");
  const auto hf = (d / "hf").string();
  auto r = run_command(kTrain + " --metrics-port 0 --samples 0 --model layers=1,heads=2,width=32,vocab=256,context=32 "
                       "--steps 1 --seq 16 --save-hf " + hf);
  ASSERT_EQ(r.rc, 0) << r.output;
  r = run_command(kTrain + " --metrics-port 0 --samples 0 --steps 1 --seq 16 --init " + hf);
  EXPECT_EQ(r.rc, 0) << r.output;
  EXPECT_NE(r.output.find("trained 1 steps"), std::string::npos) << r.output;
  std::ofstream(d / "hf" / "config.json") << R"({"model_type": "mistral", "hidden_size": 32})";
  r = run_command(kTrain + " --steps 1 --init " + hf);
  EXPECT_EQ(r.rc, 2) << r.output;
  EXPECT_NE(r.output.find("describes a model of type \"mistral\": gpt2-train trains gpt2 (GPT2LMHeadModel) and "
                          "llama (LlamaForCausalLM)"),
            std::string::npos)
      << r.output;
}

}  // namespace
