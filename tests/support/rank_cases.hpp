#pragma once
// Parameterised multi-process tests: a case is a rank count and the checker's arguments. These
// give such a case a readable gtest/ctest name and a readable printout when it fails.
#include <gtest/gtest.h>

#include <cctype>
#include <iterator>
#include <ostream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace coshard::testing {

struct RankCase {
  int ranks;
  std::string args;
};

inline void PrintTo(const RankCase& c, std::ostream* os) { *os << "{ranks " << c.ranks << ", args \"" << c.args << "\"}"; }

// "ranks2_bf16_reduce_dtype_f32" for {2, "--param-dtype bf16 --reduce-dtype f32"} when
// param-dtype is in `bare_flags`. Each "--flag value" becomes "flag_value" ("flag" + value when
// the value starts with a digit: "shard_group2"); the values of `bare_flags` stand alone; '='
// before a digit is dropped and anything else outside [A-Za-z0-9] becomes a single '_'.
inline std::string rank_case_name(const RankCase& c, const std::set<std::string>& bare_flags) {
  std::istringstream in(c.args);
  const std::vector<std::string> words{std::istream_iterator<std::string>(in), std::istream_iterator<std::string>()};
  std::string raw = "ranks" + std::to_string(c.ranks);
  for (std::size_t i = 0; i < words.size(); ++i) {
    std::string part = words[i];
    if (part.starts_with("--")) {
      part = part.substr(2);
      if (i + 1 < words.size() && !words[i + 1].starts_with("--")) {
        const std::string& value = words[++i];
        part = bare_flags.count(part) ? value : part + (std::isdigit(static_cast<unsigned char>(value[0])) ? "" : "_") + value;
      }
    }
    raw += "_" + part;
  }
  std::string name;
  for (std::size_t i = 0; i < raw.size(); ++i) {
    if (std::isalnum(static_cast<unsigned char>(raw[i]))) {
      name += raw[i];
    } else if (raw[i] == '=' && i + 1 < raw.size() && std::isdigit(static_cast<unsigned char>(raw[i + 1]))) {
      continue;
    } else if (!name.empty() && name.back() != '_') {
      name += '_';
    }
  }
  while (!name.empty() && name.back() == '_') name.pop_back();
  return name;
}

}  // namespace coshard::testing
