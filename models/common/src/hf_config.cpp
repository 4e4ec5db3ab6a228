#include "coshard/models/hf_config.hpp"

#include "coshard/runtime/file_io.hpp"

namespace coshard::models {

std::string HfConfig::prefix(const std::filesystem::path& file) { return "Hugging Face config '" + file.string() + "': "; }

HfConfig::HfConfig(const std::filesystem::path& file, const std::string& model_type)
    : file_(file), j_(nlohmann::json::parse(read_text(file, "Hugging Face config"), nullptr, false)) {
  if (j_.is_discarded() || !j_.is_object()) throw error("not a JSON object");
  if (!j_.contains("model_type") || j_["model_type"] != model_type) {
    throw error("\"model_type\" is " + (j_.contains("model_type") ? j_["model_type"].dump() : std::string("missing")) +
                ", not \"" + model_type + "\"");
  }
}

Error HfConfig::error(const std::string& msg) const { return Error(Errc::bad_config, prefix(file_) + msg); }

std::int64_t HfConfig::positive_int(const char* key) const {
  if (!j_.contains(key) || !j_[key].is_number_integer() || j_[key].get<std::int64_t>() < 1) {
    throw error(std::string("\"") + key + "\" is missing or not a positive integer");
  }
  return j_[key].get<std::int64_t>();
}

double HfConfig::number(const char* key, double fallback) const {
  if (!has(key)) return fallback;
  if (!j_[key].is_number()) throw error(std::string("\"") + key + "\" is " + j_[key].dump() + ", not a number");
  return j_[key].get<double>();
}

void HfConfig::expect(const char* key, const nlohmann::json& want, const std::string& why) const {
  if (has(key) && j_[key] != want) throw error(std::string("\"") + key + "\" is " + j_[key].dump() + "; " + why);
}

void create_hf_dir(const std::filesystem::path& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw Error(Errc::io, "cannot create --save-hf directory '" + dir.string() + "': " + ec.message());
}

}  // namespace coshard::models
