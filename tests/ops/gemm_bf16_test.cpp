// The bf16 GEMM (ops/src/isa/gemm_bf16.hpp) and the linear ops on bf16 weights. Reference: float64
// sums of the products of the bf16-rounded operands, so the only error allowed is that of f32
// summation, bounded per element by (K + 2) 2^-24 sum_k |a_ik b_kj|. Every implementation this CPU
// runs (the portable one and the AVX512-BF16 kernel) is checked on shapes around its blocks
// (mr 12, nr 32, mc 192, kc 512, nc 3072), odd K, transposed and strided operands, f32 and bf16
// sources.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstdint>
#include <string>
#include <vector>

#include "coshard/ops/blas.hpp"
#include "coshard/ops/cast.hpp"
#include "coshard/ops/cpu.hpp"
#include "coshard/ops/linear.hpp"
#include "isa/gemm_bf16.hpp"
#include "ops/gradcheck.hpp"

using namespace coshard;
using namespace coshard::testing;
using ops::detail::GemmBf16Args;
using ops::detail::GemmOperand;

namespace {

double rounded(float x) { return ops::bf16_to_f32(ops::f32_to_bf16(x)); }

std::vector<std::uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<std::uint16_t> out(v.size());
  ops::cast_f32_to_bf16(v, out);
  return out;
}

// A matrix of rows x cols stored row-major, or transposed (column-major), in f32 or bf16; with
// gap 2 every other element (neither stride 1: the kernel's scalar packing).
struct Stored {
  std::vector<float> f32;
  std::vector<std::uint16_t> bf16;
  std::size_t rows, cols;
  bool transposed, is_bf16;
  std::size_t gap;

  Stored(std::size_t r, std::size_t c, bool t, bool b, std::uint32_t seed, std::size_t g = 1)
      : f32(random_floats(r * c * g, seed, -2.0f, 2.0f)), rows(r), cols(c), transposed(t), is_bf16(b), gap(g) {
    if (is_bf16) bf16 = to_bf16(f32);
  }
  GemmOperand operand() const {
    const void* data = is_bf16 ? static_cast<const void*>(bf16.data()) : static_cast<const void*>(f32.data());
    return transposed ? GemmOperand{data, is_bf16, gap, rows * gap} : GemmOperand{data, is_bf16, cols * gap, gap};
  }
  double at(std::size_t r, std::size_t c) const {
    return rounded(f32[(transposed ? c * rows + r : r * cols + c) * gap]);
  }
  // Every rounded element, row-major: the reference reads each one M or N times, and rounding it
  // each time made this test take a minute under ASan.
  std::vector<double> dense() const {
    std::vector<double> out(rows * cols);
    for (std::size_t r = 0; r < rows; ++r) {
      for (std::size_t c = 0; c < cols; ++c) out[r * cols + c] = at(r, c);
    }
    return out;
  }
};

// Checks C against the float64 reference (plus C0 when accumulating); returns the worst error in
// units of the bound.
double worst(const std::vector<float>& c, const std::vector<float>& c0, const Stored& a, const Stored& b,
             bool accumulate, std::size_t ldc) {
  const std::size_t M = a.rows, K = a.cols, N = b.cols;
  const double unit = std::ldexp(static_cast<double>(K + 2), -24);
  const std::vector<double> da = a.dense(), db = b.dense();
  double w = 0;
  for (std::size_t i = 0; i < M; ++i) {
    std::vector<double> sums(N, 0.0), mags(N, 0.0);
    // Raw pointers: the sanitized build is -O0, where each vector subscript is a call.
    double *s = sums.data(), *mag = mags.data();
    for (std::size_t k = 0; k < K; ++k) {
      const double aik = da[i * K + k];
      const double* bk = db.data() + k * N;
      for (std::size_t j = 0; j < N; ++j) {
        const double p = aik * bk[j];
        s[j] += p;
        mag[j] += std::fabs(p);
      }
    }
    for (std::size_t j = 0; j < N; ++j) {
      const double base = accumulate ? c0[i * ldc + j] : 0.0;
      const double bound = unit * (mag[j] + std::fabs(base)) + 1e-30;
      w = std::max(w, std::fabs(c[i * ldc + j] - (s[j] + base)) / bound);
    }
  }
  return w;
}

struct Shape {
  std::size_t M, N, K;
};

class GemmBf16 : public ::testing::TestWithParam<int> {};

