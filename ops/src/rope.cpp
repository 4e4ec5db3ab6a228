#include "coshard/ops/rope.hpp"

#include <cmath>
#include <string>
#include <vector>

#include "check.hpp"
#include "isa/cpu_kernels.hpp"
#include "parallel.hpp"

namespace coshard::ops {

namespace {

double llama3_scaled(double inv_freq, const RopeScaling& s) {
  const double wavelen = 2.0 * M_PI / inv_freq;
  if (wavelen < s.original_context / s.high_freq_factor) return inv_freq;
  if (wavelen > s.original_context / s.low_freq_factor) return inv_freq / s.factor;
  const double smooth = (s.original_context / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
  return (1.0 - smooth) * inv_freq / s.factor + smooth * inv_freq;
}

void rotate(const char* op, const char* name, std::span<float> x, std::span<const float> cos,
            std::span<const float> sin, const AttentionShape& s, float sign) {
  detail::check_rope(op, name, x, cos, sin, s);
  detail::check_disjoint(op, name, x, "cos", cos);
  detail::check_disjoint(op, name, x, "sin", sin);
  const std::size_t half = s.head_size / 2, ld = s.qkv_width(), rows = s.B * s.T;
  const detail::CpuKernels& k = detail::cpu_kernels();
  // Rows are independent; within a row the query and key heads are the first NH + NKV.
  detail::split_range(rows, 1, static_cast<double>((s.heads + s.kv_heads) * s.head_size) * detail::kElementMacs,
                      [&](std::size_t b, std::size_t e) {
                        for (std::size_t r = b; r < e; ++r) {
                          const std::size_t t = r % s.T;
                          k.rope_rotate(x.data() + r * ld, cos.data() + t * half, sin.data() + t * half,
                                        s.heads + s.kv_heads, s.head_size, sign);
                        }
                      });
}

}  // namespace

void rope_table(std::span<float> cos, std::span<float> sin, std::size_t P, std::size_t head_size, double theta,
                const RopeScaling* scaling) {
  constexpr const char* op = "rope_table";
  detail::check_rope_head(op, head_size);
  if (!(theta > 1.0) || !std::isfinite(theta)) detail::fail(op, "theta must be a finite number above 1, got " + std::to_string(theta));
  if (scaling && (!(scaling->factor >= 1.0) || !(scaling->high_freq_factor > scaling->low_freq_factor) ||
                  !(scaling->low_freq_factor > 0.0) || !(scaling->original_context > 0.0))) {
    detail::fail(op, "llama3 rope scaling needs factor >= 1, 0 < low_freq_factor < high_freq_factor and a positive "
                     "original context");
  }
  const std::size_t half = head_size / 2;
  detail::check_size(op, "cos", cos, P * half, "[P, hs/2] = " + detail::dims({P, half}));
  detail::check_size(op, "sin", sin, P * half, "[P, hs/2] = " + detail::dims({P, half}));
  std::vector<double> inv(half);
  for (std::size_t i = 0; i < half; ++i) {
    inv[i] = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(head_size));
    if (scaling) inv[i] = llama3_scaled(inv[i], *scaling);
  }
  for (std::size_t t = 0; t < P; ++t) {
    for (std::size_t i = 0; i < half; ++i) {
      const double a = static_cast<double>(t) * inv[i];
      cos[t * half + i] = static_cast<float>(std::cos(a));
      sin[t * half + i] = static_cast<float>(std::sin(a));
    }
  }
}

void rope_forward(std::span<float> qkv, std::span<const float> cos, std::span<const float> sin,
                  const AttentionShape& shape) {
  rotate("rope_forward", "qkv", qkv, cos, sin, shape, 1.0f);
}

void rope_backward(std::span<float> dqkv, std::span<const float> cos, std::span<const float> sin,
                   const AttentionShape& shape) {
  rotate("rope_backward", "dqkv", dqkv, cos, sin, shape, -1.0f);
}

}  // namespace coshard::ops
