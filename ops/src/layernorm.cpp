#include "coshard/ops/layernorm.hpp"

#include <string>

#include "check.hpp"
#include "isa/cpu_kernels.hpp"
#include "parallel.hpp"

namespace coshard::ops {

void layernorm_forward(std::span<const float> x, std::span<const float> weight, std::span<const float> bias,
                       std::span<float> y, std::span<float> mean, std::span<float> rstd, std::size_t rows,
                       std::size_t C, float eps) {
  constexpr const char* op = "layernorm_forward";
  detail::check_positive(op, "C", C);
  const std::string rc = "[rows, C] = " + detail::dims({rows, C});
  detail::check_size(op, "x", x, rows * C, rc);
  detail::check_size(op, "weight", weight, C, "[C] = " + detail::dims({C}));
  detail::check_size(op, "bias", bias, C, "[C] = " + detail::dims({C}));
  detail::check_size(op, "y", y, rows * C, rc);
  detail::check_size(op, "mean", mean, rows, "[rows] = " + detail::dims({rows}));
  detail::check_size(op, "rstd", rstd, rows, "[rows] = " + detail::dims({rows}));
  detail::check_disjoint(op, "y", y, "x", x);

  // Rows are independent: a run of them per thread.
  const detail::CpuKernels& k = detail::cpu_kernels();
  detail::split_range(rows, 1, static_cast<double>(C) * detail::kElementMacs, [&](std::size_t b, std::size_t e) {
    k.layernorm_forward(x.data() + b * C, weight.data(), bias.data(), y.data() + b * C, mean.data() + b,
                        rstd.data() + b, e - b, C, eps);
  });
}

void layernorm_backward(std::span<const float> dy, std::span<const float> x, std::span<const float> weight,
                        std::span<const float> mean, std::span<const float> rstd, std::span<float> dx,
                        std::span<float> dweight, std::span<float> dbias, std::size_t rows, std::size_t C) {
  constexpr const char* op = "layernorm_backward";
  detail::check_positive(op, "C", C);
  const std::string rc = "[rows, C] = " + detail::dims({rows, C});
  detail::check_size(op, "dy", dy, rows * C, rc);
  detail::check_size(op, "x", x, rows * C, rc);
  detail::check_size(op, "weight", weight, C, "[C] = " + detail::dims({C}));
  detail::check_size(op, "mean", mean, rows, "[rows] = " + detail::dims({rows}));
  detail::check_size(op, "rstd", rstd, rows, "[rows] = " + detail::dims({rows}));
  detail::check_size(op, "dx", dx, rows * C, rc);
  detail::check_optional_size(op, "dweight", dweight, C, "[C] = " + detail::dims({C}));
  detail::check_optional_size(op, "dbias", dbias, C, "[C] = " + detail::dims({C}));
  detail::check_disjoint(op, "dx", dx, "dy", dy);
  detail::check_disjoint(op, "dx", dx, "x", x);
  detail::check_disjoint(op, "dweight", dweight, "dy", dy);
  detail::check_disjoint(op, "dbias", dbias, "dy", dy);

  // dx by runs of rows; dweight and dbias, sums over the rows, by blocks of 16 columns (64
  // bytes), so that each column's sum keeps its order on any thread count.
  const detail::CpuKernels& k = detail::cpu_kernels();
  detail::split_range(rows, 1, static_cast<double>(C) * detail::kElementMacs, [&](std::size_t b, std::size_t e) {
    k.layernorm_backward(dy.data() + b * C, x.data() + b * C, weight.data(), mean.data() + b, rstd.data() + b,
                         dx.data() + b * C, e - b, C);
  });
  if (dweight.empty() && dbias.empty()) return;
  detail::split_range(C, 16, static_cast<double>(rows) * detail::kElementMacs, [&](std::size_t b, std::size_t e) {
    k.layernorm_param_grads(dy.data() + b, x.data() + b, mean.data(), rstd.data(),
                            dweight.empty() ? nullptr : dweight.data() + b, dbias.empty() ? nullptr : dbias.data() + b,
                            rows, e - b, C);
  });
}

}  // namespace coshard::ops
