// Gradient divide factors and offload sizing on their own, against FSDP's formulas.
#include <gtest/gtest.h>

#include "gradient_reducer.hpp"
#include "offload.hpp"
#include "sharded_state.hpp"
#include "state_dict.hpp"

namespace coshard::fsdp::detail {
namespace {

using transport::ReduceOp;

// FSDP's _get_gradient_predivide_factor, written out in Python's words.
double fsdp_predivide(int world) {
  int factor = 1;
  while (world % factor == 0 && world / factor > factor) factor *= 2;
  return factor;
}

TEST(DivideFactors, PowerOfTwoPreFactorAsFsdp) {
  const std::vector<std::pair<int, double>> expected{{1, 1}, {2, 2}, {4, 2}, {6, 4}, {8, 4}, {16, 4}, {32, 8}};
  for (const auto& [world, f] : expected) {
    EXPECT_EQ(predivide_factor(world), f) << "world " << world;
    EXPECT_EQ(predivide_factor(world), fsdp_predivide(world)) << "world " << world;
  }
}

TEST(DivideFactors, F16SplitsTheAverageAroundTheSum) {
  const auto f = DivideFactors::of(std::nullopt, DType::f16, 8);
  EXPECT_EQ(f.pre, 4.0);
  EXPECT_EQ(f.post, 0.5);
  EXPECT_DOUBLE_EQ(1.0 / f.pre * f.post, 1.0 / 8);  // still the average
  EXPECT_EQ(f.reduce_scatter.op, ReduceOp::sum);
  EXPECT_EQ(f.all_reduce.op, ReduceOp::sum);
}

TEST(DivideFactors, F32AndBf16AverageInTheCollective) {
  for (DType d : {DType::f32, DType::bf16}) {
    const auto f = DivideFactors::of(std::nullopt, d, 8);
    EXPECT_EQ(f.pre, 1.0);
    EXPECT_EQ(f.post, 1.0);
    EXPECT_EQ(f.reduce_scatter.op, ReduceOp::avg);
    EXPECT_EQ(f.all_reduce.op, ReduceOp::avg);
  }
}

TEST(DivideFactors, ACustomFactorIsAPremultipliedSum) {
  const auto f = DivideFactors::of(3.0, DType::f16, 8);
  EXPECT_EQ(f.reduce_scatter.op, ReduceOp::premul_sum);
  EXPECT_DOUBLE_EQ(f.reduce_scatter.factor, 1.0 / 3);
  EXPECT_EQ(f.all_reduce.op, ReduceOp::sum);  // replicas add up the already divided shards
  EXPECT_EQ(f.pre, 1.0);
}

// Units that only declare parameters: enough for layouts, sizes and state-dict checks.
struct Declared final : Unit {
  std::string name_;
  std::vector<ParamSpec> specs;
  Declared(std::string n, std::vector<ParamSpec> s) : name_(std::move(n)), specs(std::move(s)) {}
  std::string name() const override { return name_; }
  std::vector<ParamSpec> params() const override { return specs; }
  Task<void> forward(Scope&) override { co_return; }
  Task<void> backward(Scope&) override { co_return; }
};

struct ModelTest : ::testing::Test {
  Runtime rt{{.rank = 0}};
  Declared a{"a", {{"a.w", {10}, nullptr}}};
  Declared b{"b", {{"b.w", {2, 3}, nullptr}, {"b.b", {3}, nullptr, false}}};
  Context ctx{rt, {}};
  std::vector<UnitState> units;
  void SetUp() override {
    ctx.shard_size = 2;
    units = layout_units({&a, &b}, ctx);
  }
};

TEST_F(ModelTest, OffloadedBytesCountEachOffloadedTensorOfTheShard) {
  ctx.opt.offload = {.params = true, .grads = true, .optimizer = true};
  // a: 10 -> padded 16, chunk 8; b: 6 + gap to 8 + 3 = 11 -> chunk 8. AdamW: 2 state tensors.
  EXPECT_EQ(offloaded_bytes(units, ctx), (8 + 8) * 4 * (1 + 1 + 2));
  ctx.opt.offload = {.params = true};
  EXPECT_EQ(offloaded_bytes(units, ctx), (8 + 8) * 4);
  EXPECT_EQ(optimizer_buffers(SGD{}), 0);
  EXPECT_EQ(optimizer_buffers(SGD{{.momentum = 0.9}}), 1);
}

// Where the host cannot reach device memory, reduced gradient shards land in two host slots of the
// largest shard before the host accumulates them; the cap counts them.
TEST_F(ModelTest, LandingSlotsCountWhereTheHostCannotReachDeviceMemory) {
  ctx.opt.offload = {.params = true, .grads = true, .optimizer = true};
  EXPECT_EQ(landing_bytes(units, ctx), 0u);  // the CPU device: the host accumulates in place
  Runtime discrete({.rank = 0, .discrete_memory = true});
  Context dctx{discrete, ctx.opt};
  dctx.shard_size = 2;
  dctx.reduce_dtype = DType::bf16;
  EXPECT_EQ(landing_bytes(units, dctx), 2u * 8u * 2u);
  dctx.opt.offload.grads = dctx.opt.offload.optimizer = false;
  EXPECT_EQ(landing_bytes(units, dctx), 0u);
}

TEST_F(ModelTest, ACapBelowTheOffloadedStateFailsAtCreation) {
  ctx.opt.offload = {.params = true, .host_memory_cap_bytes = 64};
  try {
    Offload off(ctx, units);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::bad_config);
    EXPECT_NE(std::string(e.what()).find("needs 64 bytes of host memory"), std::string::npos) << e.what();
  }
}

TEST_F(ModelTest, TheModelSignatureSeesNamesAndShapes) {
  Declared b2{"b", {{"b.w", {3, 2}, nullptr}, {"b.b", {3}, nullptr, false}}};
  EXPECT_EQ(model_signature(units), model_signature(layout_units({&a, &b}, ctx)));
  EXPECT_NE(model_signature(units), model_signature(layout_units({&a, &b2}, ctx)));
  EXPECT_NE(model_signature(units), model_signature(layout_units({&b, &a}, ctx)));
}

TEST_F(ModelTest, StateDictChecksNameTheEntry) {
  StateDict good{{"a.w", std::vector<float>(10)}, {"b.w", std::vector<float>(6)}, {"b.b", std::vector<float>(3)}};
  EXPECT_NO_THROW(check_state_dict(units, good, ctx));
  auto message = [&](StateDict s) {
    try {
      check_state_dict(units, s, ctx);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  StateDict missing = good, misshapen = good, extra = good;
  missing.erase("b.b");
  misshapen["b.w"].pop_back();
  extra["c.w"] = {1};
  EXPECT_NE(message(missing).find("state dict has no 'b.b' (unit 'b')"), std::string::npos);
  EXPECT_NE(message(misshapen).find("'b.w' has 5 values but the parameter has shape"), std::string::npos);
  EXPECT_NE(message(extra).find("'c.w' is not a parameter of this model"), std::string::npos);
}

}  // namespace
}  // namespace coshard::fsdp::detail
