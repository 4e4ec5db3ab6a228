#include "coshard/models/spec.hpp"

#include <cmath>
#include <set>

#include "coshard/runtime/parse_whole.hpp"

namespace coshard::models {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

}  // namespace

bool Spec::has(std::string_view key) const noexcept {
  for (const auto& [k, v] : values) {
    if (k == key) return true;
  }
  return false;
}

Spec parse_spec(std::string_view spec, const std::string& what, const std::string& names) {
  auto bad = [&](const std::string& msg) { return Error(Errc::bad_config, what + msg); };
  if (trim(spec).empty()) throw bad("empty config: use " + names);
  Spec out;
  std::set<std::string> seen;
  std::size_t index = 0;
  std::string_view rest = spec;
  while (true) {
    const auto comma = rest.find(',');
    const std::string_view item = trim(rest.substr(0, comma));
    const auto eq = item.find('=');
    if (eq == std::string_view::npos) {
      if (index != 0) {
        throw bad("'" + std::string(item) + "' in '" + std::string(spec) +
                  "' is not key=value (a config name may only come first)");
      }
      out.name = std::string(item);
    } else {
      std::string key(trim(item.substr(0, eq)));
      if (!seen.insert(key).second) throw bad("key '" + key + "' given twice in '" + std::string(spec) + "'");
      out.values.emplace_back(std::move(key), std::string(trim(item.substr(eq + 1))));
    }
    ++index;
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  return out;
}

std::int64_t spec_int(const std::string& what, const std::string& key, const std::string& value) {
  const std::optional<std::int64_t> v = parse_whole<std::int64_t>(value);
  if (!v) throw Error(Errc::bad_config, what + key + "='" + value + "' is not an integer");
  return *v;
}

double spec_double(const std::string& what, const std::string& key, const std::string& value) {
  std::size_t used = 0;
  double v = 0;
  try {
    v = std::stod(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != value.size() || !std::isfinite(v)) {
    throw Error(Errc::bad_config, what + key + "='" + value + "' is not a finite number");
  }
  return v;
}

bool spec_bool(const std::string& what, const std::string& key, const std::string& value) {
  if (value == "true" || value == "1") return true;
  if (value == "false" || value == "0") return false;
  throw Error(Errc::bad_config, what + key + "='" + value + "' is not a boolean (true, false, 1, 0)");
}

}  // namespace coshard::models
