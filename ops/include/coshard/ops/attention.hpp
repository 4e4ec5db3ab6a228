#pragma once
// Causal multi-head self-attention on a fused projection, as GPT-2's attention after c_attn:
// qkv [B, T, 3C] holds q | k | v along the last dimension, head h of each at columns
// [h*hs, (h+1)*hs) with hs = C / NH. Scores are scaled by 1/sqrt(hs); position t attends to
// positions <= t. The output [B, T, C] has the heads concatenated (input of c_proj).
#include <cstddef>
#include <span>

namespace coshard::ops {

/// Flash-attention style: the scores are computed a tile of 64 queries x 64 keys at a time with an
/// online softmax, key tiles above the diagonal are skipped, and no [T, T] matrix is ever held, so
/// memory grows linearly with T. lse [B, NH, T] is written with each query's log-sum-exp of its
/// scaled scores; the backward recomputes the probabilities from it.
void attention_forward(std::span<const float> qkv, std::span<float> out, std::span<float> lse, std::size_t B,
                       std::size_t T, std::size_t C, std::size_t NH);

/// dout [B, T, C]; qkv, out and lse as the forward left them; dqkv [B, T, 3C] is written.
void attention_backward(std::span<const float> dout, std::span<const float> qkv, std::span<const float> out,
                        std::span<const float> lse, std::span<float> dqkv, std::size_t B, std::size_t T, std::size_t C,
                        std::size_t NH);

}  // namespace coshard::ops
