// Llama on the FSDP engine against the same model trained in one process (models_fsdp_check),
// with real ranks started by coshard-run: every strategy, uneven shards on 3 ranks, clipping and
// gradient accumulation, a tied head, and bf16 mixed precision.
#include <gtest/gtest.h>

#include <string>

#include "tests/support/rank_cases.hpp"
#include "tests/support/run_command.hpp"

namespace {

using coshard::testing::run_command;
using Case = coshard::testing::RankCase;

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return coshard::testing::rank_case_name(info.param, {"config", "strategy"});
}

class LlamaFsdp : public ::testing::TestWithParam<Case> {};

TEST_P(LlamaFsdp, ShardedTrainingEqualsOneProcess) {
  const auto& c = GetParam();
  auto r = run_command(std::string(COSHARD_RUN_BIN) + " --nproc-per-node " + std::to_string(c.ranks) + " -- " +
                       MODELS_FSDP_CHECK_BIN + " --family llama " + c.args);
  EXPECT_EQ(r.rc, 0) << r.output;
  for (int i = 0; i < c.ranks; ++i) {
    EXPECT_NE(r.output.find("rank " + std::to_string(i) + ": llama parity ok"), std::string::npos) << r.output;
  }
}

// An odd shape whose flat parameters do not divide evenly over 3 ranks.
const std::string kOdd = "layers=2,heads=6,kv_heads=2,width=30,ffn=44,head_dim=6,vocab=61,context=24";

INSTANTIATE_TEST_SUITE_P(
    Llama, LlamaFsdp,
    ::testing::Values(Case{2, "--config llama-tiny"}, Case{3, "--config " + kOdd + " --seq 9 --batch 1"},
                      Case{3, "--config " + kOdd + " --seq 9 --strategy shard_grad_op --clip 0.5 --accum 2"},
                      Case{3, "--config " + kOdd + " --seq 9 --strategy hybrid_shard --clip 0.5 --accum 2"},
                      Case{2, "--config llama-tiny --strategy no_shard"},
                      Case{2, "--config llama-tiny,tie_head=true --accum 2"},
                      Case{2, "--config llama-tiny --mixed bf16 --compute bf16"}),
    case_name);

}  // namespace
