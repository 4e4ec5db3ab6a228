#pragma once
// GPT-2 checkpoints in safetensors files (the file format itself is coshard::models').
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "coshard/gpt2/config.hpp"
#include "coshard/gpt2/params.hpp"
#include "coshard/models/safetensors.hpp"

namespace coshard::gpt2 {

using models::kSafetensorsMaxHeader;
using models::SafetensorsFile;
using models::TensorEntry;
using models::TensorRef;
using models::write_safetensors;

// ---- GPT-2 checkpoints ----

using StateDict = std::map<std::string, std::vector<float>>;

// Writes the model's parameters under their Hugging Face names (lm_head.weight only when untied).
void save_model(const std::filesystem::path& path, const ParamStore& params, DType dtype = DType::f32,
                const std::map<std::string, std::string>& metadata = {});
void save_state_dict(const std::filesystem::path& path, const Config& config, const StateDict& state,
                     DType dtype = DType::f32, const std::map<std::string, std::string>& metadata = {});

// Reads every parameter of `config` from a checkpoint, validated: names may carry a
// "transformer." prefix (Hugging Face GPT2LMHeadModel); Hugging Face's attention buffers
// (h.N.attn.bias, h.N.attn.masked_bias) are ignored; an untied config without lm_head.weight gets
// a copy of wte.weight. A missing parameter, a wrong shape, a dtype other than F32/BF16/F16, or
// any other tensor is an error naming it, raised before anything is returned.
StateDict read_model(const std::filesystem::path& path, const Config& config);
// The same over the files of a sharded checkpoint (each tensor in one of them; one stored in two
// is an error naming both files).
StateDict read_model(std::span<const std::filesystem::path> files, const Config& config);
// read_model, then copies into `params` (all or nothing).
void load_model(const std::filesystem::path& path, ParamStore& params, const Config& config);

}  // namespace coshard::gpt2
