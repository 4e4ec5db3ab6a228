#pragma once
// Causal multi-head self-attention on a fused projection, as GPT-2's attention after c_attn:
// qkv [B, T, 3C] holds q | k | v along the last dimension, head h of each at columns
// [h*hs, (h+1)*hs) with hs = C / NH. Scores are scaled by 1/sqrt(hs); position t attends to
// positions <= t. The output [B, T, C] has the heads concatenated (input of c_proj).
#include <cstddef>
#include <span>

namespace coshard::ops {

/// att [B, NH, T, T] is written with the softmax probabilities (zero above the diagonal) and is
/// what the backward needs besides qkv.
void attention_forward(std::span<const float> qkv, std::span<float> out, std::span<float> att, std::size_t B,
                       std::size_t T, std::size_t C, std::size_t NH);

/// dout [B, T, C]; dqkv [B, T, 3C] is written.
void attention_backward(std::span<const float> dout, std::span<const float> qkv, std::span<const float> att,
                        std::span<float> dqkv, std::size_t B, std::size_t T, std::size_t C, std::size_t NH);

}  // namespace coshard::ops
