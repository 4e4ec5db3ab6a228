#pragma once
// Linear layer y = x W + b over rows of a flattened batch ([B, T, in] is rows = B*T), GEMMs through
// OpenBLAS. The default weight layout is Hugging Face GPT-2's Conv1D, W[in, out]; out_in is
// nn.Linear's W[out, in] (y = x W^T), which is what a head tied to the token embedding needs.
//
// Gradient semantics (all ops): gradients of inputs (dx) are written; gradients of parameters
// (dw, db) are accumulated (+=) so micro-batches accumulate without extra buffers. Zero them
// before the first micro-batch.
#include <cstddef>
#include <cstdint>
#include <span>

namespace coshard::ops {

/// How a weight is stored: in_out is W[in, out] (GPT-2's Conv1D), out_in is W[out, in] (nn.Linear).
enum class WeightLayout { in_out, out_in };

/// x [rows, in], w [in, out] (or [out, in]), b [out] or empty for no bias, y [rows, out].
void linear_forward(std::span<const float> x, std::span<const float> w, std::span<const float> b, std::span<float> y,
                    std::size_t rows, std::size_t in, std::size_t out, WeightLayout layout = WeightLayout::in_out);

/// dy [rows, out]. dx [rows, in] is written; dw (shape of w) and db [out] are accumulated. Any of
/// dx, dw, db may be empty when that gradient is not wanted.
void linear_backward(std::span<const float> dy, std::span<const float> x, std::span<const float> w,
                     std::span<float> dx, std::span<float> dw, std::span<float> db, std::size_t rows, std::size_t in,
                     std::size_t out, WeightLayout layout = WeightLayout::in_out);

/// bf16 weights (the bits mixed precision all-gathers): the GEMMs round x, and in backward dy and
/// x, to bf16 and sum the exact products in f32, as PyTorch's bf16 linear does (cpu.hpp:
/// cpu_bf16_gemm says which kernel runs). y, dx, dw and db stay f32; db sums dy unrounded.
void linear_forward(std::span<const float> x, std::span<const std::uint16_t> w, std::span<const float> b,
                    std::span<float> y, std::size_t rows, std::size_t in, std::size_t out,
                    WeightLayout layout = WeightLayout::in_out);
void linear_backward(std::span<const float> dy, std::span<const float> x, std::span<const std::uint16_t> w,
                     std::span<float> dx, std::span<float> dw, std::span<float> db, std::size_t rows, std::size_t in,
                     std::size_t out, WeightLayout layout = WeightLayout::in_out);

}  // namespace coshard::ops
