#pragma once
// Llama's parameters by name, in Hugging Face LlamaForCausalLM's order and layout, and their
// initialisation (the counter-based values and the flat store are coshard::models').
//
// Names: model.embed_tokens.weight [V, C]; per layer i, model.layers.i.:
// input_layernorm.weight [C], self_attn.q_proj.weight [NH hs, C], self_attn.k_proj.weight
// [NKV hs, C], self_attn.v_proj.weight [NKV hs, C], self_attn.o_proj.weight [C, NH hs],
// post_attention_layernorm.weight [C], mlp.gate_proj.weight [F, C], mlp.up_proj.weight [F, C],
// mlp.down_proj.weight [C, F]; model.norm.weight [C]; lm_head.weight [V, C] when untied.
// Linear weights are nn.Linear's [out, in], without biases.
//
// Initialisation (Hugging Face's _init_weights, initializer_range 0.02): linear weights and the
// embedding normal(0, 0.02), RMSNorm weights ones; lm_head.weight has a stream of its own.
#include <cstdint>
#include <vector>

#include "coshard/llama/config.hpp"
#include "coshard/models/params.hpp"

namespace coshard::llama {

using models::ParamInfo;
using models::ParamStore;

// Per-layer parameter order (index into a layer's 9 parameters).
enum BlockParam : std::size_t {
  attn_norm, q_proj, k_proj, v_proj, o_proj, mlp_norm, gate_proj, up_proj, down_proj, block_param_count
};

std::vector<ParamInfo> embedding_params(const Config& c);                  // model.embed_tokens.weight
std::vector<ParamInfo> block_params(const Config& c, std::int64_t layer);  // the 9 of model.layers.{layer}
std::vector<ParamInfo> head_params(const Config& c);                       // model.norm.weight (+ lm_head.weight)
// All parameters in Hugging Face order: embedding, layers, head.
std::vector<ParamInfo> all_params(const Config& c);

}  // namespace coshard::llama
