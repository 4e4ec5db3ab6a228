// The token-file readers on any file: llm.c's .bin (header, uint16 or uint32 tokens) and plain bytes.
#include "coshard/gpt2/data.hpp"
#include "coshard/runtime/error.hpp"
#include "fuzz_input.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static coshard::fuzz::InputFile file;  // one per process: libFuzzer calls this many times
  if (!file.write(data, size)) return 0;
  // The first byte picks the vocabulary: bytes, GPT-2's and Llama 3's (above uint16's ids).
  constexpr std::int64_t kVocabs[] = {256, 50257, 128256};
  const std::int64_t vocab = kVocabs[size > 0 ? data[0] % 3 : 0];
  (void)coshard::gpt2::tokens_in(file.path());
  for (auto read : {coshard::gpt2::read_tokens, coshard::gpt2::read_llmc_tokens}) {
    try {
      (void)read(file.path(), vocab);
    } catch (const coshard::Error&) {
    }
  }
  return 0;
}
