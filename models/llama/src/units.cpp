#include "coshard/llama/units.hpp"

#include <algorithm>

#include "coshard/runtime/error.hpp"

namespace coshard::llama {

using models::phase_grads;

// The embedding (untied), or the two-phase root {embed_tokens, norm}: phase 0 the embedding,
// phase 1 the tied head.
class EmbeddingUnit final : public fsdp::Unit {
 public:
  explicit EmbeddingUnit(LlamaUnits& m) : m_(m) {}
  std::string name() const override { return m_.c_.tie_head ? "embedding_and_head" : "embedding"; }
  int phases() const override { return m_.c_.tie_head ? 2 : 1; }
  std::vector<fsdp::ParamSpec> params() const override {
    auto infos = embedding_params(m_.c_);
    if (m_.c_.tie_head) {
      for (auto& p : head_params(m_.c_)) infos.push_back(std::move(p));
    }
    return models::param_specs(infos, m_.seed_);
  }
  bool computes_in_f32() const override { return m_.computes_in_f32(); }
  Task<void> forward(fsdp::Scope& scope) override {
    const auto p = m_.phase_params(scope, m_.c_.tie_head ? 2 : 1, name());
    if (scope.phase() == 0) {
      const auto& b = m_.pending();
      ops::Kernels k = m_.kernels(scope, "forward " + name());
      m_.acts_->set_batch(k, b.tokens, b.targets, b.B, b.T);
      m_.acts_->embedding_forward(k, p[0]);
    } else {
      m_.head_forward(scope, p[1], p[0]);
    }
    co_return;
  }
  Task<void> backward(fsdp::Scope& scope) override {
    if (scope.phase() == 0) {
      ops::Kernels k = m_.kernels(scope, "backward " + name());
      m_.acts_->embedding_backward(k, scope.grad_tensor(0));
    } else {
      const auto p = m_.phase_params(scope, 2, name());
      const auto g = phase_grads(scope, 2);
      ops::Kernels k = m_.kernels(scope, "backward head");
      m_.acts_->head_backward(k, p[1], p[0], g[1], g[0], m_.dloss_);
    }
    co_return;
  }

 private:
  LlamaUnits& m_;
};

// The untied head: model.norm and lm_head.weight.
class HeadUnit final : public fsdp::Unit {
 public:
  explicit HeadUnit(LlamaUnits& m) : m_(m) {}
  std::string name() const override { return "head"; }
  std::vector<fsdp::ParamSpec> params() const override { return models::param_specs(head_params(m_.c_), m_.seed_); }
  bool computes_in_f32() const override { return m_.computes_in_f32(); }
  Task<void> forward(fsdp::Scope& scope) override {
    const auto p = m_.phase_params(scope, 2, name());
    m_.head_forward(scope, p[0], p[1]);
    co_return;
  }
  Task<void> backward(fsdp::Scope& scope) override {
    const auto p = m_.phase_params(scope, 2, name());
    const auto g = phase_grads(scope, 2);
    ops::Kernels k = m_.kernels(scope, "backward head");
    m_.acts_->head_backward(k, p[0], p[1], g[0], g[1], m_.dloss_);
    co_return;
  }

 private:
  LlamaUnits& m_;
};

LlamaUnits::LlamaUnits(Config config, std::uint64_t seed, Compute compute)
    : UnitSet(config, seed, compute, "Llama", "llama") {
  units_.push_back(std::make_unique<EmbeddingUnit>(*this));
  for (std::int64_t l = 0; l < c_.layers; ++l) units_.push_back(std::make_unique<models::LayerUnit<LlamaUnits, block_param_count>>(*this, static_cast<std::size_t>(l), "layers."));
  if (!c_.tie_head) units_.push_back(std::make_unique<HeadUnit>(*this));
}

LlamaUnits::~LlamaUnits() = default;

void LlamaUnits::head_forward(fsdp::Scope& scope, const Tensor& norm_weight, const Tensor& head) {
  ops::Kernels k = kernels(scope, "forward head");
  acts_->head_forward(k, norm_weight, head);
  publish_loss(scope, k);
}

}  // namespace coshard::llama
