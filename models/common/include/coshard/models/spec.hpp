#pragma once
// A model's shape as text: "name", "name,key=value,...", or "key=value,..." (gpt2-train's --model).
// The parsing is the models' one; what the keys mean is each model's.
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "coshard/runtime/error.hpp"

namespace coshard::models {

struct Spec {
  std::string name;                                         ///< a named config, or empty
  std::vector<std::pair<std::string, std::string>> values;  ///< key=value pairs in order
  bool has(std::string_view key) const noexcept;
};

/// Splits `spec`; a name may only come first and a key only once. Errors are
/// Error(Errc::bad_config) beginning with `what` (e.g. "Llama config: "); `names` is the hint of an
/// empty spec.
Spec parse_spec(std::string_view spec, const std::string& what, const std::string& names);

/// An integer, a floating-point number or a boolean (true, false, 1, 0) of key=value, or
/// Error(Errc::bad_config) naming the key and the value.
std::int64_t spec_int(const std::string& what, const std::string& key, const std::string& value);
double spec_double(const std::string& what, const std::string& key, const std::string& value);
bool spec_bool(const std::string& what, const std::string& key, const std::string& value);

}  // namespace coshard::models
