#include "coshard/ops/layernorm.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "ops/gradcheck.hpp"

using namespace coshard::ops;
using namespace coshard::testing;

namespace {

// Bounds (norm-wise relative error against float64): forward 1e-6, backward 1e-5; 1e-3 for rows
// with mean 1000 (x - mean in float keeps ~1e-4 of the deviations). Measured: 7e-8, 2e-7, 2e-4.
constexpr double kForwardTol = 1e-6;
constexpr double kBackwardTol = 1e-5;
constexpr std::size_t B = 2, T = 5, kRows = B * T, C = 12;

std::vector<double> ref_layernorm(const std::vector<double>& x, const std::vector<double>& w,
                                  const std::vector<double>& b, std::size_t rows, std::size_t c) {
  std::vector<double> y(rows * c);
  for (std::size_t r = 0; r < rows; ++r) {
    double m = 0.0;
    for (std::size_t i = 0; i < c; ++i) m += x[r * c + i];
    m /= static_cast<double>(c);
    double var = 0.0;
    for (std::size_t i = 0; i < c; ++i) var += (x[r * c + i] - m) * (x[r * c + i] - m);
    var /= static_cast<double>(c);
    const double s = 1.0 / std::sqrt(var + 1e-5);
    for (std::size_t i = 0; i < c; ++i) y[r * c + i] = (x[r * c + i] - m) * s * w[i] + b[i];
  }
  return y;
}

TEST(OpsLayerNorm, ForwardMatchesFloat64ReferenceAndSavesStatistics) {
  auto x = random_floats(kRows * C, 1, -2.0f, 3.0f);
  auto w = random_floats(C, 2, 0.5f, 1.5f);
  auto b = random_floats(C, 3);
  std::vector<float> y(kRows * C), mean(kRows), rstd(kRows);
  layernorm_forward(x, w, b, y, mean, rstd, kRows, C);
  EXPECT_LT(rel_error(y, ref_layernorm(to_double(x), to_double(w), to_double(b), kRows, C)), kForwardTol);
  for (std::size_t r = 0; r < kRows; ++r) {
    double m = 0.0, var = 0.0;
    for (std::size_t i = 0; i < C; ++i) m += x[r * C + i];
    m /= C;
    for (std::size_t i = 0; i < C; ++i) var += (x[r * C + i] - m) * (x[r * C + i] - m);
    var /= C;
    EXPECT_NEAR(mean[r], m, 1e-6);
    EXPECT_NEAR(rstd[r], 1.0 / std::sqrt(var + 1e-5), 1e-5 / std::sqrt(var + 1e-5));
  }
}

TEST(OpsLayerNorm, ForwardIsStableForRowsWithALargeMean) {
  // A single-pass E[x^2] - E[x]^2 in float loses every digit of the variance here.
  auto x = random_floats(kRows * C, 4);
  for (auto& v : x) v += 1000.0f;
  std::vector<float> w(C, 1.0f), b(C, 0.0f), y(kRows * C), mean(kRows), rstd(kRows);
  layernorm_forward(x, w, b, y, mean, rstd, kRows, C);
  EXPECT_LT(rel_error(y, ref_layernorm(to_double(x), to_double(w), to_double(b), kRows, C)), 1e-3);
}

TEST(OpsLayerNorm, BackwardMatchesFiniteDifferences) {
  auto x = random_floats(kRows * C, 5, -2.0f, 2.0f);
  auto w = random_floats(C, 6, 0.5f, 1.5f);
  auto b = random_floats(C, 7);
  auto r = random_floats(kRows * C, 8);
  std::vector<float> y(kRows * C), mean(kRows), rstd(kRows);
  layernorm_forward(x, w, b, y, mean, rstd, kRows, C);
  std::vector<float> dx(kRows * C, 42.0f), dw(C, 0.0f), db(C, 0.0f);
  layernorm_backward(r, x, w, mean, rstd, dx, dw, db, kRows, C);

  const auto xd = to_double(x), wd = to_double(w), bd = to_double(b), rd = to_double(r);
  auto num_dx = numeric_grad([&](const auto& v) { return dot(ref_layernorm(v, wd, bd, kRows, C), rd); }, xd);
  auto num_dw = numeric_grad([&](const auto& v) { return dot(ref_layernorm(xd, v, bd, kRows, C), rd); }, wd);
  auto num_db = numeric_grad([&](const auto& v) { return dot(ref_layernorm(xd, wd, v, kRows, C), rd); }, bd);
  EXPECT_LT(rel_error(dx, num_dx), kBackwardTol);
  EXPECT_LT(rel_error(dw, num_dw), kBackwardTol);
  EXPECT_LT(rel_error(db, num_db), kBackwardTol);
}

TEST(OpsLayerNorm, ParameterGradientsAccumulate) {
  auto x = random_floats(kRows * C, 9);
  auto w = random_floats(C, 10);
  auto b = random_floats(C, 11);
  auto r = random_floats(kRows * C, 12);
  std::vector<float> y(kRows * C), mean(kRows), rstd(kRows), dx(kRows * C);
  layernorm_forward(x, w, b, y, mean, rstd, kRows, C);
  std::vector<float> dw1(C, 0.0f), db1(C, 0.0f);
  layernorm_backward(r, x, w, mean, rstd, dx, dw1, db1, kRows, C);
  auto dw = random_floats(C, 13);
  auto db = random_floats(C, 14);
  const auto dw0 = dw, db0 = db;
  layernorm_backward(r, x, w, mean, rstd, dx, dw, db, kRows, C);
  for (std::size_t i = 0; i < C; ++i) {
    // Equal up to summation order: the rows add into the earlier value one by one.
    EXPECT_NEAR(dw[i], dw0[i] + dw1[i], 1e-5);
    EXPECT_NEAR(db[i], db0[i] + db1[i], 1e-5);
  }
}

TEST(OpsLayerNorm, WrongSizesNameTheArgument) {
  std::vector<float> x(kRows * C), w(C), b(C), y(kRows * C), mean(kRows), rstd(kRows);
  std::vector<float> short_w(C - 1), short_rstd(kRows - 1);
  expect_invalid([&] { layernorm_forward(x, short_w, b, y, mean, rstd, kRows, C); },
                 {"layernorm_forward", "weight has 11", "expected 12"});
  expect_invalid([&] { layernorm_forward(x, w, b, y, mean, short_rstd, kRows, C); },
                 {"layernorm_forward", "rstd has 9", "expected 10"});
  std::vector<float> dx(kRows * C + 1), dw(C), db(C);
  expect_invalid([&] { layernorm_backward(y, x, w, mean, rstd, dx, dw, db, kRows, C); },
                 {"layernorm_backward", "dx has 121", "expected 120", "[rows, C] = [10, 12]"});
}

}  // namespace
