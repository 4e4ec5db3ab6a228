#include "coshard/gpt2/safetensors.hpp"

#include <regex>
#include <set>

#include "coshard/runtime/error.hpp"

namespace coshard::gpt2 {
namespace {

Error corrupt(const std::filesystem::path& path, const std::string& msg) { return models::safetensors_error(path, msg); }
using models::shape_str;

}  // namespace

// ---- GPT-2 checkpoints ----

void save_model(const std::filesystem::path& path, const ParamStore& params, DType dtype,
                const std::map<std::string, std::string>& metadata) {
  models::save_params(path, params, dtype, metadata);
}

void save_state_dict(const std::filesystem::path& path, const Config& config, const StateDict& state, DType dtype,
                     const std::map<std::string, std::string>& metadata) {
  models::save_state_dict(path, all_params(config), state, dtype, metadata);
}

StateDict read_model(const std::filesystem::path& path, const Config& config) {
  const auto file = SafetensorsFile::open(path);
  const auto infos = all_params(config);
  // Names without the "transformer." prefix.
  std::map<std::string, const TensorEntry*> entries;
  for (const auto& t : file.tensors()) {
    std::string name = t.name;
    if (name.rfind("transformer.", 0) == 0) name = name.substr(12);
    if (!entries.emplace(name, &t).second) {
      throw corrupt(path, "tensor '" + name + "' appears twice (with and without the 'transformer.' prefix)");
    }
  }
  const std::string cfg = " (config " + config.to_string() + ")";
  std::set<std::string> wanted;
  const TensorEntry* tied_head = nullptr;
  for (const auto& p : infos) {
    wanted.insert(p.name);
    auto it = entries.find(p.name);
    if (it == entries.end()) {
      if (p.name == "lm_head.weight") continue;  // untied model from a tied checkpoint: copy wte below
      throw corrupt(path, "missing tensor '" + p.name + "' of shape " + shape_str(p.shape) + cfg);
    }
    const TensorEntry& t = *it->second;
    if (!t.convertible()) {
      throw corrupt(path, "tensor '" + t.name + "' has dtype " + t.dtype_name + "; parameters must be F32, BF16 or F16");
    }
    if (t.shape != p.shape) {
      throw corrupt(path, "tensor '" + t.name + "' has shape " + shape_str(t.shape) + " but the model expects " +
                              shape_str(p.shape) + cfg);
    }
  }
  for (const auto& [name, t] : entries) {
    if (wanted.count(name)) continue;
    static const std::regex hf_buffer(R"(h\.[0-9]+\.attn\.(bias|masked_bias))");
    if (std::regex_match(name, hf_buffer)) continue;
    if (name == "lm_head.weight" && config.tie_head) {
      tied_head = t;
      continue;
    }
    throw corrupt(path, "tensor '" + t->name + "' is not a parameter of GPT-2" + cfg);
  }
  StateDict state;
  for (const auto& p : infos) {
    auto it = entries.find(p.name);
    if (it == entries.end()) continue;
    state[p.name] = file.read(*it->second);
  }
  if (!config.tie_head && !state.count("lm_head.weight")) state["lm_head.weight"] = state.at("wte.weight");
  if (tied_head) {
    // A tied model can take a file that stores the head too, only if it really is wte.
    if (tied_head->shape != Shape{config.vocab, config.width} || file.read(*tied_head) != state.at("wte.weight")) {
      throw corrupt(path, "tensor 'lm_head.weight' differs from wte.weight: the checkpoint has an untied head; "
                          "load it with tie_head=false");
    }
  }
  return state;
}

void load_model(const std::filesystem::path& path, ParamStore& params, const Config& config) {
  const auto infos = all_params(config);
  bool match = infos.size() == params.size();
  for (std::size_t i = 0; match && i < infos.size(); ++i) {
    match = infos[i].name == params.infos()[i].name && infos[i].shape == params.infos()[i].shape;
  }
  if (!match) throw Error(Errc::invalid_argument, "load_model: the parameter store does not hold GPT-2 " + config.to_string());
  const StateDict state = read_model(path, config);
  for (std::size_t i = 0; i < infos.size(); ++i) {
    const auto& v = state.at(infos[i].name);
    std::copy(v.begin(), v.end(), params.at(i).begin());
  }
}

}  // namespace coshard::gpt2
