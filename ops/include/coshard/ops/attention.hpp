#pragma once
// Causal self-attention on a fused projection qkv [B, T, (NH + 2 NKV) hs]: each row holds the NH
// query heads, then the NKV key heads, then the NKV value heads, hs elements each. Query head h
// attends with key/value head h / (NH / NKV): NKV = NH is multi-head attention (GPT-2's c_attn
// output, [B, T, 3C] with hs = C / NH), fewer key/value heads grouped-query attention (Llama's),
// which reads each key/value head from its one place in qkv rather than repeating it. Scores are
// scaled by 1/sqrt(hs); position t attends to positions <= t. The output [B, T, NH hs] has the
// heads concatenated (the input of the output projection).
#include <cstddef>
#include <span>

namespace coshard::ops {

/// The sizes of an attention call.
struct AttentionShape {
  std::size_t B = 0;          ///< sequences
  std::size_t T = 0;          ///< positions of each
  std::size_t heads = 0;      ///< NH, query heads
  std::size_t kv_heads = 0;   ///< NKV, key and value heads, dividing NH
  std::size_t head_size = 0;  ///< hs
  /// Elements of a row of qkv: (NH + 2 NKV) hs.
  std::size_t qkv_width() const noexcept { return (heads + 2 * kv_heads) * head_size; }
  /// Elements of a row of the output: NH hs.
  std::size_t out_width() const noexcept { return heads * head_size; }
};

/// Flash-attention style: the scores are computed a tile of 64 queries x 64 keys at a time with an
/// online softmax, key tiles above the diagonal are skipped, and no [T, T] matrix is ever held, so
/// memory grows linearly with T. lse [B, NH, T] is written with each query's log-sum-exp of its
/// scaled scores; the backward recomputes the probabilities from it.
void attention_forward(std::span<const float> qkv, std::span<float> out, std::span<float> lse,
                       const AttentionShape& shape);

/// dout [B, T, NH hs]; qkv, out and lse as the forward left them; dqkv [B, T, (NH + 2 NKV) hs] is
/// written (a key/value head's gradient sums over the query heads it serves, in their order).
void attention_backward(std::span<const float> dout, std::span<const float> qkv, std::span<const float> out,
                        std::span<const float> lse, std::span<float> dqkv, const AttentionShape& shape);

/// Multi-head attention in GPT-2's terms: qkv [B, T, 3C], out [B, T, C], NH heads of C / NH.
void attention_forward(std::span<const float> qkv, std::span<float> out, std::span<float> lse, std::size_t B,
                       std::size_t T, std::size_t C, std::size_t NH);

/// The backward of that: dout [B, T, C], dqkv [B, T, 3C].
void attention_backward(std::span<const float> dout, std::span<const float> qkv, std::span<const float> out,
                        std::span<const float> lse, std::span<float> dqkv, std::size_t B, std::size_t T, std::size_t C,
                        std::size_t NH);

}  // namespace coshard::ops
