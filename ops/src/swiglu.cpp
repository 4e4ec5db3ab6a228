#include "coshard/ops/swiglu.hpp"

#include <utility>

#include "check.hpp"
#include "isa/cpu_kernels.hpp"
#include "parallel.hpp"

namespace coshard::ops {

namespace {
constexpr std::size_t kGrain = 64;  // elements: runs of whole 256-byte blocks, few shared cache lines
}  // namespace

void swiglu_forward(std::span<const float> gate, std::span<const float> up, std::span<float> y) {
  constexpr const char* op = "swiglu_forward";
  detail::check_size(op, "up", up, gate.size(), "size of gate");
  detail::check_size(op, "y", y, gate.size(), "size of gate");
  detail::check_disjoint(op, "y", y, "gate", gate);
  detail::check_disjoint(op, "y", y, "up", up);
  const detail::CpuKernels& k = detail::cpu_kernels();
  detail::split_range(gate.size(), kGrain, detail::kElementMacs, [&](std::size_t b, std::size_t e) {
    k.swiglu_forward(gate.data() + b, up.data() + b, y.data() + b, e - b);
  });
}

void swiglu_backward(std::span<const float> dy, std::span<const float> gate, std::span<const float> up,
                     std::span<float> dgate, std::span<float> dup) {
  constexpr const char* op = "swiglu_backward";
  for (auto [name, s] : {std::pair{"dy", dy}, std::pair{"up", up}}) detail::check_size(op, name, s, gate.size(), "size of gate");
  detail::check_size(op, "dgate", dgate, gate.size(), "size of gate");
  detail::check_size(op, "dup", dup, gate.size(), "size of gate");
  detail::check_disjoint(op, "dgate", dgate, "dup", dup);
  for (auto [name, s] : {std::pair{"dy", dy}, std::pair{"gate", gate}, std::pair{"up", up}}) {
    detail::check_disjoint(op, "dgate", dgate, name, s);
    detail::check_disjoint(op, "dup", dup, name, s);
  }
  const detail::CpuKernels& k = detail::cpu_kernels();
  detail::split_range(gate.size(), kGrain, 2 * detail::kElementMacs, [&](std::size_t b, std::size_t e) {
    k.swiglu_backward(dy.data() + b, gate.data() + b, up.data() + b, dgate.data() + b, dup.data() + b, e - b);
  });
}

}  // namespace coshard::ops
