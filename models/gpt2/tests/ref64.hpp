#pragma once
// A naive float64 GPT-2 forward (loss only) written independently of coshard::ops, for the
// finite-difference gradient checks: parameters by Hugging Face name.
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "coshard/gpt2/config.hpp"

namespace coshard::gpt2::ref64 {

using Params64 = std::map<std::string, std::vector<double>>;

inline void layernorm64(const std::vector<double>& x, const std::vector<double>& w, const std::vector<double>& b,
                        std::vector<double>& y, std::size_t rows, std::size_t C) {
  y.assign(rows * C, 0.0);
  for (std::size_t r = 0; r < rows; ++r) {
    double m = 0, v = 0;
    for (std::size_t c = 0; c < C; ++c) m += x[r * C + c];
    m /= static_cast<double>(C);
    for (std::size_t c = 0; c < C; ++c) v += (x[r * C + c] - m) * (x[r * C + c] - m);
    v /= static_cast<double>(C);
    const double s = 1.0 / std::sqrt(v + 1e-5);
    for (std::size_t c = 0; c < C; ++c) y[r * C + c] = (x[r * C + c] - m) * s * w[c] + b[c];
  }
}

// y[rows, out] = x[rows, in] W[in, out] + b
inline void linear64(const std::vector<double>& x, const std::vector<double>& W, const std::vector<double>& b,
                     std::vector<double>& y, std::size_t rows, std::size_t in, std::size_t out) {
  y.assign(rows * out, 0.0);
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t o = 0; o < out; ++o) {
      double s = b.empty() ? 0.0 : b[o];
      for (std::size_t i = 0; i < in; ++i) s += x[r * in + i] * W[i * out + o];
      y[r * out + o] = s;
    }
  }
}

inline double loss64(const Config& cfg, const Params64& p, const std::vector<std::int32_t>& tokens,
                     const std::vector<std::int32_t>& targets, std::size_t B, std::size_t T) {
  const auto C = static_cast<std::size_t>(cfg.width), NH = static_cast<std::size_t>(cfg.heads), hs = C / NH;
  const auto V = static_cast<std::size_t>(cfg.vocab), BT = B * T;
  const auto& wte = p.at("wte.weight");
  const auto& wpe = p.at("wpe.weight");
  std::vector<double> x(BT * C);
  for (std::size_t n = 0; n < BT; ++n) {
    for (std::size_t c = 0; c < C; ++c) x[n * C + c] = wte[static_cast<std::size_t>(tokens[n]) * C + c] + wpe[(n % T) * C + c];
  }
  std::vector<double> ln, qkv, y(BT * C), proj, fc;
  for (std::int64_t l = 0; l < cfg.layers; ++l) {
    const std::string h = "h." + std::to_string(l) + ".";
    layernorm64(x, p.at(h + "ln_1.weight"), p.at(h + "ln_1.bias"), ln, BT, C);
    linear64(ln, p.at(h + "attn.c_attn.weight"), p.at(h + "attn.c_attn.bias"), qkv, BT, C, 3 * C);
    for (std::size_t b = 0; b < B; ++b) {
      for (std::size_t hh = 0; hh < NH; ++hh) {
        for (std::size_t t = 0; t < T; ++t) {
          const double* q = &qkv[(b * T + t) * 3 * C + hh * hs];
          std::vector<double> s(t + 1);
          double mx = -1e300;
          for (std::size_t u = 0; u <= t; ++u) {
            const double* k = &qkv[(b * T + u) * 3 * C + C + hh * hs];
            double d = 0;
            for (std::size_t i = 0; i < hs; ++i) d += q[i] * k[i];
            s[u] = d / std::sqrt(static_cast<double>(hs));
            mx = std::max(mx, s[u]);
          }
          double z = 0;
          for (auto& v : s) z += (v = std::exp(v - mx));
          for (std::size_t i = 0; i < hs; ++i) {
            double acc = 0;
            for (std::size_t u = 0; u <= t; ++u) acc += s[u] / z * qkv[(b * T + u) * 3 * C + 2 * C + hh * hs + i];
            y[(b * T + t) * C + hh * hs + i] = acc;
          }
        }
      }
    }
    linear64(y, p.at(h + "attn.c_proj.weight"), p.at(h + "attn.c_proj.bias"), proj, BT, C, C);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] += proj[i];
    layernorm64(x, p.at(h + "ln_2.weight"), p.at(h + "ln_2.bias"), ln, BT, C);
    linear64(ln, p.at(h + "mlp.c_fc.weight"), p.at(h + "mlp.c_fc.bias"), fc, BT, C, 4 * C);
    for (auto& v : fc) v = 0.5 * v * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v)));
    linear64(fc, p.at(h + "mlp.c_proj.weight"), p.at(h + "mlp.c_proj.bias"), proj, BT, 4 * C, C);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] += proj[i];
  }
  layernorm64(x, p.at("ln_f.weight"), p.at("ln_f.bias"), ln, BT, C);
  const auto& head = cfg.tie_head ? wte : p.at("lm_head.weight");
  double loss = 0;
  for (std::size_t n = 0; n < BT; ++n) {
    std::vector<double> logits(V);
    double mx = -1e300;
    for (std::size_t v = 0; v < V; ++v) {
      double s = 0;
      for (std::size_t c = 0; c < C; ++c) s += ln[n * C + c] * head[v * C + c];
      logits[v] = s;
      mx = std::max(mx, s);
    }
    double z = 0;
    for (double s : logits) z += std::exp(s - mx);
    loss += mx + std::log(z) - logits[static_cast<std::size_t>(targets[n])];
  }
  return loss / static_cast<double>(BT);
}

}  // namespace coshard::gpt2::ref64
