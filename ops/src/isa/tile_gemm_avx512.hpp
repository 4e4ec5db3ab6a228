#pragma once
// The products of attention's 64 x 64 tiles on AVX-512, included by the x86-64-v4 build of
// kernels.cpp only. OpenBLAS spends a large share of such small calls packing its operands and
// takes its slow path for a transposed B (82 GFLOP/s on one Zen 4 core for Q K^T, against 110 for
// a plain product). Here nothing is packed: a 64 x 64 x 64 tile's B (16 KiB) stays in L1, each
// element of A is broadcast from wherever it lies, so either layout of A reads in place, and 6 rows
// x 64 columns of C are held in 24 of the 32 zmm registers across the whole inner dimension
// (111 GFLOP/s for every layout, as fast as OpenBLAS's best). Internal linkage only (vec_math.hpp).
#include <immintrin.h>

#include <cstddef>

#include "cpu_kernels.hpp"

namespace coshard::ops::detail {
namespace {  // NOLINT(cert-dcl59-cpp,google-build-namespaces): per-ISA copies on purpose

// R rows x NV vectors of 16 columns of C; the last vector's columns are `last`'s bits.
template <int R, int NV>
inline void tile_block(const TileGemmArgs& g, std::size_t i, std::size_t j, __mmask16 last) {
  __m512 acc[R][NV];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
  const float* a = g.a + i * g.a_row;
  const float* b = g.b + j;
  for (std::size_t p = 0; p < g.k; ++p, a += g.a_col, b += g.ldb) {
    __m512 bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) bv[v] = _mm512_maskz_loadu_ps(v == NV - 1 ? last : 0xFFFF, b + 16 * v);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 x = _mm512_set1_ps(a[r * g.a_row]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_fmadd_ps(x, bv[v], acc[r][v]);
    }
  }
  const __m512 alpha = _mm512_set1_ps(g.alpha);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      const __mmask16 m = v == NV - 1 ? last : 0xFFFF;
      float* c = g.c + (i + r) * g.ldc + j + 16 * v;
      __m512 y = _mm512_mul_ps(alpha, acc[r][v]);
      if (g.accumulate) y = _mm512_add_ps(y, _mm512_maskz_loadu_ps(m, c));
      _mm512_mask_storeu_ps(c, m, y);
    }
  }
}

template <int NV>
inline void tile_rows(const TileGemmArgs& g, std::size_t j, __mmask16 last) {
  std::size_t i = 0;
  for (; i + 6 <= g.m; i += 6) tile_block<6, NV>(g, i, j, last);
  switch (g.m - i) {
    case 5: return tile_block<5, NV>(g, i, j, last);
    case 4: return tile_block<4, NV>(g, i, j, last);
    case 3: return tile_block<3, NV>(g, i, j, last);
    case 2: return tile_block<2, NV>(g, i, j, last);
    case 1: return tile_block<1, NV>(g, i, j, last);
    default: return;
  }
}

void tile_gemm(const TileGemmArgs& g) {
  for (std::size_t j = 0; j < g.n; j += 64) {
    const std::size_t w = g.n - j < 64 ? g.n - j : 64;
    const auto last = static_cast<__mmask16>(w % 16 == 0 ? 0xFFFFu : (1u << (w % 16)) - 1u);
    switch ((w + 15) / 16) {
      case 4: tile_rows<4>(g, j, last); break;
      case 3: tile_rows<3>(g, j, last); break;
      case 2: tile_rows<2>(g, j, last); break;
      default: tile_rows<1>(g, j, last); break;
    }
  }
}

}  // namespace
}  // namespace coshard::ops::detail
