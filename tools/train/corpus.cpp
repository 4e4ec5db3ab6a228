#include "corpus.hpp"

#include "coshard/gpt2/params.hpp"

namespace coshard::train {

AdditionCorpus::AdditionCorpus(std::uint64_t seed, std::size_t lines) {
  std::uint64_t s = seed;
  for (std::size_t i = 0; i < lines; ++i) {
    s = gpt2::splitmix64(s + i);
    const Addition add{static_cast<int>(s % kMaxOperand), static_cast<int>((s >> 32) % kMaxOperand)};
    for (char c : add.prompt() + add.answer() + "\n") tokens_.push_back(static_cast<std::uint8_t>(c));
  }
}

std::vector<Addition> AdditionCorpus::probes(std::size_t n) const {
  std::vector<Addition> out;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t h = gpt2::splitmix64(0xadd + i);
    out.push_back({static_cast<int>(h % kMaxOperand), static_cast<int>((h >> 32) % kMaxOperand)});
  }
  return out;
}

}  // namespace coshard::train
