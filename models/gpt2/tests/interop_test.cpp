// Hugging Face model directories (config.json + model.safetensors) and byte-level BPE decoding.
// The peer test tests/peers/hf_interop_test.py checks the same against transformers itself; these
// run everywhere and cover the refusals.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "coshard/gpt2/hf_dir.hpp"
#include "coshard/gpt2/model.hpp"
#include "coshard/gpt2/tokenizer.hpp"
#include "coshard/models/safetensors.hpp"
#include "coshard/runtime/error.hpp"

namespace {

using namespace coshard;
using namespace coshard::gpt2;
namespace fs = std::filesystem;
using json = nlohmann::json;

class Scratch {
 public:
  Scratch() : dir_(fs::temp_directory_path() / ("coshard_gpt2_interop_" + std::to_string(::getpid()))) {
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  ~Scratch() { fs::remove_all(dir_); }
  fs::path operator/(const std::string& p) const { return dir_ / p; }

 private:
  fs::path dir_;
};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

void write(const fs::path& p, const json& j) { std::ofstream(p) << j.dump(); }

StateDict state_of(const Gpt2& m) {
  StateDict s;
  for (std::size_t i = 0; i < m.params().size(); ++i) {
    auto v = m.params().at(i);
    s[m.params().infos()[i].name] = std::vector<float>(v.begin(), v.end());
  }
  return s;
}

TEST(Gpt2HfDir, SavedDirectoryReadsBackWithItsConfig) {
  Scratch d;
  const Config c = parse_config("layers=2,heads=2,width=16,vocab=40,context=8");
  Gpt2 m(c, 3);
  save_hf_dir(d / "model", c, state_of(m));
  EXPECT_EQ(read_hf_config(d / "model" / "config.json"), c);
  EXPECT_EQ(read_init(d / "model", c), state_of(m));
  const json j = json::parse(std::ifstream(d / "model" / "config.json"));
  EXPECT_EQ(j["architectures"][0], "GPT2LMHeadModel");
  EXPECT_EQ(j["activation_function"], "gelu_new");
  EXPECT_TRUE(j["tie_word_embeddings"].get<bool>());
}

// A sharded checkpoint (save_pretrained above its max_shard_size): the index maps each tensor to
// its file; transformers' GPT2LMHeadModel names carry "transformer.", and a tied head it stores is
// wte's copy.
TEST(Gpt2HfDir, ShardedCheckpointsReadThroughTheirIndex) {
  Scratch d;
  const Config c = parse_config("layers=2,heads=2,width=16,vocab=40,context=8");
  Gpt2 m(c, 3);
  const StateDict s = state_of(m);
  save_hf_dir(d / "m", c, s);
  fs::remove(d / "m" / "model.safetensors");
  const auto infos = all_params(c);
  const std::size_t half = infos.size() / 2;
  std::vector<models::ParamInfo> first(infos.begin(), infos.begin() + static_cast<std::ptrdiff_t>(half));
  std::vector<models::ParamInfo> second;
  StateDict prefixed;
  json map = json::object();
  for (std::size_t i = 0; i < infos.size(); ++i) {
    models::ParamInfo p = infos[i];
    if (i >= half) {
      p.name = "transformer." + p.name;
      prefixed[p.name] = s.at(infos[i].name);
      second.push_back(p);
    }
    map[p.name] = i < half ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  models::ParamInfo head = infos.front();  // wte: stored again as the tied head
  head.name = "lm_head.weight";
  prefixed[head.name] = s.at("wte.weight");
  second.push_back(head);
  map[head.name] = "model-00002-of-00002.safetensors";
  models::save_state_dict(d / "m" / "model-00001-of-00002.safetensors", first, s);
  models::save_state_dict(d / "m" / "model-00002-of-00002.safetensors", second, prefixed);
  write(d / "m" / "model.safetensors.index.json", json{{"metadata", json::object()}, {"weight_map", map}});
  EXPECT_EQ(read_init(d / "m", c), s);

  // The first shard's first tensor stored in the second shard as well: both files named.
  second.push_back(infos.front());
  prefixed[infos.front().name] = s.at(infos.front().name);
  models::save_state_dict(d / "m" / "model-00002-of-00002.safetensors", second, prefixed);
  const std::string twice = error_of([&] { read_init(d / "m", c); });
  EXPECT_NE(twice.find("tensor '" + infos.front().name + "' is stored in"), std::string::npos) << twice;
  EXPECT_NE(twice.find("model-00001-of-00002.safetensors"), std::string::npos) << twice;
  EXPECT_NE(twice.find("model-00002-of-00002.safetensors"), std::string::npos) << twice;
}

TEST(Gpt2HfDir, ConfigsCoshardDoesNotComputeAreRefusedNamingTheKey) {
  Scratch d;
  const Config c = parse_config("layers=2,heads=2,width=16,vocab=40,context=8");
  Gpt2 m(c, 3);
  save_hf_dir(d / "m", c, state_of(m));
  const json good = json::parse(std::ifstream(d / "m" / "config.json"));
  const auto with = [&](const char* key, const json& v) {
    json j = good;
    j[key] = v;
    write(d / "m" / "config.json", j);
    return error_of([&] { read_init(d / "m", c); });
  };
  EXPECT_NE(with("n_layer", 3).find("give --model layers=3,heads=2,width=16,vocab=40,context=8"), std::string::npos);
  EXPECT_NE(with("model_type", "llama").find("\"model_type\" is \"llama\", not \"gpt2\""), std::string::npos);
  json llama = good;  // another model's config is named as such before its keys are read as GPT-2's
  llama["model_type"] = "llama";
  llama.erase("n_embd");
  write(d / "m" / "config.json", llama);
  EXPECT_NE(error_of([&] { read_init(d / "m", c); }).find("\"model_type\" is \"llama\", not \"gpt2\""),
            std::string::npos);
  EXPECT_NE(with("activation_function", "relu").find("tanh GELU"), std::string::npos);
  EXPECT_EQ(with("activation_function", "gelu_pytorch_tanh"), "(no error)");
  EXPECT_NE(with("layer_norm_epsilon", 1e-6).find("\"layer_norm_epsilon\""), std::string::npos);
  EXPECT_NE(with("n_inner", 17).find("\"n_inner\" is 17"), std::string::npos);
  EXPECT_NE(with("scale_attn_by_inverse_layer_idx", true).find("scale_attn_by_inverse_layer_idx"), std::string::npos);
  EXPECT_NE(with("n_head", 3).find("not divisible"), std::string::npos);
  EXPECT_NE(with("vocab_size", "40").find("\"vocab_size\" is missing or not a positive integer"), std::string::npos);
  // The n_inner check computed 4 x n_embd before the width was bounded: 2^62 overflowed.
  EXPECT_NE(with("n_embd", std::int64_t{1} << 62).find("width=4611686018427387904 is out of range"), std::string::npos);
  EXPECT_NE(with("vocab_size", 1e300).find("\"vocab_size\" is missing or not a positive integer"), std::string::npos);
  write(d / "m" / "config.json", good);
  fs::rename(d / "m" / "model.safetensors", d / "m" / "x");
  EXPECT_NE(error_of([&] { read_init(d / "m", c); }).find("has no model.safetensors nor model.safetensors.index.json"),
            std::string::npos);
  fs::remove(d / "m" / "config.json");
  EXPECT_NE(error_of([&] { read_init(d / "m", c); }).find("a directory without config.json"), std::string::npos);
}

json bpe(const json& vocab) {
  return {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}}},
          {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}}},
          {"added_tokens", {{{"id", 5}, {"content", "<|endoftext|>"}, {"special", true}}}}};
}

