#include "coshard/gpt2/units.hpp"

#include <algorithm>
#include <initializer_list>

#include "coshard/runtime/error.hpp"

namespace coshard::gpt2 {

using models::phase_grads;

// The embedding (untied layout), or the two-phase root {wte, wpe, ln_f}: phase 0 the embedding,
// phase 1 the tied head.
class EmbeddingUnit final : public fsdp::Unit {
 public:
  explicit EmbeddingUnit(Gpt2Units& m) : m_(m) {}
  std::string name() const override { return m_.c_.tie_head ? "embedding_and_head" : "embedding"; }
  int phases() const override { return m_.c_.tie_head ? 2 : 1; }
  std::vector<fsdp::ParamSpec> params() const override {
    auto infos = embedding_params(m_.c_);
    if (m_.c_.tie_head) {
      for (auto& p : head_params(m_.c_)) infos.push_back(std::move(p));
    }
    return param_specs(infos, m_.seed_);
  }
  bool computes_in_f32() const override { return m_.computes_in_f32(); }
  Task<void> forward(fsdp::Scope& scope) override {
    const auto p = m_.phase_params(scope, m_.c_.tie_head ? 4 : 2, name());
    if (scope.phase() == 0) {
      const auto& b = m_.pending();
      ops::Kernels k = m_.kernels(scope, "forward " + name());
      m_.acts_->set_batch(k, b.tokens, b.targets, b.B, b.T);
      m_.acts_->embedding_forward(k, p[0], p[1]);
    } else {
      m_.head_forward(scope, p[2], p[3], p[0]);
    }
    co_return;
  }
  Task<void> backward(fsdp::Scope& scope) override {
    if (scope.phase() == 0) {
      ops::Kernels k = m_.kernels(scope, "backward " + name());
      m_.acts_->embedding_backward(k, scope.grad_tensor(0), scope.grad_tensor(1));
    } else {
      const auto p = m_.phase_params(scope, 4, name());
      const auto g = phase_grads(scope, 4);
      ops::Kernels k = m_.kernels(scope, "backward head");
      m_.acts_->head_backward(k, p[2], p[0], g[2], g[3], g[0], m_.dloss_);
    }
    co_return;
  }

 private:
  Gpt2Units& m_;
};

// The untied head: ln_f and lm_head.weight.
class HeadUnit final : public fsdp::Unit {
 public:
  explicit HeadUnit(Gpt2Units& m) : m_(m) {}
  std::string name() const override { return "head"; }
  std::vector<fsdp::ParamSpec> params() const override { return param_specs(head_params(m_.c_), m_.seed_); }
  bool computes_in_f32() const override { return m_.computes_in_f32(); }
  Task<void> forward(fsdp::Scope& scope) override {
    const auto p = m_.phase_params(scope, 3, name());
    m_.head_forward(scope, p[0], p[1], p[2]);
    co_return;
  }
  Task<void> backward(fsdp::Scope& scope) override {
    const auto p = m_.phase_params(scope, 3, name());
    const auto g = phase_grads(scope, 3);
    ops::Kernels k = m_.kernels(scope, "backward head");
    m_.acts_->head_backward(k, p[0], p[2], g[0], g[1], g[2], m_.dloss_);
    co_return;
  }

 private:
  Gpt2Units& m_;
};

Gpt2Units::Gpt2Units(Config config, std::uint64_t seed, Compute compute)
    : UnitSet(config, seed, compute, "GPT-2", "gpt2") {
  units_.push_back(std::make_unique<EmbeddingUnit>(*this));
  for (std::int64_t l = 0; l < c_.layers; ++l) units_.push_back(std::make_unique<models::LayerUnit<Gpt2Units, block_param_count>>(*this, static_cast<std::size_t>(l), "h."));
  if (!c_.tie_head) units_.push_back(std::make_unique<HeadUnit>(*this));
}

Gpt2Units::~Gpt2Units() = default;

void Gpt2Units::head_forward(fsdp::Scope& scope, const Tensor& ln_f_weight, const Tensor& ln_f_bias,
                             const Tensor& head) {
  ops::Kernels k = kernels(scope, "forward head");
  acts_->head_forward(k, ln_f_weight, ln_f_bias, head);
  publish_loss(scope, k);
}

Task<void> Gpt2Units::forward(fsdp::Engine& engine) { co_await engine.forward(); }

Task<void> Gpt2Units::backward(fsdp::Engine& engine) { co_await engine.backward(); }

}  // namespace coshard::gpt2
