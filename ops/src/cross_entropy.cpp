#include "coshard/ops/cross_entropy.hpp"

#include <cmath>
#include <string>

#include "check.hpp"

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

  // The mean of N per-position losses is summed in double: with N in the tens of thousands a
  // float sum would lose the digits the loss curve is read from.
  double total = 0.0;
  for (std::size_t n = 0; n < N; ++n) {
    const float* __restrict z = logits.data() + n * V;
    float mx = z[0];
    for (std::size_t v = 1; v < V; ++v) mx = z[v] > mx ? z[v] : mx;
    float sum = 0.0f;
    for (std::size_t v = 0; v < V; ++v) sum += std::exp(z[v] - mx);
    const float l = mx + std::log(sum);
    lse[n] = l;
    total += static_cast<double>(l) - static_cast<double>(z[targets[n]]);
  }
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

  const float scale = dloss / static_cast<float>(N);
  for (std::size_t n = 0; n < N; ++n) {
    const float* __restrict z = logits.data() + n * V;
    float* __restrict d = dlogits.data() + n * V;
    const float l = lse[n];
    for (std::size_t v = 0; v < V; ++v) d[v] = std::exp(z[v] - l) * scale;
    d[targets[n]] -= scale;
  }
}

}  // namespace coshard::ops
