#include "coshard/gpt2/units.hpp"

#include <algorithm>
#include <initializer_list>

#include "coshard/ops/cast.hpp"
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

namespace {

// A unit's parameters as its stream work reads them: Scope::param_tensor, f32 (the engine's copy,
// or no mixed precision) or bf16 (Compute::bf16). Taken when the phase runs; resolved in the work,
// where the memory may be read: bf16 GEMM weights and embedding tables stay bf16, every other bf16
// parameter (layernorms, biases) is widened into the model's scratch.
class PhaseParams {
 public:
  PhaseParams(const fsdp::Scope& scope, std::size_t count, const std::string& unit) {
    for (std::size_t i = 0; i < count; ++i) {
      const Tensor t = scope.param_tensor(i);
      const DType d = t.dtype();
      views_.push_back({t.data(), d == DType::bf16, static_cast<std::size_t>(t.numel())});
      if (d != DType::f32 && d != DType::bf16) {
        throw Error(Errc::invalid_argument, "GPT-2 unit " + unit + " computes in f32 or bf16, but its parameters are " +
                                                std::string(to_string(d)) +
                                                ": use gpt2::Compute::f32 with this mixed precision");
      }
    }
  }
  // In the work: widens every bf16 parameter but those in `kept` into `scratch`.
  void resolve(std::vector<float>& scratch, std::initializer_list<std::size_t> kept) {
    auto keep = [&](std::size_t i) { return std::find(kept.begin(), kept.end(), i) != kept.end(); };
    std::size_t total = 0;
    for (std::size_t i = 0; i < views_.size(); ++i) total += bf16(i) && !keep(i) ? views_[i].numel : 0;
    if (scratch.size() < total) scratch.resize(total);  // spans into it are taken after, never before
    f32_.assign(views_.size(), {});
    std::size_t at = 0;
    for (std::size_t i = 0; i < views_.size(); ++i) {
      const View& v = views_[i];
      if (!v.bf16) {
        f32_[i] = {static_cast<const float*>(v.data), v.numel};
      } else if (!keep(i)) {
        std::span<float> out(scratch.data() + at, v.numel);
        ops::cast_bf16_to_f32(bits(i), out);
        f32_[i] = out;
        at += v.numel;
      }
    }
  }
  bool bf16(std::size_t i) const { return views_[i].bf16; }
  std::span<const float> f32(std::size_t i) const { return f32_.at(i); }
  std::span<const std::uint16_t> bits(std::size_t i) const {
    return {static_cast<const std::uint16_t*>(views_[i].data), views_[i].numel};
  }
  GemmWeight gemm(std::size_t i) const { return bf16(i) ? GemmWeight(bits(i)) : GemmWeight(f32(i)); }

