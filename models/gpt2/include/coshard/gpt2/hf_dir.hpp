#pragma once
// Hugging Face model directories: what `transformers.GPT2LMHeadModel.save_pretrained(DIR)` writes
// and `from_pretrained(DIR)` reads, config.json beside model.safetensors.
//
//   gpt2::save_hf_dir("out/model", config, state);        // loads with from_pretrained("out/model")
//   auto state = gpt2::read_init("out/model", config);     // a directory or a .safetensors file
//
// Errors are Errc::bad_config (a config.json that is not a GPT-2 coshard computes the same way, or
// whose shape is not `config`: the message gives the --model spec that matches) or
// Errc::corrupt_file / Errc::io naming the file.
#include <filesystem>

#include "coshard/gpt2/config.hpp"
#include "coshard/gpt2/safetensors.hpp"

namespace coshard::gpt2 {

/// The GPT-2 shape a Hugging Face config.json describes, after checking that everything else in it
/// (activation, layer norm epsilon, attention scaling, inner width) is what coshard computes.
Config read_hf_config(const std::filesystem::path& config_json);

/// Writes DIR/config.json and DIR/model.safetensors (F32, Hugging Face names; the tied LM head is
/// left to transformers, which ties it on load). DIR is created if missing; each file is atomic.
void save_hf_dir(const std::filesystem::path& dir, const Config& config, const StateDict& state);

/// read_model() of a .safetensors file, or of a Hugging Face directory's weights once its
/// config.json matched `config`: model.safetensors, or the files of a sharded checkpoint's
/// model.safetensors.index.json (models::hf_weight_files).
StateDict read_init(const std::filesystem::path& path, const Config& config);

}  // namespace coshard::gpt2
