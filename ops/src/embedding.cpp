#include "coshard/ops/embedding.hpp"

#include <string>

#include "check.hpp"
#include "coshard/kernels/cast.hpp"

namespace coshard::ops {

namespace {

void check_common(const char* op, std::span<const std::int32_t> tokens, std::size_t wte_size, std::size_t wpe_size,
                  std::size_t out_size, std::size_t B, std::size_t T, std::size_t C, std::size_t V, bool optional) {
  detail::check_embedding_shapes(op, tokens.size(), wte_size, wpe_size, out_size, B, T, C, V, optional);
  for (std::size_t n = 0; n < tokens.size(); ++n) {
    const std::int32_t id = tokens[n];
    if (id < 0 || static_cast<std::size_t>(id) >= V) detail::fail_token(op, id, n, T, V);
  }
}

float widen(float x) { return x; }
float widen(std::uint16_t h) { return kernels::bf16_to_f32(h); }

template <class W>
void forward(std::span<const std::int32_t> tokens, std::span<const W> wte, std::span<const W> wpe, std::span<float> out,
             std::size_t B, std::size_t T, std::size_t C, std::size_t V) {
  constexpr const char* op = "embedding_forward";
  check_common(op, tokens, wte.size(), wpe.size(), out.size(), B, T, C, V, false);
  detail::check_disjoint(op, "out", out, "wte", wte);
  detail::check_disjoint(op, "out", out, "wpe", wpe);
  for (std::size_t b = 0; b < B; ++b) {
    for (std::size_t t = 0; t < T; ++t) {
      const std::size_t n = b * T + t;
      const W* __restrict e = wte.data() + static_cast<std::size_t>(tokens[n]) * C;
      float* __restrict o = out.data() + n * C;
      if (wpe.empty()) {  // no position table (Llama's positions are rotary)
        for (std::size_t i = 0; i < C; ++i) o[i] = widen(e[i]);
        continue;
      }
      const W* __restrict p = wpe.data() + t * C;
      for (std::size_t i = 0; i < C; ++i) o[i] = widen(e[i]) + widen(p[i]);
    }
  }
}

}  // namespace

void embedding_forward(std::span<const std::int32_t> tokens, std::span<const float> wte, std::span<const float> wpe,
                       std::span<float> out, std::size_t B, std::size_t T, std::size_t C, std::size_t V) {
  forward(tokens, wte, wpe, out, B, T, C, V);
}

void embedding_forward(std::span<const std::int32_t> tokens, std::span<const std::uint16_t> wte,
                       std::span<const std::uint16_t> wpe, std::span<float> out, std::size_t B, std::size_t T,
                       std::size_t C, std::size_t V) {
  forward(tokens, wte, wpe, out, B, T, C, V);
}

void embedding_backward(std::span<const float> dout, std::span<const std::int32_t> tokens, std::span<float> dwte,
                        std::span<float> dwpe, std::size_t B, std::size_t T, std::size_t C, std::size_t V) {
  constexpr const char* op = "embedding_backward";
  check_common(op, tokens, dwte.size(), dwpe.size(), dout.size(), B, T, C, V, true);
  detail::check_disjoint(op, "dwte", dwte, "dout", dout);
  detail::check_disjoint(op, "dwpe", dwpe, "dout", dout);
  detail::check_disjoint(op, "dwte", dwte, "dwpe", dwpe);
  for (std::size_t b = 0; b < B; ++b) {
    for (std::size_t t = 0; t < T; ++t) {
      const std::size_t n = b * T + t;
      const float* __restrict g = dout.data() + n * C;
      // A token repeated in the batch adds into the same row; rows are updated one at a time.
      if (!dwte.empty()) {
        float* __restrict e = dwte.data() + static_cast<std::size_t>(tokens[n]) * C;
        for (std::size_t i = 0; i < C; ++i) e[i] += g[i];
      }
      if (!dwpe.empty()) {
        float* __restrict p = dwpe.data() + t * C;
        for (std::size_t i = 0; i < C; ++i) p[i] += g[i];
      }
    }
  }
}

}  // namespace coshard::ops
