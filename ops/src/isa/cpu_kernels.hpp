#pragma once
// The loops of the element-wise CPU ops, compiled once per instruction set and chosen once per
// process (as PyTorch's ATen compiles its CPU kernels for DEFAULT, AVX2 and AVX512): the ops keep
// their argument checks and call through this table. OpenBLAS picks its own kernels the same way.
//
// kernels.cpp is built three times on x86-64: baseline (SSE2), x86-64-v3 (AVX2) and x86-64-v4
// (AVX-512), each inside its own namespace (COSHARD_ISA_NS), and elsewhere once. Every table gives
// the same bits: the loops are plain IEEE operations without contraction (-ffp-contract=off), the
// reductions have a fixed order (vec_math.hpp), and only the vector width differs.
#include <cstddef>
#include <cstdint>

#include "coshard/kernels/elementwise.hpp"

namespace coshard::ops::detail {

using AdamWScalars = kernels::AdamWScalars;

// C[i, j] = alpha sum_p A(i, p) B[p, j], plus C[i, j] when accumulating, for i < m, j < n, p < k.
// A(i, p) = a[i * a_row + p * a_col], so A may be given transposed; B's rows are contiguous, ldb
// apart; C's rows are ldc apart.
struct TileGemmArgs {
  std::size_t m, n, k;
  float alpha;
  const float* a;
  std::size_t a_row, a_col;
  const float* b;
  std::size_t ldb;
  bool accumulate;
  float* c;
  std::size_t ldc;
};

struct CpuKernels {
  const char* isa;  // "baseline", "avx2", "avx512"
  void (*gelu_forward)(const float* x, float* y, std::size_t n);
  void (*gelu_backward)(const float* dy, const float* x, float* dx, std::size_t n);
  void (*layernorm_forward)(const float* x, const float* w, const float* b, float* y, float* mean, float* rstd,
                            std::size_t rows, std::size_t C, float eps);
  void (*layernorm_backward)(const float* dy, const float* x, const float* w, const float* mean, const float* rstd,
                             float* dx, std::size_t rows, std::size_t C);
  // dw[i] += sum_r dy[r, i] n[r, i], db[i] += sum_r dy[r, i], the rows summed in order, over `cols`
  // columns of rows `ld` apart: a block of columns is the same sum whatever the blocks. dw and db
  // may be null (not wanted).
  void (*layernorm_param_grads)(const float* dy, const float* x, const float* mean, const float* rstd, float* dw,
                                float* db, std::size_t rows, std::size_t cols, std::size_t ld);
  // RMSNorm (Llama's): y = w (x rstd), rstd = 1 / sqrt(mean(x^2) + eps) per row, saved.
  void (*rmsnorm_forward)(const float* x, const float* w, float* y, float* rstd, std::size_t rows, std::size_t C,
                          float eps);
  void (*rmsnorm_backward)(const float* dy, const float* x, const float* w, const float* rstd, float* dx,
                           std::size_t rows, std::size_t C);
  // dw[i] += sum_r dy[r, i] x[r, i] rstd[r], the rows in order, over `cols` columns of rows `ld` apart.
  void (*rmsnorm_weight_grad)(const float* dy, const float* x, const float* rstd, float* dw, std::size_t rows,
                              std::size_t cols, std::size_t ld);
  // SwiGLU: y = silu(gate) up; dgate = dy up silu'(gate), dup = dy silu(gate).
  void (*swiglu_forward)(const float* gate, const float* up, float* y, std::size_t n);
  void (*swiglu_backward)(const float* dy, const float* gate, const float* up, float* dgate, float* dup,
                          std::size_t n);
  // Rotates `heads` heads of hs elements at x in place, Hugging Face's rotate_half pairs (i, i + hs/2)
  // by the angles whose cos and sin [hs/2] are given: sign -1 rotates back (the backward).
  void (*rope_rotate)(float* x, const float* cos, const float* sin, std::size_t heads, std::size_t hs, float sign);
  // Per row of logits [N, V]: lse[n] = log sum exp z; returns sum_n (lse[n] - z[n, target[n]]) in double.
  double (*cross_entropy_forward)(const float* z, const std::int32_t* targets, float* lse, std::size_t N,
                                  std::size_t V);
  void (*cross_entropy_backward)(const float* z, const std::int32_t* targets, const float* lse, float* d,
                                 std::size_t N, std::size_t V, float scale);
  // Attention tiles: one score row against a new running max (masked columns [vis, bc) become 0,
  // acc [hs] is rescaled), the probabilities from a saved log-sum-exp, and dS = P (dP - delta) scale.
  void (*attention_online_softmax)(float* row, std::size_t vis, std::size_t bc, float* m, float* l, float* acc,
                                   std::size_t hs);
  void (*attention_probabilities)(float* row, std::size_t vis, std::size_t bc, float lse);
  void (*attention_score_grad)(const float* p, float* dp, std::size_t bc, float delta, float scale);
  // The tile products, where this instruction set has a kernel of coshard's own (AVX-512: the
  // tiles are too small for OpenBLAS to be at its best); null elsewhere, and OpenBLAS computes them.
  // Unlike the loops above, its bits are not those of the other tables (it sums with FMA).
  void (*tile_gemm)(const TileGemmArgs& g);
  void (*adamw)(float* p, const float* g, float* m, float* v, std::size_t n, const AdamWScalars& s);
};

/// The table for this process: the widest instruction set that both the build and the CPU have,
/// unless COSHARD_CPU_ISA (baseline, avx2, avx512) asks for a narrower one. Chosen on first use.
const CpuKernels& cpu_kernels();

/// Every table this build has and this CPU can run, baseline first (for the tests that check the
/// tables agree bit for bit).
struct CpuKernelList {
  const CpuKernels* tables[3];
  std::size_t size;
};
CpuKernelList runnable_cpu_kernels();

}  // namespace coshard::ops::detail
