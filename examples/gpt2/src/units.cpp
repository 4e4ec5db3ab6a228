#include "coshard/gpt2/units.hpp"

#include "coshard/runtime/error.hpp"

namespace coshard::gpt2 {

std::vector<fsdp::ParamSpec> param_specs(const std::vector<ParamInfo>& infos, std::uint64_t seed) {
  std::vector<fsdp::ParamSpec> specs;
  for (const auto& p : infos) {
    fsdp::InitFn init = [p, seed](std::span<float> out, std::int64_t first) { init_values(p, seed, out, first); };
    specs.push_back({p.name, p.shape, std::move(init), p.weight_decay});
  }
  return specs;
}

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
  Task<void> forward(fsdp::Scope& scope) override {
    Activations* acts = &m_.acts_;
    if (scope.phase() == 0) {
      if (!m_.pending_) throw Error(Errc::invalid_argument, "GPT-2 forward without a batch: call set_batch() first");
      auto batch = m_.pending_;
      auto wte = scope.param(0), wpe = scope.param(1);
      scope.enqueue([acts, batch, wte, wpe] {
        acts->set_batch(batch->tokens, batch->targets, batch->B, batch->T);
        acts->embedding_forward(wte, wpe);
      }, "forward " + name());
    } else {
      auto wte = scope.param(0), lnw = scope.param(2), lnb = scope.param(3);
      scope.enqueue([acts, wte, lnw, lnb] { acts->head_forward(lnw, lnb, wte); }, "forward head");
      m_.loss_.publish(scope.compute(), [acts] { return acts->loss(); });
    }
    co_return;
  }
  Task<void> backward(fsdp::Scope& scope) override {
    Activations* acts = &m_.acts_;
    if (scope.phase() == 0) {
      auto dwte = scope.grad(0), dwpe = scope.grad(1);
      scope.enqueue([acts, dwte, dwpe] { acts->embedding_backward(dwte, dwpe); }, "backward " + name());
    } else {
      auto wte = scope.param(0), lnw = scope.param(2), dwte = scope.grad(0), dlnw = scope.grad(2), dlnb = scope.grad(3);
      const float dloss = m_.dloss_;
      scope.enqueue([acts, wte, lnw, dwte, dlnw, dlnb, dloss] { acts->head_backward(lnw, wte, dlnw, dlnb, dwte, dloss); },
                    "backward head");
    }
    co_return;
  }

 private:
  Gpt2Units& m_;
};

class BlockUnit final : public fsdp::Unit {
 public:
  BlockUnit(Gpt2Units& m, std::size_t layer) : m_(m), l_(layer) {}
  std::string name() const override { return "h." + std::to_string(l_); }
  std::vector<fsdp::ParamSpec> params() const override {
    return param_specs(block_params(m_.c_, static_cast<std::int64_t>(l_)), m_.seed_);
  }
  Task<void> forward(fsdp::Scope& scope) override {
    BlockWeights w;
    for (std::size_t k = 0; k < block_param_count; ++k) w[k] = scope.param(k);
    Activations* acts = &m_.acts_;
    const std::size_t l = l_;
    scope.enqueue([acts, l, w] { acts->block_forward(l, w); }, "forward " + name());
    co_return;
  }
  Task<void> backward(fsdp::Scope& scope) override {
    BlockWeights w;
    BlockGrads g;
    for (std::size_t k = 0; k < block_param_count; ++k) {
      w[k] = scope.param(k);
      g[k] = scope.grad(k);
    }
    Activations* acts = &m_.acts_;
    const std::size_t l = l_;
    scope.enqueue([acts, l, w, g] { acts->block_backward(l, w, g); }, "backward " + name());
    co_return;
  }

 private:
  Gpt2Units& m_;
  std::size_t l_;
};

// The untied head: ln_f and lm_head.weight.
class HeadUnit final : public fsdp::Unit {
 public:
  explicit HeadUnit(Gpt2Units& m) : m_(m) {}
  std::string name() const override { return "head"; }
  std::vector<fsdp::ParamSpec> params() const override { return param_specs(head_params(m_.c_), m_.seed_); }
  Task<void> forward(fsdp::Scope& scope) override {
    Activations* acts = &m_.acts_;
    auto lnw = scope.param(0), lnb = scope.param(1), w = scope.param(2);
    scope.enqueue([acts, lnw, lnb, w] { acts->head_forward(lnw, lnb, w); }, "forward head");
    m_.loss_.publish(scope.compute(), [acts] { return acts->loss(); });
    co_return;
  }
  Task<void> backward(fsdp::Scope& scope) override {
    Activations* acts = &m_.acts_;
    auto lnw = scope.param(0), w = scope.param(2), dlnw = scope.grad(0), dlnb = scope.grad(1), dw = scope.grad(2);
    const float dloss = m_.dloss_;
    scope.enqueue([acts, lnw, w, dlnw, dlnb, dw, dloss] { acts->head_backward(lnw, w, dlnw, dlnb, dw, dloss); },
                  "backward head");
    co_return;
  }

 private:
  Gpt2Units& m_;
};

Gpt2Units::Gpt2Units(Config config, std::uint64_t seed) : c_(config), seed_(seed), acts_(config) {
  units_.push_back(std::make_unique<EmbeddingUnit>(*this));
  for (std::int64_t l = 0; l < c_.layers; ++l) units_.push_back(std::make_unique<BlockUnit>(*this, static_cast<std::size_t>(l)));
  if (!c_.tie_head) units_.push_back(std::make_unique<HeadUnit>(*this));
}

Gpt2Units::~Gpt2Units() = default;

std::vector<fsdp::Unit*> Gpt2Units::units() {
  std::vector<fsdp::Unit*> v;
  for (auto& u : units_) v.push_back(u.get());
  return v;
}

std::vector<std::string> Gpt2Units::unit_names() const {
  std::vector<std::string> v;
  for (const auto& u : units_) v.push_back(u->name());
  return v;
}

void Gpt2Units::set_batch(std::vector<std::int32_t> tokens, std::vector<std::int32_t> targets, std::size_t B,
                          std::size_t T) {
  // Validate here, on the caller's thread, so that a bad batch fails where it was given.
  if (B == 0 || T == 0 || T > static_cast<std::size_t>(c_.context) || tokens.size() != B * T || targets.size() != B * T) {
    throw Error(Errc::invalid_argument, "GPT-2 set_batch: [" + std::to_string(B) + ", " + std::to_string(T) +
                                            "] needs 1 <= T <= context (" + std::to_string(c_.context) + ") and " +
                                            std::to_string(B * T) + " tokens and targets, got " +
                                            std::to_string(tokens.size()) + " and " + std::to_string(targets.size()));
  }
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= c_.vocab || targets[i] < 0 || targets[i] >= c_.vocab) {
      throw Error(Errc::invalid_argument, "GPT-2 set_batch: token or target at position " + std::to_string(i) +
                                              " is outside the vocabulary [0, " + std::to_string(c_.vocab) + ")");
    }
  }
  auto b = std::make_shared<Batch>();
  b->tokens = std::move(tokens);
  b->targets = std::move(targets);
  b->B = B;
  b->T = T;
  pending_ = std::move(b);
}

Task<void> Gpt2Units::forward(fsdp::Engine& engine) { co_await engine.forward(); }

Task<void> Gpt2Units::backward(fsdp::Engine& engine) { co_await engine.backward(); }

}  // namespace coshard::gpt2
