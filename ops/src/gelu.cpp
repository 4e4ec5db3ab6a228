#include "coshard/ops/gelu.hpp"

#include <string>

#include "check.hpp"
#include "isa/cpu_kernels.hpp"

namespace coshard::ops {

void gelu_forward(std::span<const float> x, std::span<float> y) {
  constexpr const char* op = "gelu_forward";
  detail::check_size(op, "y", y, x.size(), "size of x");
  detail::check_disjoint(op, "y", y, "x", x);
  detail::cpu_kernels().gelu_forward(x.data(), y.data(), x.size());
}

void gelu_backward(std::span<const float> dy, std::span<const float> x, std::span<float> dx) {
  constexpr const char* op = "gelu_backward";
  detail::check_size(op, "dy", dy, x.size(), "size of x");
  detail::check_size(op, "dx", dx, x.size(), "size of x");
  detail::check_disjoint(op, "dx", dx, "x", x);
  detail::check_disjoint(op, "dx", dx, "dy", dy);
  detail::cpu_kernels().gelu_backward(dy.data(), x.data(), dx.data(), x.size());
}

}  // namespace coshard::ops
