#pragma once
// Numbers a user or another program hands coshard as text (flags, environment variables, store
// values, file names, wire fields) are read one way: all of the text, in decimal, within the type.
// atoi read "abc" as 0 and 2^40 undefined; stoi threw a bare "stoi"; strtol and stol skip leading
// spaces and take a '+'; CLI11 reads "010" as octal. Callers say what the number was for and what
// range they take: this only says whether the text is a number at all.
#include <charconv>
#include <concepts>
#include <optional>
#include <string_view>
#include <type_traits>

namespace coshard {

/// `text` read whole as a decimal T: nothing when it is empty, when anything comes before or after
/// the number (a space, a '+', a unit, "0x"), or when the number is beyond T's range. Floating-point
/// types take what std::from_chars takes ("1e-3", "inf" and "nan" included: check isfinite).
template <class T>
  requires std::is_arithmetic_v<T> && (!std::same_as<std::remove_cv_t<T>, bool>)
std::optional<T> parse_whole(std::string_view text) {
  T value{};
  const char* end = text.data() + text.size();
  const auto [at, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || at != end) return std::nullopt;
  return value;
}

}  // namespace coshard
