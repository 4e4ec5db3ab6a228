#pragma once
// The embedded default corpus: lines "a+b=c" of small integer additions, deterministic from a
// seed, byte tokens (vocab 256). A two-rank CPU run learns most of the sums in a few hundred steps,
// so a newcomer sees the model learn; samples() checks completions of "a+b=".
#include <cstdint>
#include <string>
#include <vector>

#include "coshard/gpt2/data.hpp"

namespace coshard::train {

struct Addition {
  int a = 0, b = 0;
  std::string prompt() const { return std::to_string(a) + "+" + std::to_string(b) + "="; }
  std::string answer() const { return std::to_string(a + b); }
};

class AdditionCorpus {
 public:
  static constexpr int kMaxOperand = 10;  // a, b in [0, 10): 100 facts
  explicit AdditionCorpus(std::uint64_t seed, std::size_t lines = 60000);
  // The text as byte tokens.
  const gpt2::Tokens& tokens() const noexcept { return tokens_; }
  // `n` prompts spread over the facts, deterministic.
  std::vector<Addition> probes(std::size_t n) const;

 private:
  gpt2::Tokens tokens_;
};

}  // namespace coshard::train
