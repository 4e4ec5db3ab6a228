#pragma once
// Softmax cross-entropy over N positions (N = B*T) and V classes, mean over positions, as
// torch.nn.functional.cross_entropy(logits.view(-1, V), targets.view(-1)) without ignore_index.
#include <cstddef>
#include <cstdint>
#include <span>

namespace coshard::ops {

/// logits [N, V]; targets [N] in [0, V) (else Errc::invalid_argument naming the position);
/// lse [N] is written with each row's log-sum-exp for the backward. Returns the mean loss.
float cross_entropy_forward(std::span<const float> logits, std::span<const std::int32_t> targets,
                            std::span<float> lse, std::size_t N, std::size_t V);

/// dlogits [N, V] is written: (softmax(logits) - onehot(target)) * dloss / N. dloss is the
/// gradient of whatever the mean loss feeds (1 for a plain loss; 1/k when averaging k micro-batches).
void cross_entropy_backward(std::span<const float> logits, std::span<const std::int32_t> targets,
                            std::span<const float> lse, std::span<float> dlogits, std::size_t N, std::size_t V,
                            float dloss = 1.0f);

}  // namespace coshard::ops
