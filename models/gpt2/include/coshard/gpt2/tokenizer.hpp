#pragma once
// Token ids back to text, for samples: bytes (vocab 256: the id is the byte), or a Hugging Face
// byte-level BPE's tokenizer.json (what scripts/prepare-data --tokenizer bpe and GPT-2's own
// tokenizer write). Only decoding: prompts come from the token files.
//
//   auto tok = gpt2::Tokenizer::from_file("data/tokenizer.json");
//   std::string text = tok.decode(ids);
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

namespace coshard::gpt2 {

class Tokenizer {
 public:
  /// One token per byte.
  static Tokenizer bytes();
  /// A byte-level BPE tokenizer.json. Errc::bad_config naming the file for anything else (another
  /// model type or pre-tokenizer, an id outside the vocabulary, a token that is not byte-level).
  static Tokenizer from_file(const std::filesystem::path& path);

  /// Tokens in the vocabulary.
  std::size_t size() const noexcept { return pieces_.size(); }
  /// The text of `ids`; bytes that are not UTF-8 are kept as they are. Errc::invalid_argument for
  /// an id outside the vocabulary.
  std::string decode(std::span<const std::int32_t> ids) const;

 private:
  static Tokenizer parse(const std::filesystem::path& path);
  std::vector<std::string> pieces_;  // id -> bytes
};

}  // namespace coshard::gpt2
