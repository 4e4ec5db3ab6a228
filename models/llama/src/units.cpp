#include "coshard/llama/units.hpp"

#include <algorithm>

#include "coshard/runtime/error.hpp"

namespace coshard::llama {

namespace {

std::vector<Tensor> phase_params(const fsdp::Scope& scope, std::size_t count, const std::string& unit) {
  return models::phase_params(scope, count, "Llama unit " + unit, "use llama::Compute::f32 with this mixed precision");
}
using models::phase_grads;

}  // namespace

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
  bool computes_in_f32() const override { return m_.compute_ == Compute::f32; }
  Task<void> forward(fsdp::Scope& scope) override {
    const auto p = phase_params(scope, m_.c_.tie_head ? 2 : 1, name());
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
      const auto p = phase_params(scope, 2, name());
      const auto g = phase_grads(scope, 2);
      ops::Kernels k = m_.kernels(scope, "backward head");
      m_.acts_->head_backward(k, p[1], p[0], g[1], g[0], m_.dloss_);
    }
    co_return;
  }

 private:
  LlamaUnits& m_;
};

class BlockUnit final : public fsdp::Unit {
 public:
  BlockUnit(LlamaUnits& m, std::size_t layer) : m_(m), l_(layer) {}
  std::string name() const override { return "layers." + std::to_string(l_); }
  std::vector<fsdp::ParamSpec> params() const override {
    return models::param_specs(block_params(m_.c_, static_cast<std::int64_t>(l_)), m_.seed_);
  }
  bool computes_in_f32() const override { return m_.compute_ == Compute::f32; }
  Task<void> forward(fsdp::Scope& scope) override {
    const BlockWeights w = weights(scope);
    ops::Kernels k = m_.kernels(scope, "forward " + name());
    m_.acts_->block_forward(k, l_, w);
    co_return;
  }
  Task<void> backward(fsdp::Scope& scope) override {
    const BlockWeights w = weights(scope);
    BlockGrads g;
    for (std::size_t i = 0; i < block_param_count; ++i) g[i] = scope.grad_tensor(i);
    ops::Kernels k = m_.kernels(scope, "backward " + name());
    m_.acts_->block_backward(k, l_, w, g);
    co_return;
  }

 private:
  BlockWeights weights(const fsdp::Scope& scope) const {
    const auto p = phase_params(scope, block_param_count, name());
    BlockWeights w;
    std::copy(p.begin(), p.end(), w.begin());
    return w;
  }
  LlamaUnits& m_;
  std::size_t l_;
};

// The untied head: model.norm and lm_head.weight.
class HeadUnit final : public fsdp::Unit {
 public:
  explicit HeadUnit(LlamaUnits& m) : m_(m) {}
  std::string name() const override { return "head"; }
  std::vector<fsdp::ParamSpec> params() const override { return models::param_specs(head_params(m_.c_), m_.seed_); }
  bool computes_in_f32() const override { return m_.compute_ == Compute::f32; }
  Task<void> forward(fsdp::Scope& scope) override {
    const auto p = phase_params(scope, 2, name());
    m_.head_forward(scope, p[0], p[1]);
    co_return;
  }
  Task<void> backward(fsdp::Scope& scope) override {
    const auto p = phase_params(scope, 2, name());
    const auto g = phase_grads(scope, 2);
    ops::Kernels k = m_.kernels(scope, "backward head");
    m_.acts_->head_backward(k, p[0], p[1], g[0], g[1], m_.dloss_);
    co_return;
  }

 private:
  LlamaUnits& m_;
};

LlamaUnits::LlamaUnits(Config config, std::uint64_t seed, Compute compute)
    : UnitSet(config, "Llama"), seed_(seed), compute_(compute) {
  units_.push_back(std::make_unique<EmbeddingUnit>(*this));
  for (std::int64_t l = 0; l < c_.layers; ++l) units_.push_back(std::make_unique<BlockUnit>(*this, static_cast<std::size_t>(l)));
  if (!c_.tie_head) units_.push_back(std::make_unique<HeadUnit>(*this));
}

LlamaUnits::~LlamaUnits() = default;

void LlamaUnits::head_forward(fsdp::Scope& scope, const Tensor& norm_weight, const Tensor& head) {
  ops::Kernels k = kernels(scope, "forward head");
  acts_->head_forward(k, norm_weight, head);
  publish_loss(scope, k);
}

}  // namespace coshard::llama
