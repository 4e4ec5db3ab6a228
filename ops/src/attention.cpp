#include "coshard/ops/attention.hpp"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "blas_internal.hpp"
#include "check.hpp"
#include "isa/cpu_kernels.hpp"
#include "vec_math.hpp"

namespace coshard::ops {

namespace {

// Rows of queries and of keys per tile. 64 x 64 scores (16 KiB) and the tile's accumulators stay
// in L1/L2 for heads up to 128 wide, and the tile GEMMs are large enough for OpenBLAS's kernels.
constexpr std::size_t kTile = 64;

// One head of one sequence inside qkv [B, T, 3C]: row t of q, k and v at q + t * ld, etc.
struct Head {
  const float* q;
  const float* k;
  const float* v;
  std::size_t ld;  // 3C
  std::size_t hs;
  float scale;
};

// Row-major C[m, n] = alpha op(A) op(B) + beta C with leading dimensions; the callers checked
// every dimension against INT_MAX once per call.
void gemm(bool ta, bool tb, std::size_t m, std::size_t n, std::size_t k, float alpha, const float* a, std::size_t lda,
          const float* b, std::size_t ldb, float beta, float* c, std::size_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<int>(m),
              static_cast<int>(n), static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb),
              beta, c, static_cast<int>(ldc));
}

// Columns of score row `r` of the tile (query r0 + r, keys from c0, bc of them) that the causal
// mask leaves visible. Callers only pair query tiles with key tiles at or before them (c0 <= r0),
// so every row sees at least one key.
std::size_t visible(std::size_t r0, std::size_t r, std::size_t c0, std::size_t bc) {
  return std::min(bc, r0 + r + 1 - c0);
}

struct ForwardScratch {
  std::vector<float> s = std::vector<float>(kTile * kTile);
  std::vector<float> acc;  // [kTile, hs]: the unnormalised output rows
  std::vector<float> m = std::vector<float>(kTile), l = std::vector<float>(kTile);
  explicit ForwardScratch(std::size_t hs) : acc(kTile * hs) {}
};

// Queries [r0, r0 + br) of one head against every key tile up to the diagonal.
void forward_tile(const Head& h, std::size_t r0, std::size_t br, float* out, std::size_t ldo, float* lse,
                  ForwardScratch& w) {
  const detail::CpuKernels& k = detail::cpu_kernels();
  std::fill(w.acc.begin(), w.acc.end(), 0.0f);
  std::fill(w.m.begin(), w.m.end(), -std::numeric_limits<float>::infinity());
  std::fill(w.l.begin(), w.l.end(), 0.0f);
  for (std::size_t c0 = 0; c0 < r0 + br; c0 += kTile) {
    const std::size_t bc = std::min(kTile, r0 + br - c0);
    gemm(false, true, br, bc, h.hs, h.scale, h.q + r0 * h.ld, h.ld, h.k + c0 * h.ld, h.ld, 0.0f, w.s.data(), kTile);
    for (std::size_t r = 0; r < br; ++r) {
      k.attention_online_softmax(w.s.data() + r * kTile, visible(r0, r, c0, bc), bc, &w.m[r], &w.l[r],
                                 w.acc.data() + r * h.hs, h.hs);
    }
    gemm(false, false, br, h.hs, bc, 1.0f, w.s.data(), kTile, h.v + c0 * h.ld, h.ld, 1.0f, w.acc.data(), h.hs);
  }
  for (std::size_t r = 0; r < br; ++r) {
    const float inv = 1.0f / w.l[r];
    const float* a = w.acc.data() + r * h.hs;
    float* o = out + (r0 + r) * ldo;
    for (std::size_t i = 0; i < h.hs; ++i) o[i] = a[i] * inv;
    lse[r0 + r] = w.m[r] + std::log(w.l[r]);
  }
}

struct Shapes {
  std::size_t B, T, C, NH;
};

void check_common(const char* op, std::span<const float> qkv, std::span<const float> out, std::span<const float> lse,
                  const Shapes& s) {
  detail::check_heads(op, s.C, s.NH);
  detail::check_positive(op, "T", s.T);
  detail::blas_dim(op, "T", s.T);
  detail::blas_dim(op, "3C", 3 * s.C);
  detail::check_size(op, "qkv", qkv, s.B * s.T * 3 * s.C, "[B, T, 3C] = " + detail::dims({s.B, s.T, 3 * s.C}));
  detail::check_size(op, "out", out, s.B * s.T * s.C, "[B, T, C] = " + detail::dims({s.B, s.T, s.C}));
  detail::check_size(op, "lse", lse, s.B * s.NH * s.T, "[B, NH, T] = " + detail::dims({s.B, s.NH, s.T}));
}

Head head_of(const float* qkv, const Shapes& s, std::size_t b, std::size_t h) {
  const std::size_t hs = s.C / s.NH, ld = 3 * s.C;
  const float* base = qkv + b * s.T * ld + h * hs;
  return {base, base + s.C, base + 2 * s.C, ld, hs, 1.0f / std::sqrt(static_cast<float>(hs))};
}

}  // namespace

