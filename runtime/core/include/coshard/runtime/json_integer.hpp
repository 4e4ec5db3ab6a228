#pragma once
// nlohmann::json's get<T>() for an integral T converts whatever number the value holds: a double
// beyond T's range is undefined behaviour (the manifest fuzzer found `"shape": [1e300]`) and an
// integer beyond it wraps. Numbers read from a file a user hands in go through json_integer.
// A template on the JSON type, so that this layer needs no JSON library of its own.
#include <concepts>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

namespace coshard {

/// `v` as a T when it is an integer that T holds; otherwise std::out_of_range that names `what`,
/// the value and T's range. Callers turn that into the error for their file.
template <class T, class Json>
  requires std::integral<T> && (!std::same_as<std::remove_cv_t<T>, bool>)
T json_integer(const Json& v, const std::string& what) {
  if (v.is_number_unsigned()) {
    const auto u = v.template get<std::uint64_t>();
    if (std::in_range<T>(u)) return static_cast<T>(u);
  } else if (v.is_number_integer()) {
    const auto s = v.template get<std::int64_t>();
    if (std::in_range<T>(s)) return static_cast<T>(s);
  }
  std::string shown = v.dump();
  if (shown.size() > 40) shown = shown.substr(0, 37) + "...";
  throw std::out_of_range(what + " is " + shown + ", not an integer from " +
                          std::to_string(std::numeric_limits<T>::min()) + " to " +
                          std::to_string(std::numeric_limits<T>::max()));
}

}  // namespace coshard
