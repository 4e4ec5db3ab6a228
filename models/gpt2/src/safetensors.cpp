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
  const std::filesystem::path files[] = {path};
  return read_model(files, config);
}

StateDict read_model(std::span<const std::filesystem::path> files, const Config& config) {
  std::vector<SafetensorsFile> opened;
  opened.reserve(files.size());
  for (const auto& f : files) opened.push_back(SafetensorsFile::open(f));
  struct Where {
    const SafetensorsFile* file;
    const TensorEntry* entry;
  };
  // Names without the "transformer." prefix.
  std::map<std::string, Where> entries;
  for (const auto& f : opened) {
    for (const auto& t : f.tensors()) {
      std::string name = t.name;
      if (name.rfind("transformer.", 0) == 0) name = name.substr(12);
      const auto [it, fresh] = entries.emplace(name, Where{&f, &t});
      if (fresh) continue;
      if (it->second.file == &f) {
        throw corrupt(f.path(), "tensor '" + name + "' appears twice (with and without the 'transformer.' prefix)");
      }
      throw corrupt(f.path(), "tensor '" + name + "' is stored in " + it->second.file->path().string() + " too");
    }
  }
  const std::filesystem::path& first = files.front();
  const std::string cfg = " (config " + config.to_string() + ")";
  const auto infos = all_params(config);
  std::set<std::string> wanted;
  const Where* tied_head = nullptr;
  for (const auto& p : infos) {
    wanted.insert(p.name);
    auto it = entries.find(p.name);
    if (it == entries.end()) {
      if (p.name == "lm_head.weight") continue;  // untied model from a tied checkpoint: copy wte below
      throw corrupt(first, "missing tensor '" + p.name + "' of shape " + shape_str(p.shape) + cfg);
    }
    const auto& [f, t] = it->second;
    if (!t->convertible()) {
      throw corrupt(f->path(), "tensor '" + t->name + "' has dtype " + t->dtype_name +
                                   "; parameters must be F32, BF16 or F16");
    }
    if (t->shape != p.shape) {
      throw corrupt(f->path(), "tensor '" + t->name + "' has shape " + shape_str(t->shape) + " but the model expects " +
                                   shape_str(p.shape) + cfg);
    }
  }
  for (const auto& [name, where] : entries) {
    if (wanted.count(name)) continue;
    static const std::regex hf_buffer(R"(h\.[0-9]+\.attn\.(bias|masked_bias))");
    if (std::regex_match(name, hf_buffer)) continue;
    if (name == "lm_head.weight" && config.tie_head) {
      tied_head = &where;
      continue;
    }
    throw corrupt(where.file->path(), "tensor '" + where.entry->name + "' is not a parameter of GPT-2" + cfg);
  }
  StateDict state;
  for (const auto& p : infos) {
    auto it = entries.find(p.name);
    if (it == entries.end()) continue;
    state[p.name] = it->second.file->read(*it->second.entry);
  }
  if (!config.tie_head && !state.count("lm_head.weight")) state["lm_head.weight"] = state.at("wte.weight");
  if (tied_head) {
    // A tied model can take a file that stores the head too, only if it really is wte.
    if (tied_head->entry->shape != Shape{config.vocab, config.width} ||
        tied_head->file->read(*tied_head->entry) != state.at("wte.weight")) {
      throw corrupt(tied_head->file->path(), "tensor 'lm_head.weight' differs from wte.weight: the checkpoint has an "
                                             "untied head; load it with tie_head=false");
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
