#include "coshard/models/hf_dir.hpp"

#include <nlohmann/json.hpp>
#include <set>

#include "coshard/models/safetensors.hpp"
#include "coshard/runtime/error.hpp"
#include "coshard/runtime/file_io.hpp"

namespace coshard::models {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

Error bad(const fs::path& file, const std::string& msg) {
  return Error(Errc::bad_config, "Hugging Face model '" + file.string() + "': " + msg);
}

json read_json(const fs::path& file, const char* role) {
  json j = json::parse(read_text(file, role), nullptr, false);
  if (j.is_discarded() || !j.is_object()) throw bad(file, "not a JSON object");
  return j;
}

// The files a sharded checkpoint's index maps tensors to. A name with a directory part would
// read outside the model's directory: refused.
std::vector<fs::path> indexed_files(const fs::path& dir, const fs::path& index) {
  const json j = read_json(index, "Hugging Face weight index");
  if (!j.contains("weight_map") || !j["weight_map"].is_object() || j["weight_map"].empty()) {
    throw bad(index, "\"weight_map\" is missing, empty or not an object of tensor name -> file");
  }
  std::set<std::string> names;
  for (const auto& [tensor, file] : j["weight_map"].items()) {
    if (!file.is_string()) throw bad(index, "\"weight_map\" maps '" + tensor + "' to " + file.dump() + ", not a file name");
    const std::string name = file.get<std::string>();
    if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..") {
      throw bad(index, "\"weight_map\" maps '" + tensor + "' to '" + name + "', not a file of the directory");
    }
    names.insert(name);
  }
  std::vector<fs::path> files;
  for (const auto& name : names) {
    if (!fs::exists(dir / name)) {
      throw bad(index, "it maps tensors to '" + name + "', which is not in " + dir.string() + " (an incomplete download?)");
    }
    files.push_back(dir / name);
  }
  return files;
}

}  // namespace

std::string hf_model_type(const fs::path& dir) {
  const fs::path config = dir / "config.json";
  if (!fs::exists(config)) {
    throw Error(Errc::bad_config, "'" + dir.string() + "' is a directory without config.json: give a .safetensors "
                                  "file or a Hugging Face model directory (as save_pretrained writes)");
  }
  const json j = read_json(config, "Hugging Face config");
  if (!j.contains("model_type") || !j["model_type"].is_string()) {
    throw bad(config, "\"model_type\" is missing or not a string");
  }
  return j["model_type"].get<std::string>();
}

std::vector<fs::path> hf_weight_files(const fs::path& dir) {
  if (fs::exists(dir / "model.safetensors")) return {dir / "model.safetensors"};
  if (fs::exists(dir / "model.safetensors.index.json")) return indexed_files(dir, dir / "model.safetensors.index.json");
  const bool bin = fs::exists(dir / "pytorch_model.bin") || fs::exists(dir / "pytorch_model.bin.index.json");
  throw Error(Errc::bad_config, "'" + dir.string() + "' has no model.safetensors nor model.safetensors.index.json" +
                                    (bin ? ": only safetensors weights are read, not pytorch_model.bin (save it with "
                                           "save_pretrained(dir, safe_serialization=True))"
                                         : ""));
}

StateDict read_params(std::span<const fs::path> files, const std::vector<ParamInfo>& infos,
                      const std::function<bool(const std::string&)>& ignored, const std::string& model) {
  std::vector<SafetensorsFile> opened;
  opened.reserve(files.size());
  for (const auto& f : files) opened.push_back(SafetensorsFile::open(f));
  std::map<std::string, std::pair<const SafetensorsFile*, const TensorEntry*>> entries;
  for (const auto& f : opened) {
    for (const auto& t : f.tensors()) {
      const auto [it, fresh] = entries.emplace(t.name, std::pair{&f, &t});
      if (!fresh) {
        throw safetensors_error(f.path(), "tensor '" + t.name + "' is stored in " + it->second.first->path().string() +
                                              " too");
      }
    }
  }
  const std::string cfg = " (" + model + ")";
  std::set<std::string> wanted;
  for (const auto& p : infos) {
    wanted.insert(p.name);
    const auto it = entries.find(p.name);
    if (it == entries.end()) {
      throw safetensors_error(files.front(), "missing tensor '" + p.name + "' of shape " + shape_str(p.shape) + cfg);
    }
    const auto& [f, t] = it->second;
    if (!t->convertible()) {
      throw safetensors_error(f->path(), "tensor '" + t->name + "' has dtype " + t->dtype_name +
                                             "; parameters must be F32, BF16 or F16");
    }
    if (t->shape != p.shape) {
      throw safetensors_error(f->path(), "tensor '" + t->name + "' has shape " + shape_str(t->shape) +
                                             " but the model expects " + shape_str(p.shape) + cfg);
    }
  }
  for (const auto& [name, where] : entries) {
    if (!wanted.count(name) && !ignored(name)) {
      throw safetensors_error(where.first->path(), "tensor '" + name + "' is not a parameter of the model" + cfg);
    }
  }
  StateDict state;
  for (const auto& p : infos) {
    const auto& [f, t] = entries.at(p.name);
    state[p.name] = f->read(*t);
  }
  return state;
}

}  // namespace coshard::models
