#include "coshard/models/unit_io.hpp"

#include "coshard/models/unit_set.hpp"

#include "coshard/runtime/cuda.hpp"
#include "coshard/runtime/error.hpp"

namespace coshard::models {

std::vector<Tensor> phase_params(const fsdp::Scope& scope, std::size_t count, const std::string& unit,
                                 const std::string& fix) {
  std::vector<Tensor> p;
  for (std::size_t i = 0; i < count; ++i) {
    p.push_back(scope.param_tensor(i));
    const DType d = p.back().dtype();
    if (d != DType::f32 && d != DType::bf16) {
      throw Error(Errc::invalid_argument,
                  unit + " computes in f32 or bf16, but its parameters are " + std::string(to_string(d)) + ": " + fix);
    }
  }
  return p;
}

std::vector<Tensor> phase_grads(const fsdp::Scope& scope, std::size_t count) {
  std::vector<Tensor> g;
  for (std::size_t i = 0; i < count; ++i) g.push_back(scope.grad_tensor(i));
  return g;
}

ops::Kernels ComputeLauncher::begin(fsdp::Scope& scope, std::string span) {
  if (!launch_ || launch_->stream() != &scope.compute()) launch_ = std::make_unique<ops::Launcher>(scope.compute());
  return launch_->begin(std::move(span));
}

void HostLoss::publish(fsdp::Scope& scope, ops::Kernels& k, const Tensor& device_loss) {
  if (!host_) {
    host_ = std::make_shared<Allocator>(scope.runtime().device().kind == DeviceKind::cuda ? cuda::pinned_host_memory()
                                                                                          : cpu_memory());
  }
  // The work keeps the allocator as long as the tensor (declared after it, destroyed before it):
  // the units may go first, with this work still queued, when a step fails.
  struct Slot {
    std::shared_ptr<Allocator> memory;
    Tensor value;
  };
  auto loss = std::make_shared<const Slot>(Slot{host_, Tensor::empty(*host_, DType::f32, {1})});
  k.to_host(loss->value, device_loss);
  k.submit();
  loss_.publish(scope.compute(), [loss] { return *loss->value.data_as<float>(); });
}

void check_batch(const std::string& what, const std::vector<std::int32_t>& tokens,
                 const std::vector<std::int32_t>& targets, std::size_t B, std::size_t T, std::int64_t vocab,
                 std::int64_t context, bool targets_optional) {
  const bool no_targets = targets_optional && targets.empty();
  if (B == 0 || T == 0 || T > static_cast<std::size_t>(context) || tokens.size() != B * T ||
      (!no_targets && targets.size() != B * T)) {
    throw Error(Errc::invalid_argument, what + "[" + std::to_string(B) + ", " + std::to_string(T) +
                                            "] needs 1 <= T <= context (" + std::to_string(context) + ") and " +
                                            std::to_string(B * T) + " tokens and targets, got " +
                                            std::to_string(tokens.size()) + " and " + std::to_string(targets.size()));
  }
  // Checked here, on the host, so that no kernel has to check them (CUDA would synchronise).
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= vocab || (!no_targets && (targets[i] < 0 || targets[i] >= vocab))) {
      throw Error(Errc::invalid_argument, what + "token or target at position " + std::to_string(i) +
                                              " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
    }
  }
}

}  // namespace coshard::models
