#pragma once
// What a model's FSDP units share besides their kernels (gpt2::Gpt2Units, llama::LlamaUnits
// derive from it): the units in engine order, the next batch (validated on the caller's thread,
// installed on the compute stream when the embedding runs), the compute-stream launcher, the
// activations (made on the first phase, in the runtime's device memory), the loss scale and the
// loss on its way to the host; and the decoder layer's unit, which is the same for every model.
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "coshard/fsdp/unit.hpp"
#include "coshard/models/unit_io.hpp"

namespace coshard::models {

/// What a model's units compute with under bf16 mixed precision (fsdp::Options::mixed_precision.param).
///  - f32: an f32 copy of each resident unit's parameters, which the engine makes (the values are
///    bf16-rounded; GEMMs in f32).
///  - bf16: the all-gathered bf16 parameters themselves (Unit::computes_in_f32() false): no f32
///    copy, GEMMs with bf16 weights and f32 sums (ops/linear.hpp), as PyTorch FSDP's param_dtype
///    computes (cuBLAS's bf16 GEMM on CUDA); norms and biases are widened to f32 by the phase's
///    kernels. Without mixed precision the parameters are f32 and this is the same as f32; with
///    f16 it is an error.
enum class Compute { f32, bf16 };

/// Throws Errc::invalid_argument, beginning with `what`, unless tokens (and targets, unless empty
/// and optional) hold B x T ids in [0, vocab) with 1 <= T <= context.
void check_batch(const std::string& what, const std::vector<std::int32_t>& tokens,
                 const std::vector<std::int32_t>& targets, std::size_t B, std::size_t T, std::int64_t vocab,
                 std::int64_t context, bool targets_optional);

template <class Config, class Activations>
class UnitSet {
 public:
  struct Batch {
    std::vector<std::int32_t> tokens, targets;
    std::size_t B = 0, T = 0;
  };
  UnitSet(const UnitSet&) = delete;
  UnitSet& operator=(const UnitSet&) = delete;

  const Config& config() const noexcept { return c_; }
  /// In engine order (pass to Engine::create).
  std::vector<fsdp::Unit*> units() {
    std::vector<fsdp::Unit*> v;
    for (auto& u : units_) v.push_back(u.get());
    return v;
  }
  std::vector<std::string> unit_names() const {
    std::vector<std::string> v;
    for (const auto& u : units_) v.push_back(u->name());
    return v;
  }
  /// The next iteration's batch ([B, T] tokens and targets); may be called while the previous
  /// iteration's work is in flight.
  void set_batch(std::vector<std::int32_t> tokens, std::vector<std::int32_t> targets, std::size_t B, std::size_t T) {
    check_batch(model_ + " set_batch: ", tokens, targets, B, T, c_.vocab, c_.context, false);
    pending_ = std::make_shared<const Batch>(Batch{std::move(tokens), std::move(targets), B, T});
  }
  /// Gradient scale of the mean loss (1/k for k accumulated micro-batches); default 1.
  void set_loss_scale(float dloss) noexcept { dloss_ = dloss; }
  /// The last forward's mean loss, once the compute stream has computed it.
  Task<float> loss() const { return loss_.get(); }

 protected:
  /// `model` names it in messages ("GPT-2"), `ns` is its namespace ("gpt2").
  UnitSet(Config c, std::uint64_t seed, Compute compute, std::string model, std::string ns)
      : c_(std::move(c)), seed_(seed), compute_(compute), model_(std::move(model)), ns_(std::move(ns)) {
    c_.validate();
  }
  ~UnitSet() = default;

  bool computes_in_f32() const noexcept { return compute_ == Compute::f32; }
  /// The phase's first `count` parameters as the unit's kernels read them (models::phase_params).
  std::vector<Tensor> phase_params(const fsdp::Scope& scope, std::size_t count, const std::string& unit) const {
    return models::phase_params(scope, count, model_ + " unit " + unit,
                                "use " + ns_ + "::Compute::f32 with this mixed precision");
  }

  /// The kernels of a phase on the scope's compute stream; makes the activations on the first.
  ops::Kernels kernels(fsdp::Scope& scope, std::string span) {
    if (!acts_) acts_ = std::make_unique<Activations>(c_, scope.runtime().allocator());
    return launch_.begin(scope, std::move(span));
  }
  /// After a head's forward: its loss to the host, when the batch has targets.
  void publish_loss(fsdp::Scope& scope, ops::Kernels& k) {
    if (acts_->has_targets()) loss_.publish(scope, k, acts_->loss());
  }
  /// The pending batch, or an error naming the model when none was given.
  const Batch& pending() const;

  Config c_;
  std::uint64_t seed_;
  Compute compute_;
  std::string model_, ns_;
  std::unique_ptr<Activations> acts_;
  std::shared_ptr<const Batch> pending_;
  float dloss_ = 1.0f;
  std::vector<std::unique_ptr<fsdp::Unit>> units_;

 private:
  ComputeLauncher launch_;
  HostLoss loss_;
};

template <class Config, class Activations>
const typename UnitSet<Config, Activations>::Batch& UnitSet<Config, Activations>::pending() const {
  if (!pending_) throw Error(Errc::invalid_argument, model_ + " forward without a batch: call set_batch() first");
  return *pending_;
}

/// Decoder layer `layer` of a model: the unit `prefix<layer>` holding the layer's N parameters
/// (block_params(config, layer) of the config's namespace), whose phases are the activations'
/// block_forward and block_backward. Set is a UnitSet that befriends it.
template <class Set, std::size_t N>
class LayerUnit final : public fsdp::Unit {
 public:
  LayerUnit(Set& m, std::size_t layer, const std::string& prefix) : m_(m), l_(layer), name_(prefix + std::to_string(layer)) {}
  std::string name() const override { return name_; }
  std::vector<fsdp::ParamSpec> params() const override {
    return param_specs(block_params(m_.c_, static_cast<std::int64_t>(l_)), m_.seed_);
  }
  bool computes_in_f32() const override { return m_.computes_in_f32(); }
  Task<void> forward(fsdp::Scope& scope) override {
    const auto w = weights(scope);
    ops::Kernels k = m_.kernels(scope, "forward " + name_);
    m_.acts_->block_forward(k, l_, w);
    co_return;
  }
  Task<void> backward(fsdp::Scope& scope) override {
    const auto w = weights(scope);
    std::array<Tensor, N> g;
    for (std::size_t i = 0; i < N; ++i) g[i] = scope.grad_tensor(i);
    ops::Kernels k = m_.kernels(scope, "backward " + name_);
    m_.acts_->block_backward(k, l_, w, g);
    co_return;
  }

 private:
  std::array<Tensor, N> weights(const fsdp::Scope& scope) const {
    const auto p = m_.phase_params(scope, N, name_);
    std::array<Tensor, N> w;
    for (std::size_t i = 0; i < N; ++i) w[i] = p[i];
    return w;
  }

  Set& m_;
  std::size_t l_;
  std::string name_;
};

}  // namespace coshard::models
