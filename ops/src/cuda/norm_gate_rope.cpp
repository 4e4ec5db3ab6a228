// Host side of the CUDA versions of Llama's building blocks: RMSNorm, SwiGLU and RoPE. Checks are
// the CPU ops' (../check.hpp), so the messages are the same.
#include <cuda_runtime_api.h>

#include <climits>
#include <string>
#include <utility>

#include "../check.hpp"
#include "coshard/ops/cuda_ops.hpp"
#include "cuda_check.hpp"
#include "launch.hpp"

namespace coshard::ops::cuda {

using detail::as_stream;

void rmsnorm_forward(void* stream, std::span<const float> x, std::span<const float> weight, std::span<float> y,
                     std::span<float> rstd, std::size_t rows, std::size_t C, float eps) {
  constexpr const char* op = "rmsnorm_forward";
  ops::detail::check_rmsnorm(op, x, weight, rstd, rows, C);
  ops::detail::check_size(op, "y", y, rows * C, "[rows, C] = " + ops::detail::dims({rows, C}));
  ops::detail::check_eps(op, eps);
  ops::detail::check_disjoint(op, "y", y, "x", x);
  ops::detail::check_disjoint(op, "rstd", rstd, "x", x);
  detail::check_grid(op, "rows", rows, INT_MAX);
  COSHARD_OPS_CUDA_CHECK(
      detail::launch_rmsnorm_forward(x.data(), weight.data(), y.data(), rstd.data(), rows, C, eps, as_stream(stream)));
}

void rmsnorm_backward(void* stream, std::span<const float> dy, std::span<const float> x, std::span<const float> weight,
                      std::span<const float> rstd, std::span<float> dx, std::span<float> dweight, std::size_t rows,
                      std::size_t C) {
  constexpr const char* op = "rmsnorm_backward";
  const std::string rc = "[rows, C] = " + ops::detail::dims({rows, C});
  ops::detail::check_rmsnorm(op, x, weight, rstd, rows, C);
  ops::detail::check_size(op, "dy", dy, rows * C, rc);
  ops::detail::check_size(op, "dx", dx, rows * C, rc);
  ops::detail::check_optional_size(op, "dweight", dweight, C, "[C] = " + ops::detail::dims({C}));
  ops::detail::check_disjoint(op, "dx", dx, "dy", dy);
  ops::detail::check_disjoint(op, "dx", dx, "x", x);
  ops::detail::check_disjoint(op, "dweight", dweight, "dy", dy);
  detail::check_grid(op, "rows", rows, INT_MAX);
  COSHARD_OPS_CUDA_CHECK(detail::launch_rmsnorm_backward(dy.data(), x.data(), weight.data(), rstd.data(), dx.data(),
                                                         dweight.empty() ? nullptr : dweight.data(), rows, C,
                                                         as_stream(stream)));
}

void swiglu_forward(void* stream, std::span<const float> gate, std::span<const float> up, std::span<float> y) {
  constexpr const char* op = "swiglu_forward";
  ops::detail::check_size(op, "up", up, gate.size(), "size of gate");
  ops::detail::check_size(op, "y", y, gate.size(), "size of gate");
  ops::detail::check_disjoint(op, "y", y, "gate", gate);
  ops::detail::check_disjoint(op, "y", y, "up", up);
  COSHARD_OPS_CUDA_CHECK(detail::launch_swiglu_forward(gate.data(), up.data(), y.data(), gate.size(), as_stream(stream)));
}

void swiglu_backward(void* stream, std::span<const float> dy, std::span<const float> gate, std::span<const float> up,
                     std::span<float> dgate, std::span<float> dup) {
  constexpr const char* op = "swiglu_backward";
  for (auto [name, s] : {std::pair{"dy", dy}, std::pair{"up", up}}) ops::detail::check_size(op, name, s, gate.size(), "size of gate");
  ops::detail::check_size(op, "dgate", dgate, gate.size(), "size of gate");
  ops::detail::check_size(op, "dup", dup, gate.size(), "size of gate");
  ops::detail::check_disjoint(op, "dgate", dgate, "dup", dup);
  for (auto [name, s] : {std::pair{"dy", dy}, std::pair{"gate", gate}, std::pair{"up", up}}) {
    ops::detail::check_disjoint(op, "dgate", dgate, name, s);
    ops::detail::check_disjoint(op, "dup", dup, name, s);
  }
  COSHARD_OPS_CUDA_CHECK(detail::launch_swiglu_backward(dy.data(), gate.data(), up.data(), dgate.data(), dup.data(),
                                                        gate.size(), as_stream(stream)));
}

namespace {
void rotate(void* stream, const char* op, const char* name, std::span<float> x, std::span<const float> cos,
            std::span<const float> sin, const AttentionShape& s, float sign) {
  ops::detail::check_rope(op, name, x, cos, sin, s);
  ops::detail::check_disjoint(op, name, x, "cos", cos);
  ops::detail::check_disjoint(op, name, x, "sin", sin);
  COSHARD_OPS_CUDA_CHECK(detail::launch_rope(x.data(), cos.data(), sin.data(), s.B * s.T, s.T, s.qkv_width(),
                                             s.heads + s.kv_heads, s.head_size, sign, as_stream(stream)));
}
}  // namespace

void rope_forward(void* stream, std::span<float> qkv, std::span<const float> cos, std::span<const float> sin,
                  const AttentionShape& shape) {
  rotate(stream, "rope_forward", "qkv", qkv, cos, sin, shape, 1.0f);
}

void rope_backward(void* stream, std::span<float> dqkv, std::span<const float> cos, std::span<const float> sin,
                   const AttentionShape& shape) {
  rotate(stream, "rope_backward", "dqkv", dqkv, cos, sin, shape, -1.0f);
}

}  // namespace coshard::ops::cuda
