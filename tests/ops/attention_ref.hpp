#pragma once
// The float64 reference of the attention suites: causal multi-head attention on qkv [B, T, 3C]
// (C = NH hs), written from the definition.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

namespace coshard::testing {

// Naive causal attention in float64, written from the definition with the whole [T, T] matrix:
// per (b, h), S = Q K^T / sqrt(hs) with -inf above the diagonal, P = softmax(S) by rows, O = P V.
// Also gives each row's log-sum-exp and, given dO, the gradient of qkv (the textbook backward of
// softmax and two matrix products, sharing nothing with the tiled kernel).
struct Reference {
  std::vector<double> out, lse, dqkv;
};

inline Reference ref_mha(const std::vector<double>& qkv, std::size_t B, std::size_t T, std::size_t NH, std::size_t hs,
                         const std::vector<double>* dout = nullptr) {
  const std::size_t C = NH * hs;
  Reference r{std::vector<double>(B * T * C, 0.0), std::vector<double>(B * NH * T), std::vector<double>(B * T * 3 * C, 0.0)};
  auto at = [&](std::size_t b, std::size_t t, std::size_t part, std::size_t h, std::size_t i) {
    return (b * T + t) * 3 * C + part * C + h * hs + i;
  };
  for (std::size_t b = 0; b < B; ++b) {
    for (std::size_t h = 0; h < NH; ++h) {
      for (std::size_t t = 0; t < T; ++t) {
        std::vector<double> p(t + 1);
        double mx = -INFINITY;
        for (std::size_t j = 0; j <= t; ++j) {
          double d = 0.0;
          for (std::size_t i = 0; i < hs; ++i) d += qkv[at(b, t, 0, h, i)] * qkv[at(b, j, 1, h, i)];
          p[j] = d / std::sqrt(static_cast<double>(hs));
          mx = std::max(mx, p[j]);
        }
        double sum = 0.0;
        for (auto& v : p) sum += (v = std::exp(v - mx));
        for (auto& v : p) v /= sum;
        r.lse[(b * NH + h) * T + t] = mx + std::log(sum);
        for (std::size_t j = 0; j <= t; ++j)
          for (std::size_t i = 0; i < hs; ++i) r.out[(b * T + t) * C + h * hs + i] += p[j] * qkv[at(b, j, 2, h, i)];
        if (dout == nullptr) continue;
        // dP_j = dO . v_j; dS_j = P_j (dP_j - sum_k P_k dP_k) / sqrt(hs); dq += dS_j k_j; dk_j += dS_j q.
        const double* g = dout->data() + (b * T + t) * C + h * hs;
        std::vector<double> dp(t + 1, 0.0);
        double pdp = 0.0;
        for (std::size_t j = 0; j <= t; ++j) {
          for (std::size_t i = 0; i < hs; ++i) {
            dp[j] += g[i] * qkv[at(b, j, 2, h, i)];
            r.dqkv[at(b, j, 2, h, i)] += p[j] * g[i];
          }
          pdp += p[j] * dp[j];
        }
        for (std::size_t j = 0; j <= t; ++j) {
          const double ds = p[j] * (dp[j] - pdp) / std::sqrt(static_cast<double>(hs));
          for (std::size_t i = 0; i < hs; ++i) {
            r.dqkv[at(b, t, 0, h, i)] += ds * qkv[at(b, j, 1, h, i)];
            r.dqkv[at(b, j, 1, h, i)] += ds * qkv[at(b, t, 0, h, i)];
          }
        }
      }
    }
  }
  return r;
}

}  // namespace coshard::testing
