#include "coshard/gpt2/model.hpp"

#include <limits>
#include <string>

#include "coshard/models/unit_set.hpp"
#include "coshard/runtime/error.hpp"

namespace coshard::gpt2 {
namespace {

void check_grad(const Tensor& g, std::size_t n, const char* what) {
  if (static_cast<std::size_t>(g.numel()) != n) {
    throw Error(Errc::invalid_argument, std::string("GPT-2 backward: gradient of ") + what + " has " +
                                            std::to_string(g.numel()) + " elements, expected " + std::to_string(n));
  }
}

}  // namespace

Activations::Activations(Config config, Allocator& alloc) : c_(config), alloc_(alloc) {
  c_.validate();
  const auto L = static_cast<std::size_t>(c_.layers);
  resid_.resize(L + 1);
  blocks_.resize(L);
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

void Activations::set_batch(ops::Kernels& k, std::vector<std::int32_t> tokens, std::vector<std::int32_t> targets,
                            std::size_t B, std::size_t T) {
  models::check_batch("GPT-2: ", tokens, targets, B, T, c_.vocab, c_.context, true);
  B_ = B;
  T_ = T;
  has_targets_ = !targets.empty();
  const std::size_t C = static_cast<std::size_t>(c_.width), BT = B * T, NH = static_cast<std::size_t>(c_.heads);
  if (tokens_.numel() != static_cast<std::int64_t>(BT)) {
    tokens_ = Tensor::empty(alloc_, DType::i32, {static_cast<std::int64_t>(BT)});
    targets_ = Tensor::empty(alloc_, DType::i32, {static_cast<std::int64_t>(BT)});
  }
  k.upload(tokens_, std::move(tokens));
  if (has_targets_) k.upload(targets_, std::move(targets));
  const std::size_t saved = k.attention_saved_numel(B, T, NH);
  for (auto& r : resid_) size(k, r, BT * C);
  for (auto& b : blocks_) {
    size(k, b.ln1, BT * C), size(k, b.ln1_mean, BT), size(k, b.ln1_rstd, BT), size(k, b.qkv, BT * 3 * C);
    size(k, b.att_saved, saved), size(k, b.atty, BT * C), size(k, b.res2, BT * C), size(k, b.ln2, BT * C);
    size(k, b.ln2_mean, BT), size(k, b.ln2_rstd, BT), size(k, b.fch, BT * 4 * C), size(k, b.fch_gelu, BT * 4 * C);
  }
  const auto Vs = static_cast<std::size_t>(c_.vocab);
  size(k, lnf_, BT * C), size(k, lnf_mean_, BT), size(k, lnf_rstd_, BT), size(k, logits_, BT * Vs), size(k, lse_, BT);
  size(k, dresid_, BT * C), size(k, dres2_, BT * C), size(k, dtmp_, BT * C), size(k, dln_, BT * C);
  size(k, datty_, BT * C), size(k, dqkv_, BT * 3 * C), size(k, dfch_, BT * 4 * C), size(k, dfch_gelu_, BT * 4 * C);
  size(k, tmp_, BT * C), size(k, loss_, 1);
}

double Activations::bytes_for(const Config& c, double B, double T) noexcept {
  const double L = static_cast<double>(c.layers), C = static_cast<double>(c.width), H = static_cast<double>(c.heads),
               V = static_cast<double>(c.vocab), BT = B * T;
  // resid_ L+1, a block 15, ln_f 1, backward scratch 17 (times C); means and rstds 4 a block, ln_f's
  // 2 and lse_ 1; attention's lse a head; logits_ and dlogits_; the loss; tokens_ and targets_ (int32).
  const double floats = BT * C * (16 * L + 19) + BT * (4 * L + 3) + L * B * H * T + 2 * BT * V + 1;
  return 4 * floats + 8 * BT;
}

std::size_t Activations::bytes() const noexcept {
  std::size_t bytes = 0;
  auto add = [&](const Tensor& t) { bytes += t.nbytes(); };
  for (const auto& r : resid_) add(r);
  for (const auto& b : blocks_) {
    for (const Tensor* t : {&b.ln1, &b.ln1_mean, &b.ln1_rstd, &b.qkv, &b.att_saved, &b.atty, &b.res2, &b.ln2,
                            &b.ln2_mean, &b.ln2_rstd, &b.fch, &b.fch_gelu}) {
      add(*t);
    }
  }
  for (const Tensor* t : {&lnf_, &lnf_mean_, &lnf_rstd_, &logits_, &lse_, &dlogits_, &dresid_, &dres2_, &dtmp_, &dln_,
                          &datty_, &dqkv_, &dfch_, &dfch_gelu_, &tmp_, &loss_, &tokens_, &targets_}) {
    add(*t);
  }
  return bytes;
}

void Activations::embedding_forward(ops::Kernels& k, const Tensor& wte, const Tensor& wpe) {
  k.embedding_forward(tokens_, wte, wpe, resid_[0], B_, T_, static_cast<std::size_t>(c_.width),
                      static_cast<std::size_t>(c_.vocab));
}

void Activations::block_forward(ops::Kernels& k, std::size_t l, const BlockWeights& w) {
  const std::size_t C = static_cast<std::size_t>(c_.width), BT = B_ * T_, NH = static_cast<std::size_t>(c_.heads);
  Block& a = blocks_.at(l);
  const auto& x = resid_[l];
  k.layernorm_forward(x, f32(k, w[ln_1_weight]), f32(k, w[ln_1_bias]), a.ln1, a.ln1_mean, a.ln1_rstd, BT, C);
  k.linear_forward(a.ln1, w[c_attn_weight], f32(k, w[c_attn_bias]), a.qkv, BT, C, 3 * C);
  k.attention_forward(a.qkv, a.atty, a.att_saved, B_, T_, C, NH);
  k.linear_forward(a.atty, w[attn_c_proj_weight], f32(k, w[attn_c_proj_bias]), tmp_, BT, C, C);
  k.residual_forward(x, tmp_, a.res2);
  k.layernorm_forward(a.res2, f32(k, w[ln_2_weight]), f32(k, w[ln_2_bias]), a.ln2, a.ln2_mean, a.ln2_rstd, BT, C);
  k.linear_forward(a.ln2, w[c_fc_weight], f32(k, w[c_fc_bias]), a.fch, BT, C, 4 * C);
  k.gelu_forward(a.fch, a.fch_gelu);
  k.linear_forward(a.fch_gelu, w[mlp_c_proj_weight], f32(k, w[mlp_c_proj_bias]), tmp_, BT, 4 * C, C);
  k.residual_forward(a.res2, tmp_, resid_[l + 1]);
}

void Activations::head_forward(ops::Kernels& k, const Tensor& ln_f_weight, const Tensor& ln_f_bias,
                               const Tensor& head) {
  const std::size_t C = static_cast<std::size_t>(c_.width), BT = B_ * T_, V = static_cast<std::size_t>(c_.vocab);
  k.layernorm_forward(resid_.back(), f32(k, ln_f_weight), f32(k, ln_f_bias), lnf_, lnf_mean_, lnf_rstd_, BT, C);
  k.linear_forward(lnf_, head, {}, logits_, BT, C, V, ops::WeightLayout::out_in);
  if (has_targets_) k.cross_entropy_forward(logits_, targets_, lse_, loss_, BT, V);
}

void Activations::head_backward(ops::Kernels& k, const Tensor& ln_f_weight, const Tensor& head,
                                const Tensor& d_ln_f_weight, const Tensor& d_ln_f_bias, const Tensor& d_head,
                                float dloss) {
  if (!has_targets_) throw Error(Errc::invalid_argument, "GPT-2 backward: the batch has no targets");
  const std::size_t C = static_cast<std::size_t>(c_.width), BT = B_ * T_, V = static_cast<std::size_t>(c_.vocab);
  check_grad(d_head, V * C, "the head weight");
  size(k, dlogits_, BT * V);
  k.cross_entropy_backward(logits_, targets_, lse_, dlogits_, BT, V, dloss);
  k.linear_backward(dlogits_, lnf_, head, dln_, d_head, {}, BT, C, V, ops::WeightLayout::out_in);
  k.layernorm_backward(dln_, resid_.back(), f32(k, ln_f_weight), lnf_mean_, lnf_rstd_, dresid_, d_ln_f_weight,
                       d_ln_f_bias, BT, C);
}

void Activations::block_backward(ops::Kernels& k, std::size_t l, const BlockWeights& w, const BlockGrads& g) {
  const std::size_t C = static_cast<std::size_t>(c_.width), BT = B_ * T_, NH = static_cast<std::size_t>(c_.heads);
  Block& a = blocks_.at(l);
  // dresid_ holds the gradient of the block's output; it leaves holding that of its input.
  k.copy(dres2_, dresid_);
  // MLP branch: out = res2 + c_proj(gelu(c_fc(ln_2(res2)))).
  k.linear_backward(dresid_, a.fch_gelu, w[mlp_c_proj_weight], dfch_gelu_, g[mlp_c_proj_weight], g[mlp_c_proj_bias],
                    BT, 4 * C, C);
  k.gelu_backward(dfch_gelu_, a.fch, dfch_);
  k.linear_backward(dfch_, a.ln2, w[c_fc_weight], dln_, g[c_fc_weight], g[c_fc_bias], BT, C, 4 * C);
  k.layernorm_backward(dln_, a.res2, f32(k, w[ln_2_weight]), a.ln2_mean, a.ln2_rstd, dtmp_, g[ln_2_weight],
                       g[ln_2_bias], BT, C);
  k.accumulate(dres2_, dtmp_);
  // Attention branch: res2 = x + c_proj(attn(c_attn(ln_1(x)))).
  k.linear_backward(dres2_, a.atty, w[attn_c_proj_weight], datty_, g[attn_c_proj_weight], g[attn_c_proj_bias], BT, C,
                    C);
  k.attention_backward(datty_, a.qkv, a.atty, a.att_saved, dqkv_, B_, T_, C, NH);
  k.linear_backward(dqkv_, a.ln1, w[c_attn_weight], dln_, g[c_attn_weight], g[c_attn_bias], BT, C, 3 * C);
  k.layernorm_backward(dln_, resid_[l], f32(k, w[ln_1_weight]), a.ln1_mean, a.ln1_rstd, dresid_, g[ln_1_weight],
                       g[ln_1_bias], BT, C);
  k.accumulate(dresid_, dres2_);
}

void Activations::embedding_backward(ops::Kernels& k, const Tensor& d_wte, const Tensor& d_wpe) {
  k.embedding_backward(dresid_, tokens_, d_wte, d_wpe, B_, T_, static_cast<std::size_t>(c_.width),
                       static_cast<std::size_t>(c_.vocab));
}

// ---- Gpt2 ----

Gpt2::Gpt2(Config config, std::uint64_t seed)
    : c_(config), params_(all_params(config)), grads_(params_.infos()),
      memory_(std::make_unique<Allocator>(cpu_memory())), acts_(config, *memory_) {
  params_.initialize(seed);
}

BlockWeights Gpt2::block_weights(std::size_t layer) const {
  return params_.tensors<block_param_count>(block_offset(layer));
}

BlockGrads Gpt2::block_grads(std::size_t layer) {
  return grads_.tensors<block_param_count>(block_offset(layer));
}

float Gpt2::forward(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets, std::size_t B,
                    std::size_t T) {
  ops::Kernels k = launch_.begin("");
  acts_.set_batch(k, {tokens.begin(), tokens.end()}, {targets.begin(), targets.end()}, B, T);
  acts_.embedding_forward(k, params_.tensor(0), params_.tensor(1));
  for (std::size_t l = 0; l < static_cast<std::size_t>(c_.layers); ++l) acts_.block_forward(k, l, block_weights(l));
  const std::size_t h = head_offset();
  acts_.head_forward(k, params_.tensor(h), params_.tensor(h + 1), params_.tensor(c_.tie_head ? 0 : h + 2));
  // The ops ran on this thread, in host memory.
  return acts_.has_targets() ? *acts_.loss().data_as<float>() : std::numeric_limits<float>::quiet_NaN();
}

void Gpt2::backward(float dloss) {
  ops::Kernels k = launch_.begin("");
  const std::size_t h = head_offset();
  const std::size_t head = c_.tie_head ? 0 : h + 2;
  acts_.head_backward(k, params_.tensor(h), params_.tensor(head), grads_.tensor(h), grads_.tensor(h + 1),
                      grads_.tensor(head), dloss);
  for (std::size_t l = static_cast<std::size_t>(c_.layers); l-- > 0;) acts_.block_backward(k, l, block_weights(l), block_grads(l));
  acts_.embedding_backward(k, grads_.tensor(0), grads_.tensor(1));
}

float Gpt2::forward_backward(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets, std::size_t B,
                             std::size_t T) {
  const float loss = forward(tokens, targets, B, T);
  backward(1.0f);
  return loss;
}

std::span<const float> Gpt2::logits() const {
  const Tensor& l = acts_.logits();
  return {l.data_as<float>(), static_cast<std::size_t>(l.numel())};
}

}  // namespace coshard::gpt2
