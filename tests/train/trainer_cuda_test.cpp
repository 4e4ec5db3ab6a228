// gpt2-train on CUDA (--device cuda: a GPU per local rank, NCCL between them) trains GPT-2 to the
// losses of the CPU device, with a sharded checkpoint saved and resumed, with CPU offload (pinned
// host state, the optimizer as host callbacks), and under bf16 mixed precision on the engine's f32 copy on both sides (--f32-compute: the CPU computes on the bf16
// parameters only where it has the AVX512-BF16 kernel, so the two would take different GEMMs;
// the bf16 GEMMs are compared op by op in gpt2_model_cuda_test). Label gpu: skipped, naming the reason, where no CUDA device is usable. The bound is
// looser than the cpu-discrete device's bitwise equality: the CUDA ops sum in another order
// (1e-5 per op against the CPU ops, tests/ops/cuda_ops_test.cpp), and six steps of training carry
// that on.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "coshard/runtime/cuda.hpp"
#include "support/run_command.hpp"
#include "train/trainer_support.hpp"

namespace {

using coshard::testing::run_command;
using namespace coshard::testing::train;

std::vector<double> losses_from(const std::string& output, int from) {
  std::vector<double> out;
  for (const auto& s : step_records(output)) {
    if (s["step"].get<int>() >= from) out.push_back(s["loss"].get<double>());
  }
  return out;
}

void expect_near_each(const std::vector<double>& got, const std::vector<double>& want, std::size_t first_step) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], 1e-3 * std::fabs(want[i])) << "step " << first_step + i;
  }
}

TEST(TrainerCuda, SameLossesAsTheCpuDevice) {
  const auto probe = coshard::cuda::probe();
  if (probe.devices == 0) GTEST_SKIP() << "no CUDA device: " << probe.reason;
  const int ranks = std::min(2, probe.devices);
  auto d = temp_dir("cuda");
  const std::string common = "--steps 6 --seq 32 --clip 1 --log-json - ";
  for (const std::string extra : {"", "--mixed-precision bf16 --f32-compute --strategy shard_grad_op",
                                   "--mixed-precision bf16 --f32-compute --offload"}) {
    auto cpu = run_command(launch(ranks, common + extra));
    ASSERT_EQ(cpu.rc, 0) << cpu.output;
    const fs::path dir = d / ("ckpt" + std::to_string(extra.size()));
    auto cuda = run_command(launch(ranks, common + extra + " --device cuda --checkpoint-every 3 --checkpoint-dir " +
                                              dir.string()));
    ASSERT_EQ(cuda.rc, 0) << cuda.output;
    const auto want = losses_from(cpu.output, 1);
    ASSERT_EQ(want.size(), 6u) << cpu.output;
    expect_near_each(losses_from(cuda.output, 1), want, 1);
    auto resumed = run_command(launch(ranks, common + extra + " --device cuda --resume " +
                                                 (dir / "step-00000003").string()));
    ASSERT_EQ(resumed.rc, 0) << resumed.output;
    expect_near_each(losses_from(resumed.output, 4), {want.begin() + 3, want.end()}, 4);
  }
}

}  // namespace
