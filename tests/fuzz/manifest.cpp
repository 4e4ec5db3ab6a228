// The checkpoint manifest reader on any bytes: a clear coshard::Error or a manifest, nothing else
// (another exception escaping is a finding).
#include <string>

#include "coshard/fsdp/checkpoint.hpp"
#include "coshard/runtime/error.hpp"
#include "fuzz_input.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    (void)coshard::fsdp::manifest_from_json(std::string(reinterpret_cast<const char*>(data), size), "fuzz input");
  } catch (const coshard::Error&) {
  }
  return 0;
}
