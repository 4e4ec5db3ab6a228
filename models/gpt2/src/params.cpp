#include "coshard/gpt2/params.hpp"

#include <cmath>

namespace coshard::gpt2 {

namespace {

ParamInfo normal(std::string name, Shape shape, float std) { return models::normal_param(std::move(name), std::move(shape), std); }
ParamInfo zeros(std::string name, Shape shape) { return models::zeros_param(std::move(name), std::move(shape)); }
ParamInfo ones(std::string name, Shape shape) { return models::ones_param(std::move(name), std::move(shape)); }

constexpr float kStd = 0.02f;
constexpr float kPositionStd = 0.01f;

}  // namespace

std::vector<ParamInfo> embedding_params(const Config& c) {
  return {normal("wte.weight", {c.vocab, c.width}, kStd), normal("wpe.weight", {c.context, c.width}, kPositionStd)};
}

std::vector<ParamInfo> block_params(const Config& c, std::int64_t layer) {
  const std::string h = "h." + std::to_string(layer) + ".";
  const std::int64_t C = c.width;
  const auto residual_std = static_cast<float>(kStd / std::sqrt(2.0 * static_cast<double>(c.layers)));
  return {ones(h + "ln_1.weight", {C}),
          zeros(h + "ln_1.bias", {C}),
          normal(h + "attn.c_attn.weight", {C, 3 * C}, kStd),
          zeros(h + "attn.c_attn.bias", {3 * C}),
          normal(h + "attn.c_proj.weight", {C, C}, residual_std),
          zeros(h + "attn.c_proj.bias", {C}),
          ones(h + "ln_2.weight", {C}),
          zeros(h + "ln_2.bias", {C}),
          normal(h + "mlp.c_fc.weight", {C, 4 * C}, kStd),
          zeros(h + "mlp.c_fc.bias", {4 * C}),
          normal(h + "mlp.c_proj.weight", {4 * C, C}, residual_std),
          zeros(h + "mlp.c_proj.bias", {C})};
}

std::vector<ParamInfo> head_params(const Config& c) {
  std::vector<ParamInfo> v{ones("ln_f.weight", {c.width}), zeros("ln_f.bias", {c.width})};
  if (!c.tie_head) {
    auto p = normal("lm_head.weight", {c.vocab, c.width}, kStd);
    p.init_key = "wte.weight";  // starts equal to wte
    v.push_back(std::move(p));
  }
  return v;
}

std::vector<ParamInfo> all_params(const Config& c) { return models::model_params(c); }

}  // namespace coshard::gpt2
