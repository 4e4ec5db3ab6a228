// The checkpoint format on its own: checksums, the manifest's JSON, and the pieces each shard
// stores tiling every parameter exactly once.
#include <gtest/gtest.h>

#include <map>

#include "coshard/fsdp/checkpoint.hpp"
#include "sharded_checkpoint.hpp"
#include "sharded_state.hpp"

namespace coshard::fsdp::detail {
namespace {

TEST(CheckpointFormat, Crc32cMatchesTheStandardCheckValue) {
  const std::string text = "123456789";
  EXPECT_EQ(crc32c(std::as_bytes(std::span<const char>(text.data(), text.size()))), 0xe3069283u);
  // Chained over two parts: the same as over the whole.
  const auto bytes = std::as_bytes(std::span<const char>(text.data(), text.size()));
  EXPECT_EQ(crc32c(bytes.subspan(4), crc32c(bytes.first(4))), 0xe3069283u);
}

TEST(CheckpointFormat, ManifestJsonRoundTrips) {
  Manifest m;
  m.world_size = 4;
  m.strategy = "hybrid_shard";
  m.shard_group_size = 2;
  m.optimizer = "adamw";
  m.param_dtype = "bf16";
  m.units = {{"h.0", 7, false}};
  m.files = {{"rank-00000.bin", 0, 96, 0xdeadbeefu}};
  m.pieces = {{"h.0.w", "exp_avg", {4, 6}, 8, 16, "rank-00000.bin", 32, 12345u}};
  m.metadata = {{"step", "7"}, {"seed", "18446744073709551615"}};
  const Manifest back = manifest_from_json(to_json(m), "test");
  EXPECT_EQ(to_json(back), to_json(m));
  EXPECT_EQ(back.pieces[0].shape, (Shape{4, 6}));
  EXPECT_EQ(back.metadata.at("seed"), "18446744073709551615");
}

TEST(CheckpointFormat, NewerVersionsAndForeignFilesAreRefusedByName) {
  Manifest m;
  m.version = kCheckpointFormatVersion + 1;
  try {
    manifest_from_json(to_json(m), "d/manifest.json");
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::bad_config);
    EXPECT_NE(std::string(e.what()).find("'d/manifest.json' was written in checkpoint format version 2"), std::string::npos);
  }
  EXPECT_THROW(manifest_from_json("{\"format\": \"something else\"}", "x"), Error);
  EXPECT_THROW(manifest_from_json("not json", "x"), Error);
}

struct Declared final : Unit {
  std::vector<ParamSpec> specs;
  explicit Declared(std::vector<ParamSpec> s) : specs(std::move(s)) {}
  std::string name() const override { return "u"; }
  std::vector<ParamSpec> params() const override { return specs; }
  Task<void> forward(Scope&) override { co_return; }
  Task<void> backward(Scope&) override { co_return; }
};

// Every (parameter, kind) is stored exactly once over the shard group, for uneven shapes.
TEST(CheckpointFormat, ThePiecesOfAllShardsTileEveryParameterOnce) {
  Runtime rt({.rank = 0});
  Declared unit({{"w", {7, 3}, nullptr}, {"b", {5}, nullptr}, {"g", {1}, nullptr}});
  for (int shards : {1, 2, 3, 4}) {
    Context ctx(rt, {});
    ctx.shard_size = shards;
    const auto units = layout_units({&unit}, ctx);
    std::map<std::pair<std::string, std::string>, std::vector<int>> seen;  // element -> times stored
    for (int r = 0; r < shards; ++r) {
      std::uint64_t next_byte = 0;
      for (const auto& p : pieces_of(units, ctx, r, "f")) {
        EXPECT_EQ(p.byte_offset, next_byte) << "pieces are contiguous in the file";
        next_byte += static_cast<std::uint64_t>(p.length) * 4;
        auto& counts = seen[{p.param, p.kind}];
        counts.resize(static_cast<std::size_t>(numel(p.shape)));
        for (std::int64_t i = p.offset; i < p.offset + p.length; ++i) ++counts[static_cast<std::size_t>(i)];
      }
    }
    EXPECT_EQ(seen.size(), 9u) << shards << " shards: 3 parameters x (param, exp_avg, exp_avg_sq)";
    for (const auto& [key, counts] : seen) {
      for (int c : counts) EXPECT_EQ(c, 1) << key.first << " " << key.second << ", " << shards << " shards";
    }
  }
}

TEST(CheckpointFormat, StateKindsFollowTheOptimizer) {
  EXPECT_EQ(state_kinds(AdamW{}), (std::vector<std::string>{"param", "exp_avg", "exp_avg_sq"}));
  EXPECT_EQ(state_kinds(SGD{{.momentum = 0.9}}), (std::vector<std::string>{"param", "momentum_buffer"}));
  EXPECT_EQ(state_kinds(SGD{}), (std::vector<std::string>{"param"}));
}

}  // namespace
}  // namespace coshard::fsdp::detail
