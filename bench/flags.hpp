#pragma once
// The benchmarks' number flags: the whole text, within what the benchmark can run. atoi read
// "abc" as 0, and bench_collectives --min 0 made its size loop (bytes *= 4) endless.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "coshard/runtime/parse_whole.hpp"

namespace coshard::bench {

/// `text` as a number in [lo, hi]; otherwise says so on stderr, naming `tool` and `flag`, and
/// exits with 2 (a usage error).
template <class T>
T flag_number(const char* tool, std::string_view flag, std::string_view text, T lo, T hi) {
  const std::optional<T> v = parse_whole<T>(text);
  if (!v || !(*v >= lo && *v <= hi)) {
    std::fprintf(stderr, "%s: %.*s takes a number from %s to %s, not '%.*s'\n", tool, static_cast<int>(flag.size()),
                 flag.data(), std::to_string(lo).c_str(), std::to_string(hi).c_str(), static_cast<int>(text.size()),
                 text.data());
    std::exit(2);
  }
  return *v;
}

}  // namespace coshard::bench
