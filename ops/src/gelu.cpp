#include "coshard/ops/gelu.hpp"

#include <cmath>
#include <string>

#include "check.hpp"

namespace coshard::ops {

namespace {
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCoeff = 0.044715f;
}  // namespace

void gelu_forward(std::span<const float> x, std::span<float> y) {
  constexpr const char* op = "gelu_forward";
  detail::check_size(op, "y", y, x.size(), "size of x");
  detail::check_disjoint(op, "y", y, "x", x);
  const float* __restrict xp = x.data();
  float* __restrict yp = y.data();
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float v = xp[i];
    yp[i] = 0.5f * v * (1.0f + std::tanh(kSqrt2OverPi * (v + kCoeff * v * v * v)));
  }
}

void gelu_backward(std::span<const float> dy, std::span<const float> x, std::span<float> dx) {
  constexpr const char* op = "gelu_backward";
  detail::check_size(op, "dy", dy, x.size(), "size of x");
  detail::check_size(op, "dx", dx, x.size(), "size of x");
  detail::check_disjoint(op, "dx", dx, "x", x);
  detail::check_disjoint(op, "dx", dx, "dy", dy);
  const float* __restrict xp = x.data();
  const float* __restrict g = dy.data();
  float* __restrict out = dx.data();
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float v = xp[i];
    const float u = kSqrt2OverPi * (v + kCoeff * v * v * v);
    const float th = std::tanh(u);
    const float sech2 = 1.0f - th * th;
    const float du = kSqrt2OverPi * (1.0f + 3.0f * kCoeff * v * v);
    out[i] = g[i] * (0.5f * (1.0f + th) + 0.5f * v * sech2 * du);
  }
}

}  // namespace coshard::ops
