#include "coshard/gpt2/model.hpp"

#include <algorithm>
#include <limits>
#include <string>

#include "coshard/ops/attention.hpp"
#include "coshard/ops/cross_entropy.hpp"
#include "coshard/ops/embedding.hpp"
#include "coshard/ops/gelu.hpp"
#include "coshard/ops/layernorm.hpp"
#include "coshard/ops/linear.hpp"
#include "coshard/ops/residual.hpp"
#include "coshard/runtime/error.hpp"

namespace coshard::gpt2 {
namespace {

void size(std::vector<float>& v, std::size_t n) {
  if (v.size() != n) v.assign(n, 0.0f);
}

void check_grad(std::span<float> g, std::size_t n, const char* what) {
  if (g.size() != n) {
    throw Error(Errc::invalid_argument, std::string("GPT-2 backward: gradient of ") + what + " has " +
                                            std::to_string(g.size()) + " elements, expected " + std::to_string(n));
  }
}

void linear_forward(std::span<const float> x, const GemmWeight& w, std::span<const float> b, std::span<float> y,
                    std::size_t rows, std::size_t in, std::size_t out,
                    ops::WeightLayout layout = ops::WeightLayout::in_out) {
  if (w.bf16.empty()) return ops::linear_forward(x, w.f32, b, y, rows, in, out, layout);
  ops::linear_forward(x, w.bf16, b, y, rows, in, out, layout);
}

void linear_backward(std::span<const float> dy, std::span<const float> x, const GemmWeight& w, std::span<float> dx,
                     std::span<float> dw, std::span<float> db, std::size_t rows, std::size_t in, std::size_t out,
                     ops::WeightLayout layout = ops::WeightLayout::in_out) {
  if (w.bf16.empty()) return ops::linear_backward(dy, x, w.f32, dx, dw, db, rows, in, out, layout);
  ops::linear_backward(dy, x, w.bf16, dx, dw, db, rows, in, out, layout);
}

}  // namespace

Activations::Activations(Config config) : c_(config) {
  c_.validate();
  const auto L = static_cast<std::size_t>(c_.layers);
  resid_.resize(L + 1);
  blocks_.resize(L);
}

void Activations::set_batch(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets, std::size_t B,
                            std::size_t T) {
  if (B == 0 || T == 0 || T > static_cast<std::size_t>(c_.context)) {
    throw Error(Errc::invalid_argument, "GPT-2: batch [" + std::to_string(B) + ", " + std::to_string(T) +
                                            "] needs B >= 1 and 1 <= T <= context (" + std::to_string(c_.context) + ")");
  }
  if (tokens.size() != B * T || (!targets.empty() && targets.size() != B * T)) {
    throw Error(Errc::invalid_argument, "GPT-2: batch [" + std::to_string(B) + ", " + std::to_string(T) + "] needs " +
                                            std::to_string(B * T) + " tokens and targets, got " +
                                            std::to_string(tokens.size()) + " and " + std::to_string(targets.size()));
  }
  const auto V = static_cast<std::int64_t>(c_.vocab);
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= V || (!targets.empty() && (targets[i] < 0 || targets[i] >= V))) {
      throw Error(Errc::invalid_argument, "GPT-2: token or target at position " + std::to_string(i) +
                                              " is outside the vocabulary [0, " + std::to_string(V) + ")");
    }
  }
  tokens_.assign(tokens.begin(), tokens.end());
  targets_.assign(targets.begin(), targets.end());
  B_ = B;
  T_ = T;
  const std::size_t C = static_cast<std::size_t>(c_.width), BT = B * T, NH = static_cast<std::size_t>(c_.heads);
  for (auto& r : resid_) size(r, BT * C);
  for (auto& b : blocks_) {
    size(b.ln1, BT * C), size(b.ln1_mean, BT), size(b.ln1_rstd, BT), size(b.qkv, BT * 3 * C);
    size(b.att_lse, B * NH * T), size(b.atty, BT * C), size(b.res2, BT * C), size(b.ln2, BT * C);
    size(b.ln2_mean, BT), size(b.ln2_rstd, BT), size(b.fch, BT * 4 * C), size(b.fch_gelu, BT * 4 * C);
  }
  const auto V_ = static_cast<std::size_t>(c_.vocab);
  size(lnf_, BT * C), size(lnf_mean_, BT), size(lnf_rstd_, BT), size(logits_, BT * V_), size(lse_, BT);
  size(dresid_, BT * C), size(dres2_, BT * C), size(dtmp_, BT * C), size(dln_, BT * C), size(datty_, BT * C);
  size(dqkv_, BT * 3 * C), size(dfch_, BT * 4 * C), size(dfch_gelu_, BT * 4 * C), size(tmp_, BT * C);
  loss_ = std::numeric_limits<float>::quiet_NaN();
}

