// The Hugging Face JSON files a user hands gpt2-train on any bytes: tokenizer.json (decoded with
// every id it defines) and config.json. A clear coshard::Error or a result, nothing else.
#include <cstdint>
#include <vector>

#include "coshard/gpt2/hf_dir.hpp"
#include "coshard/gpt2/tokenizer.hpp"
#include "coshard/runtime/error.hpp"
#include "fuzz_input.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static coshard::fuzz::InputFile file;  // one per process: libFuzzer calls this many times
  if (!file.write(data, size)) return 0;
  try {
    const auto t = coshard::gpt2::Tokenizer::from_file(file.path());
    std::vector<std::int32_t> ids(t.size());
    for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int32_t>(i);
    (void)t.decode(ids);
  } catch (const coshard::Error&) {
  }
  try {
    (void)coshard::gpt2::read_hf_config(file.path());
  } catch (const coshard::Error&) {
  }
  return 0;
}
