#pragma once
// Llama shapes (Hugging Face LlamaForCausalLM's config.json in coshard's names): vocabulary,
// context (max_position_embeddings), layers, query heads and key/value heads (grouped-query
// attention when fewer), width (hidden_size), the MLP's width (intermediate_size), the head size
// (head_dim), rms_norm_eps, rope_theta and Llama 3.1's rope scaling, and whether the LM head is
// tied to the token embedding. Named configs and the key=value syntax of gpt2::parse_config:
//
//   parse_config("llama-tiny")                 // a named config
//   parse_config("llama-60M,vocab=50257")      // a named config with overrides
//
// Bad specs throw coshard::Error(Errc::bad_config) naming the key and the value.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "coshard/ops/rope.hpp"

namespace coshard::llama {

struct Config {
  std::int64_t vocab = 256;     // V
  std::int64_t context = 64;    // longest sequence (max_position_embeddings)
  std::int64_t layers = 2;      // L: model.layers.0 .. L-1
  std::int64_t heads = 4;       // NH, query heads
  std::int64_t kv_heads = 2;    // NKV, key/value heads: dividing NH
  std::int64_t width = 64;      // C (hidden_size)
  std::int64_t ffn = 176;       // F (intermediate_size): the SwiGLU MLP's width
  std::int64_t head_dim = 16;   // hs: even (RoPE rotates pairs)
  double rms_eps = 1e-5;        // rms_norm_eps
  double rope_theta = 10000.0;  // rope_theta
  bool rope_llama3 = false;     // rope_scaling {rope_type: llama3, ...}: rope_scaling below
  ops::RopeScaling rope_scaling{};
  // false (Llama's default): a separate lm_head.weight [V, C]. true: logits = norm(x) embed^T.
  bool tie_head = false;

  std::int64_t q_width() const noexcept { return heads * head_dim; }
  std::int64_t kv_width() const noexcept { return kv_heads * head_dim; }
  std::int64_t num_params() const noexcept;
  // Throws Errc::bad_config naming the first bad field.
  void validate() const;
  // Every key, so that it parses back (rope_scaling=llama3:factor:low:high:context where set).
  std::string to_string() const;
  bool operator==(const Config& o) const noexcept;
};

// llama-tiny: L2 NH4 NKV2 C64 F176 hs16 V256 T64 (125k parameters; byte-level, for tests).
// llama-60M: L8 NH8 NKV4 C512 F1408 hs64 V32000 T1024 (Llama 2's vocabulary).
// llama-150M: L12 NH12 NKV4 C768 F2816 hs64 V32000 T1024.
// llama3.2-1B, llama3.1-8B: the released shapes (theta 500000, llama3 rope scaling; 1B ties its head).
Config named_config(std::string_view name);
std::vector<std::string> config_names();
Config parse_config(std::string_view spec);

}  // namespace coshard::llama
