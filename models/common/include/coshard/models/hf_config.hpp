#pragma once
// A Hugging Face config.json, read with the errors every family gives: each names the file and the
// key (Errc::bad_config), and a value of the wrong JSON type is "malformed", never a crash.
//
//   const models::HfConfig j(dir / "config.json", "llama");   // model_type checked first
//   c.width = j.positive_int("hidden_size");
//   j.expect("mlp_bias", false, "coshard's Llama has no biases in gate/up/down_proj");
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "coshard/runtime/error.hpp"

namespace coshard::models {

class HfConfig {
 public:
  /// Reads the file; its "model_type" must be `model_type` (another model's keys mean other things).
  HfConfig(const std::filesystem::path& file, const std::string& model_type);

  const nlohmann::json& json() const noexcept { return j_; }
  bool has(const char* key) const { return j_.contains(key) && !j_[key].is_null(); }
  /// An integer >= 1; missing or anything else is an error naming the key.
  std::int64_t positive_int(const char* key) const;
  /// A number, or `fallback` when absent or null.
  double number(const char* key, double fallback) const;
  /// The key absent, null or holding `want`; else "\"key\" is <value>; <why>".
  void expect(const char* key, const nlohmann::json& want, const std::string& why) const;
  Error error(const std::string& msg) const;

  /// parse(), with nlohmann's type errors (a key of the wrong type) as this file's "malformed".
  template <typename Parse>
  static auto read(const std::filesystem::path& file, Parse&& parse) {
    try {
      return parse();
    } catch (const nlohmann::json::exception& e) {
      throw Error(Errc::bad_config, prefix(file) + "malformed: " + e.what());
    }
  }
  static std::string prefix(const std::filesystem::path& file);

 private:
  std::filesystem::path file_;
  nlohmann::json j_;
};

/// --save-hf's directory, created if missing (Errc::io naming it).
void create_hf_dir(const std::filesystem::path& dir);

}  // namespace coshard::models