TEST_P(GemmBf16, EveryImplementationSumsTheRoundedProductsInF32) {
  const auto list = ops::detail::runnable_gemm_bf16();
  const int which = GetParam();
  if (static_cast<std::size_t>(which) >= list.size) GTEST_SKIP() << "this CPU has no avx512_bf16";
  const auto& impl = list.impls[which];
  const Shape shapes[] = {{1, 1, 1},     {1, 1, 2},     {13, 33, 7},   {12, 32, 512},  {25, 65, 513},
                          {193, 40, 17}, {5, 3105, 3},  {197, 70, 1031}, {13, 3100, 515}};
  std::uint32_t seed = 1;
  for (const Shape& s : shapes) {
    for (int variant = 0; variant < 10; ++variant) {
      const bool ta = variant & 1, tb = variant & 2, accumulate = variant & 4;
      const std::size_t gap = variant >= 8 ? 2 : 1;
      const Stored a(s.M, s.K, ta, variant % 3 == 0, seed++, gap), b(s.K, s.N, tb, variant % 3 != 2, seed++, gap);
      const std::size_t ldc = s.N + (variant & 1);  // a C wider than N is left alone past N
      std::vector<float> c0 = random_floats(s.M * ldc, seed++), c = c0;
      impl.run(GemmBf16Args{s.M, s.N, s.K, a.operand(), b.operand(), c.data(), ldc, accumulate});
      const std::string what = std::string(impl.name) + " M=" + std::to_string(s.M) + " N=" + std::to_string(s.N) +
                               " K=" + std::to_string(s.K) + " variant " + std::to_string(variant);
      EXPECT_LE(worst(c, c0, a, b, accumulate, ldc), 1.0) << what;
      for (std::size_t i = 0; i < s.M && ldc > s.N; ++i) EXPECT_EQ(c[i * ldc + s.N], c0[i * ldc + s.N]) << what;
    }
  }
}

TEST_P(GemmBf16, NoInnerDimensionGivesZerosOrLeavesCAlone) {
  const auto list = ops::detail::runnable_gemm_bf16();
  if (static_cast<std::size_t>(GetParam()) >= list.size) GTEST_SKIP() << "this CPU has no avx512_bf16";
  const auto& impl = list.impls[GetParam()];
  const float a = 1.0f, b = 1.0f;
  std::vector<float> c(6, 3.0f);
  impl.run(GemmBf16Args{2, 3, 0, {&a, false, 0, 1}, {&b, false, 3, 1}, c.data(), 3, true});
  EXPECT_EQ(c, std::vector<float>(6, 3.0f));
  impl.run(GemmBf16Args{2, 3, 0, {&a, false, 0, 1}, {&b, false, 3, 1}, c.data(), 3, false});
  EXPECT_EQ(c, std::vector<float>(6, 0.0f));
}

INSTANTIATE_TEST_SUITE_P(Impl, GemmBf16, ::testing::Values(0, 1), [](const auto& p) {
  return p.param == 0 ? std::string("sgemm") : std::string("avx512_bf16");
});

// The linear ops on bf16 weights against float64 sums of bf16-rounded operands: y = x W + b,
// dx = dy W^T, dW += x^T dy, db += sum of dy (unrounded, f32).
class LinearBf16 : public ::testing::TestWithParam<ops::WeightLayout> {};

TEST_P(LinearBf16, ForwardAndBackwardAreTheRoundedProducts) {
  const ops::WeightLayout layout = GetParam();
  const bool in_out = layout == ops::WeightLayout::in_out;
  const std::size_t rows = 37, in = 45, out = 70;
  const auto x = random_floats(rows * in, 11), wf = random_floats(in * out, 12), b = random_floats(out, 13);
  const auto dy = random_floats(rows * out, 14), dw0 = random_floats(in * out, 15), db0 = random_floats(out, 16);
  const auto w = to_bf16(wf);
  auto W = [&](std::size_t i, std::size_t o) { return rounded(wf[in_out ? i * out + o : o * in + i]); };

  std::vector<float> y(rows * out), dx(rows * in), dw = dw0, db = db0;
  ops::linear_forward(x, w, b, y, rows, in, out, layout);
  ops::linear_backward(dy, x, w, dx, dw, db, rows, in, out, layout);

  const double tol = 2e-6;  // relative to the sum of |products|; f32 summation of at most 70 terms
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t o = 0; o < out; ++o) {
      double s = b[o], mag = std::fabs(b[o]);
      for (std::size_t i = 0; i < in; ++i) s += rounded(x[r * in + i]) * W(i, o), mag += std::fabs(x[r * in + i] * W(i, o));
      ASSERT_NEAR(y[r * out + o], s, tol * mag) << "y[" << r << ", " << o << "]";
    }
    for (std::size_t i = 0; i < in; ++i) {
      double s = 0, mag = 0;
      for (std::size_t o = 0; o < out; ++o) s += rounded(dy[r * out + o]) * W(i, o), mag += std::fabs(dy[r * out + o] * W(i, o));
      ASSERT_NEAR(dx[r * in + i], s, tol * mag) << "dx[" << r << ", " << i << "]";
    }
  }
  for (std::size_t i = 0; i < in; ++i) {
    for (std::size_t o = 0; o < out; ++o) {
      const std::size_t at = in_out ? i * out + o : o * in + i;
      double s = dw0[at], mag = std::fabs(dw0[at]);
      for (std::size_t r = 0; r < rows; ++r) {
        s += rounded(x[r * in + i]) * rounded(dy[r * out + o]);
        mag += std::fabs(x[r * in + i] * dy[r * out + o]);
      }
      ASSERT_NEAR(dw[at], s, tol * mag) << "dw at " << at;
    }
  }
  for (std::size_t o = 0; o < out; ++o) {
    double s = db0[o];
    for (std::size_t r = 0; r < rows; ++r) s += dy[r * out + o];  // unrounded
    EXPECT_NEAR(db[o], s, 1e-5) << "db[" << o << "]";
  }
}

