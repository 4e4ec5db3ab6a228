// Multi-process tests of the FSDP engine: real ranks started by coshard-run, each comparing the
// sharded training of an MLP with the same model trained without sharding (engine_check.cpp).
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "engine_run.hpp"
#include "support/rank_cases.hpp"

namespace {

using namespace coshard::testing;

// 1. Parity with one process, for every strategy and rank count, on MLPs of uneven shapes.
using ParityCase = coshard::testing::RankCase;

std::string parity_name(const ::testing::TestParamInfo<ParityCase>& info) {
  return coshard::testing::rank_case_name(info.param, {"strategy", "param-dtype"});
}

class Parity : public ::testing::TestWithParam<ParityCase> {};

TEST_P(Parity, ShardedTrainingEqualsOneProcess) {
  const auto& c = GetParam();
  if (c.args.find("--offload params") != std::string::npos && device_args() == " --device cpu-discrete") {
    GTEST_SKIP() << "offload of the parameters alone is refused where the host cannot reach device memory "
                    "(EngineOffload.BadOptionsFailAtCreation checks the error)";
  }
  for (const std::string layers : {"16x15,15x8", "7x15,15x3", "16x17,17x8"}) {
    // A case may name its own layers (the last --layers wins).
    auto r = check(c.ranks, "--layers " + layers + " " + c.args);
    expect_ok(r, c.ranks, "parity");
  }
}

std::vector<ParityCase> parity_cases() {
  std::vector<ParityCase> cases;
  for (int n : {1, 2, 3, 4}) {
    for (const std::string s : {"full_shard", "shard_grad_op", "no_shard"}) cases.push_back({n, "--strategy " + s});
  }
  for (const std::string s : {"hybrid_shard", "hybrid_shard_zero2"}) {
    cases.push_back({4, "--strategy " + s + " --shard-group 2"});  // a 2 x 2 mesh
  }
  cases.push_back({2, "--param-dtype bf16"});                          // mixed precision, bf16 reductions
  cases.push_back({3, "--param-dtype bf16 --reduce-dtype f32"});
  cases.push_back({2, "--param-dtype f16 --strategy shard_grad_op"});  // f16: split divide
  cases.push_back({4, "--param-dtype bf16 --strategy hybrid_shard --shard-group 2"});
  cases.push_back({2, "--forward-prefetch 0 --backward none"});
  cases.push_back({2, "--forward-prefetch 2 --in-flight 3 --backward post"});
  cases.push_back({4, "--reshard-int 2"});
  cases.push_back({2, "--param-dtype bf16 --strategy no_shard"});
  // A two-phase root unit (first and last layer), as a tied embedding and LM head need.
  cases.push_back({2, "--root 1 --layers 16x15,15x9,9x8"});
  cases.push_back({3, "--root 1 --layers 16x15,15x9,9x8 --strategy shard_grad_op --param-dtype bf16"});
  cases.push_back({4, "--root 1 --layers 16x15,15x9,9x8 --strategy hybrid_shard --shard-group 2 --micro no_sync,sync"});
  // Units that read their parameters in param_dtype (Unit::computes_in_f32 false): no f32 copy,
  // the same results.
  for (const std::string a : {"--strategy full_shard", "--strategy no_shard", "--root 1 --layers 16x15,15x9,9x8",
                              "--offload all"}) {
    cases.push_back({2, "--param-dtype bf16 --unit-params param-dtype " + a});
  }
  cases.push_back({2, "--param-dtype f16 --strategy shard_grad_op --unit-params param-dtype"});
  cases.push_back({4, "--param-dtype bf16 --strategy hybrid_shard --shard-group 2 --unit-params param-dtype"});
  // A random delay before every work item on every stream (Runtime::Options::stream_jitter):
  // a stream-side wait the engine forgets shows as a wrong result.
  cases.push_back({2, "--stress 1 --steps 6"});
  cases.push_back({2, "--stress 1 --steps 6 --strategy shard_grad_op --param-dtype bf16"});
  cases.push_back({4, "--stress 1 --steps 6 --strategy hybrid_shard --shard-group 2 --micro no_sync,sync"});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Engine, Parity, ::testing::ValuesIn(parity_cases()), parity_name);

// CPU offload (issue 6): parity with one process (and so with non-offloaded training) for every
// sharded strategy, with and without mixed precision, pipelined and serial optimizer, on 1, 2 and
// 4 ranks; random delays on every stream never change the results.
std::vector<ParityCase> offload_cases() {
  std::vector<ParityCase> cases;
  for (int n : {1, 2, 4}) {
    for (const std::string s : {"full_shard", "shard_grad_op"}) {
      cases.push_back({n, "--offload all --strategy " + s});
      cases.push_back({n, "--offload all --pipelined 0 --param-dtype bf16 --strategy " + s});
    }
  }
  for (const std::string s : {"hybrid_shard", "hybrid_shard_zero2"}) {
    cases.push_back({4, "--offload all --shard-group 2 --strategy " + s});
  }
  cases.push_back({2, "--offload params --param-dtype bf16"});
  cases.push_back({2, "--offload all --clip-max 0.05"});              // the optimizer waits for the norm
  cases.push_back({2, "--offload all --micro no_sync,sync,no_sync,sync"});  // accumulation, last backward
  cases.push_back({2, "--offload all --micro sync,sync --pipelined 1"});
  cases.push_back({2, "--offload all --stress 1 --steps 6"});
  cases.push_back({3, "--offload all --stress 1 --param-dtype bf16 --root 1 --layers 16x15,15x9,9x8 --steps 6"});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Offload, Parity, ::testing::ValuesIn(offload_cases()), parity_name);

TEST(EngineOffload, NoFullSizeStateOnTheDevice) {
  for (const std::string dtype : {"f32", "bf16"}) {  // bf16: where the host cannot reach the device, an f32 slot too
    expect_ok(check(2, "--mode offload-memory --offload all --layers 64x64,64x64,64x64,64x32 --param-dtype " + dtype), 2,
              "offload-memory");
  }
}

TEST(EngineOffload, BadOptionsFailAtCreation) { expect_ok(check(2, "--mode offload-errors"), 2, "offload-errors"); }

// 2. Collective counts per iteration.
TEST(EngineCounts, PerIterationAsFsdp) {
  for (const std::string s : {"full_shard", "shard_grad_op", "no_shard"}) {
    expect_ok(check(2, "--mode counts --layers 8x8,8x8,8x8,8x4 --strategy " + s), 2, "counts");
  }
  expect_ok(check(4, "--mode counts --layers 8x8,8x8,8x4 --strategy hybrid_shard --shard-group 2"), 4, "counts");
}

// 3. The exact issue order for the prefetch modes.
std::string issue_order(const std::string& args) {
  auto r = check(2, "--mode order --layers 8x8,8x8,8x8,8x4 " + args);
  EXPECT_EQ(r.rc, 0) << r.output;
  auto at = r.output.find("issue order: ");
  if (at == std::string::npos) return r.output;
  return r.output.substr(at + 13, r.output.find('\n', at) - at - 13);
}

TEST(EngineOrder, DefaultPrefetch) {
  // Forward: each unit's all-gather is issued while the one before computes; the last unit stays
  // unsharded into backward. BACKWARD_PRE: the next unit's all-gather goes before this unit's
  // gradient compute, then this unit's reduce-scatter.
  EXPECT_EQ(issue_order(""),
            "forward layers.0 all_gather; forward layers.1 all_gather; forward layers.0 compute; "
            "forward layers.2 all_gather; forward layers.1 compute; forward layers.3 all_gather; forward layers.2 compute; "
            "forward layers.3 compute; "
            "backward layers.2 all_gather; backward layers.3 compute; backward layers.3 reduce_scatter; "
            "backward layers.1 all_gather; backward layers.2 compute; backward layers.2 reduce_scatter; "
            "backward layers.0 all_gather; backward layers.1 compute; backward layers.1 reduce_scatter; "
            "backward layers.0 compute; backward layers.0 reduce_scatter");
}

TEST(EngineOrder, BackwardPostGathersAfterTheGradientCompute) {
  auto log = issue_order("--backward post");
  EXPECT_EQ(log.substr(log.find("backward")),
            "backward layers.3 compute; backward layers.2 all_gather; backward layers.3 reduce_scatter; "
            "backward layers.2 compute; backward layers.1 all_gather; backward layers.2 reduce_scatter; "
            "backward layers.1 compute; backward layers.0 all_gather; backward layers.1 reduce_scatter; "
            "backward layers.0 compute; backward layers.0 reduce_scatter");
}

TEST(EngineOrder, ForwardPrefetchOfOneAndTwoUnits) {
  auto two = issue_order("--forward-prefetch 2 --in-flight 3");
  EXPECT_EQ(two.substr(0, two.find("; backward")),
            "forward layers.0 all_gather; forward layers.1 all_gather; forward layers.2 all_gather; "
            "forward layers.0 compute; forward layers.3 all_gather; forward layers.1 compute; "
            "forward layers.2 compute; forward layers.3 compute");
  auto none = issue_order("--forward-prefetch 0 --backward none");
  EXPECT_EQ(none,
            "forward layers.0 all_gather; forward layers.0 compute; forward layers.1 all_gather; forward layers.1 compute; "
            "forward layers.2 all_gather; forward layers.2 compute; forward layers.3 all_gather; forward layers.3 compute; "
            "backward layers.3 compute; backward layers.3 reduce_scatter; backward layers.2 all_gather; "
            "backward layers.2 compute; backward layers.2 reduce_scatter; backward layers.1 all_gather; "
            "backward layers.1 compute; backward layers.1 reduce_scatter; backward layers.0 all_gather; "
            "backward layers.0 compute; backward layers.0 reduce_scatter");
}

// 5. Memory: the allocator's peak over a step within the FSDP formula (engine_check's memory
// mode). Seven units of 66 KB against two in flight: a unit not resharded after forward exceeds
// it by 291 KB, reduce-scatter outputs kept per unit (the code before 2026-11-24) did by 144 KB;
// its slack is 6 KB. Units that read bf16 parameters take no f32 copy: the peak drops from
// 1,247,232 to 1,115,136 bytes, and an engine that still made the copy exceeds the bound by 127 KB.
TEST(EngineMemory, PeakFollowsTheFsdpFormula) {
  const std::string model = "--mode memory --layers 128x128,128x128,128x128,128x128,128x128,128x128,128x64 ";
  for (const std::string a : {"--strategy full_shard", "--strategy shard_grad_op", "--reduce-dtype bf16",
                              "--param-dtype bf16", "--param-dtype bf16 --unit-params param-dtype",
                              "--param-dtype bf16 --unit-params param-dtype --strategy shard_grad_op"}) {
    expect_ok(check(2, model + a), 2, "memory");
  }
}

// 6. Gradient accumulation: micro-batches with no_sync equal one batch of their union.
TEST(EngineAccumulation, NoSyncInterleavings) {
  expect_ok(check(2, "--micro no_sync,no_sync,no_sync,sync,sync,sync,no_sync,no_sync,no_sync,sync --steps 4"), 2,
            "parity");
  expect_ok(check(2, "--micro sync,sync,sync,no_sync,no_sync,no_sync,sync --steps 4 --strategy shard_grad_op"), 2,
            "parity");
  expect_ok(check(2, "--micro no_sync,sync --steps 4 --strategy no_shard"), 2, "parity");
}

// 7. Mixed precision: unsharded parameters in param_dtype, reductions in reduce_dtype.
TEST(EngineMixedPrecision, CollectivesRunInTheirDtypes) {
  expect_ok(check(2, "--mode dtypes --param-dtype bf16"), 2, "dtypes");
  expect_ok(check(2, "--mode dtypes --param-dtype bf16 --reduce-dtype f32"), 2, "dtypes");
  expect_ok(check(2, "--mode dtypes --param-dtype f16 --reduce-dtype f16"), 2, "dtypes");
}

// 8. A rank taking another order in the first iteration fails every rank by name.
TEST(EngineErrors, DifferentForwardOrderIsNamedOnEveryRank) {
  auto r = check(2, "--mode wrong-order --layers 8x8,8x8,8x4");
  EXPECT_NE(r.rc, 0) << r.output;
  for (int i = 0; i < 2; ++i) {
    EXPECT_NE(r.output.find("[rank " + std::to_string(i) + "] rank " + std::to_string(i) +
                            ": error: coshard invalid_argument"),
              std::string::npos)
        << r.output;
  }
  EXPECT_NE(r.output.find("forward order differs across ranks: at position 0 of the first forward, rank 1 runs unit "
                          "'layers.2' where rank 0 runs 'layers.0'"),
            std::string::npos)
      << r.output;
  EXPECT_LT(r.seconds, 30);
}

// 9. clip_grad_norm equals the one-process norm; state dict round trip.
TEST(EngineClip, NormEqualsOneProcess) {
  for (const std::string p : {"2", "1", "inf"}) {
    expect_ok(check(2, "--mode clip --clip-p " + p), 2, "clip");
    expect_ok(check(3, "--mode clip --clip-p " + p + " --strategy no_shard"), 3, "clip");
  }
  expect_ok(check(4, "--mode clip --strategy hybrid_shard --shard-group 2"), 4, "clip");
}

TEST(EngineStateDict, RoundTripAndBadDicts) {
  expect_ok(check(2, "--mode state-dict"), 2, "state-dict");
  expect_ok(check(3, "--mode state-dict --strategy no_shard"), 3, "state-dict");
}

}  // namespace

