#include "coshard/ops/cast.hpp"

#include <bit>
#include <string>

#include "coshard/runtime/error.hpp"

namespace coshard::ops {

std::uint16_t f32_to_bf16(float x) noexcept {
  auto u = std::bit_cast<std::uint32_t>(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // ties to even; carries into the exponent (to Inf) as it should
  return static_cast<std::uint16_t>(u >> 16);
}

float bf16_to_f32(std::uint16_t h) noexcept { return std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16); }

std::uint16_t f32_to_f16(float x) noexcept {
  const auto u = std::bit_cast<std::uint32_t>(x);
  const auto sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));  // NaN
  if (abs >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds past 65504: Inf
  if (abs >= 0x38800000u) {  // normal in fp16 (>= 2^-14)
    std::uint32_t m = abs - 0x38000000u;  // rebias exponent 127 -> 15
    m += 0xfffu + ((m >> 13) & 1u);
    return static_cast<std::uint16_t>(sign | (m >> 13));
  }
  if (abs < 0x33000000u) return sign;  // below half the smallest subnormal (2^-25): zero
  // Subnormal: shift the full 24-bit significand into place, rounding to nearest even.
  const std::uint32_t exp = abs >> 23;
  const std::uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
  const std::uint32_t shift = 126u - exp;  // 14 + (113 - exp) bits dropped, in [14, 24]
  std::uint32_t half = mant >> shift;
  const std::uint32_t rem = mant & ((1u << shift) - 1u);
  const std::uint32_t mid = 1u << (shift - 1u);
  if (rem > mid || (rem == mid && (half & 1u))) ++half;
  return static_cast<std::uint16_t>(sign | half);
}

float f16_to_f32(std::uint16_t h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));  // Inf/NaN
  if (exp != 0) return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (mant << 13));
  if (mant == 0) return std::bit_cast<float>(sign);
  int e = 113;  // normalise the subnormal
  while (!(mant & 0x400u)) {
    mant <<= 1;
    --e;
  }
  return std::bit_cast<float>(sign | (static_cast<std::uint32_t>(e) << 23) | ((mant & 0x3ffu) << 13));
}

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
  for (std::size_t i = 0; i < in.size(); ++i) out[i] = f32_to_bf16(in[i]);
}
void cast_bf16_to_f32(std::span<const std::uint16_t> in, std::span<float> out) {
  check(in, out, "cast_bf16_to_f32");
  for (std::size_t i = 0; i < in.size(); ++i) out[i] = bf16_to_f32(in[i]);
}
void cast_f32_to_f16(std::span<const float> in, std::span<std::uint16_t> out) {
  check(in, out, "cast_f32_to_f16");
  for (std::size_t i = 0; i < in.size(); ++i) out[i] = f32_to_f16(in[i]);
}
void cast_f16_to_f32(std::span<const std::uint16_t> in, std::span<float> out) {
  check(in, out, "cast_f16_to_f32");
  for (std::size_t i = 0; i < in.size(); ++i) out[i] = f16_to_f32(in[i]);
}

}  // namespace coshard::ops
