// Attention's tile products on coshard's own kernel (ops/src/isa/tile_gemm_avx512.hpp), in every
// table that has one, against float64 sums: shapes around its 6-row and 16- and 64-column blocks,
// A in both layouts, with and without accumulating, and C wider and longer than the product
// (untouched there).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "isa/cpu_kernels.hpp"
#include "ops/gradcheck.hpp"

using namespace coshard;
using namespace coshard::testing;
using ops::detail::TileGemmArgs;

namespace {

struct Case {
  std::size_t m, n, k;
  bool a_transposed, accumulate;
};

std::string name(const Case& c) {
  return "m " + std::to_string(c.m) + " n " + std::to_string(c.n) + " k " + std::to_string(c.k) +
         (c.a_transposed ? " A^T" : "") + (c.accumulate ? " accumulate" : "");
}

// The largest error over C's elements as a multiple of what f32 summation may make: with u = 2^-24,
// (k + 2) u (sum_p |alpha a b| + |C before|) per element. At most 1 passes.
double worst_error(const ops::detail::CpuKernels& table, const Case& c) {
  const std::size_t lda = c.a_transposed ? c.m + 3 : c.k + 5, ldb = c.n + 7, ldc = c.n + 9;
  const auto a = random_floats((c.a_transposed ? c.k : c.m) * lda, 11, -2.0f, 2.0f);
  const auto b = random_floats(c.k * ldb, 12, -2.0f, 2.0f);
  const std::size_t rows = c.m + 2;  // two rows below the product
  const auto before = random_floats(rows * ldc, 13, -4.0f, 4.0f);
  auto out = before;
  const float alpha = 0.375f;
  const std::size_t a_row = c.a_transposed ? 1 : lda, a_col = c.a_transposed ? lda : 1;
  table.tile_gemm(TileGemmArgs{c.m, c.n, c.k, alpha, a.data(), a_row, a_col, b.data(), ldb, c.accumulate, out.data(), ldc});
  double worst = 0.0;
  for (std::size_t i = 0; i < rows; ++i) {
    for (std::size_t j = 0; j < ldc; ++j) {
      const float got = out[i * ldc + j];
      if (i >= c.m || j >= c.n) {  // beyond the product: never written
        EXPECT_EQ(got, before[i * ldc + j]) << name(c) << " wrote C[" << i << ", " << j << "]";
        continue;
      }
      double sum = 0.0, mag = 0.0;
      for (std::size_t p = 0; p < c.k; ++p) {
        const double ab = static_cast<double>(alpha) * a[i * a_row + p * a_col] * b[p * ldb + j];
        sum += ab, mag += std::fabs(ab);
      }
      if (c.accumulate) sum += before[i * ldc + j], mag += std::fabs(before[i * ldc + j]);
      const double bound = static_cast<double>(c.k + 2) * std::ldexp(1.0, -24) * mag;
      const double err = std::fabs(got - sum);
      worst = std::max(worst, bound > 0.0 ? err / bound : (err == 0.0 ? 0.0 : 2.0));
    }
  }
  return worst;
}

TEST(OpsTileGemm, MatchesFloat64InEveryTableThatHasIt) {
  const auto list = ops::detail::runnable_cpu_kernels();
  std::size_t tested = 0;
  for (std::size_t t = 0; t < list.size; ++t) {
    const auto& table = *list.tables[t];
    if (table.tile_gemm == nullptr) continue;  // OpenBLAS computes the tiles there
    SCOPED_TRACE(table.isa);
    for (const std::size_t m : {1, 5, 6, 7, 13, 64}) {
      for (const std::size_t n : {1, 15, 16, 17, 33, 64, 65, 100, 128}) {
        for (const std::size_t k : {1, 7, 64, 129}) {
          for (const bool a_transposed : {false, true}) {
            for (const bool accumulate : {false, true}) {
              const Case c{m, n, k, a_transposed, accumulate};
              EXPECT_LE(worst_error(table, c), 1.0) << name(c);
            }
          }
        }
      }
    }
    ++tested;
  }
  if (tested == 0) GTEST_SKIP() << "no instruction set this CPU runs has a tile kernel (AVX-512): OpenBLAS computes the tiles";
}

TEST(OpsTileGemm, EmptyInnerDimensionScalesOrClears) {
  const auto list = ops::detail::runnable_cpu_kernels();
  const auto& table = *list.tables[list.size - 1];
  if (table.tile_gemm == nullptr) GTEST_SKIP() << "no tile kernel on this CPU";
  std::vector<float> c(6, 5.0f);
  const float a = 1.0f, b = 1.0f;
  table.tile_gemm(TileGemmArgs{2, 3, 0, 1.0f, &a, 1, 1, &b, 3, true, c.data(), 3});
  EXPECT_EQ(c, std::vector<float>(6, 5.0f));
  table.tile_gemm(TileGemmArgs{2, 3, 0, 1.0f, &a, 1, 1, &b, 3, false, c.data(), 3});
  EXPECT_EQ(c, std::vector<float>(6, 0.0f));
}

}  // namespace