double Activations::bytes_for(const Config& c, double B, double T) noexcept {
  const double L = static_cast<double>(c.layers), C = static_cast<double>(c.width), H = static_cast<double>(c.heads),
               V = static_cast<double>(c.vocab), BT = B * T;
  // resid_ L+1, a block 15, ln_f 1, backward scratch 17 (times C); means and rstds 4 a block, ln_f's
  // 2 and lse_ 1; attention's lse a head; logits_ and dlogits_; tokens_ and targets_ (int32).
  const double floats = BT * C * (16 * L + 19) + BT * (4 * L + 3) + L * B * H * T + 2 * BT * V;
  return 4 * floats + 8 * BT;
}

std::size_t Activations::bytes() const noexcept {
  std::size_t floats = 0;
  auto add = [&](const std::vector<float>& v) { floats += v.size(); };
  for (const auto& r : resid_) add(r);
  for (const auto& b : blocks_) {
    for (const auto* v : {&b.ln1, &b.ln1_mean, &b.ln1_rstd, &b.qkv, &b.att_lse, &b.atty, &b.res2, &b.ln2, &b.ln2_mean,
                          &b.ln2_rstd, &b.fch, &b.fch_gelu}) {
      add(*v);
    }
  }
  for (const auto* v : {&lnf_, &lnf_mean_, &lnf_rstd_, &logits_, &lse_, &dlogits_, &dresid_, &dres2_, &dtmp_, &dln_,
                        &datty_, &dqkv_, &dfch_, &dfch_gelu_, &tmp_}) {
    add(*v);
  }
  return floats * sizeof(float) + (tokens_.size() + targets_.size()) * sizeof(std::int32_t);
}

void Activations::embedding_forward(std::span<const float> wte, std::span<const float> wpe) {
  ops::embedding_forward(tokens_, wte, wpe, resid_[0], B_, T_, static_cast<std::size_t>(c_.width),
                         static_cast<std::size_t>(c_.vocab));
}

void Activations::embedding_forward(std::span<const std::uint16_t> wte, std::span<const std::uint16_t> wpe) {
  ops::embedding_forward(tokens_, wte, wpe, resid_[0], B_, T_, static_cast<std::size_t>(c_.width),
                         static_cast<std::size_t>(c_.vocab));
}

void Activations::block_forward(std::size_t l, const BlockWeights& w) {
  const std::size_t C = static_cast<std::size_t>(c_.width), BT = B_ * T_, NH = static_cast<std::size_t>(c_.heads);
  Block& a = blocks_.at(l);
  const auto& x = resid_[l];
  ops::layernorm_forward(x, w.f32[ln_1_weight], w.f32[ln_1_bias], a.ln1, a.ln1_mean, a.ln1_rstd, BT, C);
  linear_forward(a.ln1, w.gemm(c_attn_weight), w.f32[c_attn_bias], a.qkv, BT, C, 3 * C);
  ops::attention_forward(a.qkv, a.atty, a.att_lse, B_, T_, C, NH);
  linear_forward(a.atty, w.gemm(attn_c_proj_weight), w.f32[attn_c_proj_bias], tmp_, BT, C, C);
  ops::residual_forward(x, tmp_, a.res2);
  ops::layernorm_forward(a.res2, w.f32[ln_2_weight], w.f32[ln_2_bias], a.ln2, a.ln2_mean, a.ln2_rstd, BT, C);
  linear_forward(a.ln2, w.gemm(c_fc_weight), w.f32[c_fc_bias], a.fch, BT, C, 4 * C);
  ops::gelu_forward(a.fch, a.fch_gelu);
  linear_forward(a.fch_gelu, w.gemm(mlp_c_proj_weight), w.f32[mlp_c_proj_bias], tmp_, BT, 4 * C, C);
  ops::residual_forward(a.res2, tmp_, resid_[l + 1]);
}

float Activations::head_forward(std::span<const float> ln_f_weight, std::span<const float> ln_f_bias,
                                GemmWeight head) {
  const std::size_t C = static_cast<std::size_t>(c_.width), BT = B_ * T_, V = static_cast<std::size_t>(c_.vocab);
  ops::layernorm_forward(resid_.back(), ln_f_weight, ln_f_bias, lnf_, lnf_mean_, lnf_rstd_, BT, C);
  linear_forward(lnf_, head, {}, logits_, BT, C, V, ops::WeightLayout::out_in);
  loss_ = targets_.empty() ? std::numeric_limits<float>::quiet_NaN()
                           : ops::cross_entropy_forward(logits_, targets_, lse_, BT, V);
  return loss_;
}

