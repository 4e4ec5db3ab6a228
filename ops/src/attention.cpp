#include "coshard/ops/attention.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "check.hpp"

namespace coshard::ops {

namespace {

float dot(const float* __restrict a, const float* __restrict b, std::size_t n) {
  float s = 0.0f;
  for (std::size_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

void axpy(float alpha, const float* __restrict x, float* __restrict y, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

}  // namespace

void attention_forward(std::span<const float> qkv, std::span<float> out, std::span<float> att, std::size_t B,
                       std::size_t T, std::size_t C, std::size_t NH) {
  constexpr const char* op = "attention_forward";
  detail::check_heads(op, C, NH);
  detail::check_size(op, "qkv", qkv, B * T * 3 * C, "[B, T, 3C] = " + detail::dims({B, T, 3 * C}));
  detail::check_size(op, "out", out, B * T * C, "[B, T, C] = " + detail::dims({B, T, C}));
  detail::check_size(op, "att", att, B * NH * T * T, "[B, NH, T, T] = " + detail::dims({B, NH, T, T}));
  detail::check_disjoint(op, "out", out, "qkv", qkv);
  detail::check_disjoint(op, "att", att, "qkv", qkv);
  detail::check_disjoint(op, "att", att, "out", out);

  const std::size_t hs = C / NH;
  const std::size_t C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  for (std::size_t b = 0; b < B; ++b) {
    const float* base = qkv.data() + b * T * C3;
    for (std::size_t h = 0; h < NH; ++h) {
      for (std::size_t t = 0; t < T; ++t) {
        const float* q = base + t * C3 + h * hs;
        float* a = att.data() + ((b * NH + h) * T + t) * T;
        float mx = -INFINITY;
        for (std::size_t j = 0; j <= t; ++j) {
          const float s = dot(q, base + j * C3 + C + h * hs, hs) * scale;
          a[j] = s;
          mx = std::max(mx, s);
        }
        float sum = 0.0f;
        for (std::size_t j = 0; j <= t; ++j) {
          a[j] = std::exp(a[j] - mx);
          sum += a[j];
        }
        const float inv = 1.0f / sum;
        for (std::size_t j = 0; j <= t; ++j) a[j] *= inv;
        // Masked positions hold exact zeros so att is the full probability matrix.
        std::fill(a + t + 1, a + T, 0.0f);
        float* o = out.data() + (b * T + t) * C + h * hs;
        std::fill(o, o + hs, 0.0f);
        for (std::size_t j = 0; j <= t; ++j) axpy(a[j], base + j * C3 + 2 * C + h * hs, o, hs);
      }
    }
  }
}

void attention_backward(std::span<const float> dout, std::span<const float> qkv, std::span<const float> att,
                        std::span<float> dqkv, std::size_t B, std::size_t T, std::size_t C, std::size_t NH) {
  constexpr const char* op = "attention_backward";
  detail::check_heads(op, C, NH);
  detail::check_size(op, "dout", dout, B * T * C, "[B, T, C] = " + detail::dims({B, T, C}));
  detail::check_size(op, "qkv", qkv, B * T * 3 * C, "[B, T, 3C] = " + detail::dims({B, T, 3 * C}));
  detail::check_size(op, "att", att, B * NH * T * T, "[B, NH, T, T] = " + detail::dims({B, NH, T, T}));
  detail::check_size(op, "dqkv", dqkv, B * T * 3 * C, "[B, T, 3C] = " + detail::dims({B, T, 3 * C}));
  detail::check_disjoint(op, "dqkv", dqkv, "dout", dout);
  detail::check_disjoint(op, "dqkv", dqkv, "qkv", qkv);
  detail::check_disjoint(op, "dqkv", dqkv, "att", att);

  const std::size_t hs = C / NH;
  const std::size_t C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  std::fill(dqkv.begin(), dqkv.end(), 0.0f);
  std::vector<float> datt(T);  // one row's gradient w.r.t. the probabilities, then the scores
  for (std::size_t b = 0; b < B; ++b) {
    const float* base = qkv.data() + b * T * C3;
    float* dbase = dqkv.data() + b * T * C3;
    for (std::size_t h = 0; h < NH; ++h) {
      for (std::size_t t = 0; t < T; ++t) {
        const float* a = att.data() + ((b * NH + h) * T + t) * T;
        const float* g = dout.data() + (b * T + t) * C + h * hs;
        // out_t = sum_j a_j v_j: d a_j = g . v_j and d v_j += a_j g.
        float* dp = datt.data();
        float a_dot_da = 0.0f;
        for (std::size_t j = 0; j <= t; ++j) {
          dp[j] = dot(g, base + j * C3 + 2 * C + h * hs, hs);
          a_dot_da += a[j] * dp[j];
          axpy(a[j], g, dbase + j * C3 + 2 * C + h * hs, hs);
        }
        // Softmax backward over the unmasked prefix only (masked probabilities are 0 and their
        // scores never influence the output): ds_j = a_j (da_j - sum_k a_k da_k).
        for (std::size_t j = 0; j <= t; ++j) dp[j] = a[j] * (dp[j] - a_dot_da) * scale;
        // s_j = scale q . k_j: dq += ds_j k_j, dk_j += ds_j q.
        const float* q = base + t * C3 + h * hs;
        float* dq = dbase + t * C3 + h * hs;
        for (std::size_t j = 0; j <= t; ++j) {
          axpy(dp[j], base + j * C3 + C + h * hs, dq, hs);
          axpy(dp[j], q, dbase + j * C3 + C + h * hs, hs);
        }
      }
    }
  }
}

}  // namespace coshard::ops