// 10. Sharded checkpoints: a run resumed from a checkpoint saved on another world size and
// strategy logs the uninterrupted run's losses (engine_check compares every step with the
// one-process reference, which never stops). The global batch is 12 rows in every run.
class EngineCheckpoint : public ::testing::Test {
 protected:
  std::filesystem::path dir = std::filesystem::temp_directory_path() /
                              ("coshard-ckpt-" + std::to_string(::getpid()) + "-" +
                               ::testing::UnitTest::GetInstance()->current_test_info()->name());
  void SetUp() override { std::filesystem::create_directories(dir); }
  void TearDown() override { std::filesystem::remove_all(dir); }
  std::string at(const char* name) const { return (dir / name).string(); }
};

TEST_F(EngineCheckpoint, ResumesAcrossWorldSizesAndStrategies) {
  // full_shard on 4 -> hybrid_shard on 2 x 2 (async save) -> shard_grad_op on 3 -> one rank.
  expect_ok(check(4, "--rows 3 --steps 6 --save " + at("a") + " --save-at 2"), 4, "parity");
  expect_ok(check(4, "--rows 3 --steps 6 --strategy hybrid_shard --shard-group 2 --resume " + at("a") + " --save " +
                         at("b") + " --save-at 4 --save-async 1"), 4, "parity");
  expect_ok(check(3, "--rows 4 --steps 6 --strategy shard_grad_op --resume " + at("b") + " --save " + at("c") +
                         " --save-at 5"), 3, "parity");
  expect_ok(check(1, "--rows 12 --steps 6 --resume " + at("c")), 1, "parity");
}

TEST_F(EngineCheckpoint, ResumesWithOffloadAndATwoPhaseRoot) {
  const std::string model = " --root 1 --layers 16x15,15x9,9x8 --offload all --steps 5";
  expect_ok(check(2, "--rows 3" + model + " --save " + at("a") + " --save-at 3 --save-async 1"), 2, "parity");
  expect_ok(check(3, "--rows 2" + model + " --resume " + at("a")), 3, "parity");
}

TEST_F(EngineCheckpoint, DamagedCheckpointsAndFailedSavesAreClearErrors) {
  expect_ok(check(2, "--mode checkpoint-errors --save " + dir.string()), 2, "checkpoint-errors");
}
