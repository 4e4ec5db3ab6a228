// GPT-2 on the FSDP engine against the same model trained in one process (gpt2_fsdp_check),
// with real ranks started by coshard-run: tied head (the root unit runs at both ends) and untied.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/support/rank_cases.hpp"
#include "tests/support/run_command.hpp"

namespace {

using coshard::testing::run_command;

using Case = coshard::testing::RankCase;

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return coshard::testing::rank_case_name(info.param, {"config", "strategy"});
}

class Gpt2Fsdp : public ::testing::TestWithParam<Case> {};

TEST_P(Gpt2Fsdp, ShardedTrainingEqualsOneProcess) {
  const auto& c = GetParam();
  auto r = run_command(std::string(COSHARD_RUN_BIN) + " --nproc-per-node " + std::to_string(c.ranks) + " -- " +
                       GPT2_FSDP_CHECK_BIN + " " + c.args);
  EXPECT_EQ(r.rc, 0) << r.output;
  for (int i = 0; i < c.ranks; ++i) {
    EXPECT_NE(r.output.find("rank " + std::to_string(i) + ": gpt2 parity ok"), std::string::npos) << r.output;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Gpt2, Gpt2Fsdp,
    ::testing::Values(Case{2, "--config tiny"}, Case{3, "--config tiny --batch 1"},
                      Case{2, "--config tiny,tie_head=false"}, Case{2, "--config tiny --strategy shard_grad_op"},
                      Case{2, "--config tiny --strategy no_shard"},
                      Case{3, "--config layers=3,heads=3,width=24,vocab=29,context=16 --seq 9"},
                      // bf16 mixed precision, computing on an f32 copy and on the bf16 parameters
                      // (bf16 GEMMs): the f32 reference within bf16's rounding.
                      Case{2, "--config tiny --mixed bf16 --compute f32"},
                      Case{2, "--config tiny --mixed bf16 --compute bf16"},
                      Case{2, "--config tiny,tie_head=false --mixed bf16 --compute bf16"},
                      Case{3, "--config layers=3,heads=3,width=24,vocab=29,context=16 --seq 9 --mixed bf16 --compute bf16"}),
    case_name);

// Units that compute in bf16 cannot read f16 parameters: the rank fails naming the unit and the fix.
TEST(Gpt2FsdpBf16, ComputeRefusesF16Parameters) {
  auto r = run_command(std::string(COSHARD_RUN_BIN) + " --nproc-per-node 2 -- " + GPT2_FSDP_CHECK_BIN +
                       " --config tiny --steps 1 --mixed f16 --compute bf16");
  EXPECT_NE(r.rc, 0) << r.output;
  EXPECT_NE(r.output.find("computes in f32 or bf16, but its parameters are f16: use gpt2::Compute::f32"),
            std::string::npos)
      << r.output;
}

}  // namespace
