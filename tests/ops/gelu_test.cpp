// GELU (tanh approximation) and the residual add.
#include "coshard/ops/gelu.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "coshard/ops/residual.hpp"
#include "ops/gradcheck.hpp"

using namespace coshard::ops;
using namespace coshard::testing;

namespace {

// Bounds (norm-wise relative error against float64): forward 1e-6, backward 1e-5. Measured: 2e-8, 1.3e-7.
constexpr double kForwardTol = 1e-6;
constexpr double kBackwardTol = 1e-5;
constexpr std::size_t kN = 2 * 5 * 12;

std::vector<double> ref_gelu(const std::vector<double>& x) {
  std::vector<double> y(x.size());
  const double k = std::sqrt(2.0 / M_PI);
  for (std::size_t i = 0; i < x.size(); ++i) y[i] = 0.5 * x[i] * (1.0 + std::tanh(k * (x[i] + 0.044715 * x[i] * x[i] * x[i])));
  return y;
}

TEST(OpsGelu, ForwardMatchesFloat64Reference) {
  auto x = random_floats(kN, 1, -4.0f, 4.0f);
  x[0] = 0.0f;
  x[1] = -12.0f;  // saturated tails: 0 and x
  x[2] = 12.0f;
  std::vector<float> y(kN);
  gelu_forward(x, y);
  EXPECT_LT(rel_error(y, ref_gelu(to_double(x))), kForwardTol);
  EXPECT_EQ(y[0], 0.0f);
  EXPECT_NEAR(y[1], 0.0f, 1e-6);
  EXPECT_FLOAT_EQ(y[2], 12.0f);
}

TEST(OpsGelu, BackwardMatchesFiniteDifferences) {
  auto x = random_floats(kN, 2, -4.0f, 4.0f);
  auto r = random_floats(kN, 3);
  std::vector<float> dx(kN);
  gelu_backward(r, x, dx);
  const auto rd = to_double(r);
  auto num = numeric_grad([&](const auto& v) { return dot(ref_gelu(v), rd); }, to_double(x));
  EXPECT_LT(rel_error(dx, num), kBackwardTol);
}

TEST(OpsGelu, WrongSizesAndOverlapAreRefused) {
  std::vector<float> x(kN), y(kN - 1), dy(kN);
  expect_invalid([&] { gelu_forward(x, y); }, {"gelu_forward", "y has 119", "expected 120"});
  expect_invalid([&] { gelu_backward(y, x, dy); }, {"gelu_backward", "dy has 119"});
  expect_invalid([&] { gelu_forward(x, x); }, {"gelu_forward", "y and x must not overlap"});
}

TEST(OpsResidual, ForwardAddsAndWorksInPlace) {
  auto a = random_floats(kN, 4);
  auto b = random_floats(kN, 5);
  std::vector<float> out(kN);
  residual_forward(a, b, out);
  for (std::size_t i = 0; i < kN; ++i) EXPECT_EQ(out[i], a[i] + b[i]);
  auto a2 = a;
  residual_forward(a2, b, a2);
  EXPECT_EQ(a2, out);
}

TEST(OpsResidual, AccumulateAddsIntoTheGradient) {
  auto acc = random_floats(kN, 6);
  auto x = random_floats(kN, 7);
  const auto acc0 = acc;
  accumulate(acc, x);
  for (std::size_t i = 0; i < kN; ++i) EXPECT_EQ(acc[i], acc0[i] + x[i]);
}

TEST(OpsResidual, WrongSizesAndPartialOverlapAreRefused) {
  std::vector<float> a(kN), b(kN + 1), out(kN);
  expect_invalid([&] { residual_forward(a, b, out); }, {"residual_forward", "b has 121", "expected 120"});
  std::vector<float> buf(kN + 1);
  std::span<float> s(buf);
  expect_invalid([&] { residual_forward(s.first(kN), a, s.last(kN)); }, {"residual_forward", "out and a must not overlap"});
  expect_invalid([&] { accumulate(out, b); }, {"accumulate", "x has 121"});
}

}  // namespace