TEST_P(LinearBf16, ABadShapeNamesTheArgument) {
  const std::vector<float> x(6);
  const std::vector<std::uint16_t> w(5);
  std::vector<float> yy(6);
  expect_invalid([&] { ops::linear_forward(x, w, {}, yy, 2, 3, 2, GetParam()); }, {"linear_forward", "w has 5", "6"});
  const std::vector<std::uint16_t> w4(4);
  const std::vector<float> dy5(5);
  std::vector<float> dx(6);
  expect_invalid([&] { ops::linear_backward(dy5, x, w4, dx, {}, {}, 3, 2, 2, GetParam()); },
                 {"linear_backward", "dy has 5", "6"});
}

INSTANTIATE_TEST_SUITE_P(Layout, LinearBf16, ::testing::Values(ops::WeightLayout::in_out, ops::WeightLayout::out_in),
                         [](const auto& p) {
                           return p.param == ops::WeightLayout::in_out ? std::string("in_out") : std::string("out_in");
                         });

// The bf16 GEMMs apply coshard's default of one thread per rank as the f32 ones do. OpenBLAS's own
// default is a thread per core, and the kernel would take as many. This must be the process's
// first GEMM: ctest runs each test in its own process, and OpsGemmBf16.Asked.avx2, which runs
// several, runs this suite (a TEST) before the parameterised ones.
TEST(GemmBf16Choice, DefaultIsOneThreadPerRank) {
  if (std::getenv("OPENBLAS_NUM_THREADS") != nullptr) GTEST_SKIP() << "OPENBLAS_NUM_THREADS is set";
  const std::vector<float> x(6, 1.0f);
  const std::vector<std::uint16_t> w(6, ops::f32_to_bf16(1.0f));
  std::vector<float> y(4);
  ops::linear_forward(x, w, {}, y, 2, 3, 2);
  EXPECT_EQ(ops::blas_threads(), 1);
  EXPECT_EQ(y, std::vector<float>(4, 3.0f));
}

// The kernel wherever the CPU has it, unless a narrower COSHARD_CPU_ISA rules it out
// (OpsGemmBf16.Asked.avx2 runs this suite with avx2).
TEST(GemmBf16Choice, TheKernelWhereTheCpuHasIt) {
  const auto list = ops::detail::runnable_gemm_bf16();
  const bool has = list.size == 2 && std::string(ops::cpu_isa()) == "avx512";
  EXPECT_EQ(std::string(ops::cpu_bf16_gemm()), has ? "avx512_bf16" : "sgemm") << "CPU ISA " << ops::cpu_isa();
}

// On several threads (blas_threads()), each takes a slice of C's columns: the same sums as one,
// for bf16 and f32 B (a slice of B starts n0 columns in, in its own element size).
TEST(GemmBf16Choice, ThreadsSplitTheColumnsAndGiveTheSameBits) {
  const std::size_t M = 67, N = 1000, K = 300;
  const auto& impl = ops::detail::gemm_bf16_for_now();
  // The portable path splits one sgemm into OpenBLAS calls on slices (OpsLinear.ThreadsSplitEveryProduct).
  if (std::string(impl.name) != "avx512_bf16") GTEST_SKIP() << "no bf16 kernel here: its split is the sgemm's";
  for (const bool b_bf16 : {true, false}) {
    for (const bool b_transposed : {true, false}) {
      const Stored a(M, K, false, false, 91), b(K, N, b_transposed, b_bf16, 92);
      std::vector<float> one(M * N), three(M * N, 1.0f);
      ops::set_blas_threads(1);
      impl.run(GemmBf16Args{M, N, K, a.operand(), b.operand(), one.data(), N, false});
      ops::set_blas_threads(3);
      if (ops::blas_threads() != 3) GTEST_SKIP() << "this OpenBLAS runs one thread only";
      impl.run(GemmBf16Args{M, N, K, a.operand(), b.operand(), three.data(), N, false});
      ops::set_blas_threads(1);
      const std::string what = std::string("B ") + (b_bf16 ? "bf16" : "f32") + (b_transposed ? " transposed" : "");
      EXPECT_EQ(one, three) << what;  // each column's sums in the same order
      EXPECT_LE(worst(one, one, a, b, false, N), 1.0) << what;
    }
  }
}

}  // namespace
