#include "coshard/models/params.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "coshard/runtime/error.hpp"

namespace coshard::models {

std::int64_t ParamInfo::numel() const noexcept {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

ParamInfo normal_param(std::string name, Shape shape, float std, bool decay) {
  ParamInfo p{std::move(name), std::move(shape), Init::normal, std, {}, decay};
  p.init_key = p.name;
  return p;
}

ParamInfo zeros_param(std::string name, Shape shape) {
  ParamInfo p{std::move(name), std::move(shape), Init::zeros, 0.0f, {}, false};
  p.init_key = p.name;
  return p;
}

ParamInfo ones_param(std::string name, Shape shape) {
  ParamInfo p{std::move(name), std::move(shape), Init::ones, 0.0f, {}, false};
  p.init_key = p.name;
  return p;
}

std::vector<fsdp::ParamSpec> param_specs(const std::vector<ParamInfo>& infos, std::uint64_t seed) {
  std::vector<fsdp::ParamSpec> specs;
  for (const auto& p : infos) {
    fsdp::InitFn init = [p, seed](std::span<float> out, std::int64_t first) { init_values(p, seed, out, first); };
    specs.push_back({p.name, p.shape, std::move(init), p.weight_decay});
  }
  return specs;
}

std::uint64_t splitmix64(std::uint64_t x) noexcept {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

std::uint64_t hash_name(std::string_view name) noexcept {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (char ch : name) h = (h ^ static_cast<unsigned char>(ch)) * 1099511628211ull;
  return h;
}

double normal_sample(std::uint64_t key, std::uint64_t index) noexcept {
  // Two independent uniforms per element from the counter, then Box-Muller (cosine branch).
  const std::uint64_t a = splitmix64(key ^ splitmix64(2 * index));
  const std::uint64_t b = splitmix64(key ^ splitmix64(2 * index + 1));
  const double u1 = (static_cast<double>(a >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
  const double u2 = static_cast<double>(b >> 11) * 0x1.0p-53;          // [0, 1)
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

void init_values(const ParamInfo& p, std::uint64_t seed, std::span<float> out, std::int64_t first) {
  switch (p.init) {
    case Init::zeros:
      std::fill(out.begin(), out.end(), 0.0f);
      return;
    case Init::ones:
      std::fill(out.begin(), out.end(), 1.0f);
      return;
    case Init::normal: {
      const std::uint64_t key = splitmix64(seed) ^ hash_name(p.init_key);
      for (std::size_t k = 0; k < out.size(); ++k) {
        out[k] = static_cast<float>(p.std * normal_sample(key, static_cast<std::uint64_t>(first) + k));
      }
      return;
    }
  }
}

ParamStore::ParamStore(std::vector<ParamInfo> infos) : infos_(std::move(infos)) {
  std::int64_t at = 0;
  for (const auto& p : infos_) {
    offsets_.push_back(at);
    at += (p.numel() + 15) / 16 * 16;
  }
  memory_ = std::make_unique<Allocator>(cpu_memory());
  data_ = Tensor::empty(*memory_, DType::f32, {at});
  fill(0.0f);
}

ParamStore& ParamStore::operator=(ParamStore&& o) noexcept {
  data_ = std::move(o.data_);  // before the allocator it came from replaces this one's
  memory_ = std::move(o.memory_);
  infos_ = std::move(o.infos_);
  offsets_ = std::move(o.offsets_);
  return *this;
}

ParamStore::~ParamStore() = default;

std::span<float> ParamStore::at(std::size_t i) {
  return flat().subspan(static_cast<std::size_t>(offsets_.at(i)), static_cast<std::size_t>(infos_[i].numel()));
}
std::span<const float> ParamStore::at(std::size_t i) const {
  return flat().subspan(static_cast<std::size_t>(offsets_.at(i)), static_cast<std::size_t>(infos_[i].numel()));
}

Tensor ParamStore::tensor(std::size_t i) const { return data_.view(offsets_.at(i), infos_.at(i).shape); }

std::int64_t ParamStore::index_of(std::string_view name) const noexcept {
  for (std::size_t i = 0; i < infos_.size(); ++i) {
    if (infos_[i].name == name) return static_cast<std::int64_t>(i);
  }
  return -1;
}

std::span<float> ParamStore::operator[](std::string_view name) {
  const auto i = index_of(name);
  if (i < 0) throw Error(Errc::invalid_argument, "no parameter named '" + std::string(name) + "'");
  return at(static_cast<std::size_t>(i));
}
std::span<const float> ParamStore::operator[](std::string_view name) const {
  const auto i = index_of(name);
  if (i < 0) throw Error(Errc::invalid_argument, "no parameter named '" + std::string(name) + "'");
  return at(static_cast<std::size_t>(i));
}

std::vector<ops::ParamRange> ParamStore::ranges() const {
  std::vector<ops::ParamRange> r;
  for (std::size_t i = 0; i < infos_.size(); ++i) {
    r.push_back({static_cast<std::size_t>(offsets_[i]), static_cast<std::size_t>(infos_[i].numel()), infos_[i].weight_decay});
  }
  return r;
}

void ParamStore::fill(float v) {
  const auto all = flat();
  std::fill(all.begin(), all.end(), v);
}

void ParamStore::initialize(std::uint64_t seed) {
  for (std::size_t i = 0; i < infos_.size(); ++i) init_values(infos_[i], seed, at(i), 0);
}

}  // namespace coshard::models
