#include "coshard/llama/hf_dir.hpp"

#include <string>

#include "coshard/llama/params.hpp"
#include "coshard/models/hf_config.hpp"
#include "coshard/models/safetensors.hpp"
#include "coshard/runtime/error.hpp"
#include "coshard/runtime/file_io.hpp"

namespace coshard::llama {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// The keys that change what the model computes and that coshard's Llama does not: each must be
// absent or hold Llama's default.
void check_computation(const models::HfConfig& j) {
  const auto expect = [&](const char* key, const json& want, const char* what) {
    j.expect(key, want, std::string("coshard's Llama ") + what + " (" + key + " " + want.dump() + ")");
  };
  expect("hidden_act", "silu", "computes the SwiGLU MLP with SiLU");
  expect("attention_bias", false, "has no biases in q/k/v/o_proj");
  expect("mlp_bias", false, "has no biases in gate/up/down_proj");
  expect("attention_dropout", 0.0, "trains without attention dropout");
  expect("pretraining_tp", 1, "computes each projection whole");
}

// RoPE: transformers 5 keeps theta and the type in "rope_parameters"; 4 had "rope_theta" beside a
// "rope_scaling" of {"rope_type" (or "type"), ...} or null.
void read_rope(const models::HfConfig& j, Config& c) {
  const char* key = j.has("rope_parameters") ? "rope_parameters" : "rope_scaling";
  const json rope = j.has(key) ? j.json()[key] : json::object();
  if (!rope.is_object()) throw j.error(std::string("\"") + key + "\" is " + rope.dump() + ", not an object");
  const auto num = [&](const char* k, double fallback) {
    if (!rope.contains(k) || rope[k].is_null()) return fallback;
    if (!rope[k].is_number()) throw j.error(std::string("\"") + key + "\"'s \"" + k + "\" is not a number");
    return rope[k].get<double>();
  };
  c.rope_theta = num("rope_theta", j.number("rope_theta", 10000.0));
  const std::string type = rope.value("rope_type", rope.value("type", std::string("default")));
  if (type == "default") return;
  if (type != "llama3") {
    throw j.error(std::string("\"") + key + "\" has rope_type \"" + type +
                  "\"; coshard's Llama computes RoPE of type default and llama3 (Llama 3.1's) only");
  }
  c.rope_llama3 = true;
  for (const char* k : {"factor", "low_freq_factor", "high_freq_factor"}) {
    if (!rope.contains(k)) throw j.error(std::string("\"") + key + "\" of type llama3 lacks \"" + k + "\"");
  }
  c.rope_scaling.factor = num("factor", 0.0);
  c.rope_scaling.low_freq_factor = num("low_freq_factor", 0.0);
  c.rope_scaling.high_freq_factor = num("high_freq_factor", 0.0);
  c.rope_scaling.original_context =
      num("original_max_position_embeddings", j.number("original_max_position_embeddings", 0.0));
  if (!(c.rope_scaling.original_context > 0)) {
    throw j.error(std::string("\"") + key + "\" of type llama3 lacks \"original_max_position_embeddings\"");
  }
}

Config parse_hf_config(const fs::path& config_json) {
  const models::HfConfig j(config_json, "llama");
  Config c;
  c.vocab = j.positive_int("vocab_size");
  c.context = j.positive_int("max_position_embeddings");
  c.layers = j.positive_int("num_hidden_layers");
  c.heads = j.positive_int("num_attention_heads");
  c.width = j.positive_int("hidden_size");
  c.ffn = j.positive_int("intermediate_size");
  c.kv_heads = j.has("num_key_value_heads") ? j.positive_int("num_key_value_heads") : c.heads;
  if (j.has("head_dim")) {
    c.head_dim = j.positive_int("head_dim");
  } else if (c.width % c.heads != 0) {
    throw j.error("\"num_attention_heads\" " + std::to_string(c.heads) + " does not divide \"hidden_size\" " +
                  std::to_string(c.width) + " and there is no \"head_dim\"");
  } else {
    c.head_dim = c.width / c.heads;
  }
  c.rms_eps = j.number("rms_norm_eps", 1e-6);  // LlamaConfig's default
  c.tie_head = j.json().value("tie_word_embeddings", false);
  read_rope(j, c);
  check_computation(j);
  try {
    c.validate();
  } catch (const Error& e) {
    throw j.error(e.message());
  }
  return c;
}

bool ignored(const std::string& name) { return name.ends_with(".self_attn.rotary_emb.inv_freq"); }

}  // namespace

Config read_hf_config(const fs::path& config_json) {
  return models::HfConfig::read(config_json, [&] { return parse_hf_config(config_json); });
}

void save_hf_dir(const fs::path& dir, const Config& c, const StateDict& state) {
  models::create_hf_dir(dir);
  json rope_scaling = nullptr;
  if (c.rope_llama3) {
    rope_scaling = {{"rope_type", "llama3"},
                    {"factor", c.rope_scaling.factor},
                    {"low_freq_factor", c.rope_scaling.low_freq_factor},
                    {"high_freq_factor", c.rope_scaling.high_freq_factor},
                    {"original_max_position_embeddings", c.rope_scaling.original_context}};
  }
  // rope_theta and rope_scaling at the top, as transformers 4 writes them: 5 reads them too.
  const json j = {{"architectures", {"LlamaForCausalLM"}},
                  {"model_type", "llama"},
                  {"vocab_size", c.vocab},
                  {"max_position_embeddings", c.context},
                  {"hidden_size", c.width},
                  {"intermediate_size", c.ffn},
                  {"num_hidden_layers", c.layers},
                  {"num_attention_heads", c.heads},
                  {"num_key_value_heads", c.kv_heads},
                  {"head_dim", c.head_dim},
                  {"hidden_act", "silu"},
                  {"rms_norm_eps", c.rms_eps},
                  {"rope_theta", c.rope_theta},
                  {"rope_scaling", rope_scaling},
                  {"attention_bias", false},
                  {"attention_dropout", 0.0},
                  {"mlp_bias", false},
                  {"pretraining_tp", 1},
                  {"initializer_range", 0.02},
                  {"tie_word_embeddings", c.tie_head},
                  {"use_cache", true},
                  {"torch_dtype", "float32"}};
  models::save_state_dict(dir / "model.safetensors", all_params(c), state, DType::f32, {{"format", "pt"}});
  write_atomic(dir / "config.json", j.dump(2) + "\n");
}

StateDict read_init(const fs::path& path, const Config& config) {
  const std::string model = "Llama " + config.to_string();
  if (!fs::is_directory(path)) {
    const fs::path files[] = {path};
    return models::read_params(files, all_params(config), ignored, model);
  }
  const Config found = read_hf_config(path / "config.json");
  if (!(found == config)) {
    throw Error(Errc::bad_config, "'" + path.string() + "/config.json' is Llama " + found.to_string() +
                                      ", but the model is " + model + "; give --model " + found.to_string());
  }
  return models::read_params(models::hf_weight_files(path), all_params(config), ignored, model);
}

}  // namespace coshard::llama
