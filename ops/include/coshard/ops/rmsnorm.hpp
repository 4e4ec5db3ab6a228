#pragma once
// Root-mean-square normalisation over the last dimension C of `rows` rows, as Hugging Face's
// LlamaRMSNorm computes in f32: y = weight * (x * rstd), rstd = 1 / sqrt(mean(x^2) + eps). No mean
// is subtracted and there is no bias. The forward saves each row's rstd for the backward.
#include <cstddef>
#include <span>

namespace coshard::ops {

/// x, y [rows, C]; weight [C]; rstd [rows] (written). eps comes from the model's config
/// (rms_norm_eps: 1e-5 for Llama 2 and 3, 1e-6 for others).
void rmsnorm_forward(std::span<const float> x, std::span<const float> weight, std::span<float> y,
                     std::span<float> rstd, std::size_t rows, std::size_t C, float eps);

/// dy, x, dx [rows, C]: dx is written; dweight [C] is accumulated (it may be empty).
void rmsnorm_backward(std::span<const float> dy, std::span<const float> x, std::span<const float> weight,
                      std::span<const float> rstd, std::span<float> dx, std::span<float> dweight, std::size_t rows,
                      std::size_t C);

}  // namespace coshard::ops
