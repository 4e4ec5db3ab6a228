// GPT-2 124M under gpt2-train: a batch that the host, or the job's memory cgroup, cannot hold is
// refused before training, naming a batch that fits. On 2 ranks the allocator's peak follows the
// FSDP memory formula, computed here from the model's shape (not from the engine's report), for
// full_shard and shard_grad_op. 124M is the model whose embedding-and-head unit is 5.5 blocks,
// where pooling every slot at the largest unit's size once held 2 GB more than the units need.
// Label e2e: a 124M run is too heavy for the sanitizer builds.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "support/run_command.hpp"
#include "train/trainer_support.hpp"

namespace {

using coshard::testing::run_command;
using namespace coshard::testing::train;

constexpr std::int64_t kRanks = 2;

// What one tensor of `bytes` takes from the caching allocator (docs/runtime.md): 512-byte classes
// below 1 MiB, 2 MiB classes above.
std::int64_t block(std::int64_t bytes) {
  const std::int64_t unit = bytes < (1 << 20) ? 512 : (2 << 20);
  return (bytes + unit - 1) / unit * unit;
}

// One FSDP unit of f32 parameters: its shard (an upper bound: each parameter and the shard start
// aligned to 16 bytes, the total padded to divide by the ranks) and its unsharded size.
struct UnitBytes {
  std::int64_t shard, full;
};
UnitBytes unit_bytes(std::int64_t params, int tensors) {
  const std::int64_t chunk = (params + 4 * tensors + kRanks - 1) / kRanks + 4;
  return {4 * chunk, 4 * chunk * kRanks};
}

struct Formula {
  std::int64_t sharded, gathered, gradients, reduction, activations, total;
};

// GPT-2's activations of a [B, T] batch, in the runtime's device memory (gpt2::Activations, kept for
// the run): each tensor a block of its own. Per block: ln_1, attention out, the residual and
// ln_2 ([BT, C]), qkv ([BT, 3C]), the MLP's two [BT, 4C], four rows of means and rstds ([BT]) and
// attention's saved log-sum-exps ([B, heads, T]); besides: L+1 residual streams, ln_f and 6
// backward buffers of [BT, C], one [BT, 3C] and two [BT, 4C], ln_f's mean and rstd and the
// log-sum-exps of the loss ([BT]), the logits and their gradient ([BT, V]), the loss, and the
// tokens and targets (int32 [BT]).
std::int64_t activations_bytes(std::int64_t d, std::int64_t vocab, std::int64_t blocks, std::int64_t heads,
                               std::int64_t B, std::int64_t T) {
  const std::int64_t bt = B * T, f = 4;
  const std::int64_t per_block = 4 * block(f * bt * d) + block(f * bt * 3 * d) + 2 * block(f * bt * 4 * d) +
                                 4 * block(f * bt) + block(f * B * heads * T);
  return blocks * per_block + (blocks + 1 + 1 + 6) * block(f * bt * d) + block(f * bt * 3 * d) +
         2 * block(f * bt * 4 * d) + 3 * block(f * bt) + 2 * block(f * bt * vocab) + block(f) + 2 * block(4 * bt);
}

// GPT-2 124M: 12 blocks of 12 d^2 + 13 d parameters (12 tensors), and the root unit of wte, wpe and
// ln_f (4 tensors), which runs first and last and stays gathered through the step, as FSDP's root.
// Between steps: the sharded state (f32 master, gradient shard, AdamW's two moments). During one:
// the root and `in_flight` (2) blocks gathered, or every unit when kept after forward; the root's
// gradient buffer (open from the head's backward to the embedding's) and two blocks' (the one
// computing, and the one before, whose reduce-scatter overlaps that compute); one
// reduce-scatter output, the root's (the reduce stream runs one reduction at a time).
Formula formula_124m(bool keep_after_forward, std::int64_t batch, std::int64_t seq) {
  constexpr std::int64_t d = 768, vocab = 50257, context = 1024, blocks = 12, heads = 12;
  const UnitBytes block_unit = unit_bytes(12 * d * d + 13 * d, 12);
  const UnitBytes root = unit_bytes(vocab * d + context * d + 2 * d, 4);
  Formula f{};
  f.sharded = 4 * (blocks * block(block_unit.shard) + block(root.shard));
  f.gathered = block(root.full) + (keep_after_forward ? blocks : 2) * block(block_unit.full);
  f.gradients = block(root.full) + 2 * block(block_unit.full);
  f.reduction = block(root.shard);
  f.activations = activations_bytes(d, vocab, blocks, heads, batch, seq);
  f.total = f.sharded + f.gathered + f.gradients + f.reduction + f.activations + (1 << 20);  // + scalars: norms
  return f;
}

// gpt2-train's end line: what the ranks peaked at (least, most, MiB resident) and what its memory
// check counted a rank. The check refuses only what cannot fit because that count is a floor.
void expect_the_check_counts_no_more_than_a_rank_peaks_at(const std::string& output, const std::string& run) {
  const auto at = output.find("memory: the ranks peaked at ");
  ASSERT_NE(at, std::string::npos) << output;
  double least = 0, most = 0, counted = 0;
  ASSERT_EQ(std::sscanf(output.c_str() + at, "memory: the ranks peaked at %lf-%lf MiB resident; the memory check "
                        "counted at least %lf MiB", &least, &most, &counted), 3)
      << output.substr(at);
  EXPECT_LE(counted, least) << run << ": " << output.substr(at);
  // And it counts most of it: what it leaves out (the program, BLAS scratch) is small beside this.
  EXPECT_GE(counted, 0.5 * least) << run << ": " << output.substr(at);
}

void expect_peak_follows_the_formula(const std::string& strategy, bool keep_after_forward) {
  constexpr std::int64_t batch = 1, seq = 64;
  const Formula f = formula_124m(keep_after_forward, batch, seq);
  auto r = run_command(launch(kRanks, "--model 124M --strategy " + strategy + " --batch " + std::to_string(batch) +
                                          " --seq " + std::to_string(seq) + " --steps 3 --threads 1 --log-json -"));
  ASSERT_EQ(r.rc, 0) << r.output;
  const auto steps = step_records(r.output);
  ASSERT_EQ(steps.size(), 3u) << r.output;
  const auto peak = steps.back()["peak_mem_bytes"].get<std::int64_t>();
  const auto state = steps.back()["state_bytes"].get<std::int64_t>();
  const auto pools = steps.back()["pool_bytes"].get<std::int64_t>();
  const std::string figures = strategy + ": peak " + std::to_string(peak) + " bytes, formula " +
                              std::to_string(f.total) + " (sharded " + std::to_string(f.sharded) + " + gathered " +
                              std::to_string(f.gathered) + " + gradients " + std::to_string(f.gradients) +
                              " + reduction " + std::to_string(f.reduction) + " + activations " +
                              std::to_string(f.activations) + " + 1 MiB); engine report: state " +
                              std::to_string(state) + ", pools " + std::to_string(pools);
  std::printf("%s\n", figures.c_str());
  EXPECT_LE(peak, f.total) << figures;
  // Tight from below too (measured: the formula less its 1 MiB for scalars): a formula loose by a
  // buffer, the smallest a block's 14 MB shard, would hide a unit kept too long.
  EXPECT_GE(peak, f.total - (4 << 20)) << figures;
  expect_the_check_counts_no_more_than_a_rank_peaks_at(r.output, strategy);
}

TEST(TrainerMemory, PeakFollowsTheFsdpFormulaOnGpt2_124M_FullShard) { expect_peak_follows_the_formula("full_shard", false); }

TEST(TrainerMemory, PeakFollowsTheFsdpFormulaOnGpt2_124M_ShardGradOp) {
  expect_peak_follows_the_formula("shard_grad_op", true);
}

// The same on 10M, where activations weigh more: strategies, mixed precision, accumulation and no
// prefetch each change a term.
TEST(TrainerMemory, TheCheckCountsNoMoreThanAnyRankPeaksAt) {
  for (const std::string flags : {"", " --strategy shard_grad_op --mixed-precision bf16 --grad-accum 2",
                                  " --strategy no_shard --forward-prefetch 0 --backward-prefetch none"}) {
    const auto r = run_command("timeout 300 " + launch(kRanks, "--model 10M --batch 8 --seq 256 --steps 1" + flags));
    ASSERT_EQ(r.rc, 0) << flags << "\n" << r.output;
    expect_the_check_counts_no_more_than_a_rank_peaks_at(r.output, flags);
  }
}

// Such a batch was killed by the OOM killer in its first step (exit 137, or a swapping host).
TEST(TrainerMemory, ABatchTheHostCannotHoldIsRefusedBeforeTrainingNamingOneThatFits) {
  const auto r = run_command("timeout 120 " + launch(kRanks, "--model 124M --batch 4096 --seq 1024 --steps 1"));
  EXPECT_EQ(r.rc, 1) << r.output;
  EXPECT_LT(r.seconds, 60) << r.output;
  for (const char* part : {"the 2 rank(s) on this host need at least ", "activations of --batch 4096 x --seq 1024 ",
                           "sharded parameters, gradients and AdamW state ", " is available (",
                           " fits (--global-batch or --grad-accum keeps the global batch)",
                           "--no-memory-check skips this check"}) {
    EXPECT_NE(r.output.find(part), std::string::npos) << part << "\n" << r.output;
  }
  EXPECT_EQ(r.output.find("step 1"), std::string::npos) << "training started: " << r.output;
}

// A job's memory cgroup (Slurm's, a container's) may leave far less than the host has free: the
// kernel kills within the cgroup's limit. A v1 child of this process's memory cgroup with 512 MiB.
TEST(TrainerMemory, TheMemoryCgroupsLimitCountsWhereItLeavesLessThanTheHost) {
  const auto where = run_command("awk -F: '$2 ~ /(^|,)memory(,|$)/ { print $3 }' /proc/self/cgroup");
  const std::string parent = "/sys/fs/cgroup/memory" + where.output.substr(0, where.output.find('\n'));
  const std::string cg = parent + "/coshard-test-" + std::to_string(::getpid());
  if (where.output.empty() || run_command("mkdir " + cg + " && echo 536870912 > " + cg + "/memory.limit_in_bytes").rc != 0) {
    run_command("rmdir " + cg);
    GTEST_SKIP() << "needs a cgroup v1 memory hierarchy this test may add a child to (as root): " << where.output;
  }
  const auto r = run_command("sh -c 'echo $$ > " + cg + "/cgroup.procs && exec timeout 60 " + kTrain +
                             " --metrics-port 0 --model 124M --steps 1'");
  run_command("rmdir " + cg);
  EXPECT_EQ(r.rc, 1) << r.output;
  EXPECT_NE(r.output.find("the 1 rank(s) on this host need at least "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(" is available (the memory cgroup limit of " + cg + ")"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("not even --batch 1 fits"), std::string::npos) << r.output;  // 124M's state: 2 GB
}

}  // namespace
