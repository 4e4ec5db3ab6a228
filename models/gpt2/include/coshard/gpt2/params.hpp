#pragma once
// GPT-2's parameters by name, in Hugging Face GPT2LMHeadModel's order and layout, their
// initialisation, and a flat fp32 store of them.
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
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "coshard/gpt2/config.hpp"
#include "coshard/ops/optim.hpp"
#include "coshard/runtime/tensor.hpp"

namespace coshard::gpt2 {

enum class Init { normal, zeros, ones };

struct ParamInfo {
  std::string name;
  Shape shape;
  Init init = Init::zeros;
  float std = 0.0f;             // Init::normal
  std::string init_key;         // name whose random stream it uses (wte.weight for lm_head.weight)
  bool weight_decay = false;    // matrices and embeddings: true; biases and layernorms: false
  std::int64_t numel() const noexcept;
};

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

// Fills elements [first, first + out.size()) of `p` (row-major) for `seed`.
void init_values(const ParamInfo& p, std::uint64_t seed, std::span<float> out, std::int64_t first);
// A standard normal sample, a pure function of (key, index).
double normal_sample(std::uint64_t key, std::uint64_t index) noexcept;
std::uint64_t splitmix64(std::uint64_t x) noexcept;
std::uint64_t hash_name(std::string_view name) noexcept;

// Named fp32 parameters in one flat buffer of host memory (each parameter 16-float aligned within
// it), zeroed when made. Move-only: the buffer is a tensor, which tensor() views for ops::Kernels.
class ParamStore {
 public:
  ParamStore() = default;
  explicit ParamStore(std::vector<ParamInfo> infos);
  ParamStore(ParamStore&&) noexcept = default;
  ParamStore& operator=(ParamStore&&) noexcept;
  ~ParamStore();

  const std::vector<ParamInfo>& infos() const noexcept { return infos_; }
  std::size_t size() const noexcept { return infos_.size(); }
  std::span<float> at(std::size_t i);
  std::span<const float> at(std::size_t i) const;
  // Parameter i as a tensor of its shape, sharing the buffer: a view that must not outlive the
  // store (nor a move-assignment to it), whose allocator it came from.
  Tensor tensor(std::size_t i) const;
  // By name; throws Errc::invalid_argument naming it when unknown.
  std::span<float> operator[](std::string_view name);
  std::span<const float> operator[](std::string_view name) const;
  // Index of `name`, or -1.
  std::int64_t index_of(std::string_view name) const noexcept;
  std::span<float> flat() noexcept { return {data_.data_as<float>(), static_cast<std::size_t>(data_.numel())}; }
  std::span<const float> flat() const noexcept {
    return {data_.data_as<float>(), static_cast<std::size_t>(data_.numel())};
  }
  std::int64_t offset(std::size_t i) const { return offsets_.at(i); }
  // The ranges of the flat buffer that hold parameters, with their weight-decay flag (for
  // ops::adamw_step; the alignment gaps are left out).
  std::vector<ops::ParamRange> ranges() const;
  void fill(float v);
  // Initialises every parameter for `seed`.
  void initialize(std::uint64_t seed);

 private:
  std::vector<ParamInfo> infos_;
  std::vector<std::int64_t> offsets_;
  std::unique_ptr<Allocator> memory_;  // outlives data_
  Tensor data_;
};

}  // namespace coshard::gpt2
