#pragma once
// The model gpt2-train trains, of either family: GPT-2 or Llama. --model names one ("tiny", "10M",
// "124M" or "gpt2-124M" for GPT-2; "llama-tiny", "llama-60M", ... for Llama) or gives its shape as
// key=value pairs (Llama's have kv_heads, ffn and head_dim). What the trainer needs of a model is
// here, one place per family: its sizes, its FSDP units, the whole model in one process (samples),
// and its files.
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "coshard/fsdp/unit.hpp"
#include "coshard/gpt2/config.hpp"
#include "coshard/llama/config.hpp"
#include "coshard/models/params.hpp"
#include "coshard/runtime/task.hpp"

namespace coshard::train {

using StateDict = std::map<std::string, std::vector<float>>;

class ModelConfig {
 public:
  ModelConfig() = default;
  explicit ModelConfig(gpt2::Config c) : c_(c) {}
  explicit ModelConfig(llama::Config c) : c_(c) {}
  // --model's text; Errc::bad_config naming the key or the name.
  static ModelConfig parse(std::string_view spec);
  // The family and shape a Hugging Face model directory's config.json describes; a model_type
  // other than gpt2 and llama is Errc::bad_config naming it.
  static ModelConfig from_hf_dir(const std::filesystem::path& dir);

  const char* family() const noexcept { return is_llama() ? "llama" : "gpt2"; }
  bool is_llama() const noexcept { return std::holds_alternative<llama::Config>(c_); }
  const gpt2::Config& gpt2() const { return std::get<gpt2::Config>(c_); }
  const llama::Config& llama() const { return std::get<llama::Config>(c_); }

  std::int64_t vocab() const noexcept;
  std::int64_t context() const noexcept;
  std::int64_t num_params() const noexcept;
  std::vector<models::ParamInfo> all_params() const;
  // Parameters of the units the plan keeps open besides the layers (embedding, final norm, an
  // untied head) and of one layer, for the memory formula.
  double root_params() const noexcept;
  double layer_params() const noexcept;
  std::int64_t layers() const noexcept;
  double activation_bytes(double B, double T) const noexcept;
  // Parses back with parse(): GPT-2's key=value form, or Llama's (which has kv_heads).
  std::string to_string() const;
  // transformers' class of the family: GPT2LMHeadModel, LlamaForCausalLM.
  const char* hf_class() const noexcept { return is_llama() ? "LlamaForCausalLM" : "GPT2LMHeadModel"; }
  bool operator==(const ModelConfig&) const = default;

 private:
  std::variant<gpt2::Config, llama::Config> c_;
};

// A model's FSDP units, whatever the family (gpt2::Gpt2Units, llama::LlamaUnits).
class Units {
 public:
  virtual ~Units() = default;
  virtual std::vector<fsdp::Unit*> units() = 0;
  virtual void set_batch(std::vector<std::int32_t> tokens, std::vector<std::int32_t> targets, std::size_t B,
                         std::size_t T) = 0;
  virtual void set_loss_scale(float dloss) = 0;
  virtual Task<float> loss() const = 0;
};
// bf16: compute on the bf16 parameters (the families' Compute::bf16).
std::unique_ptr<Units> make_units(const ModelConfig& c, std::uint64_t seed, bool bf16);

// The whole model in one process (the samples at the end of a run).
class FullModel {
 public:
  virtual ~FullModel() = default;
  virtual models::ParamStore& params() = 0;
  // Logits [T, V] of one sequence.
  virtual std::span<const float> logits(std::span<const std::int32_t> tokens) = 0;
};
std::unique_ptr<FullModel> make_full_model(const ModelConfig& c, std::uint64_t seed);

// --save: the parameters under their Hugging Face names, in one safetensors file.
void save_state_dict(const std::filesystem::path& path, const ModelConfig& c, const StateDict& state);
// --init: a .safetensors file of Hugging Face names, or a Hugging Face directory of this model.
StateDict read_init(const std::filesystem::path& path, const ModelConfig& c);
// --save-hf: a directory transformers' from_pretrained loads as c.hf_class().
void save_hf_dir(const std::filesystem::path& dir, const ModelConfig& c, const StateDict& state);

}  // namespace coshard::train
