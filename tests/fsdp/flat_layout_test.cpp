// Flat parameters on their own: alignment, padding, shard ranges, init and bad specs.
#include "flat_layout.hpp"

#include <gtest/gtest.h>

namespace coshard::fsdp::detail {
namespace {

std::vector<ParamSpec> specs() {
  auto iota = [](std::span<float> out, std::int64_t first) {
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<float>(first + static_cast<std::int64_t>(i));
  };
  return {{"w", {3, 3}, iota, true}, {"b", {3}, nullptr, false}};
}

TEST(FlatLayout, ParametersStartAlignedAndThePaddedLengthDividesByShards) {
  // f32: 16 bytes are 4 elements. w: [0, 9), b: [12, 15), chunk 15/2 -> 8, padded 16.
  const auto l = FlatLayout::build("u", specs(), 2, 4);
  ASSERT_EQ(l.params.size(), 2u);
  EXPECT_EQ(l.params[0].offset, 0);
  EXPECT_EQ(l.params[1].offset, 12);
  EXPECT_EQ(l.chunk, 8);
  EXPECT_EQ(l.padded, 16);
  const auto one = FlatLayout::build("u", specs(), 1, 4);
  EXPECT_EQ(one.padded, 16);  // shards start aligned too
}

TEST(FlatLayout, RangesCoverParametersOnlyAndCarryWeightDecay) {
  const auto l = FlatLayout::build("u", specs(), 2, 4);
  const auto r0 = l.ranges(0, 8);  // rank 0: w[0, 8)
  ASSERT_EQ(r0.size(), 1u);
  EXPECT_EQ(r0[0].offset, 0u);
  EXPECT_EQ(r0[0].size, 8u);
  EXPECT_TRUE(r0[0].weight_decay);
  const auto r1 = l.ranges(8, 8);  // rank 1: w[8], gap, b, padding
  ASSERT_EQ(r1.size(), 2u);
  EXPECT_EQ(r1[0].offset, 0u);
  EXPECT_EQ(r1[0].size, 1u);
  EXPECT_EQ(r1[1].offset, 4u);
  EXPECT_EQ(r1[1].size, 3u);
  EXPECT_FALSE(r1[1].weight_decay);
}

TEST(FlatLayout, InitFillsEachShardByElementIndexAndZeroesTheRest) {
  const auto l = FlatLayout::build("u", specs(), 2, 4);
  std::vector<float> shard(8, -1.0f);
  l.init(shard, 8);
  EXPECT_EQ(shard, (std::vector<float>{8, 0, 0, 0, 0, 0, 0, 0}));
}

TEST(FlatLayout, BadSpecsNameTheUnitAndParameter) {
  auto message = [](std::vector<ParamSpec> s) {
    try {
      FlatLayout::build("blk", std::move(s), 2, 4);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message({}).find("unit 'blk' has no parameters"), std::string::npos);
  EXPECT_NE(message({{"w", {2}, nullptr}, {"w", {2}, nullptr}}).find("'w' is empty or used twice"), std::string::npos);
  EXPECT_NE(message({{"w", {2, 0}, nullptr}}).find("parameter 'w' has shape"), std::string::npos);
}

}  // namespace
}  // namespace coshard::fsdp::detail
