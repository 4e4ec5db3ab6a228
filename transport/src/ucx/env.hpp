#pragma once
// The UCX backend's COSHARD_UCX_* switches: a value that is set but unreadable is a bad_config
// error naming the variable, never silently ignored.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>

#include "coshard/runtime/error.hpp"
#include "coshard/runtime/parse_whole.hpp"

namespace coshard::transport::detail {

// 1/on/true or 0/off/false; nothing when unset or empty.
inline std::optional<bool> env_switch(const char* name) {
  const char* env = std::getenv(name);
  if (!env || !*env) return std::nullopt;
  std::string v = env;
  if (v == "1" || v == "on" || v == "true") return true;
  if (v == "0" || v == "off" || v == "false") return false;
  throw Error(Errc::bad_config, std::string(name) + "='" + v + "' is not one of 0, 1");
}

// A byte count (an integer from 0 to 2^63 - 1: the peers' identities carry it signed, where a
// count past that would read as -1, "no hierarchy"); nothing when unset or empty.
inline std::optional<std::size_t> env_bytes(const char* name) {
  const char* env = std::getenv(name);
  if (!env || !*env) return std::nullopt;
  const std::optional<std::int64_t> v = parse_whole<std::int64_t>(env);
  if (!v || *v < 0) {
    throw Error(Errc::bad_config,
                std::string(name) + "='" + env + "' is not a byte count (an integer from 0 to 2^63 - 1)");
  }
  return static_cast<std::size_t>(*v);
}

}  // namespace coshard::transport::detail
