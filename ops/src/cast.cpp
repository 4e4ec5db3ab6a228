#include "coshard/ops/cast.hpp"

#include <string>

#include "coshard/runtime/error.hpp"

namespace coshard::ops {

namespace {
template <class In, class Out>
void check(std::span<In> in, std::span<Out> out, const char* what) {
  if (in.size() != out.size()) {
    throw Error(Errc::invalid_argument, std::string(what) + ": input has " + std::to_string(in.size()) +
                                            " elements but output has " + std::to_string(out.size()));
  }
}
}  // namespace

void cast_f32_to_bf16(std::span<const float> in, std::span<std::uint16_t> out) {
  check(in, out, "cast_f32_to_bf16");
  for (std::size_t i = 0; i < in.size(); ++i) out[i] = kernels::f32_to_bf16(in[i]);
}
void cast_bf16_to_f32(std::span<const std::uint16_t> in, std::span<float> out) {
  check(in, out, "cast_bf16_to_f32");
  for (std::size_t i = 0; i < in.size(); ++i) out[i] = kernels::bf16_to_f32(in[i]);
}
void cast_f32_to_f16(std::span<const float> in, std::span<std::uint16_t> out) {
  check(in, out, "cast_f32_to_f16");
  for (std::size_t i = 0; i < in.size(); ++i) out[i] = kernels::f32_to_f16(in[i]);
}
void cast_f16_to_f32(std::span<const std::uint16_t> in, std::span<float> out) {
  check(in, out, "cast_f16_to_f32");
  for (std::size_t i = 0; i < in.size(); ++i) out[i] = kernels::f16_to_f32(in[i]);
}

}  // namespace coshard::ops
