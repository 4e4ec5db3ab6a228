#include "coshard/ops/rmsnorm.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "ops/gradcheck.hpp"

using namespace coshard::ops;
using namespace coshard::testing;

namespace {

// Bounds (norm-wise relative error against float64): forward 1e-6, backward 1e-5.
constexpr double kForwardTol = 1e-6;
constexpr double kBackwardTol = 1e-5;
constexpr float kEps = 1e-5f;

// Hugging Face's LlamaRMSNorm in float64: w * x / sqrt(mean(x^2) + eps).
std::vector<double> ref_rmsnorm(const std::vector<double>& x, const std::vector<double>& w, std::size_t rows,
                                std::size_t c, double eps = kEps) {
  std::vector<double> y(rows * c);
  for (std::size_t r = 0; r < rows; ++r) {
    double ms = 0.0;
    for (std::size_t i = 0; i < c; ++i) ms += x[r * c + i] * x[r * c + i];
    const double s = 1.0 / std::sqrt(ms / static_cast<double>(c) + eps);
    for (std::size_t i = 0; i < c; ++i) y[r * c + i] = w[i] * (x[r * c + i] * s);
  }
  return y;
}

struct Dims {
  std::size_t rows, C;
};
// Widths around the 16 lanes of the reductions and odd ones.
constexpr Dims kDims[] = {{1, 1}, {10, 12}, {3, 15}, {7, 17}, {5, 64}, {2, 97}, {4, 1031}};

TEST(OpsRmsNorm, ForwardMatchesFloat64ReferenceAndSavesRstd) {
  std::uint32_t seed = 1;
  for (const auto [rows, C] : kDims) {
    SCOPED_TRACE(std::to_string(rows) + " x " + std::to_string(C));
    auto x = random_floats(rows * C, seed++, -2.0f, 3.0f);
    auto w = random_floats(C, seed++, 0.5f, 1.5f);
    std::vector<float> y(rows * C), rstd(rows);
    rmsnorm_forward(x, w, y, rstd, rows, C, kEps);
    EXPECT_LT(rel_error(y, ref_rmsnorm(to_double(x), to_double(w), rows, C)), kForwardTol);
    for (std::size_t r = 0; r < rows; ++r) {
      double ms = 0.0;
      for (std::size_t i = 0; i < C; ++i) ms += static_cast<double>(x[r * C + i]) * x[r * C + i];
      const double want = 1.0 / std::sqrt(ms / static_cast<double>(C) + kEps);
      EXPECT_NEAR(rstd[r], want, 1e-6 * want);
    }
  }
}

TEST(OpsRmsNorm, EpsComesFromTheConfigAndKeepsAZeroRowFinite) {
  const std::size_t C = 8;
  std::vector<float> x(C, 0.0f), w(C, 1.0f), y(C, 7.0f), rstd(1);
  rmsnorm_forward(x, w, y, rstd, 1, C, 1e-6f);
  EXPECT_NEAR(rstd[0], 1000.0f, 1e-2);  // 1 / sqrt(1e-6)
  for (float v : y) EXPECT_EQ(v, 0.0f);
  expect_invalid([&] { rmsnorm_forward(x, w, y, rstd, 1, C, 0.0f); }, {"rmsnorm_forward", "eps must be positive"});
}

TEST(OpsRmsNorm, BackwardMatchesFiniteDifferences) {
  for (const Dims d : {Dims{10, 12}, Dims{3, 33}}) {
    // Named copies, not a structured binding: clang 14 cannot capture a binding in a lambda.
    const std::size_t rows = d.rows, C = d.C;
    auto x = random_floats(rows * C, 5, -2.0f, 2.0f);
    auto w = random_floats(C, 6, 0.5f, 1.5f);
    auto r = random_floats(rows * C, 8);
    std::vector<float> y(rows * C), rstd(rows);
    rmsnorm_forward(x, w, y, rstd, rows, C, kEps);
    std::vector<float> dx(rows * C, 42.0f), dw(C, 0.0f);
    rmsnorm_backward(r, x, w, rstd, dx, dw, rows, C);
    const auto xd = to_double(x), wd = to_double(w), rd = to_double(r);
    EXPECT_LT(rel_error(dx, numeric_grad([&](const auto& v) { return dot(ref_rmsnorm(v, wd, rows, C), rd); }, xd)),
              kBackwardTol);
    EXPECT_LT(rel_error(dw, numeric_grad([&](const auto& v) { return dot(ref_rmsnorm(xd, v, rows, C), rd); }, wd)),
              kBackwardTol);
  }
}

TEST(OpsRmsNorm, WeightGradientAccumulatesAndIsOptional) {
  const std::size_t rows = 6, C = 20;
  auto x = random_floats(rows * C, 9);
  auto w = random_floats(C, 10);
  auto r = random_floats(rows * C, 12);
  std::vector<float> y(rows * C), rstd(rows), dx(rows * C), dx_alone(rows * C);
  rmsnorm_forward(x, w, y, rstd, rows, C, kEps);
  std::vector<float> dw1(C, 0.0f);
  rmsnorm_backward(r, x, w, rstd, dx, dw1, rows, C);
  rmsnorm_backward(r, x, w, rstd, dx_alone, {}, rows, C);
  EXPECT_EQ(dx, dx_alone);
  auto dw = random_floats(C, 13);
  const auto dw0 = dw;
  rmsnorm_backward(r, x, w, rstd, dx, dw, rows, C);
  for (std::size_t i = 0; i < C; ++i) EXPECT_NEAR(dw[i], dw0[i] + dw1[i], 1e-5);
}

TEST(OpsRmsNorm, WrongSizesNameTheArgument) {
  const std::size_t rows = 10, C = 12;
  std::vector<float> x(rows * C), w(C), y(rows * C), rstd(rows), short_w(C - 1), short_rstd(rows - 1);
  expect_invalid([&] { rmsnorm_forward(x, short_w, y, rstd, rows, C, kEps); },
                 {"rmsnorm_forward", "weight has 11", "expected 12"});
  expect_invalid([&] { rmsnorm_forward(x, w, y, short_rstd, rows, C, kEps); },
                 {"rmsnorm_forward", "rstd has 9", "expected 10"});
  std::vector<float> dx(rows * C + 1), dw(C);
  expect_invalid([&] { rmsnorm_backward(y, x, w, rstd, dx, dw, rows, C); },
                 {"rmsnorm_backward", "dx has 121", "expected 120", "[rows, C] = [10, 12]"});
  expect_invalid([&] { rmsnorm_forward(x, w, x, rstd, rows, C, kEps); }, {"y and x must not overlap"});
}

}  // namespace
