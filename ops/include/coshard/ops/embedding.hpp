#pragma once
// Token plus position embedding: out[b, t, :] = wte[tokens[b, t], :] + wpe[t, :], or the token's
// row alone where the model has no position table (Llama: wpe empty).
#include <cstddef>
#include <cstdint>
#include <span>

namespace coshard::ops {

/// tokens [B, T] with ids in [0, V) (else Errc::invalid_argument naming the position);
/// wte [V, C]; wpe [P, C] with P >= T (the model's context length; rows past T are unused), or empty;
/// out [B, T, C].
void embedding_forward(std::span<const std::int32_t> tokens, std::span<const float> wte, std::span<const float> wpe,
                       std::span<float> out, std::size_t B, std::size_t T, std::size_t C, std::size_t V);

/// The same with bf16 tables (mixed precision's all-gathered bits): out is exact (each bf16 widened,
/// then one f32 add).
void embedding_forward(std::span<const std::int32_t> tokens, std::span<const std::uint16_t> wte,
                       std::span<const std::uint16_t> wpe, std::span<float> out, std::size_t B, std::size_t T,
                       std::size_t C, std::size_t V);

/// dout [B, T, C]; dwte (shape of wte) and dwpe (shape of wpe) are accumulated, either may be empty.
void embedding_backward(std::span<const float> dout, std::span<const std::int32_t> tokens, std::span<float> dwte,
                        std::span<float> dwpe, std::size_t B, std::size_t T, std::size_t C, std::size_t V);

}  // namespace coshard::ops
