#include "coshard/ops/swiglu.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "ops/gradcheck.hpp"

using namespace coshard::ops;
using namespace coshard::testing;

namespace {

constexpr double kForwardTol = 1e-6;
constexpr double kBackwardTol = 1e-5;

// silu(gate) * up in float64, as torch.nn.functional.silu(gate) * up.
std::vector<double> ref_swiglu(const std::vector<double>& gate, const std::vector<double>& up) {
  std::vector<double> y(gate.size());
  for (std::size_t i = 0; i < y.size(); ++i) y[i] = gate[i] / (1.0 + std::exp(-gate[i])) * up[i];
  return y;
}

TEST(OpsSwiGlu, ForwardMatchesFloat64Reference) {
  for (const std::size_t n : {1, 15, 17, 64, 1031}) {
    auto gate = random_floats(n, 1, -12.0f, 12.0f);
    auto up = random_floats(n, 2, -3.0f, 3.0f);
    std::vector<float> y(n);
    swiglu_forward(gate, up, y);
    EXPECT_LT(rel_error(y, ref_swiglu(to_double(gate), to_double(up))), kForwardTol) << n;
  }
}

TEST(OpsSwiGlu, BackwardMatchesFiniteDifferences) {
  const std::size_t n = 40;
  auto gate = random_floats(n, 3, -6.0f, 6.0f);
  auto up = random_floats(n, 4, -2.0f, 2.0f);
  auto r = random_floats(n, 5);
  std::vector<float> dgate(n, 9.0f), dup(n, 9.0f);
  swiglu_backward(r, gate, up, dgate, dup);
  const auto gd = to_double(gate), ud = to_double(up), rd = to_double(r);
  EXPECT_LT(rel_error(dgate, numeric_grad([&](const auto& v) { return dot(ref_swiglu(v, ud), rd); }, gd)), kBackwardTol);
  EXPECT_LT(rel_error(dup, numeric_grad([&](const auto& v) { return dot(ref_swiglu(gd, v), rd); }, ud)), kBackwardTol);
}

TEST(OpsSwiGlu, SaturatesWithoutNaNAndPassesNaNThrough) {
  std::vector<float> gate = {-200.0f, 200.0f, NAN}, up = {3.0f, 3.0f, 1.0f}, y(3), dy = {1.0f, 1.0f, 1.0f};
  swiglu_forward(gate, up, y);
  EXPECT_EQ(y[0], -0.0f);
  EXPECT_EQ(y[1], 600.0f);
  EXPECT_TRUE(std::isnan(y[2]));
  std::vector<float> dgate(3), dup(3);
  swiglu_backward(dy, gate, up, dgate, dup);
  EXPECT_EQ(dgate[0], 0.0f);
  EXPECT_EQ(dgate[1], 3.0f);
  EXPECT_TRUE(std::isnan(dgate[2]));
}

TEST(OpsSwiGlu, WrongSizesAndOverlapsNameTheArgument) {
  std::vector<float> gate(8), up(8), y(8), short_up(7);
  expect_invalid([&] { swiglu_forward(gate, short_up, y); }, {"swiglu_forward", "up has 7", "expected 8"});
  expect_invalid([&] { swiglu_forward(gate, up, gate); }, {"swiglu_forward", "y and gate must not overlap"});
  std::vector<float> dgate(8), dup(8);
  expect_invalid([&] { swiglu_backward(y, gate, up, dgate, dgate); }, {"swiglu_backward", "dgate and dup must not overlap"});
  expect_invalid([&] { swiglu_backward(y, gate, up, dgate, std::span<float>(dup).first(5)); },
                 {"swiglu_backward", "dup has 5", "expected 8"});
}

}  // namespace
