#pragma once
// Rotary position embeddings, Hugging Face Llama's layout (rotate_half): within each head of hs
// elements, element i and element i + hs/2 form a pair, rotated by the angle t * inv_freq[i] at
// position t (from 0 in each sequence), inv_freq[i] = theta^(-2i/hs). Weights of Hugging Face
// Llama checkpoints therefore load without a permutation. The rotation is applied in place to the
// query and key heads of the fused projection attention.hpp reads, after the projection; its
// backward rotates the gradient back (the rotation is orthogonal).
#include <cstddef>
#include <span>

#include "coshard/ops/attention.hpp"

namespace coshard::ops {

/// Llama 3.1's frequency scaling (rope_scaling with rope_type "llama3"): frequencies whose
/// wavelength exceeds original_context / low_freq_factor are divided by factor, those under
/// original_context / high_freq_factor kept, the ones between interpolated smoothly.
struct RopeScaling {
  double factor = 8.0;            ///< long wavelengths' frequencies are divided by this
  double low_freq_factor = 1.0;   ///< wavelengths over original_context / this are scaled
  double high_freq_factor = 4.0;  ///< wavelengths under original_context / this are kept
  double original_context = 8192.0;  ///< original_max_position_embeddings
};

/// cos and sin [P, hs/2] of the angles of positions [0, P), computed in double and rounded once.
/// theta: rope_theta (10000 for Llama 2, 500000 for Llama 3); scaling may be null (none).
void rope_table(std::span<float> cos, std::span<float> sin, std::size_t P, std::size_t head_size, double theta,
                const RopeScaling* scaling = nullptr);

/// Rotates the query and key heads of qkv [B, T, (NH + 2 NKV) hs] in place (the value heads stay),
/// position t by row t of the table; cos and sin hold P >= T rows of hs/2. hs must be even.
void rope_forward(std::span<float> qkv, std::span<const float> cos, std::span<const float> sin,
                  const AttentionShape& shape);

/// The gradient through rope_forward, in place on dqkv's query and key heads.
void rope_backward(std::span<float> dqkv, std::span<const float> cos, std::span<const float> sin,
                   const AttentionShape& shape);

}  // namespace coshard::ops
