#include "coshard/llama/params.hpp"

#include <string>

namespace coshard::llama {
namespace {

constexpr float kStd = 0.02f;  // Hugging Face's initializer_range

ParamInfo linear(std::string name, std::int64_t out, std::int64_t in) {
  return models::normal_param(std::move(name), {out, in}, kStd);
}

}  // namespace

std::vector<ParamInfo> embedding_params(const Config& c) {
  return {models::normal_param("model.embed_tokens.weight", {c.vocab, c.width}, kStd)};
}

std::vector<ParamInfo> block_params(const Config& c, std::int64_t layer) {
  const std::string p = "model.layers." + std::to_string(layer) + ".";
  const std::int64_t C = c.width;
  return {models::ones_param(p + "input_layernorm.weight", {C}),
          linear(p + "self_attn.q_proj.weight", c.q_width(), C),
          linear(p + "self_attn.k_proj.weight", c.kv_width(), C),
          linear(p + "self_attn.v_proj.weight", c.kv_width(), C),
          linear(p + "self_attn.o_proj.weight", C, c.q_width()),
          models::ones_param(p + "post_attention_layernorm.weight", {C}),
          linear(p + "mlp.gate_proj.weight", c.ffn, C),
          linear(p + "mlp.up_proj.weight", c.ffn, C),
          linear(p + "mlp.down_proj.weight", C, c.ffn)};
}

std::vector<ParamInfo> head_params(const Config& c) {
  std::vector<ParamInfo> v{models::ones_param("model.norm.weight", {c.width})};
  if (!c.tie_head) v.push_back(linear("lm_head.weight", c.vocab, c.width));
  return v;
}

std::vector<ParamInfo> all_params(const Config& c) { return models::model_params(c); }

}  // namespace coshard::llama
