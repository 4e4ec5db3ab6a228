#include "coshard/ops/attention.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "blas_internal.hpp"
#include "check.hpp"
#include "isa/cpu_kernels.hpp"
#include "parallel.hpp"
#include "vec_math.hpp"

namespace coshard::ops {

namespace {

// Rows of queries and of keys per tile. 64 x 64 scores (16 KiB) and the tile's accumulators stay
// in L1/L2 for heads up to 128 wide.
constexpr std::size_t kTile = 64;

// One query head of one sequence inside qkv, with its key/value head: row t of q, k and v at
// q + t * ld, etc.
struct Head {
  const float* q;
  const float* k;
  const float* v;
  std::size_t ld;  // (NH + 2 NKV) hs
  std::size_t hs;
  float scale;
};

// A tile product (cpu_kernels.hpp): coshard's kernel where the instruction set has one, else one
// OpenBLAS call on this thread (the heads are already split over the threads), which reads A in
// either layout too; the callers give A with one of its strides 1. The callers checked every
// dimension against INT_MAX once per call.
void product(const detail::CpuKernels& k, const detail::TileGemmArgs& g) {
  if (k.tile_gemm != nullptr) return k.tile_gemm(g);
  const bool ta = g.a_row == 1 && g.a_col != 1;  // A given as its transpose, a_col apart
  detail::sgemm_here(ta, false, g.m, g.n, g.k, g.alpha, g.a, ta ? g.a_col : g.a_row, g.b, g.ldb,
                     g.accumulate ? 1.0f : 0.0f, g.c, g.ldc);
}

// x^T of one head's keys or values, tile by tile: the [hs, 64] block of key tile c0 at
// out + c0 * hs, row d of it holding element d of keys c0 .. c0 + 63. Products with K^T and V^T
// then read B by rows, as both kernels are fastest at, from a block that fits L1.
void transpose_tiles(const float* x, std::size_t ld, std::size_t T, std::size_t hs, float* out) {
  for (std::size_t c0 = 0; c0 < T; c0 += kTile) {
    const std::size_t bc = std::min(kTile, T - c0);
    float* block = out + c0 * hs;
    for (std::size_t j = 0; j < bc; ++j) {
      const float* row = x + (c0 + j) * ld;
      for (std::size_t d = 0; d < hs; ++d) block[d * kTile + j] = row[d];
    }
  }
}

std::size_t tiles_floats(std::size_t T, std::size_t hs) { return (T + kTile - 1) / kTile * kTile * hs; }

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
  std::vector<float> kt;  // the head's K^T (transpose_tiles)
  ForwardScratch(std::size_t T, std::size_t hs) : acc(kTile * hs), kt(tiles_floats(T, hs)) {}
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
    product(k, {br, bc, h.hs, h.scale, h.q + r0 * h.ld, h.ld, 1, w.kt.data() + c0 * h.hs, kTile, false, w.s.data(),
                kTile});
    for (std::size_t r = 0; r < br; ++r) {
      k.attention_online_softmax(w.s.data() + r * kTile, visible(r0, r, c0, bc), bc, &w.m[r], &w.l[r],
                                 w.acc.data() + r * h.hs, h.hs);
    }
    product(k, {br, h.hs, bc, 1.0f, w.s.data(), kTile, 1, h.v + c0 * h.ld, h.ld, true, w.acc.data(), h.hs});
  }
  for (std::size_t r = 0; r < br; ++r) {
    const float inv = 1.0f / w.l[r];
    const float* a = w.acc.data() + r * h.hs;
    float* o = out + (r0 + r) * ldo;
    for (std::size_t i = 0; i < h.hs; ++i) o[i] = a[i] * inv;
    lse[r0 + r] = w.m[r] + std::log(w.l[r]);
  }
}

using Shapes = AttentionShape;

// The GPT-2 form's sizes, in its own terms ([B, T, 3C]), before it becomes an AttentionShape.
void check_gpt2(const char* op, std::span<const float> qkv, std::span<const float> out, std::span<const float> lse,
                std::size_t B, std::size_t T, std::size_t C, std::size_t NH) {
  detail::check_heads(op, C, NH);
  detail::check_positive(op, "T", T);
  detail::check_size(op, "qkv", qkv, B * T * 3 * C, "[B, T, 3C] = " + detail::dims({B, T, 3 * C}));
  detail::check_size(op, "out", out, B * T * C, "[B, T, C] = " + detail::dims({B, T, C}));
  detail::check_size(op, "lse", lse, B * NH * T, "[B, NH, T] = " + detail::dims({B, NH, T}));
}

void check_common(const char* op, std::span<const float> qkv, std::span<const float> out, std::span<const float> lse,
                  const Shapes& s) {
  detail::check_attention_shape(op, s.T, s.heads, s.kv_heads, s.head_size);
  detail::blas_dim(op, "T", s.T);
  detail::blas_dim(op, "(NH + 2 NKV) hs", s.qkv_width());
  detail::check_size(op, "qkv", qkv, s.B * s.T * s.qkv_width(),
                     "[B, T, (NH + 2 NKV) hs] = " + detail::dims({s.B, s.T, s.qkv_width()}));
  detail::check_size(op, "out", out, s.B * s.T * s.out_width(), "[B, T, NH hs] = " + detail::dims({s.B, s.T, s.out_width()}));
  detail::check_size(op, "lse", lse, s.B * s.heads * s.T, "[B, NH, T] = " + detail::dims({s.B, s.heads, s.T}));
}

