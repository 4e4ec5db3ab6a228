#include "coshard/gpt2/hf_dir.hpp"

#include <string>

#include "coshard/models/hf_config.hpp"
#include "coshard/models/hf_dir.hpp"
#include "coshard/runtime/error.hpp"
#include "coshard/runtime/file_io.hpp"

namespace coshard::gpt2 {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// The keys that change what the model computes: each must hold what coshard computes (or be absent
// and default to it, as transformers' GPT2Config does).
void check_computation(const models::HfConfig& j, std::int64_t width) {
  const auto expect = [&](const char* key, const json& want, const char* why) {
    j.expect(key, want, std::string("coshard's GPT-2 ") + why);
  };
  const json& act = j.json().contains("activation_function") ? j.json()["activation_function"] : json("gelu_new");
  if (act != "gelu_new" && act != "gelu_pytorch_tanh") {
    throw j.error("\"activation_function\" is " + act.dump() + "; coshard's GPT-2 uses the tanh GELU (gelu_new)");
  }
  if (j.json().contains("layer_norm_epsilon") && j.json()["layer_norm_epsilon"] != 1e-5) {
    throw j.error("\"layer_norm_epsilon\" is " + j.json()["layer_norm_epsilon"].dump() + "; coshard's GPT-2 uses 1e-05");
  }
  expect("n_inner", 4 * width, "has an MLP 4 x n_embd wide");
  expect("scale_attn_weights", true, "scales attention scores by 1/sqrt(head size)");
  expect("scale_attn_by_inverse_layer_idx", false, "does not scale attention by the layer index");
  expect("reorder_and_upcast_attn", false, "computes attention in float32 without reordering");
}

Config parse_hf_config(const fs::path& config_json) {
  const models::HfConfig j(config_json, "gpt2");
  Config c;
  c.vocab = j.positive_int("vocab_size");
  c.context = j.positive_int("n_positions");
  c.layers = j.positive_int("n_layer");
  c.heads = j.positive_int("n_head");
  c.width = j.positive_int("n_embd");
  c.tie_head = j.json().value("tie_word_embeddings", true);
  try {
    c.validate();  // first: the checks below compute with the width (4 x 2^62 overflowed)
  } catch (const Error& e) {
    throw j.error(e.message());
  }
  check_computation(j, c.width);
  return c;
}

}  // namespace

Config read_hf_config(const fs::path& config_json) {
  return models::HfConfig::read(config_json, [&] { return parse_hf_config(config_json); });
}

void save_hf_dir(const fs::path& dir, const Config& config, const StateDict& state) {
  models::create_hf_dir(dir);
  json j = {{"architectures", {"GPT2LMHeadModel"}},
            {"model_type", "gpt2"},
            {"vocab_size", config.vocab},
            {"n_positions", config.context},
            {"n_ctx", config.context},
            {"n_embd", config.width},
            {"n_layer", config.layers},
            {"n_head", config.heads},
            {"n_inner", nullptr},
            {"activation_function", "gelu_new"},
            {"layer_norm_epsilon", 1e-5},
            {"initializer_range", 0.02},
            {"resid_pdrop", 0.0},
            {"embd_pdrop", 0.0},
            {"attn_pdrop", 0.0},
            {"scale_attn_weights", true},
            {"scale_attn_by_inverse_layer_idx", false},
            {"reorder_and_upcast_attn", false},
            {"tie_word_embeddings", config.tie_head},
            {"use_cache", true},
            {"torch_dtype", "float32"}};
  if (config.vocab == 50257) j["bos_token_id"] = j["eos_token_id"] = 50256;  // GPT-2's <|endoftext|>
  save_state_dict(dir / "model.safetensors", config, state, DType::f32, {{"format", "pt"}});
  write_atomic(dir / "config.json", j.dump(2) + "\n");
}

StateDict read_init(const fs::path& path, const Config& config) {
  if (!fs::is_directory(path)) return read_model(path, config);
  if (!fs::exists(path / "config.json")) {
    throw Error(Errc::bad_config, "'" + path.string() + "' is a directory without config.json: give a .safetensors "
                                  "file or a Hugging Face model directory");
  }
  const Config found = read_hf_config(path / "config.json");
  if (!(found == config)) {
    throw Error(Errc::bad_config, "'" + path.string() + "/config.json' is GPT-2 " + found.to_string() +
                                      ", but the model is " + config.to_string() + "; give --model " + found.to_string());
  }
  return read_model(models::hf_weight_files(path), config);
}

}  // namespace coshard::gpt2
