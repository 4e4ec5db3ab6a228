#include "coshard/ops/gelu.hpp"

#include <string>

#include "check.hpp"
#include "isa/cpu_kernels.hpp"
#include "parallel.hpp"

namespace coshard::ops {

namespace {
constexpr std::size_t kGrain = 64;  // elements: runs of whole 256-byte blocks, few shared cache lines
}  // namespace

void gelu_forward(std::span<const float> x, std::span<float> y) {
  constexpr const char* op = "gelu_forward";
  detail::check_size(op, "y", y, x.size(), "size of x");
  detail::check_disjoint(op, "y", y, "x", x);
  const detail::CpuKernels& k = detail::cpu_kernels();
  detail::split_range(x.size(), kGrain, detail::kElementMacs,
                      [&](std::size_t b, std::size_t e) { k.gelu_forward(x.data() + b, y.data() + b, e - b); });
}

void gelu_backward(std::span<const float> dy, std::span<const float> x, std::span<float> dx) {
  constexpr const char* op = "gelu_backward";
  detail::check_size(op, "dy", dy, x.size(), "size of x");
  detail::check_size(op, "dx", dx, x.size(), "size of x");
  detail::check_disjoint(op, "dx", dx, "x", x);
  detail::check_disjoint(op, "dx", dx, "dy", dy);
  const detail::CpuKernels& k = detail::cpu_kernels();
  detail::split_range(x.size(), kGrain, detail::kElementMacs, [&](std::size_t b, std::size_t e) {
    k.gelu_backward(dy.data() + b, x.data() + b, dx.data() + b, e - b);
  });
}

}  // namespace coshard::ops