Shapes gpt2_shape(std::size_t B, std::size_t T, std::size_t C, std::size_t NH) { return {B, T, NH, NH, C / NH}; }

// Query head h of sequence b, with the key/value head it reads.
Head head_of(const float* qkv, const Shapes& s, std::size_t b, std::size_t h) {
  const std::size_t hs = s.head_size, ld = s.qkv_width(), kvh = h / (s.heads / s.kv_heads);
  const float* row = qkv + b * s.T * ld;
  return {row + h * hs, row + (s.heads + kvh) * hs, row + (s.heads + s.kv_heads + kvh) * hs, ld, hs,
          1.0f / std::sqrt(static_cast<float>(hs))};
}

// Heads (or groups of them) [0, n) split into `parts` contiguous runs; each has the same work.
std::size_t first_head(std::size_t heads, std::size_t parts, std::size_t t) { return heads * t / parts; }

// Multiply-adds of a call's tile products, at half the [T, T] scores (the causal half).
double attention_macs(const Shapes& s, std::size_t products) {
  const auto T = static_cast<double>(s.T);
  return static_cast<double>(s.B) * static_cast<double>(s.out_width()) * T * T / 2.0 * static_cast<double>(products);
}

}  // namespace

void attention_forward(std::span<const float> qkv, std::span<float> out, std::span<float> lse, const Shapes& s) {
  constexpr const char* op = "attention_forward";
  check_common(op, qkv, out, lse, s);
  detail::check_disjoint(op, "out", out, "qkv", qkv);
  detail::check_disjoint(op, "lse", lse, "qkv", qkv);
  detail::check_disjoint(op, "lse", lse, "out", out);

  // Query heads are independent, so each thread takes a run of them with scratch of its own.
  const std::size_t heads = s.B * s.heads, hs = s.head_size, T = s.T, ldo = s.out_width();
  const std::size_t parts = detail::threads_for(attention_macs(s, 2), heads);
  std::vector<ForwardScratch> scratch;
  for (std::size_t t = 0; t < parts; ++t) scratch.emplace_back(T, hs);
  (void)detail::cpu_kernels();  // a bad COSHARD_CPU_ISA throws here, on the caller's thread
  detail::run_parts(parts, [&](std::size_t t) {
    ForwardScratch& w = scratch[t];
    for (std::size_t bh = first_head(heads, parts, t); bh < first_head(heads, parts, t + 1); ++bh) {
      const std::size_t b = bh / s.heads, h = bh % s.heads;
      const Head hd = head_of(qkv.data(), s, b, h);
      transpose_tiles(hd.k, hd.ld, T, hs, w.kt.data());
      float* o = out.data() + b * T * ldo + h * hs;
      float* l = lse.data() + bh * T;
      for (std::size_t r0 = 0; r0 < T; r0 += kTile) forward_tile(hd, r0, std::min(kTile, T - r0), o, ldo, l, w);
    }
  });
}

void attention_forward(std::span<const float> qkv, std::span<float> out, std::span<float> lse, std::size_t B,
                       std::size_t T, std::size_t C, std::size_t NH) {
  check_gpt2("attention_forward", qkv, out, lse, B, T, C, NH);
  attention_forward(qkv, out, lse, gpt2_shape(B, T, C, NH));
}

namespace {

// The gradients of one head: rows of dq, dk, dv inside dqkv (stride ld), dout (stride ldo).
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
  std::vector<float> kt, vt;  // the key/value head's K^T and V^T (transpose_tiles)
  std::vector<float> delta;
  BackwardScratch(std::size_t T, std::size_t hs) : kt(tiles_floats(T, hs)), vt(tiles_floats(T, hs)), delta(T) {}
};

// Query tile [r0, r0 + br) against key tile [c0, c0 + bc): recompute P from the saved
// log-sum-exp, then dV += P^T dO, dP = dO V^T, dS = P (dP - delta) scale, dQ += dS K, dK += dS^T Q.
void backward_tile(const Head& h, const HeadGrads& g, std::size_t r0, std::size_t br, std::size_t c0, std::size_t bc,
                   BackwardScratch& w) {
  const detail::CpuKernels& k = detail::cpu_kernels();
  float* p = w.p.data();
  product(k, {br, bc, h.hs, h.scale, h.q + r0 * h.ld, h.ld, 1, w.kt.data() + c0 * h.hs, kTile, false, p, kTile});
  for (std::size_t r = 0; r < br; ++r) k.attention_probabilities(p + r * kTile, visible(r0, r, c0, bc), bc, g.lse[r0 + r]);
  product(k, {bc, h.hs, br, 1.0f, p, 1, kTile, g.dout + r0 * g.ldo, g.ldo, true, g.dv + c0 * h.ld, h.ld});
  float* ds = w.dp.data();
  product(k, {br, bc, h.hs, 1.0f, g.dout + r0 * g.ldo, g.ldo, 1, w.vt.data() + c0 * h.hs, kTile, false, ds, kTile});
  for (std::size_t r = 0; r < br; ++r) k.attention_score_grad(p + r * kTile, ds + r * kTile, bc, g.delta[r0 + r], h.scale);
  product(k, {br, h.hs, bc, 1.0f, ds, kTile, 1, h.k + c0 * h.ld, h.ld, true, g.dq + r0 * h.ld, h.ld});
  product(k, {bc, h.hs, br, 1.0f, ds, 1, kTile, h.q + r0 * h.ld, h.ld, true, g.dk + c0 * h.ld, h.ld});
}

