#pragma once
// GELU with the tanh approximation (GPT-2's "gelu_new", torch's approximate="tanh"):
// y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
#include <span>

namespace coshard::ops {

/// x, y of equal size; y must not overlap x.
void gelu_forward(std::span<const float> x, std::span<float> y);

/// dx = dy * gelu'(x), written; dx must not overlap dy or x.
void gelu_backward(std::span<const float> dy, std::span<const float> x, std::span<float> dx);

}  // namespace coshard::ops
