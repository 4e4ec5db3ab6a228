#include "coshard/llama/model.hpp"

#include <algorithm>
#include <limits>
#include <string>

#include "coshard/ops/rope.hpp"
#include "coshard/models/unit_set.hpp"
#include "coshard/runtime/error.hpp"

namespace coshard::llama {
namespace {

using ops::WeightLayout;
constexpr WeightLayout kLinear = WeightLayout::out_in;  // nn.Linear's [out, in]

void check_grad(const Tensor& g, std::size_t n, const char* what) {
  if (static_cast<std::size_t>(g.numel()) != n) {
    throw Error(Errc::invalid_argument, std::string("Llama backward: gradient of ") + what + " has " +
                                            std::to_string(g.numel()) + " elements, expected " + std::to_string(n));
  }
}

std::size_t z(std::int64_t v) { return static_cast<std::size_t>(v); }

}  // namespace

Activations::Activations(Config config, Allocator& alloc) : c_(config), alloc_(alloc) {
  c_.validate();
  resid_.resize(z(c_.layers) + 1);
  blocks_.resize(z(c_.layers));
}

void Activations::size(ops::Kernels& k, Tensor& t, std::size_t n) {
  if (t.defined() && static_cast<std::size_t>(t.numel()) == n) return;
  t = Tensor::empty(alloc_, DType::f32, {static_cast<std::int64_t>(n)});
  k.zero(t);
}

Tensor Activations::f32(ops::Kernels& k, const Tensor& p) {
  if (p.dtype() == DType::f32) return p;
  Tensor wide = Tensor::empty(alloc_, DType::f32, p.shape());
  k.widen_bf16(wide, p);
  return wide;
}

Tensor Activations::first(const Tensor& t, std::size_t n) { return t.view(0, {static_cast<std::int64_t>(n)}); }

ops::AttentionShape Activations::shape() const noexcept {
  return {B_, T_, z(c_.heads), z(c_.kv_heads), z(c_.head_dim)};
}

void Activations::set_batch(ops::Kernels& k, std::vector<std::int32_t> tokens, std::vector<std::int32_t> targets,
                            std::size_t B, std::size_t T) {
  models::check_batch("Llama: ", tokens, targets, B, T, c_.vocab, c_.context, true);
  const bool new_length = T != T_;
  B_ = B;
  T_ = T;
  has_targets_ = !targets.empty();
  const std::size_t BT = B * T, C = z(c_.width), F = z(c_.ffn), Q = z(c_.q_width()), W = shape().qkv_width();
  if (tokens_.numel() != static_cast<std::int64_t>(BT)) {
    tokens_ = Tensor::empty(alloc_, DType::i32, {static_cast<std::int64_t>(BT)});
    targets_ = Tensor::empty(alloc_, DType::i32, {static_cast<std::int64_t>(BT)});
  }
  k.upload(tokens_, std::move(tokens));
  if (has_targets_) k.upload(targets_, std::move(targets));
  const std::size_t half = z(c_.head_dim) / 2;
  if (new_length || !cos_.defined()) {
    std::vector<float> cos(T * half), sin(T * half);
    ops::rope_table(cos, sin, T, z(c_.head_dim), c_.rope_theta, c_.rope_llama3 ? &c_.rope_scaling : nullptr);
    size(k, cos_, T * half), size(k, sin_, T * half);
    k.upload(cos_, std::move(cos));
    k.upload(sin_, std::move(sin));
  }
  const std::size_t saved = k.attention_saved_numel(B, T, z(c_.heads));
  for (auto& r : resid_) size(k, r, BT * C);
  for (auto& b : blocks_) {
    size(k, b.n1, BT * C), size(k, b.rstd1, BT), size(k, b.qkv, BT * W), size(k, b.att, BT * Q);
    size(k, b.att_saved, saved), size(k, b.res2, BT * C), size(k, b.n2, BT * C), size(k, b.rstd2, BT);
    size(k, b.gate, BT * F), size(k, b.up, BT * F), size(k, b.act, BT * F);
  }
  const std::size_t Vs = z(c_.vocab);
  size(k, nf_, BT * C), size(k, rstdf_, BT), size(k, logits_, BT * Vs), size(k, lse_, BT), size(k, loss_, 1);
  size(k, proj_, BT * Q), size(k, tmp_, BT * C);
  size(k, dresid_, BT * C), size(k, dres2_, BT * C), size(k, dtmp_, BT * C), size(k, dn_, BT * C);
  size(k, dact_, BT * F), size(k, dgate_, BT * F), size(k, dup_, BT * F), size(k, datt_, BT * Q);
  size(k, dqkv_, BT * W), size(k, dproj_, BT * Q);
}

double Activations::bytes_for(const Config& c, double B, double T) noexcept {
  const double L = static_cast<double>(c.layers), C = static_cast<double>(c.width), F = static_cast<double>(c.ffn),
               Q = static_cast<double>(c.q_width()), W = static_cast<double>(c.q_width() + 2 * c.kv_width()),
               H = static_cast<double>(c.heads), V = static_cast<double>(c.vocab), BT = B * T;
  // A layer: n1, res2, n2 (C), qkv (W), att (Q), gate, up, act (F), two rstds and attention's
  // log-sum-exp (a head). Then resid_ L+1 and nf_ (C), rstdf_ and lse_, logits_ and dlogits_ (V),
  // the loss; forward scratch proj_ (Q) and tmp_ (C); backward scratch 4 C, 3 F, 2 Q and W; the
  // rotary table; tokens_ and targets_ (int32).
  const double layer = BT * (3 * C + W + Q + 3 * F + 2) + B * H * T;
  const double floats = L * layer + BT * ((L + 2) * C + 2 + 2 * V + Q + C + 4 * C + 3 * F + 2 * Q + W) + 1 +
                        T * static_cast<double>(c.head_dim);
  return 4 * floats + 8 * BT;
}

std::size_t Activations::bytes() const noexcept {
  std::size_t bytes = 0;
  auto add = [&](const Tensor& t) { bytes += t.nbytes(); };
  for (const auto& r : resid_) add(r);
  for (const auto& b : blocks_) {
    for (const Tensor* t : {&b.n1, &b.rstd1, &b.qkv, &b.att, &b.att_saved, &b.res2, &b.n2, &b.rstd2, &b.gate, &b.up,
                            &b.act}) {
      add(*t);
    }
  }
  for (const Tensor* t : {&nf_, &rstdf_, &logits_, &lse_, &dlogits_, &loss_, &proj_, &tmp_, &dresid_, &dres2_, &dtmp_,
                          &dn_, &dact_, &dgate_, &dup_, &datt_, &dqkv_, &dproj_, &tokens_, &targets_, &cos_, &sin_}) {
    add(*t);
  }
  return bytes;
}

void Activations::embedding_forward(ops::Kernels& k, const Tensor& embed) {
  k.embedding_forward(tokens_, embed, Tensor(), resid_[0], B_, T_, z(c_.width), z(c_.vocab));
}

void Activations::block_forward(ops::Kernels& k, std::size_t l, const BlockWeights& w) {
  const std::size_t C = z(c_.width), BT = B_ * T_, F = z(c_.ffn), Q = z(c_.q_width()), KV = z(c_.kv_width());
  const ops::AttentionShape s = shape();
  const std::size_t W = s.qkv_width();
  const auto eps = static_cast<float>(c_.rms_eps);
  Block& a = blocks_.at(l);
  const Tensor& x = resid_[l];
  k.rmsnorm_forward(x, f32(k, w[attn_norm]), a.n1, a.rstd1, BT, C, eps);
  // q, k and v into the fused [BT, (NH + 2 NKV) hs] that RoPE and attention read.
  const Tensor q = first(proj_, BT * Q), kv = first(proj_, BT * KV);
  k.linear_forward(a.n1, w[q_proj], {}, q, BT, C, Q, kLinear);
  k.put_columns(q, a.qkv, BT, Q, W, 0);
  k.linear_forward(a.n1, w[k_proj], {}, kv, BT, C, KV, kLinear);
  k.put_columns(kv, a.qkv, BT, KV, W, Q);
  k.linear_forward(a.n1, w[v_proj], {}, kv, BT, C, KV, kLinear);
  k.put_columns(kv, a.qkv, BT, KV, W, Q + KV);
  k.rope_forward(a.qkv, cos_, sin_, s);
  k.attention_forward(a.qkv, a.att, a.att_saved, s);
  k.linear_forward(a.att, w[o_proj], {}, tmp_, BT, Q, C, kLinear);
  k.residual_forward(x, tmp_, a.res2);
  k.rmsnorm_forward(a.res2, f32(k, w[mlp_norm]), a.n2, a.rstd2, BT, C, eps);
  k.linear_forward(a.n2, w[gate_proj], {}, a.gate, BT, C, F, kLinear);
  k.linear_forward(a.n2, w[up_proj], {}, a.up, BT, C, F, kLinear);
  k.swiglu_forward(a.gate, a.up, a.act);
  k.linear_forward(a.act, w[down_proj], {}, tmp_, BT, F, C, kLinear);
  k.residual_forward(a.res2, tmp_, resid_[l + 1]);
}

void Activations::head_forward(ops::Kernels& k, const Tensor& norm_weight, const Tensor& head) {
  const std::size_t C = z(c_.width), BT = B_ * T_, V = z(c_.vocab);
  k.rmsnorm_forward(resid_.back(), f32(k, norm_weight), nf_, rstdf_, BT, C, static_cast<float>(c_.rms_eps));
  k.linear_forward(nf_, head, {}, logits_, BT, C, V, kLinear);
  if (has_targets_) k.cross_entropy_forward(logits_, targets_, lse_, loss_, BT, V);
}

void Activations::head_backward(ops::Kernels& k, const Tensor& norm_weight, const Tensor& head,
                                const Tensor& d_norm_weight, const Tensor& d_head, float dloss) {
  if (!has_targets_) throw Error(Errc::invalid_argument, "Llama backward: the batch has no targets");
  const std::size_t C = z(c_.width), BT = B_ * T_, V = z(c_.vocab);
  check_grad(d_head, V * C, "the head weight");
  size(k, dlogits_, BT * V);
  k.cross_entropy_backward(logits_, targets_, lse_, dlogits_, BT, V, dloss);
  k.linear_backward(dlogits_, nf_, head, dn_, d_head, {}, BT, C, V, kLinear);
  k.rmsnorm_backward(dn_, resid_.back(), f32(k, norm_weight), rstdf_, dresid_, d_norm_weight, BT, C);
}

void Activations::block_backward(ops::Kernels& k, std::size_t l, const BlockWeights& w, const BlockGrads& g) {
  const std::size_t C = z(c_.width), BT = B_ * T_, F = z(c_.ffn), Q = z(c_.q_width()), KV = z(c_.kv_width());
  const ops::AttentionShape s = shape();
  const std::size_t W = s.qkv_width();
  Block& a = blocks_.at(l);
  // dresid_ holds the gradient of the layer's output; it leaves holding that of its input.
  k.copy(dres2_, dresid_);
  // MLP branch: out = res2 + down(silu(gate(n2)) * up(n2)), n2 = norm(res2).
  k.linear_backward(dresid_, a.act, w[down_proj], dact_, g[down_proj], {}, BT, F, C, kLinear);
  k.swiglu_backward(dact_, a.gate, a.up, dgate_, dup_);
  k.linear_backward(dgate_, a.n2, w[gate_proj], dn_, g[gate_proj], {}, BT, C, F, kLinear);
  k.linear_backward(dup_, a.n2, w[up_proj], dtmp_, g[up_proj], {}, BT, C, F, kLinear);
  k.accumulate(dn_, dtmp_);
  k.rmsnorm_backward(dn_, a.res2, f32(k, w[mlp_norm]), a.rstd2, dtmp_, g[mlp_norm], BT, C);
  k.accumulate(dres2_, dtmp_);
  // Attention branch: res2 = x + o(attention(rope(q, k), v)), q, k, v projections of norm(x).
  k.linear_backward(dres2_, a.att, w[o_proj], datt_, g[o_proj], {}, BT, Q, C, kLinear);
  k.attention_backward(datt_, a.qkv, a.att, a.att_saved, dqkv_, s);
  k.rope_backward(dqkv_, cos_, sin_, s);
  const Tensor dq = first(dproj_, BT * Q), dkv = first(dproj_, BT * KV);
  k.get_columns(dqkv_, dq, BT, Q, W, 0);
  k.linear_backward(dq, a.n1, w[q_proj], dn_, g[q_proj], {}, BT, C, Q, kLinear);
  k.get_columns(dqkv_, dkv, BT, KV, W, Q);
  k.linear_backward(dkv, a.n1, w[k_proj], dtmp_, g[k_proj], {}, BT, C, KV, kLinear);
  k.accumulate(dn_, dtmp_);
  k.get_columns(dqkv_, dkv, BT, KV, W, Q + KV);
  k.linear_backward(dkv, a.n1, w[v_proj], dtmp_, g[v_proj], {}, BT, C, KV, kLinear);
  k.accumulate(dn_, dtmp_);
  k.rmsnorm_backward(dn_, resid_[l], f32(k, w[attn_norm]), a.rstd1, dresid_, g[attn_norm], BT, C);
  k.accumulate(dresid_, dres2_);
}

void Activations::embedding_backward(ops::Kernels& k, const Tensor& d_embed) {
  k.embedding_backward(dresid_, tokens_, d_embed, Tensor(), B_, T_, z(c_.width), z(c_.vocab));
}

// ---- Llama ----

Llama::Llama(Config config, std::uint64_t seed)
    : c_(config), params_(all_params(config)), grads_(params_.infos()),
      memory_(std::make_unique<Allocator>(cpu_memory())), acts_(config, *memory_) {
  params_.initialize(seed);
}

BlockWeights Llama::block_weights(std::size_t layer) const {
  return params_.tensors<block_param_count>(block_offset(layer));
}

BlockGrads Llama::block_grads(std::size_t layer) {
  return grads_.tensors<block_param_count>(block_offset(layer));
}

float Llama::forward(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets, std::size_t B,
                     std::size_t T) {
  ops::Kernels k = launch_.begin("");
  acts_.set_batch(k, {tokens.begin(), tokens.end()}, {targets.begin(), targets.end()}, B, T);
  acts_.embedding_forward(k, params_.tensor(0));
  for (std::size_t l = 0; l < z(c_.layers); ++l) acts_.block_forward(k, l, block_weights(l));
  const std::size_t h = head_offset();
  acts_.head_forward(k, params_.tensor(h), params_.tensor(c_.tie_head ? 0 : h + 1));
  return acts_.has_targets() ? *acts_.loss().data_as<float>() : std::numeric_limits<float>::quiet_NaN();
}

void Llama::backward(float dloss) {
  ops::Kernels k = launch_.begin("");
  const std::size_t h = head_offset(), head = c_.tie_head ? 0 : h + 1;
  acts_.head_backward(k, params_.tensor(h), params_.tensor(head), grads_.tensor(h), grads_.tensor(head), dloss);
  for (std::size_t l = z(c_.layers); l-- > 0;) acts_.block_backward(k, l, block_weights(l), block_grads(l));
  acts_.embedding_backward(k, grads_.tensor(0));
}

std::span<const float> Llama::logits() const {
  const Tensor& l = acts_.logits();
  return {l.data_as<float>(), static_cast<std::size_t>(l.numel())};
}

}  // namespace coshard::llama