 private:
  // Where a parameter is, not a Tensor: the work holds no reference to the engine's buffers.
  struct View {
    const void* data;
    bool bf16;
    std::size_t numel;
  };
  std::vector<View> views_;
  std::vector<std::span<const float>> f32_;
};

}  // namespace

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
  bool computes_in_f32() const override { return m_.compute_ == Compute::f32; }
  Task<void> forward(fsdp::Scope& scope) override {
    Activations* acts = &m_.acts_;
    std::vector<float>* scratch = &m_.widened_;
    PhaseParams p(scope, m_.c_.tie_head ? 4 : 2, name());
    if (scope.phase() == 0) {
      if (!m_.pending_) throw Error(Errc::invalid_argument, "GPT-2 forward without a batch: call set_batch() first");
      auto batch = m_.pending_;
      scope.enqueue([acts, batch, p, scratch]() mutable {
        acts->set_batch(batch->tokens, batch->targets, batch->B, batch->T);
        p.resolve(*scratch, {0, 1});
        if (p.bf16(0)) {
          acts->embedding_forward(p.bits(0), p.bits(1));
        } else {
          acts->embedding_forward(p.f32(0), p.f32(1));
        }
      }, "forward " + name());
    } else {
      scope.enqueue([acts, p, scratch]() mutable {
        p.resolve(*scratch, {0, 1});
        acts->head_forward(p.f32(2), p.f32(3), p.gemm(0));
      }, "forward head");
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
      PhaseParams p(scope, 4, name());
      std::vector<float>* scratch = &m_.widened_;
      auto dwte = scope.grad(0), dlnw = scope.grad(2), dlnb = scope.grad(3);
      const float dloss = m_.dloss_;
      scope.enqueue([acts, p, scratch, dwte, dlnw, dlnb, dloss]() mutable {
        p.resolve(*scratch, {0, 1});
        acts->head_backward(p.f32(2), p.gemm(0), dlnw, dlnb, dwte, dloss);
      }, "backward head");
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
  bool computes_in_f32() const override { return m_.compute_ == Compute::f32; }
  Task<void> forward(fsdp::Scope& scope) override {
    Activations* acts = &m_.acts_;
    std::vector<float>* scratch = &m_.widened_;
    PhaseParams p(scope, block_param_count, name());
    const std::size_t l = l_;
    scope.enqueue([acts, l, p, scratch]() mutable { acts->block_forward(l, weights(p, *scratch)); },
                  "forward " + name());
    co_return;
  }
  Task<void> backward(fsdp::Scope& scope) override {
    BlockGrads g;
    for (std::size_t k = 0; k < block_param_count; ++k) g[k] = scope.grad(k);
    Activations* acts = &m_.acts_;
    std::vector<float>* scratch = &m_.widened_;
    PhaseParams p(scope, block_param_count, name());
    const std::size_t l = l_;
    scope.enqueue([acts, l, p, g, scratch]() mutable { acts->block_backward(l, weights(p, *scratch), g); },
                  "backward " + name());
    co_return;
  }

 private:
  static BlockWeights weights(PhaseParams& p, std::vector<float>& scratch) {
    p.resolve(scratch, {c_attn_weight, attn_c_proj_weight, c_fc_weight, mlp_c_proj_weight});
    BlockWeights w;
    for (std::size_t k = 0; k < block_param_count; ++k) {
      if (p.bf16(k) && p.f32(k).empty()) {
        w.bf16[k] = p.bits(k);
      } else {
        w.f32[k] = p.f32(k);
      }
    }
    return w;
  }

  Gpt2Units& m_;
  std::size_t l_;
};

// The untied head: ln_f and lm_head.weight.
class HeadUnit final : public fsdp::Unit {
 public:
  explicit HeadUnit(Gpt2Units& m) : m_(m) {}
  std::string name() const override { return "head"; }
  std::vector<fsdp::ParamSpec> params() const override { return param_specs(head_params(m_.c_), m_.seed_); }
  bool computes_in_f32() const override { return m_.compute_ == Compute::f32; }
  Task<void> forward(fsdp::Scope& scope) override {
    Activations* acts = &m_.acts_;
    std::vector<float>* scratch = &m_.widened_;
    PhaseParams p(scope, 3, name());
    scope.enqueue([acts, p, scratch]() mutable {
      p.resolve(*scratch, {2});
      acts->head_forward(p.f32(0), p.f32(1), p.gemm(2));
    }, "forward head");
    m_.loss_.publish(scope.compute(), [acts] { return acts->loss(); });
    co_return;
  }
  Task<void> backward(fsdp::Scope& scope) override {
    Activations* acts = &m_.acts_;
    std::vector<float>* scratch = &m_.widened_;
    PhaseParams p(scope, 3, name());
    auto dlnw = scope.grad(0), dlnb = scope.grad(1), dw = scope.grad(2);
    const float dloss = m_.dloss_;
    scope.enqueue([acts, p, scratch, dlnw, dlnb, dw, dloss]() mutable {
      p.resolve(*scratch, {2});
      acts->head_backward(p.f32(0), p.gemm(2), dlnw, dlnb, dw, dloss);
    }, "backward head");
    co_return;
  }

 private:
  Gpt2Units& m_;
};

Gpt2Units::Gpt2Units(Config config, std::uint64_t seed, Compute compute)
    : c_(config), seed_(seed), compute_(compute), acts_(config) {
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
