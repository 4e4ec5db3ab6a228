#include "coshard/ops/cross_entropy.hpp"

#include <algorithm>
#include <string>
#include <vector>

#include "check.hpp"
#include "isa/cpu_kernels.hpp"
#include "parallel.hpp"

namespace coshard::ops {

namespace {

constexpr std::size_t kBlockRows = 64;  // rows per partial sum of the loss

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

  // Blocks of rows, a run of them per thread; the blocks' sums are added in order afterwards, so
  // the loss has the same bits on any thread count.
  const detail::CpuKernels& k = detail::cpu_kernels();
  const std::size_t blocks = (N + kBlockRows - 1) / kBlockRows;
  std::vector<double> sums(blocks);
  detail::split_range(blocks, 1, static_cast<double>(kBlockRows * V) * detail::kElementMacs,
                      [&](std::size_t b, std::size_t e) {
                        for (std::size_t i = b; i < e; ++i) {
                          const std::size_t r = i * kBlockRows, n = std::min(kBlockRows, N - r);
                          sums[i] = k.cross_entropy_forward(logits.data() + r * V, targets.data() + r, lse.data() + r, n, V);
                        }
                      });
  double total = 0.0;
  for (const double s : sums) total += s;
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

  const detail::CpuKernels& k = detail::cpu_kernels();
  const float scale = dloss / static_cast<float>(N);
  detail::split_range(N, 1, static_cast<double>(V) * detail::kElementMacs, [&](std::size_t b, std::size_t e) {
    k.cross_entropy_backward(logits.data() + b * V, targets.data() + b, lse.data() + b, dlogits.data() + b * V, e - b,
                             V, scale);
  });
}

}  // namespace coshard::ops
