#pragma once
// What a model's FSDP units share around their kernels: the parameters and gradients of a phase
// as tensors, the launcher on the engine's compute stream, and the loss's way to the host (a
// stream-ordered copy into host memory, pinned on CUDA, read by a Readback: no host access to
// device memory and no synchronisation).
#include <memory>
#include <string>
#include <vector>

#include "coshard/fsdp/unit.hpp"
#include "coshard/ops/kernels.hpp"
#include "coshard/runtime/allocator.hpp"
#include "coshard/runtime/readback.hpp"

namespace coshard::models {

/// The unit's first `count` parameters as its kernels read them (Scope::param_tensor): f32, or bf16
/// where the unit computes on the mixed-precision parameters. Another dtype throws "<unit> computes
/// in f32 or bf16, but its parameters are <dtype>: <fix>".
std::vector<Tensor> phase_params(const fsdp::Scope& scope, std::size_t count, const std::string& unit,
                                 const std::string& fix);
/// The unit's first `count` gradient tensors (f32).
std::vector<Tensor> phase_grads(const fsdp::Scope& scope, std::size_t count);

/// The launcher of the engine's compute stream, made again when the stream changes.
class ComputeLauncher {
 public:
  ops::Kernels begin(fsdp::Scope& scope, std::string span);

 private:
  std::unique_ptr<ops::Launcher> launch_;
};

/// The mean loss of the last forward, on its way to the host.
class HostLoss {
 public:
  /// Copies `device_loss` (one f32) to host memory through `k` and publishes it on the scope's
  /// compute stream after k's work; `k` is submitted.
  void publish(fsdp::Scope& scope, ops::Kernels& k, const Tensor& device_loss);
  /// The latest published loss, once its kernel and copy ran.
  Task<float> get() const { return loss_.get(); }

 private:
  std::shared_ptr<Allocator> host_;  // pinned on CUDA; shared with the work that reads it
  Readback<float> loss_;
};

}  // namespace coshard::models
