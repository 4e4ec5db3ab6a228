#include "model.hpp"

#include "coshard/gpt2/hf_dir.hpp"
#include "coshard/gpt2/model.hpp"
#include "coshard/gpt2/units.hpp"
#include "coshard/llama/hf_dir.hpp"
#include "coshard/llama/model.hpp"
#include "coshard/llama/units.hpp"
#include "coshard/models/hf_dir.hpp"
#include "coshard/models/safetensors.hpp"
#include "coshard/runtime/error.hpp"

namespace coshard::train {

ModelConfig ModelConfig::parse(std::string_view spec) {
  const bool llama_keys = spec.find("kv_heads=") != std::string_view::npos || spec.find("ffn=") != std::string_view::npos ||
                          spec.find("head_dim=") != std::string_view::npos;
  if (spec.starts_with("llama") || llama_keys) return ModelConfig(llama::parse_config(spec));
  if (spec.starts_with("gpt2-")) spec.remove_prefix(5);  // gpt2-124M: the family named
  return ModelConfig(gpt2::parse_config(spec));
}

ModelConfig ModelConfig::from_hf_dir(const std::filesystem::path& dir) {
  const std::string type = models::hf_model_type(dir);
  if (type == "gpt2") return ModelConfig(gpt2::read_hf_config(dir / "config.json"));
  if (type == "llama") return ModelConfig(llama::read_hf_config(dir / "config.json"));
  throw Error(Errc::bad_config, "'" + (dir / "config.json").string() + "' describes a model of type \"" + type +
                                    "\": gpt2-train trains gpt2 (GPT2LMHeadModel) and llama (LlamaForCausalLM)");
}

std::int64_t ModelConfig::vocab() const noexcept {
  return std::visit([](const auto& c) { return c.vocab; }, c_);
}

std::int64_t ModelConfig::context() const noexcept {
  return std::visit([](const auto& c) { return c.context; }, c_);
}

std::int64_t ModelConfig::layers() const noexcept {
  return std::visit([](const auto& c) { return c.layers; }, c_);
}

std::int64_t ModelConfig::num_params() const noexcept {
  return std::visit([](const auto& c) { return c.num_params(); }, c_);
}

std::vector<models::ParamInfo> ModelConfig::all_params() const {
  if (is_llama()) return llama::all_params(llama());
  return gpt2::all_params(gpt2());
}

double ModelConfig::root_params() const noexcept {
  if (is_llama()) {
    const auto& c = llama();
    return static_cast<double>(c.vocab * c.width * (c.tie_head ? 1 : 2) + c.width);
  }
  const auto& c = gpt2();
  return static_cast<double>(c.vocab * c.width + c.context * c.width + 2 * c.width + (c.tie_head ? 0 : c.vocab * c.width));
}

double ModelConfig::layer_params() const noexcept {
  if (is_llama()) {
    const auto& c = llama();
    return static_cast<double>(2 * c.width + c.width * (c.q_width() + 2 * c.kv_width()) + c.q_width() * c.width +
                               3 * c.width * c.ffn);
  }
  const double C = static_cast<double>(gpt2().width);
  return 12 * C * C + 13 * C;
}

double ModelConfig::activation_bytes(double B, double T) const noexcept {
  if (is_llama()) return llama::Activations::bytes_for(llama(), B, T);
  return gpt2::Activations::bytes_for(gpt2(), B, T);
}

std::string ModelConfig::to_string() const {
  return std::visit([](const auto& c) { return c.to_string(); }, c_);
}

namespace {

template <class U>
class UnitsOf final : public Units {
 public:
  template <class... A>
  explicit UnitsOf(A&&... a) : u_(std::forward<A>(a)...) {}
  std::vector<fsdp::Unit*> units() override { return u_.units(); }
  void set_batch(std::vector<std::int32_t> tokens, std::vector<std::int32_t> targets, std::size_t B,
                 std::size_t T) override {
    u_.set_batch(std::move(tokens), std::move(targets), B, T);
  }
  void set_loss_scale(float dloss) override { u_.set_loss_scale(dloss); }
  Task<float> loss() const override { return u_.loss(); }

 private:
  U u_;
};

template <class M>
class FullOf final : public FullModel {
 public:
  template <class... A>
  explicit FullOf(A&&... a) : m_(std::forward<A>(a)...) {}
  models::ParamStore& params() override { return m_.params(); }
  std::span<const float> logits(std::span<const std::int32_t> tokens) override {
    m_.forward(tokens, {}, 1, tokens.size());
    return m_.logits();
  }

 private:
  M m_;
};

}  // namespace

std::unique_ptr<Units> make_units(const ModelConfig& c, std::uint64_t seed, bool bf16) {
  if (c.is_llama()) {
    return std::make_unique<UnitsOf<llama::LlamaUnits>>(c.llama(), seed, bf16 ? llama::Compute::bf16 : llama::Compute::f32);
  }
  return std::make_unique<UnitsOf<gpt2::Gpt2Units>>(c.gpt2(), seed, bf16 ? gpt2::Compute::bf16 : gpt2::Compute::f32);
}

std::unique_ptr<FullModel> make_full_model(const ModelConfig& c, std::uint64_t seed) {
  if (c.is_llama()) return std::make_unique<FullOf<llama::Llama>>(c.llama(), seed);
  return std::make_unique<FullOf<gpt2::Gpt2>>(c.gpt2(), seed);
}

void save_state_dict(const std::filesystem::path& path, const ModelConfig& c, const StateDict& state) {
  models::save_state_dict(path, c.all_params(), state);
}

StateDict read_init(const std::filesystem::path& path, const ModelConfig& c) {
  return c.is_llama() ? llama::read_init(path, c.llama()) : gpt2::read_init(path, c.gpt2());
}

void save_hf_dir(const std::filesystem::path& dir, const ModelConfig& c, const StateDict& state) {
  if (c.is_llama()) {
    llama::save_hf_dir(dir, c.llama(), state);
  } else {
    gpt2::save_hf_dir(dir, c.gpt2(), state);
  }
}

}  // namespace coshard::train