void attention_forward(std::span<const float> qkv, std::span<float> out, std::span<float> lse, std::size_t B,
                       std::size_t T, std::size_t C, std::size_t NH) {
  constexpr const char* op = "attention_forward";
  const Shapes s{B, T, C, NH};
  check_common(op, qkv, out, lse, s);
  detail::check_disjoint(op, "out", out, "qkv", qkv);
  detail::check_disjoint(op, "lse", lse, "qkv", qkv);
  detail::check_disjoint(op, "lse", lse, "out", out);
  detail::apply_default_blas_threads();

  ForwardScratch w(C / NH);
  for (std::size_t b = 0; b < B; ++b) {
    for (std::size_t h = 0; h < NH; ++h) {
      const Head hd = head_of(qkv.data(), s, b, h);
      float* o = out.data() + b * T * C + h * hd.hs;
      float* l = lse.data() + (b * NH + h) * T;
      for (std::size_t r0 = 0; r0 < T; r0 += kTile) forward_tile(hd, r0, std::min(kTile, T - r0), o, C, l, w);
    }
  }
}

namespace {

// The gradients of one head: rows of dq, dk, dv inside dqkv (stride 3C), dout (stride C).
struct HeadGrads {
  float* dq;
  float* dk;
  float* dv;
  const float* dout;
  std::size_t ldo;
  const float* lse;
  const float* delta;  // rowsum(dout * out), per query
};

struct BackwardScratch {
  std::vector<float> p = std::vector<float>(kTile * kTile), dp = std::vector<float>(kTile * kTile);
};

// Query tile [r0, r0 + br) against key tile [c0, c0 + bc): recompute P from the saved
// log-sum-exp, then dV += P^T dO, dP = dO V^T, dS = P (dP - delta) scale, dQ += dS K, dK += dS^T Q.
void backward_tile(const Head& h, const HeadGrads& g, std::size_t r0, std::size_t br, std::size_t c0, std::size_t bc,
                   BackwardScratch& w) {
  const detail::CpuKernels& k = detail::cpu_kernels();
  float* p = w.p.data();
  gemm(false, true, br, bc, h.hs, h.scale, h.q + r0 * h.ld, h.ld, h.k + c0 * h.ld, h.ld, 0.0f, p, kTile);
  for (std::size_t r = 0; r < br; ++r) k.attention_probabilities(p + r * kTile, visible(r0, r, c0, bc), bc, g.lse[r0 + r]);
  gemm(true, false, bc, h.hs, br, 1.0f, p, kTile, g.dout + r0 * g.ldo, g.ldo, 1.0f, g.dv + c0 * h.ld, h.ld);
  float* ds = w.dp.data();
  gemm(false, true, br, bc, h.hs, 1.0f, g.dout + r0 * g.ldo, g.ldo, h.v + c0 * h.ld, h.ld, 0.0f, ds, kTile);
  for (std::size_t r = 0; r < br; ++r) k.attention_score_grad(p + r * kTile, ds + r * kTile, bc, g.delta[r0 + r], h.scale);
  gemm(false, false, br, h.hs, bc, 1.0f, ds, kTile, h.k + c0 * h.ld, h.ld, 1.0f, g.dq + r0 * h.ld, h.ld);
  gemm(true, false, bc, h.hs, br, 1.0f, ds, kTile, h.q + r0 * h.ld, h.ld, 1.0f, g.dk + c0 * h.ld, h.ld);
}

}  // namespace

void attention_backward(std::span<const float> dout, std::span<const float> qkv, std::span<const float> out,
                        std::span<const float> lse, std::span<float> dqkv, std::size_t B, std::size_t T, std::size_t C,
                        std::size_t NH) {
  constexpr const char* op = "attention_backward";
  const Shapes s{B, T, C, NH};
  check_common(op, qkv, out, lse, s);
  detail::check_size(op, "dout", dout, B * T * C, "[B, T, C] = " + detail::dims({B, T, C}));
  detail::check_size(op, "dqkv", dqkv, B * T * 3 * C, "[B, T, 3C] = " + detail::dims({B, T, 3 * C}));
  detail::check_disjoint(op, "dqkv", dqkv, "dout", dout);
  detail::check_disjoint(op, "dqkv", dqkv, "qkv", qkv);
  detail::check_disjoint(op, "dqkv", dqkv, "out", out);
  detail::check_disjoint(op, "dqkv", dqkv, "lse", lse);
  detail::apply_default_blas_threads();

  std::fill(dqkv.begin(), dqkv.end(), 0.0f);
  BackwardScratch w;
  std::vector<float> delta(T);
  for (std::size_t b = 0; b < B; ++b) {
    for (std::size_t h = 0; h < NH; ++h) {
      const Head hd = head_of(qkv.data(), s, b, h);
      const std::size_t first = b * T * C + h * hd.hs;
      for (std::size_t t = 0; t < T; ++t) {
        delta[t] = detail::dot(dout.data() + first + t * C, out.data() + first + t * C, hd.hs);
      }
      float* dq = dqkv.data() + b * T * 3 * C + h * hd.hs;
      const HeadGrads g{dq, dq + C, dq + 2 * C, dout.data() + first, C, lse.data() + (b * NH + h) * T, delta.data()};
      for (std::size_t c0 = 0; c0 < T; c0 += kTile) {
        for (std::size_t r0 = c0; r0 < T; r0 += kTile)
          backward_tile(hd, g, r0, std::min(kTile, T - r0), c0, std::min(kTile, T - c0), w);
      }
    }
  }
}

}  // namespace coshard::ops
