// The safetensors reader on any file: open validates the header, reading a tensor converts it.
#include "coshard/gpt2/safetensors.hpp"
#include "coshard/runtime/error.hpp"
#include "fuzz_input.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static coshard::fuzz::InputFile file;  // one per process: libFuzzer calls this many times
  if (!file.write(data, size)) return 0;
  try {
    const auto f = coshard::gpt2::SafetensorsFile::open(file.path());
    for (const auto& t : f.tensors()) {
      if (t.convertible() && t.numel() <= (1 << 20)) (void)f.read(t);
    }
  } catch (const coshard::Error&) {
  }
  return 0;
}
