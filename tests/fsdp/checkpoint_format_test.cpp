// The checkpoint format on its own: checksums, the manifest's JSON, and the pieces each shard
// stores tiling every parameter exactly once.
#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>

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
  m.pieces = {{"h.0.w", "exp_avg", {4, 6}, 0, 8, "rank-00000.bin", 0, 54321u},
              {"h.0.w", "exp_avg", {4, 6}, 8, 16, "rank-00000.bin", 32, 12345u}};
  m.metadata = {{"step", "7"}, {"seed", "18446744073709551615"}, {"note", "caf\u00e9 \"quoted\"\n"}};
  const Manifest back = manifest_from_json(to_json(m), "test");
  EXPECT_EQ(to_json(back), to_json(m));
  EXPECT_EQ(back.pieces[1].shape, (Shape{4, 6}));
  EXPECT_EQ(back.metadata.at("seed"), "18446744073709551615");
  EXPECT_EQ(back.metadata.at("note"), "caf\u00e9 \"quoted\"\n");
}

// A manifest that pieces tile, as a save writes it.
Manifest tiled() {
  Manifest m;
  m.optimizer = "adamw";
  m.files = {{"rank-00000.bin", 0, 96, 1u}, {"rank-00001.bin", 1, 64, 2u}};
  m.pieces = {{"w", "param", {4, 6}, 0, 8, "rank-00000.bin", 64, 3u}, {"w", "param", {4, 6}, 8, 16, "rank-00001.bin", 0, 4u}};
  m.metadata = {{"step", "8"}};
  return m;
}

void expect_damaged(const std::string& text, const std::string& needle) {
  try {
    manifest_from_json(text, "d/manifest.json");
    ADD_FAILURE() << "accepted; expected '" << needle << "' in:\n" << text;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::corrupt_file) << e.what();
    EXPECT_NE(std::string(e.what()).find("checkpoint file 'd/manifest.json' " + needle), std::string::npos) << e.what();
  }
}

std::string replaced(std::string text, const std::string& from, const std::string& to) {
  const auto at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return at == std::string::npos ? text : text.replace(at, from.size(), to);
}

// Fields no piece checksum covers (the step, an offset) were trusted as written: a one-digit edit
// resumed at another step, or loaded shifted weights.
TEST(CheckpointFormat, TheManifestsOwnChecksumCatchesAnEditOfAnyField) {
  const std::string text = to_json(tiled());
  EXPECT_NO_THROW(manifest_from_json(text, "d/manifest.json"));
  expect_damaged(replaced(text, "\"step\": \"8\"", "\"step\": \"4\""), "fails its checksum");
  expect_damaged(replaced(text, "\"byte_offset\": 64", "\"byte_offset\": 60"), "fails its checksum");
  // Version 2 always writes one: a manifest of version 2 without it was cut or edited.
  const auto line = text.find("\n \"crc32c\": ");  // the top level's, one space in
  ASSERT_NE(line, std::string::npos) << text;
  std::string cut = text;
  cut.erase(line, text.find('\n', line + 1) - line);
  expect_damaged(cut, "has no checksum of its own");
  // Version 1 wrote none and is still read.
  Manifest v1 = tiled();
  v1.version = 1;
  const std::string old = to_json(v1);
  EXPECT_EQ(old.find("\n \"crc32c\""), std::string::npos) << old;
  EXPECT_EQ(manifest_from_json(old, "d/manifest.json").metadata.at("step"), "8");
}

// With a valid checksum (a writer's bug, or a version 1 manifest), pieces that do not tile were
// read out of bounds (coshard-ckpt export crashed) or an overlap plus a gap loaded as whole.
TEST(CheckpointFormat, PiecesThatDoNotTileTheirParameterInsideTheFilesAreRefused) {
  Manifest m = tiled();
  m.pieces[1].offset = 6;  // overlaps 6..8 and leaves 22..24 unstored: the same count of elements
  expect_damaged(to_json(m), "stores elements twice from 6 of 'w' (param)");
  m = tiled();
  m.pieces[0].shape = {4, 7};  // export sized its buffer by the first piece and copied the second past it
  expect_damaged(to_json(m), "gives 'w' two shapes, [4, 7] and [4, 6]");
  m = tiled();
  m.pieces.pop_back();
  expect_damaged(to_json(m), "stores 8 of the 24 elements of 'w' (param)");
  m = tiled();
  m.pieces[0].byte_offset = 72;  // 32 bytes from 72 run past the file's 96
  expect_damaged(to_json(m), "places a piece of 'w' outside the files it lists");
  m = tiled();
  m.pieces[1].file = "rank-00002.bin";
  expect_damaged(to_json(m), "places a piece of 'w' outside the files it lists");
  m = tiled();
  m.files[1].name = "rank-00000.bin";
  expect_damaged(to_json(m), "lists the file 'rank-00000.bin' twice");
}