TEST(Gpt2Tokenizer, BytesAndByteLevelBpeDecode) {
  const auto bytes = Tokenizer::bytes();
  EXPECT_EQ(bytes.size(), 256u);
  const std::vector<std::int32_t> hi = {'h', 'i', '\n', 0xff};
  EXPECT_EQ(bytes.decode(hi), "hi\n\xff");

  Scratch d;
  // GPT-2's byte alphabet: U+0120 is the space, U+010A the newline, U+0143 byte 0xAD.
  write(d / "t.json", bpe({{"h", 0}, {"i", 1}, {"\u0120there", 2}, {"\u010a", 3}, {"\u0143", 4}}));
  const auto t = Tokenizer::from_file(d / "t.json");
  EXPECT_EQ(t.size(), 6u);
  const std::vector<std::int32_t> ids = {0, 1, 2, 3, 5}, soft = {4}, out = {6};
  EXPECT_EQ(t.decode(ids), "hi there\n<|endoftext|>");
  EXPECT_EQ(t.decode(soft), "\xad");
  EXPECT_NE(error_of([&] { t.decode(out); }).find("token 6 is outside the tokenizer's 6 entries"), std::string::npos);
}

TEST(Gpt2Tokenizer, OtherTokenizersAreRefusedNamingTheFile) {
  Scratch d;
  const auto refused = [&](const std::string& text) {
    std::ofstream(d / "t.json") << text;
    return error_of([&] { Tokenizer::from_file(d / "t.json"); });
  };
  EXPECT_NE(refused("{not json").find("t.json': not JSON"), std::string::npos);
  json wp = bpe({{"a", 0}});
  wp["model"]["type"] = "WordPiece";
  EXPECT_NE(refused(wp.dump()).find("not a BPE model"), std::string::npos);
  json ws = bpe({{"a", 0}});
  ws["pre_tokenizer"]["type"] = "Whitespace";
  EXPECT_NE(refused(ws.dump()).find("the pre-tokenizer is not ByteLevel"), std::string::npos);
  EXPECT_NE(refused(bpe({{"\u4e2d", 0}}).dump()).find("is not byte-level"), std::string::npos);
  EXPECT_NE(refused(bpe({{"a", 70000}}).dump()).find("the id of vocabulary entry 'a' is 70000, not an integer from 0 to 65535"),
            std::string::npos);
  // Ids that a plain get<int>() would cast: a double beyond any integer's range (undefined
  // behaviour), a fraction, a negative, an unsigned beyond int64.
  for (const std::string id : {"1e300", "2.5", "-1", "18446744073709551615"}) {
    EXPECT_NE(refused(R"({"model": {"type": "BPE", "vocab": {"a": )" + id + R"(}}, "pre_tokenizer": {"type": "ByteLevel"}})")
                  .find("vocabulary entry 'a' is " + json::parse(id).dump() + ", not an integer from 0 to 65535"),
              std::string::npos)
        << id;
  }
  json added = bpe({{"a", 0}});
  added["added_tokens"] = json::array({{{"content", "<|x|>"}, {"id", 1e300}}});
  EXPECT_NE(refused(added.dump()).find("the id of added token '<|x|>' is 1e+300, not an integer"), std::string::npos);
  added["added_tokens"] = json::array({{{"content", "<|x|>"}}});
  EXPECT_NE(refused(added.dump()).find("the id of added token '<|x|>' is null"), std::string::npos);
  EXPECT_NE(error_of([&] { Tokenizer::from_file(d / "missing.json"); })
                .find("tokenizer: cannot read '" + (d / "missing.json").string() + "': No such file or directory"),
            std::string::npos);
}

}  // namespace
