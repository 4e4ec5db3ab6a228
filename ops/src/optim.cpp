#include "coshard/ops/optim.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "check.hpp"
#include "isa/cpu_kernels.hpp"
#include "parallel.hpp"

namespace coshard::ops {

void adamw_update(std::span<float> param, std::span<const float> grad, std::span<float> exp_avg,
                  std::span<float> exp_avg_sq, std::int64_t step, double lr, double beta1, double beta2, double eps,
                  double weight_decay) {
  constexpr const char* op = "adamw_update";
  const std::size_t n = param.size();
  detail::check_size(op, "grad", grad, n, "size of param");
  detail::check_size(op, "exp_avg", exp_avg, n, "size of param");
  detail::check_size(op, "exp_avg_sq", exp_avg_sq, n, "size of param");
  if (step < 1) detail::fail(op, "step must be >= 1 (1 for the first update), got " + std::to_string(step));
  detail::check_nonneg(op, "lr", lr);
  detail::check_beta(op, "beta1", beta1);
  detail::check_beta(op, "beta2", beta2);
  detail::check_nonneg(op, "eps", eps);
  detail::check_nonneg(op, "weight_decay", weight_decay);
  detail::check_disjoint(op, "param", param, "grad", grad);
  detail::check_disjoint(op, "param", param, "exp_avg", exp_avg);
  detail::check_disjoint(op, "param", param, "exp_avg_sq", exp_avg_sq);
  detail::check_disjoint(op, "exp_avg", exp_avg, "exp_avg_sq", exp_avg_sq);
  detail::check_disjoint(op, "exp_avg", exp_avg, "grad", grad);
  detail::check_disjoint(op, "exp_avg_sq", exp_avg_sq, "grad", grad);

  // The scalars are computed in double as torch computes them in Python, then applied in float
  // as torch's CPU kernels apply a Python scalar to a float tensor.
  const auto s = static_cast<double>(step);
  const double bc1 = 1.0 - std::pow(beta1, s);
  const double bc2 = 1.0 - std::pow(beta2, s);
  const detail::AdamWScalars k{.decay = static_cast<float>(1.0 - lr * weight_decay),
                                .w1 = static_cast<float>(1.0 - beta1),
                                .b2 = static_cast<float>(beta2),
                                .w2 = static_cast<float>(1.0 - beta2),
                                .step_size = static_cast<float>(lr / bc1),
                                .bc2_sqrt = static_cast<float>(std::sqrt(bc2)),
                                .eps = static_cast<float>(eps)};
  const detail::CpuKernels& table = detail::cpu_kernels();
  detail::split_range(n, 64, detail::kElementMacs, [&](std::size_t b, std::size_t e) {
    table.adamw(param.data() + b, grad.data() + b, exp_avg.data() + b, exp_avg_sq.data() + b, e - b, k);
  });
}

void adamw_step(std::span<float> param, std::span<const float> grad, AdamWState& state, const AdamWOptions& opt,
                std::span<const ParamRange> ranges) {
  constexpr const char* op = "adamw_step";
  const std::size_t n = param.size();
  detail::check_size(op, "grad", grad, n, "size of param");
  detail::check_size(op, "state.exp_avg", std::span<const float>(state.exp_avg), n, "size of param");
  detail::check_size(op, "state.exp_avg_sq", std::span<const float>(state.exp_avg_sq), n, "size of param");
  const auto rs = detail::checked_ranges(op, ranges, n);
  const std::int64_t step = state.step + 1;
  for (const auto& r : rs) {
    adamw_update(param.subspan(r.offset, r.size), grad.subspan(r.offset, r.size),
                 std::span<float>(state.exp_avg).subspan(r.offset, r.size),
                 std::span<float>(state.exp_avg_sq).subspan(r.offset, r.size), step, opt.lr, opt.beta1, opt.beta2,
                 opt.eps, r.weight_decay ? opt.weight_decay : 0.0);
  }
  state.step = step;
}

void sgd_update(std::span<float> param, std::span<const float> grad, std::span<float> momentum_buffer,
                bool first_step, double lr, double momentum, double dampening, double weight_decay, bool nesterov) {
  constexpr const char* op = "sgd_update";
  const std::size_t n = param.size();
  detail::check_size(op, "grad", grad, n, "size of param");
  detail::check_nonneg(op, "lr", lr);
  detail::check_nonneg(op, "momentum", momentum);
  detail::check_nonneg(op, "weight_decay", weight_decay);
  if (nesterov && (momentum <= 0.0 || dampening != 0.0)) {
    detail::fail(op, "nesterov needs momentum > 0 and dampening == 0 (got momentum " + std::to_string(momentum) +
                         ", dampening " + std::to_string(dampening) + ")");
  }
  if (momentum != 0.0) detail::check_size(op, "momentum_buffer", momentum_buffer, n, "size of param");
  detail::check_disjoint(op, "param", param, "grad", grad);
  detail::check_disjoint(op, "param", param, "momentum_buffer", momentum_buffer);
  detail::check_disjoint(op, "momentum_buffer", momentum_buffer, "grad", grad);

  const kernels::SGDScalars k{.wd = static_cast<float>(weight_decay),
                              .mu = static_cast<float>(momentum),
                              .damp = static_cast<float>(1.0 - dampening),
                              .neg_lr = static_cast<float>(-lr),
                              .first_step = first_step,
                              .nesterov = nesterov};
  float* __restrict p = param.data();
  const float* __restrict g = grad.data();
  if (momentum == 0.0) {
    for (std::size_t i = 0; i < n; ++i) kernels::sgd_update(p[i], g[i], nullptr, k);
    return;
  }
  float* __restrict buf = momentum_buffer.data();
  for (std::size_t i = 0; i < n; ++i) kernels::sgd_update(p[i], g[i], buf + i, k);
}

void sgd_step(std::span<float> param, std::span<const float> grad, SGDState& state, const SGDOptions& opt,
              std::span<const ParamRange> ranges) {
  constexpr const char* op = "sgd_step";
  const std::size_t n = param.size();
  detail::check_size(op, "grad", grad, n, "size of param");
  if (opt.momentum != 0.0) {
    detail::check_size(op, "state.momentum_buffer", std::span<const float>(state.momentum_buffer), n, "size of param");
  }
  const auto rs = detail::checked_ranges(op, ranges, n);
  for (const auto& r : rs) {
    auto buf = opt.momentum != 0.0 ? std::span<float>(state.momentum_buffer).subspan(r.offset, r.size)
                                   : std::span<float>();
    sgd_update(param.subspan(r.offset, r.size), grad.subspan(r.offset, r.size), buf, !state.has_buffer, opt.lr,
               opt.momentum, opt.dampening, r.weight_decay ? opt.weight_decay : 0.0, opt.nesterov);
  }
  if (opt.momentum != 0.0) state.has_buffer = true;
}

}  // namespace coshard::ops
