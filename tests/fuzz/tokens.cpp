// The token-file readers on any file: llm.c's .bin (header, uint16 tokens) and plain bytes.
#include "coshard/gpt2/data.hpp"
#include "coshard/runtime/error.hpp"
#include "fuzz_input.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static coshard::fuzz::InputFile file;  // one per process: libFuzzer calls this many times
  if (!file.write(data, size)) return 0;
  const std::int64_t vocab = size > 0 && data[0] % 2 ? 50257 : 256;
  for (auto read : {coshard::gpt2::read_tokens, coshard::gpt2::read_llmc_tokens}) {
    try {
      (void)read(file.path(), vocab);
    } catch (const coshard::Error&) {
    }
  }
  return 0;
}
