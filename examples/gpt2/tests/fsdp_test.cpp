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
                      Case{3, "--config layers=3,heads=3,width=24,vocab=29,context=16 --seq 9"}),
    case_name);

}  // namespace
