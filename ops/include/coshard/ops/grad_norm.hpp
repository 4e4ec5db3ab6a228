#pragma once
// Gradient norm over a set of buffers (torch.nn.utils.clip_grad_norm_'s total norm), accumulated
// in double. Split into a per-rank partial and a finish step so a sharded model can reduce the
// partials across ranks in between (sum for l2 and l1, max for inf).
#include <cstddef>
#include <span>

namespace coshard::ops {

/// Which norm to compute: torch's norm_type 2, 1 and inf.
enum class NormType { l2, l1, inf };

/// l2: sum of squares; l1: sum of absolute values; inf: max absolute value. NaN propagates.
double norm_partial(std::span<const std::span<const float>> buffers, NormType type);
/// l2: sqrt(reduced); l1 and inf: reduced.
double norm_finish(double reduced, NormType type);
/// norm_finish(norm_partial(...)) for buffers all on this rank.
double grad_norm(std::span<const std::span<const float>> buffers, NormType type);

/// torch's clip coefficient: min(1, max_norm / (total_norm + 1e-6)).
double clip_coefficient(double total_norm, double max_norm);

/// buffer *= s.
void scale_inplace(std::span<float> buffer, float s);

}  // namespace coshard::ops
