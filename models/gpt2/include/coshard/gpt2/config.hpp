#pragma once
// GPT-2 shapes: vocabulary, context (maximum positions), layers, heads and width (C), plus whether
// the LM head is tied to the token embedding. Named configs and a "key=value" shape syntax:
//
//   parse_config("tiny")                                     // a named config
//   parse_config("10M,vocab=50257")                          // a named config with overrides
//   parse_config("layers=2,heads=3,width=48,vocab=97,context=32")  // every shape key given
//
// Bad specs throw coshard::Error(Errc::bad_config) naming the key and the value.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace coshard::gpt2 {

struct Config {
  std::int64_t vocab = 256;    // V
  std::int64_t context = 64;   // T_max: rows of wpe
  std::int64_t layers = 2;     // L: blocks h.0 .. h.{L-1}
  std::int64_t heads = 4;      // NH
  std::int64_t width = 96;     // C, divisible by heads
  // true: logits = ln_f(x) wte^T (GPT-2). false: a separate lm_head.weight [V, C] (initialised
  // like wte; loading a checkpoint without it copies wte into it).
  bool tie_head = true;

  std::int64_t head_size() const noexcept { return width / heads; }
  // Parameter count (lm_head.weight included when untied).
  std::int64_t num_params() const noexcept;
  // Throws Errc::bad_config naming the first bad field.
  void validate() const;
  // "layers=2,heads=4,width=96,vocab=256,context=64" (",tie_head=false" when untied): parses back.
  std::string to_string() const;
  bool operator==(const Config&) const = default;
};

// tiny: L2 NH4 C96 V256 T64 (~253k parameters; byte-level).
// 10M: L6 NH6 C384 V256 T256 (~10.8M; about 0.65 s per step of 4x256 tokens on one core).
// 124M: L12 NH12 C768 V50257 T1024 (GPT-2 small as released).
Config named_config(std::string_view name);
std::vector<std::string> config_names();
Config parse_config(std::string_view spec);

}  // namespace coshard::gpt2
