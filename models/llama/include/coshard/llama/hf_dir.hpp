#pragma once
// Hugging Face Llama directories: what `transformers.LlamaForCausalLM.save_pretrained(DIR)` writes
// and `from_pretrained(DIR)` reads, config.json beside model.safetensors (or a sharded checkpoint's
// model.safetensors.index.json and its files).
//
//   llama::save_hf_dir("out/model", config, state);      // loads with from_pretrained("out/model")
//   auto state = llama::read_init("out/model", config);   // a directory or a .safetensors file
//
// config.json: hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
// num_key_value_heads (default: num_attention_heads), head_dim (default: hidden_size /
// num_attention_heads), vocab_size, max_position_embeddings, rms_norm_eps, tie_word_embeddings
// (default false), and RoPE as transformers 4 writes it (rope_theta, rope_scaling) or as 5 does
// (rope_parameters holding rope_theta and rope_type). Keys that change the math coshard does not
// compute are refused naming the key: rope types other than default and llama3, attention_bias
// or mlp_bias true, hidden_act other than silu, nonzero attention_dropout, pretraining_tp > 1.
#include <filesystem>

#include "coshard/llama/config.hpp"
#include "coshard/models/hf_dir.hpp"

namespace coshard::llama {

using models::StateDict;

/// The Llama shape a Hugging Face config.json describes, after checking that everything else in it
/// is what coshard computes. Errc::bad_config naming the file and the key.
Config read_hf_config(const std::filesystem::path& config_json);

/// Writes DIR/config.json and DIR/model.safetensors (F32, Hugging Face names; a tied head is left
/// to transformers, which ties it on load). DIR is created if missing; each file is atomic.
void save_hf_dir(const std::filesystem::path& dir, const Config& config, const StateDict& state);

/// The parameters of `config` from a .safetensors file of Hugging Face names, or from a Hugging
/// Face directory once its config.json matched `config`. Rotary buffers that older transformers
/// saved (self_attn.rotary_emb.inv_freq) are skipped; any other tensor that is not a parameter is
/// an error.
StateDict read_init(const std::filesystem::path& path, const Config& config);

}  // namespace coshard::llama
