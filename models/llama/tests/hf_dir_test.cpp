// Hugging Face Llama directories: config.json as transformers 4 and 5 write it (the released
// Llama 3.2 1B's among them) reads as coshard's shape, save_hf_dir round-trips a model bit for
// bit, sharded checkpoints read through their index, and every key or file coshard cannot take is
// refused naming it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "coshard/llama/hf_dir.hpp"
#include "coshard/llama/params.hpp"
#include "coshard/models/safetensors.hpp"
#include "coshard/runtime/error.hpp"

namespace {

using namespace coshard;
using namespace coshard::llama;
namespace fs = std::filesystem;

class LlamaHfDir : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("coshard-llama-hf-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path write(const std::string& name, const std::string& text) const {
    const auto p = dir_ / name;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
    return p;
  }
  fs::path dir_;
};

template <typename F>
std::string error_of(F&& f, Errc code = Errc::bad_config) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    return e.message();
  }
  ADD_FAILURE() << "accepted";
  return {};
}

#define EXPECT_HAS(text, needle) EXPECT_NE((text).find(needle), std::string::npos) << (text)

// A model's values by name, distinct in every element.
StateDict state_of(const Config& c) {
  StateDict s;
  float v = 0.0f;
  for (const auto& p : all_params(c)) {
    auto& t = s[p.name];
    t.resize(static_cast<std::size_t>(p.numel()));
    for (auto& x : t) x = (v += 0.001f);
  }
  return s;
}

// meta-llama/Llama-3.2-1B's config.json (transformers 4.45).
const char* kLlama32 = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu",
  "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192,
  "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
  "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8, "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "transformers_version": "4.45.0.dev0", "use_cache": true, "vocab_size": 128256})";

TEST_F(LlamaHfDir, TheReleasedLlama32ConfigIsTheNamedShape) {
  EXPECT_EQ(read_hf_config(write("config.json", kLlama32)), named_config("llama3.2-1B"));
}

// transformers 5 keeps theta and the type inside rope_parameters; an old config leaves out
// num_key_value_heads and head_dim (multi-head attention, hidden_size / heads) and rms_norm_eps.
TEST_F(LlamaHfDir, Transformers5RopeParametersAndOldDefaultsRead) {
  Config c = read_hf_config(write("config.json", R"({"model_type": "llama", "vocab_size": 97,
    "max_position_embeddings": 64, "hidden_size": 48, "intermediate_size": 80, "num_hidden_layers": 1,
    "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5,
    "rope_parameters": {"rope_type": "default", "rope_theta": 250000.0}})"));
  EXPECT_EQ(c.rope_theta, 250000.0);
  EXPECT_FALSE(c.rope_llama3);
  EXPECT_EQ(c.head_dim, 12);
  EXPECT_EQ(c.kv_heads, 2);
  c = read_hf_config(write("config.json", R"({"model_type": "llama", "vocab_size": 32000,
    "max_position_embeddings": 2048, "hidden_size": 64, "intermediate_size": 172, "num_hidden_layers": 2,
    "num_attention_heads": 4, "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
    "low_freq_factor": 1.0, "high_freq_factor": 4.0}, "original_max_position_embeddings": 1024})"));
  EXPECT_EQ(c.kv_heads, 4);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.rms_eps, 1e-6);  // LlamaConfig's default
  EXPECT_FALSE(c.tie_head);
  EXPECT_TRUE(c.rope_llama3);
  EXPECT_EQ(c.rope_scaling.factor, 8.0);
  EXPECT_EQ(c.rope_scaling.original_context, 1024.0);
}

TEST_F(LlamaHfDir, SaveThenReadIsTheSameModelBitForBit) {
  for (const std::string spec : {"llama-tiny", "llama-tiny,kv_heads=1,vocab=97,tie_head=true",
                                  "llama-tiny,rope_theta=500000,rope_scaling=llama3:8:1:4:32,rms_eps=1e-6"}) {
    const Config c = parse_config(spec);
    const StateDict s = state_of(c);
    const auto out = dir_ / "out";
    save_hf_dir(out, c, s);
    EXPECT_EQ(read_hf_config(out / "config.json"), c) << spec;
    EXPECT_EQ(read_init(out, c), s) << spec;
    const auto file = models::SafetensorsFile::open(out / "model.safetensors");
    EXPECT_EQ(file.find("lm_head.weight") != nullptr, !c.tie_head) << spec;  // transformers ties on load
    EXPECT_HAS(error_of([&] { read_init(out, parse_config("llama-tiny,layers=3")); }),
               "give --model " + c.to_string());
    fs::remove_all(out);
  }
}