void expect_invalid(const nlohmann::json& j, const std::string& needle) {
  try {
    manifest_from_json(j.dump(1), "d/manifest.json");
    ADD_FAILURE() << "accepted; expected '" << needle << "' in:\n" << j.dump(1);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::corrupt_file) << e.what();
    EXPECT_NE(std::string(e.what()).find("'d/manifest.json' is not a valid checkpoint manifest (" + needle), std::string::npos)
        << e.what();
  }
}

// The fuzzer's find: get<int64_t>() of `1e300` is a float-to-integer cast out of range, undefined
// behaviour (UBSan stopped on it); integers beyond a field's type wrapped, and sums and products
// of large counts overflowed past the bounds checks. Version 1 has no checksum of its own, so each
// edit reaches the field checks.
TEST(CheckpointFormat, NumbersNoFieldCanHoldAreRefusedNotCast) {
  Manifest v1 = tiled();
  v1.version = 1;
  const auto base = nlohmann::json::parse(to_json(v1));
  const auto edited = [&](auto edit) {
    auto j = base;
    edit(j);
    return j;
  };
  const auto piece = [](nlohmann::json& j) -> nlohmann::json& { return j["pieces"][0]; };
  expect_invalid(edited([&](auto& j) { piece(j)["shape"][0] = 1e300; }),
                 "a dimension of \"shape\" is 1e+300, not an integer from -9223372036854775808");
  expect_invalid(edited([&](auto& j) { piece(j)["offset"] = -1e300; }), "\"offset\" is -1e+300, not an integer");
  expect_invalid(edited([&](auto& j) { piece(j)["length"] = 8.5; }), "\"length\" is 8.5, not an integer");
  expect_invalid(edited([&](auto& j) { piece(j)["crc32c"] = -1; }), "\"crc32c\" is -1, not an integer from 0 to 4294967295");
  expect_invalid(edited([&](auto& j) { j["files"][0]["rank"] = 4294967296LL; }),
                 "\"rank\" is 4294967296, not an integer from -2147483648 to 2147483647");
  expect_invalid(edited([&](auto& j) { j["files"][0]["bytes"] = 1.8446744073709552e19; }), "\"bytes\" is 1.8446744073709552e+19");
  expect_invalid(edited([&](auto& j) { j["world_size"] = "4"; }), "\"world_size\" is \"4\", not an integer");
  expect_invalid(edited([&](auto& j) { piece(j)["shape"] = 24; }), "\"shape\" is not an array");
  expect_invalid(edited([&](auto& j) { piece(j)["shape"] = {-4, -6}; }), "\"shape\" has a negative dimension");
  expect_invalid(edited([&](auto& j) { piece(j)["shape"] = {1LL << 62, 4}; }),
                 "\"shape\" [4611686018427387904, 4] has more than 2^63 elements");
  // A zero dimension makes the others' product empty, not an overflow: the pieces then lie outside it.
  expect_invalid(edited([&](auto& j) { piece(j)["shape"] = {0, 1LL << 62, 4}; }), "piece of 'w' lies outside its shape");
  // The next optimizer step added one to INT64_MAX; a negative one failed later without naming the file.
  Manifest stepped = v1;
  stepped.units = {{"u", 0, false}};
  const auto with_step = nlohmann::json::parse(to_json(stepped));
  for (const auto step : {INT64_MAX, std::int64_t{-1}}) {
    auto j = with_step;
    j["units"][0]["optimizer_step"] = step;
    expect_invalid(j, "unit 'u' has optimizer step " + std::to_string(step) + ", not one from 0 to 2^53");
  }
  // offset + length once overflowed past "lies outside its shape".
  expect_invalid(edited([&](auto& j) { piece(j)["offset"] = INT64_MAX; }), "piece of 'w' lies outside its shape");
  // length * 4 bytes wrapped to 0 and passed as inside the file: export then read 2^62 floats.
  Manifest huge = v1;
  huge.pieces = {{"w", "param", {1LL << 62}, 0, 1LL << 62, "rank-00000.bin", 0, 3u}};
  expect_damaged(to_json(huge), "places a piece of 'w' outside the files it lists");
}

TEST(CheckpointFormat, NewerVersionsAndForeignFilesAreRefusedByName) {
  Manifest m;
  m.version = kCheckpointFormatVersion + 1;
  try {
    manifest_from_json(to_json(m), "d/manifest.json");
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::bad_config);
    EXPECT_NE(std::string(e.what()).find("'d/manifest.json' was written in checkpoint format version " +
                                         std::to_string(kCheckpointFormatVersion + 1)),
              std::string::npos);
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
