#pragma once
// What every model of coshard shares about its parameters: a parameter by name and shape with its
// initialisation, counter-based initial values (a pure function of (seed, name, element), so that
// each FSDP rank initialises only its own shard and every sharding gives the same model bit for
// bit), the fsdp::ParamSpecs of a list of them, and a flat f32 store of them in host memory.
#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "coshard/fsdp/unit.hpp"
#include "coshard/ops/optim.hpp"
#include "coshard/runtime/tensor.hpp"

namespace coshard::models {

enum class Init { normal, zeros, ones };

struct ParamInfo {
  std::string name;
  Shape shape;
  Init init = Init::zeros;
  float std = 0.0f;             // Init::normal
  std::string init_key;         // name whose random stream it uses (a tied copy shares its source's)
  bool weight_decay = false;    // matrices and embeddings: true; biases and norms: false
  std::int64_t numel() const noexcept;
};

/// Builders: normal(0, std) with weight decay unless said otherwise, zeros and ones without.
ParamInfo normal_param(std::string name, Shape shape, float std, bool decay = true);
ParamInfo zeros_param(std::string name, Shape shape);
ParamInfo ones_param(std::string name, Shape shape);

// Fills elements [first, first + out.size()) of `p` (row-major) for `seed`.
void init_values(const ParamInfo& p, std::uint64_t seed, std::span<float> out, std::int64_t first);
// A standard normal sample, a pure function of (key, index): splitmix64 hashes and a Box-Muller
// transform.
double normal_sample(std::uint64_t key, std::uint64_t index) noexcept;
std::uint64_t splitmix64(std::uint64_t x) noexcept;
std::uint64_t hash_name(std::string_view name) noexcept;

// The ParamSpecs of a list of parameters (init from (seed, name, index), weight-decay flags).
std::vector<fsdp::ParamSpec> param_specs(const std::vector<ParamInfo>& infos, std::uint64_t seed);

/// Every parameter of a model in its order, from the builders of the config's namespace:
/// embedding_params(c), block_params(c, l) for each layer, head_params(c). Validates c first.
template <class Config>
std::vector<ParamInfo> model_params(const Config& c) {
  c.validate();
  auto v = embedding_params(c);
  for (std::int64_t l = 0; l < c.layers; ++l) {
    for (auto& p : block_params(c, l)) v.push_back(std::move(p));
  }
  for (auto& p : head_params(c)) v.push_back(std::move(p));
  return v;
}

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
  // Parameters [first, first + N) as tensor() views.
  template <std::size_t N>
  std::array<Tensor, N> tensors(std::size_t first) const {
    std::array<Tensor, N> v;
    for (std::size_t k = 0; k < N; ++k) v[k] = tensor(first + k);
    return v;
  }
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

}  // namespace coshard::models