// A sharded checkpoint (save_pretrained above max_shard_size): the index maps each tensor to its
// file. Older transformers saved the rotary inverse frequencies as buffers: skipped.
TEST_F(LlamaHfDir, ShardedCheckpointsReadThroughTheirIndex) {
  const Config c = parse_config("llama-tiny,layers=1");
  const StateDict s = state_of(c);
  const auto infos = all_params(c);
  const std::vector<ParamInfo> first(infos.begin(), infos.begin() + 4), second(infos.begin() + 4, infos.end());
  const auto out = dir_ / "sharded";
  save_hf_dir(out, c, s);
  fs::remove(out / "model.safetensors");
  models::save_state_dict(out / "model-00001-of-00002.safetensors", first, s);
  StateDict with_buffer = s;
  with_buffer["model.layers.0.self_attn.rotary_emb.inv_freq"] = std::vector<float>(8, 1.0f);
  std::vector<ParamInfo> second_and_buffer = second;
  second_and_buffer.push_back(models::ones_param("model.layers.0.self_attn.rotary_emb.inv_freq", {8}));
  models::save_state_dict(out / "model-00002-of-00002.safetensors", second_and_buffer, with_buffer);
  std::string map;
  for (const auto& p : infos) {
    map += std::string(map.empty() ? "" : ", ") + "\"" + p.name + "\": \"model-0000" +
           (&p - infos.data() < 4 ? "1" : "2") + "-of-00002.safetensors\"";
  }
  write("sharded/model.safetensors.index.json", R"({"metadata": {}, "weight_map": {)" + map + "}}");
  EXPECT_EQ(read_init(out, c), s);

  write("sharded/model.safetensors.index.json", R"({"weight_map": {"a": "model-00003-of-00003.safetensors"}})");
  EXPECT_HAS(error_of([&] { read_init(out, c); }), "maps tensors to 'model-00003-of-00003.safetensors', which is not in");
  write("sharded/model.safetensors.index.json", R"({"weight_map": {"a": "../../etc/passwd"}})");
  EXPECT_HAS(error_of([&] { read_init(out, c); }), "not a file of the directory");
  std::string first_only;
  for (const auto& p : first) first_only += std::string(first_only.empty() ? "" : ", ") + "\"" + p.name + "\": \"model-00001-of-00002.safetensors\"";
  write("sharded/model.safetensors.index.json", R"({"weight_map": {)" + first_only + "}}");
  EXPECT_HAS(error_of([&] { read_init(out, c); }, Errc::corrupt_file), "missing tensor 'model.layers.0.self_attn.v_proj.weight'");
  fs::remove(out / "model.safetensors.index.json");
  write("sharded/pytorch_model.bin", "x");
  EXPECT_HAS(error_of([&] { read_init(out, c); }), "only safetensors weights are read, not pytorch_model.bin");
}

TEST_F(LlamaHfDir, TensorsThatAreNotTheModelsAreNamed) {
  const Config c = parse_config("llama-tiny,layers=1");
  StateDict s = state_of(c);
  const auto out = dir_ / "out";
  save_hf_dir(out, c, s);
  auto infos = all_params(c);
  infos.pop_back();  // lm_head.weight
  models::save_state_dict(out / "model.safetensors", infos, s);
  EXPECT_HAS(error_of([&] { read_init(out, c); }, Errc::corrupt_file), "missing tensor 'lm_head.weight' of shape [256, 64]");
  infos = all_params(c);
  infos.push_back(models::ones_param("model.layers.0.self_attn.q_proj.bias", {64}));
  s["model.layers.0.self_attn.q_proj.bias"] = std::vector<float>(64, 0.0f);
  models::save_state_dict(out / "model.safetensors", infos, s);
  EXPECT_HAS(error_of([&] { read_init(out, c); }, Errc::corrupt_file),
             "tensor 'model.layers.0.self_attn.q_proj.bias' is not a parameter of the model");
  const auto file = dir_ / "w.safetensors";
  infos = all_params(parse_config("llama-tiny,layers=1,ffn=100"));
  models::save_state_dict(file, infos, state_of(parse_config("llama-tiny,layers=1,ffn=100")));
  EXPECT_HAS(error_of([&] { read_init(file, c); }, Errc::corrupt_file),
             "tensor 'model.layers.0.mlp.gate_proj.weight' has shape [100, 64] but the model expects [176, 64]");
}

// Keys that change the math coshard does not compute, and files of another model, each named.
TEST_F(LlamaHfDir, ConfigsCoshardDoesNotComputeAreRefusedByKey) {
  const std::string base = R"("model_type": "llama", "vocab_size": 97, "max_position_embeddings": 64,
    "hidden_size": 48, "intermediate_size": 80, "num_hidden_layers": 1, "num_attention_heads": 4)";
  const auto refused = [&](const std::string& extra, const std::string& needle) {
    const auto p = write("config.json", "{" + base + extra + "}");
    EXPECT_HAS(error_of([&] { read_hf_config(p); }), needle);
  };
  refused(R"(, "attention_bias": true)", "\"attention_bias\" is true; coshard's Llama has no biases in q/k/v/o_proj");
  refused(R"(, "mlp_bias": true)", "\"mlp_bias\" is true");
  refused(R"(, "hidden_act": "gelu")", "\"hidden_act\" is \"gelu\"");
  refused(R"(, "attention_dropout": 0.1)", "\"attention_dropout\" is 0.1");
  refused(R"(, "pretraining_tp": 2)", "\"pretraining_tp\" is 2");
  refused(R"(, "rope_scaling": {"rope_type": "yarn", "factor": 4.0})",
          "has rope_type \"yarn\"; coshard's Llama computes RoPE of type default and llama3");
  refused(R"(, "rope_scaling": {"type": "linear", "factor": 2.0})", "has rope_type \"linear\"");
  refused(R"(, "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0})",
          "lacks \"high_freq_factor\"");
  refused(R"(, "num_key_value_heads": 3)", "kv_heads=3 does not divide heads=4");
  refused(R"(, "head_dim": 11)", "head_dim=11 is odd");
  refused(R"(, "hidden_size": "48")", "\"hidden_size\" is missing or not a positive integer");
  EXPECT_HAS(error_of([&] { read_hf_config(write("config.json", R"({"model_type": "gpt2", "n_embd": 48})")); }),
             "\"model_type\" is \"gpt2\", not \"llama\"");
  EXPECT_HAS(error_of([&] { read_hf_config(write("config.json", "{not json")); }), "not a JSON object");
  EXPECT_HAS(error_of([&] { read_hf_config(dir_ / "none.json"); }, Errc::io), "none.json");
  EXPECT_HAS(error_of([&] { models::hf_model_type(dir_ / "empty"); }), "is a directory without config.json");
}

}  // namespace
