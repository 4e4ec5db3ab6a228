#include "coshard/ops/rmsnorm.hpp"

#include <string>

#include "check.hpp"
#include "isa/cpu_kernels.hpp"
#include "parallel.hpp"

namespace coshard::ops {

void rmsnorm_forward(std::span<const float> x, std::span<const float> weight, std::span<float> y,
                     std::span<float> rstd, std::size_t rows, std::size_t C, float eps) {
  constexpr const char* op = "rmsnorm_forward";
  detail::check_rmsnorm(op, x, weight, rstd, rows, C);
  detail::check_size(op, "y", y, rows * C, "[rows, C] = " + detail::dims({rows, C}));
  detail::check_eps(op, eps);
  detail::check_disjoint(op, "y", y, "x", x);
  detail::check_disjoint(op, "rstd", rstd, "x", x);
  const detail::CpuKernels& k = detail::cpu_kernels();
  detail::split_range(rows, 1, static_cast<double>(C) * detail::kElementMacs, [&](std::size_t b, std::size_t e) {
    k.rmsnorm_forward(x.data() + b * C, weight.data(), y.data() + b * C, rstd.data() + b, e - b, C, eps);
  });
}

void rmsnorm_backward(std::span<const float> dy, std::span<const float> x, std::span<const float> weight,
                      std::span<const float> rstd, std::span<float> dx, std::span<float> dweight, std::size_t rows,
                      std::size_t C) {
  constexpr const char* op = "rmsnorm_backward";
  const std::string rc = "[rows, C] = " + detail::dims({rows, C});
  detail::check_rmsnorm(op, x, weight, rstd, rows, C);
  detail::check_size(op, "dy", dy, rows * C, rc);
  detail::check_size(op, "dx", dx, rows * C, rc);
  detail::check_optional_size(op, "dweight", dweight, C, "[C] = " + detail::dims({C}));
  detail::check_disjoint(op, "dx", dx, "dy", dy);
  detail::check_disjoint(op, "dx", dx, "x", x);
  detail::check_disjoint(op, "dweight", dweight, "dy", dy);
  // dx by runs of rows; dweight, a sum over the rows, by blocks of 16 columns, so that each
  // column's sum keeps its order on any thread count (as layernorm's).
  const detail::CpuKernels& k = detail::cpu_kernels();
  detail::split_range(rows, 1, static_cast<double>(C) * detail::kElementMacs, [&](std::size_t b, std::size_t e) {
    k.rmsnorm_backward(dy.data() + b * C, x.data() + b * C, weight.data(), rstd.data() + b, dx.data() + b * C, e - b, C);
  });
  if (dweight.empty()) return;
  detail::split_range(C, 16, static_cast<double>(rows) * detail::kElementMacs, [&](std::size_t b, std::size_t e) {
    k.rmsnorm_weight_grad(dy.data() + b, x.data() + b, rstd.data(), dweight.data() + b, rows, e - b, C);
  });
}

}  // namespace coshard::ops
