#pragma once
// The gated activation of Llama's MLP, down(silu(gate(x)) * up(x)): the element-wise part between
// the gate and up projections and the down projection. silu(x) = x sigmoid(x) (the shared rule of
// coshard/kernels/elementwise.hpp, the same on the CPU and CUDA).
#include <span>

namespace coshard::ops {

/// y = silu(gate) * up; gate, up and y of equal size, y overlapping neither.
void swiglu_forward(std::span<const float> gate, std::span<const float> up, std::span<float> y);

/// dgate = dy * up * silu'(gate), dup = dy * silu(gate), both written; neither may overlap an input
/// or the other.
void swiglu_backward(std::span<const float> dy, std::span<const float> gate, std::span<const float> up,
                     std::span<float> dgate, std::span<float> dup);

}  // namespace coshard::ops
