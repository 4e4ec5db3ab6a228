#pragma once
// Residual connections. The forward is out = a + b; its backward hands dout to both branches, so
// there is no residual_backward: the caller passes dout on and, where a branch's gradient meets
// another (the residual stream in a transformer block's backward), adds it with accumulate().
#include <span>

namespace coshard::ops {

/// out = a + b, all of equal size; out may be a or b (in place).
void residual_forward(std::span<const float> a, std::span<const float> b, std::span<float> out);

/// acc += x (gradient accumulation of an activation gradient); acc must not overlap x.
void accumulate(std::span<float> acc, std::span<const float> x);

}  // namespace coshard::ops