// Every gradient of key/value head `kvh` of sequence b and of the query heads it serves, in their
// order, into dqkv zeroed by the caller: the group is one thread's, so its key and value gradients
// sum in the same order on any thread count.
void backward_group(std::span<const float> dout, std::span<const float> qkv, std::span<const float> out,
                    std::span<const float> lse, std::span<float> dqkv, const Shapes& s, std::size_t b, std::size_t kvh,
                    BackwardScratch& w) {
  const std::size_t T = s.T, ld = s.qkv_width(), ldo = s.out_width(), group = s.heads / s.kv_heads;
  const Head first = head_of(qkv.data(), s, b, kvh * group);
  transpose_tiles(first.k, first.ld, T, first.hs, w.kt.data());
  transpose_tiles(first.v, first.ld, T, first.hs, w.vt.data());
  float* row = dqkv.data() + b * T * ld;
  for (std::size_t h = kvh * group; h < (kvh + 1) * group; ++h) {
    const Head hd = head_of(qkv.data(), s, b, h);
    const std::size_t at = b * T * ldo + h * hd.hs;
    for (std::size_t t = 0; t < T; ++t) w.delta[t] = detail::dot(dout.data() + at + t * ldo, out.data() + at + t * ldo, hd.hs);
    const HeadGrads g{row + h * hd.hs, row + (s.heads + kvh) * hd.hs, row + (s.heads + s.kv_heads + kvh) * hd.hs,
                      dout.data() + at, ldo, lse.data() + (b * s.heads + h) * T, w.delta.data()};
    for (std::size_t c0 = 0; c0 < T; c0 += kTile) {
      for (std::size_t r0 = c0; r0 < T; r0 += kTile)
        backward_tile(hd, g, r0, std::min(kTile, T - r0), c0, std::min(kTile, T - c0), w);
    }
  }
}

}  // namespace

void attention_backward(std::span<const float> dout, std::span<const float> qkv, std::span<const float> out,
                        std::span<const float> lse, std::span<float> dqkv, const Shapes& s) {
  constexpr const char* op = "attention_backward";
  check_common(op, qkv, out, lse, s);
  detail::check_size(op, "dout", dout, s.B * s.T * s.out_width(), "[B, T, NH hs] = " + detail::dims({s.B, s.T, s.out_width()}));
  detail::check_size(op, "dqkv", dqkv, s.B * s.T * s.qkv_width(),
                     "[B, T, (NH + 2 NKV) hs] = " + detail::dims({s.B, s.T, s.qkv_width()}));
  detail::check_disjoint(op, "dqkv", dqkv, "dout", dout);
  detail::check_disjoint(op, "dqkv", dqkv, "qkv", qkv);
  detail::check_disjoint(op, "dqkv", dqkv, "out", out);
  detail::check_disjoint(op, "dqkv", dqkv, "lse", lse);

  std::fill(dqkv.begin(), dqkv.end(), 0.0f);
  const std::size_t groups = s.B * s.kv_heads;
  const std::size_t parts = detail::threads_for(attention_macs(s, 5), groups);
  std::vector<BackwardScratch> scratch;
  for (std::size_t t = 0; t < parts; ++t) scratch.emplace_back(s.T, s.head_size);
  (void)detail::cpu_kernels();
  detail::run_parts(parts, [&](std::size_t t) {
    for (std::size_t g = first_head(groups, parts, t); g < first_head(groups, parts, t + 1); ++g)
      backward_group(dout, qkv, out, lse, dqkv, s, g / s.kv_heads, g % s.kv_heads, scratch[t]);
  });
}

void attention_backward(std::span<const float> dout, std::span<const float> qkv, std::span<const float> out,
                        std::span<const float> lse, std::span<float> dqkv, std::size_t B, std::size_t T, std::size_t C,
                        std::size_t NH) {
  constexpr const char* op = "attention_backward";
  check_gpt2(op, qkv, out, lse, B, T, C, NH);
  detail::check_size(op, "dout", dout, B * T * C, "[B, T, C] = " + detail::dims({B, T, C}));
  detail::check_size(op, "dqkv", dqkv, B * T * 3 * C, "[B, T, 3C] = " + detail::dims({B, T, 3 * C}));
  attention_backward(dout, qkv, out, lse, dqkv, gpt2_shape(B, T, C, NH));
}

}  // namespace coshard::ops
