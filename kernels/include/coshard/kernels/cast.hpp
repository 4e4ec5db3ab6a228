#pragma once
// Scalar casts between fp32, bf16 and fp16, for host and device: round to nearest even, Inf kept,
// NaN kept as a quiet NaN with its sign, fp16 overflow to Inf and gradual underflow to
// subnormals. Inline so that the loops that call them (buffer casts, the transport's reductions,
// the CUDA kernels) vectorise or at least avoid a call per element.
#include <cstdint>

#include "coshard/kernels/host_device.hpp"

namespace coshard::kernels {

/// The bf16 bits nearest to `x` (ties to even); NaN stays a quiet NaN.
COSHARD_HD inline std::uint16_t f32_to_bf16(float x) noexcept {
  std::uint32_t u = float_to_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // ties to even; carries into the exponent (to Inf) as it should
  return static_cast<std::uint16_t>(u >> 16);
}

/// The fp32 value of bf16 bits `h`; exact.
COSHARD_HD inline float bf16_to_f32(std::uint16_t h) noexcept {
  return bits_to_float(static_cast<std::uint32_t>(h) << 16);
}

/// The fp16 bits nearest to `x` (ties to even): overflow becomes Inf, tiny values subnormals or zero.
COSHARD_HD inline std::uint16_t f32_to_f16(float x) noexcept {
  const std::uint32_t u = float_to_bits(x);
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

/// The fp32 value of fp16 bits `h`, subnormals included; exact.
COSHARD_HD inline float f16_to_f32(std::uint16_t h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return bits_to_float(sign | 0x7f800000u | (mant << 13));  // Inf/NaN
  if (exp != 0) return bits_to_float(sign | ((exp + 112u) << 23) | (mant << 13));
  if (mant == 0) return bits_to_float(sign);
  std::uint32_t e = 113;  // normalise the subnormal
  while (!(mant & 0x400u)) {
    mant <<= 1;
    --e;
  }
  return bits_to_float(sign | (e << 23) | ((mant & 0x3ffu) << 13));
}

/// The value an fp32 takes after a round trip through the low precision: what mixed precision
/// computes with, while storage stays fp32.
COSHARD_HD inline float round_to_bf16(float x) noexcept { return bf16_to_f32(f32_to_bf16(x)); }
/// Like round_to_bf16, through fp16.
COSHARD_HD inline float round_to_f16(float x) noexcept { return f16_to_f32(f32_to_f16(x)); }

}  // namespace coshard::kernels
