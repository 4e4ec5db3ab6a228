#pragma once
// What a model's FSDP units share besides their kernels (gpt2::Gpt2Units, llama::LlamaUnits
// derive from it): the units in engine order, the next batch (validated on the caller's thread,
// installed on the compute stream when the embedding runs), the compute-stream launcher, the
// activations (made on the first phase, in the runtime's device memory), the loss scale and the
// loss on its way to the host.
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "coshard/fsdp/unit.hpp"
#include "coshard/models/unit_io.hpp"

namespace coshard::models {

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
  UnitSet(Config c, std::string model) : c_(std::move(c)), model_(std::move(model)) { c_.validate(); }
  ~UnitSet() = default;

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
  std::string model_;  // in messages: "GPT-2", "Llama"
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

}  // namespace coshard::models
