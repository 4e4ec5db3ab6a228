#include "coshard/ops/cross_entropy.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "ops/gradcheck.hpp"

using namespace coshard::ops;
using namespace coshard::testing;

namespace {

// Bounds: loss 1e-6 relative; dlogits 1e-5 (norm-wise relative against float64 differences).
// Measured: dlogits 1e-7.
constexpr double kLossTol = 1e-6;
constexpr double kBackwardTol = 1e-5;
constexpr std::size_t B = 2, T = 5, kN = B * T, V = 13;

double ref_loss(const std::vector<double>& z, const std::vector<std::int32_t>& tg, std::size_t n, std::size_t v) {
  double total = 0.0;
  for (std::size_t r = 0; r < n; ++r) {
    double mx = z[r * v];
    for (std::size_t j = 1; j < v; ++j) mx = std::max(mx, z[r * v + j]);
    double s = 0.0;
    for (std::size_t j = 0; j < v; ++j) s += std::exp(z[r * v + j] - mx);
    total += mx + std::log(s) - z[r * v + static_cast<std::size_t>(tg[r])];
  }
  return total / static_cast<double>(n);
}

std::vector<std::int32_t> targets(std::size_t n, std::size_t v) {
  std::vector<std::int32_t> t(n);
  for (std::size_t i = 0; i < n; ++i) t[i] = static_cast<std::int32_t>((i * 7 + 3) % v);
  t[0] = 0;
  t[1] = static_cast<std::int32_t>(v - 1);  // both ends of the range
  return t;
}

TEST(OpsCrossEntropy, LossMatchesFloat64Reference) {
  auto z = random_floats(kN * V, 1, -3.0f, 3.0f);
  auto tg = targets(kN, V);
  std::vector<float> lse(kN);
  const float loss = cross_entropy_forward(z, tg, lse, kN, V);
  const double ref = ref_loss(to_double(z), tg, kN, V);
  EXPECT_NEAR(loss, ref, kLossTol * std::fabs(ref));
}

TEST(OpsCrossEntropy, UniformLogitsGiveLogV) {
  std::vector<float> z(kN * V, 0.25f), lse(kN);
  EXPECT_NEAR(cross_entropy_forward(z, targets(kN, V), lse, kN, V), std::log(static_cast<double>(V)), 1e-6);
}

TEST(OpsCrossEntropy, LargeLogitsDoNotOverflow) {
  auto z = random_floats(kN * V, 2, -3.0f, 3.0f);
  for (auto& v : z) v += 1000.0f;  // exp(1000) overflows without the max shift
  auto tg = targets(kN, V);
  std::vector<float> lse(kN), d(kN * V);
  const float loss = cross_entropy_forward(z, tg, lse, kN, V);
  cross_entropy_backward(z, tg, lse, d, kN, V);
  EXPECT_TRUE(std::isfinite(loss));
  for (float v : d) EXPECT_TRUE(std::isfinite(v));
}

TEST(OpsCrossEntropy, BackwardMatchesFiniteDifferences) {
  auto z = random_floats(kN * V, 3, -3.0f, 3.0f);
  auto tg = targets(kN, V);
  std::vector<float> lse(kN), d(kN * V, 5.0f);
  cross_entropy_forward(z, tg, lse, kN, V);
  cross_entropy_backward(z, tg, lse, d, kN, V);
  auto num = numeric_grad([&](const auto& v) { return ref_loss(v, tg, kN, V); }, to_double(z));
  EXPECT_LT(rel_error(d, num), kBackwardTol);

  // dloss scales the gradient (e.g. 1/k for k accumulated micro-batches).
  std::vector<float> d2(kN * V);
  cross_entropy_backward(z, tg, lse, d2, kN, V, 0.25f);
  for (std::size_t i = 0; i < d.size(); ++i) EXPECT_NEAR(d2[i], 0.25f * d[i], 1e-7);
}

TEST(OpsCrossEntropy, TargetOutOfRangeNamesThePosition) {
  auto z = random_floats(kN * V, 4);
  std::vector<float> lse(kN), d(kN * V);
  auto tg = targets(kN, V);
  tg[6] = static_cast<std::int32_t>(V);
  expect_invalid([&] { cross_entropy_forward(z, tg, lse, kN, V); },
                 {"cross_entropy_forward", "target 13 at position 6", "[0, V = 13)"});
  expect_invalid([&] { cross_entropy_backward(z, tg, lse, d, kN, V); }, {"cross_entropy_backward", "position 6"});
  tg[6] = 1;
  tg[9] = -1;
  expect_invalid([&] { cross_entropy_forward(z, tg, lse, kN, V); }, {"target -1 at position 9"});
}

TEST(OpsCrossEntropy, WrongSizesNameTheArgument) {
  std::vector<float> z(kN * V - 1), lse(kN), d(kN * V);
  auto tg = targets(kN, V);
  expect_invalid([&] { cross_entropy_forward(z, tg, lse, kN, V); },
                 {"cross_entropy_forward", "logits has 129", "expected 130", "[N, V] = [10, 13]"});
  std::vector<std::int32_t> short_tg(kN - 1);
  std::vector<float> z_ok(kN * V);
  expect_invalid([&] { cross_entropy_forward(z_ok, short_tg, lse, kN, V); }, {"targets has 9", "expected 10"});
  std::vector<float> short_lse(2);
  expect_invalid([&] { cross_entropy_backward(z_ok, tg, short_lse, d, kN, V); }, {"cross_entropy_backward", "lse has 2"});
}

}  // namespace
