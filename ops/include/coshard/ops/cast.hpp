#pragma once
// Scalar and buffer casts between fp32, bf16 and fp16: round to nearest even, Inf kept, NaN kept
// as a quiet NaN with its sign, fp16 overflow to Inf and gradual underflow to subnormals.
#include <cstddef>
#include <cstdint>
#include <span>

namespace coshard::ops {

std::uint16_t f32_to_bf16(float x) noexcept;
float bf16_to_f32(std::uint16_t h) noexcept;
std::uint16_t f32_to_f16(float x) noexcept;
float f16_to_f32(std::uint16_t h) noexcept;

void cast_f32_to_bf16(std::span<const float> in, std::span<std::uint16_t> out);
void cast_bf16_to_f32(std::span<const std::uint16_t> in, std::span<float> out);
void cast_f32_to_f16(std::span<const float> in, std::span<std::uint16_t> out);
void cast_f16_to_f32(std::span<const std::uint16_t> in, std::span<float> out);

}  // namespace coshard::ops
