#include "coshard/ops/residual.hpp"

#include <string>

#include "check.hpp"

namespace coshard::ops {

void residual_forward(std::span<const float> a, std::span<const float> b, std::span<float> out) {
  constexpr const char* op = "residual_forward";
  detail::check_size(op, "b", b, a.size(), "size of a");
  detail::check_size(op, "out", out, a.size(), "size of a");
  if (out.data() != a.data()) detail::check_disjoint(op, "out", out, "a", a);
  if (out.data() != b.data()) detail::check_disjoint(op, "out", out, "b", b);
  // No __restrict: out may be a or b. Element i reads only a[i], b[i] before writing out[i], so
  // in place is exact; GCC still vectorises behind a runtime overlap check.
  const float* ap = a.data();
  const float* bp = b.data();
  float* op_ = out.data();
  for (std::size_t i = 0; i < a.size(); ++i) op_[i] = ap[i] + bp[i];
}

void accumulate(std::span<float> acc, std::span<const float> x) {
  constexpr const char* op = "accumulate";
  detail::check_size(op, "x", x, acc.size(), "size of acc");
  detail::check_disjoint(op, "acc", acc, "x", x);
  float* __restrict ap = acc.data();
  const float* __restrict xp = x.data();
  for (std::size_t i = 0; i < acc.size(); ++i) ap[i] += xp[i];
}

}  // namespace coshard::ops