void Activations::head_backward(std::span<const float> ln_f_weight, GemmWeight head,
                                std::span<float> d_ln_f_weight, std::span<float> d_ln_f_bias, std::span<float> d_head,
                                float dloss) {
  if (targets_.empty()) throw Error(Errc::invalid_argument, "GPT-2 backward: the batch has no targets");
  const std::size_t C = static_cast<std::size_t>(c_.width), BT = B_ * T_, V = static_cast<std::size_t>(c_.vocab);
  check_grad(d_head, V * C, "the head weight");
  size(dlogits_, BT * V);
  ops::cross_entropy_backward(logits_, targets_, lse_, dlogits_, BT, V, dloss);
  linear_backward(dlogits_, lnf_, head, dln_, d_head, {}, BT, C, V, ops::WeightLayout::out_in);
  ops::layernorm_backward(dln_, resid_.back(), ln_f_weight, lnf_mean_, lnf_rstd_, dresid_, d_ln_f_weight, d_ln_f_bias,
                          BT, C);
}

void Activations::block_backward(std::size_t l, const BlockWeights& w, const BlockGrads& g) {
  const std::size_t C = static_cast<std::size_t>(c_.width), BT = B_ * T_, NH = static_cast<std::size_t>(c_.heads);
  Block& a = blocks_.at(l);
  // dresid_ holds the gradient of the block's output; it leaves holding that of its input.
  std::copy(dresid_.begin(), dresid_.end(), dres2_.begin());
  // MLP branch: out = res2 + c_proj(gelu(c_fc(ln_2(res2)))).
  linear_backward(dresid_, a.fch_gelu, w.gemm(mlp_c_proj_weight), dfch_gelu_, g[mlp_c_proj_weight], g[mlp_c_proj_bias],
                       BT, 4 * C, C);
  ops::gelu_backward(dfch_gelu_, a.fch, dfch_);
  linear_backward(dfch_, a.ln2, w.gemm(c_fc_weight), dln_, g[c_fc_weight], g[c_fc_bias], BT, C, 4 * C);
  ops::layernorm_backward(dln_, a.res2, w.f32[ln_2_weight], a.ln2_mean, a.ln2_rstd, dtmp_, g[ln_2_weight], g[ln_2_bias],
                          BT, C);
  ops::accumulate(dres2_, dtmp_);
  // Attention branch: res2 = x + c_proj(attn(c_attn(ln_1(x)))).
  linear_backward(dres2_, a.atty, w.gemm(attn_c_proj_weight), datty_, g[attn_c_proj_weight], g[attn_c_proj_bias], BT, C,
                       C);
  ops::attention_backward(datty_, a.qkv, a.atty, a.att_lse, dqkv_, B_, T_, C, NH);
  linear_backward(dqkv_, a.ln1, w.gemm(c_attn_weight), dln_, g[c_attn_weight], g[c_attn_bias], BT, C, 3 * C);
  ops::layernorm_backward(dln_, resid_[l], w.f32[ln_1_weight], a.ln1_mean, a.ln1_rstd, dresid_, g[ln_1_weight],
                          g[ln_1_bias], BT, C);
  ops::accumulate(dresid_, dres2_);
}

void Activations::embedding_backward(std::span<float> d_wte, std::span<float> d_wpe) {
  ops::embedding_backward(dresid_, tokens_, d_wte, d_wpe, B_, T_, static_cast<std::size_t>(c_.width),
                          static_cast<std::size_t>(c_.vocab));
}

// ---- Gpt2 ----

Gpt2::Gpt2(Config config, std::uint64_t seed)
    : c_(config), params_(all_params(config)), grads_(params_.infos()), acts_(config) {
  params_.initialize(seed);
}

BlockWeights Gpt2::block_weights(std::size_t layer) const {
  BlockWeights w;
  for (std::size_t k = 0; k < block_param_count; ++k) w.f32[k] = params_.at(block_offset(layer) + k);
  return w;
}

float Gpt2::forward(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets, std::size_t B,
                    std::size_t T) {
  acts_.set_batch(tokens, targets, B, T);
  acts_.embedding_forward(params_.at(0), params_.at(1));
  for (std::size_t l = 0; l < static_cast<std::size_t>(c_.layers); ++l) acts_.block_forward(l, block_weights(l));
  const std::size_t h = head_offset();
  return acts_.head_forward(params_.at(h), params_.at(h + 1), c_.tie_head ? params_.at(0) : params_.at(h + 2));
}

void Gpt2::backward(float dloss) {
  const std::size_t h = head_offset();
  acts_.head_backward(params_.at(h), c_.tie_head ? params_.at(0) : params_.at(h + 2), grads_.at(h), grads_.at(h + 1),
                      c_.tie_head ? grads_.at(0) : grads_.at(h + 2), dloss);
  for (std::size_t l = static_cast<std::size_t>(c_.layers); l-- > 0;) {
    BlockGrads g;
    for (std::size_t k = 0; k < block_param_count; ++k) g[k] = grads_.at(block_offset(l) + k);
    acts_.block_backward(l, block_weights(l), g);
  }
  acts_.embedding_backward(grads_.at(0), grads_.at(1));
}

float Gpt2::forward_backward(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets, std::size_t B,
                             std::size_t T) {
  const float loss = forward(tokens, targets, B, T);
  backward(1.0f);
  return loss;
}

}  // namespace coshard::gpt2
