#pragma once
// What every family's Hugging Face model directory has in common: config.json, whose "model_type"
// says the family, and the weights, in model.safetensors or, for a sharded checkpoint, in the
// files model.safetensors.index.json's "weight_map" names (save_pretrained shards above its
// max_shard_size). Each family reads its own config keys (gpt2/hf_dir.hpp, llama/hf_dir.hpp).
//
// Errors are Errc::bad_config for what a directory lacks or says (naming the file and the key) and
// Errc::corrupt_file for a tensor that is missing, misshapen or not a parameter.
#include <filesystem>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "coshard/models/params.hpp"

namespace coshard::models {

using StateDict = std::map<std::string, std::vector<float>>;

/// config.json's "model_type" ("gpt2", "llama", ...) of a Hugging Face model directory.
std::string hf_model_type(const std::filesystem::path& dir);

/// The safetensors files that hold a directory's weights: model.safetensors, or every file the
/// index maps a tensor to (each once, in the directory). A directory with only pytorch_model.bin,
/// or with neither, is refused naming what it has.
std::vector<std::filesystem::path> hf_weight_files(const std::filesystem::path& dir);

/// Every parameter of `infos` from `files`, all checked before anything is returned: a missing
/// tensor, a wrong shape, a dtype other than F32, BF16 or F16, a tensor stored twice, or one that
/// is not a parameter and not `ignored` fails naming it and `model` (its config, for the message).
StateDict read_params(std::span<const std::filesystem::path> files, const std::vector<ParamInfo>& infos,
                      const std::function<bool(const std::string&)>& ignored, const std::string& model);

}  // namespace coshard::models
