#pragma once
// Scalar and buffer casts between fp32, bf16 and fp16: round to nearest even, Inf kept, NaN kept
// as a quiet NaN with its sign, fp16 overflow to Inf and gradual underflow to subnormals. The
// scalar casts live in coshard::kernels (shared with the CUDA kernels and the transport); ops
// re-exports them so its callers keep one name for every cast.
#include <cstddef>
#include <cstdint>
#include <span>

#include "coshard/kernels/cast.hpp"

namespace coshard::ops {

using kernels::bf16_to_f32;
using kernels::f16_to_f32;
using kernels::f32_to_bf16;
using kernels::f32_to_f16;

/// Casts every element of `in` to bf16 into `out`, of the same size (else Errc::invalid_argument).
void cast_f32_to_bf16(std::span<const float> in, std::span<std::uint16_t> out);
/// Widens every bf16 element of `in` into `out`, of the same size (exact).
void cast_bf16_to_f32(std::span<const std::uint16_t> in, std::span<float> out);
/// Casts every element of `in` to fp16 into `out`, of the same size; overflow becomes Inf.
void cast_f32_to_f16(std::span<const float> in, std::span<std::uint16_t> out);
/// Widens every fp16 element of `in` into `out`, of the same size (exact).
void cast_f16_to_f32(std::span<const std::uint16_t> in, std::span<float> out);

}  // namespace coshard::ops
