#pragma once
// GPT-2's parameters by name, in Hugging Face GPT2LMHeadModel's order and layout, and their
// initialisation (the counter-based values and the flat store are coshard::models', shared).
//
// Names: wte.weight [V, C], wpe.weight [T, C]; per block i: h.i.ln_1.{weight,bias} [C],
// h.i.attn.c_attn.weight [C, 3C] + bias [3C], h.i.attn.c_proj.weight [C, C] + bias [C],
// h.i.ln_2.{weight,bias} [C], h.i.mlp.c_fc.weight [C, 4C] + bias [4C],
// h.i.mlp.c_proj.weight [4C, C] + bias [C]; ln_f.{weight,bias} [C]; lm_head.weight [V, C] only
// when the head is untied. Linear weights are Conv1D [in, out] as in the HF checkpoints.
//
// Initialisation (GPT-2's): linear weights and wte normal(0, 0.02); the residual projections
// attn.c_proj.weight and mlp.c_proj.weight normal(0, 0.02 / sqrt(2 L)); wpe normal(0, 0.01) as
// OpenAI's GPT-2 code (Hugging Face and nanoGPT use 0.02); biases zeros; layernorm weights ones.
// An untied lm_head.weight gets wte's values (same seed key), so both heads start identical.
// Every value is a counter-based function of (seed, parameter name, element index): splitmix64
// hashes and a Box-Muller transform, so each FSDP rank initialises only its own shard.
#include <cstdint>
#include <vector>

#include "coshard/gpt2/config.hpp"
#include "coshard/models/params.hpp"

namespace coshard::gpt2 {

using models::Init;
using models::ParamInfo;
using models::ParamStore;
using models::init_values;
using models::normal_sample;
using models::splitmix64;
using models::hash_name;

// Per-block parameter order (index into a block's 12 parameters).
enum BlockParam : std::size_t {
  ln_1_weight, ln_1_bias, c_attn_weight, c_attn_bias, attn_c_proj_weight, attn_c_proj_bias,
  ln_2_weight, ln_2_bias, c_fc_weight, c_fc_bias, mlp_c_proj_weight, mlp_c_proj_bias, block_param_count
};

std::vector<ParamInfo> embedding_params(const Config& c);        // wte, wpe
std::vector<ParamInfo> block_params(const Config& c, std::int64_t layer);  // the 12 of h.{layer}
std::vector<ParamInfo> head_params(const Config& c);             // ln_f.weight, ln_f.bias (+ lm_head.weight)
// All parameters in Hugging Face order: embedding, blocks, head.
std::vector<ParamInfo> all_params(const Config& c);

}  // namespace coshard::gpt2
