#include "coshard/ops/cross_entropy.hpp"

#include <string>

#include "check.hpp"
#include "isa/cpu_kernels.hpp"

namespace coshard::ops {

namespace {

void check_targets(const char* op, std::span<const std::int32_t> targets, std::size_t V) {
  for (std::size_t n = 0; n < targets.size(); ++n) {
    const std::int32_t id = targets[n];
    if (id < 0 || static_cast<std::size_t>(id) >= V) detail::fail_target(op, id, n, V);
  }
}

}  // namespace

float cross_entropy_forward(std::span<const float> logits, std::span<const std::int32_t> targets,
                            std::span<float> lse, std::size_t N, std::size_t V) {
  constexpr const char* op = "cross_entropy_forward";
  detail::check_positive(op, "N", N);
  detail::check_positive(op, "V", V);
  detail::check_size(op, "logits", logits, N * V, "[N, V] = " + detail::dims({N, V}));
  detail::check_size(op, "targets", targets, N, "[N] = " + detail::dims({N}));
  detail::check_size(op, "lse", lse, N, "[N] = " + detail::dims({N}));
  detail::check_disjoint(op, "lse", lse, "logits", logits);
  check_targets(op, targets, V);

  const double total = detail::cpu_kernels().cross_entropy_forward(logits.data(), targets.data(), lse.data(), N, V);
  return static_cast<float>(total / static_cast<double>(N));
}

void cross_entropy_backward(std::span<const float> logits, std::span<const std::int32_t> targets,
                            std::span<const float> lse, std::span<float> dlogits, std::size_t N, std::size_t V,
                            float dloss) {
  constexpr const char* op = "cross_entropy_backward";
  detail::check_positive(op, "N", N);
  detail::check_positive(op, "V", V);
  detail::check_size(op, "logits", logits, N * V, "[N, V] = " + detail::dims({N, V}));
  detail::check_size(op, "targets", targets, N, "[N] = " + detail::dims({N}));
  detail::check_size(op, "lse", lse, N, "[N] = " + detail::dims({N}));
  detail::check_size(op, "dlogits", dlogits, N * V, "[N, V] = " + detail::dims({N, V}));
  detail::check_disjoint(op, "dlogits", dlogits, "logits", logits);
  detail::check_disjoint(op, "dlogits", dlogits, "lse", lse);
  check_targets(op, targets, V);

  detail::cpu_kernels().cross_entropy_backward(logits.data(), targets.data(), lse.data(), dlogits.data(), N, V,
                                               dloss / static_cast<float>(N));
}

}  // namespace coshard::ops
