#pragma once
// Layer normalisation over the last dimension C of rows = B*T rows, as torch.nn.LayerNorm
// (biased variance, eps inside the square root). The forward saves each row's mean and
// 1/sqrt(var + eps) for the backward.
#include <cstddef>
#include <span>

namespace coshard::ops {

/// torch.nn.LayerNorm's default eps, added to the variance inside the square root.
inline constexpr float layernorm_eps = 1e-5f;

/// x, y [rows, C]; weight, bias [C]; mean, rstd [rows] (written).
void layernorm_forward(std::span<const float> x, std::span<const float> weight, std::span<const float> bias,
                       std::span<float> y, std::span<float> mean, std::span<float> rstd, std::size_t rows,
                       std::size_t C, float eps = layernorm_eps);

/// dy, x, dx [rows, C]: dx is written; dweight, dbias [C] are accumulated (either may be empty).
void layernorm_backward(std::span<const float> dy, std::span<const float> x, std::span<const float> weight,
                        std::span<const float> mean, std::span<const float> rstd, std::span<float> dx,
                        std::span<float> dweight, std::span<float> dbias, std::size_t rows, std::size_t C);

}  // namespace coshard::ops
