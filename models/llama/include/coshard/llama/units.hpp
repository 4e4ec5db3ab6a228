#pragma once
// Llama as FSDP units for coshard::fsdp::Engine, in GPT-2's pattern (coshard/gpt2/units.hpp).
//
// Untied head (Llama's default): a plain sequence, "embedding" {model.embed_tokens.weight},
// "layers.0" .. "layers.{L-1}" (9 parameters each), "head" {model.norm.weight, lm_head.weight}.
// Tied head (Llama 3.2 1B): the embedding is used at both ends, so it lives in a two-phase root
// unit "embedding_and_head" {model.embed_tokens.weight, model.norm.weight}, unsharded from its
// first forward phase to its last backward phase, its gradient reduced once.
//
// The units run their kernels through ops::Kernels on the engine's compute stream and keep their
// activations in the runtime's device memory: the same code on the CPU, cpu-discrete and CUDA
// devices. The batch goes in with set_batch() before forward(); co_await loss() waits for the
// kernel that computed it and its copy to the host.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "coshard/fsdp/engine.hpp"
#include "coshard/fsdp/unit.hpp"
#include "coshard/llama/model.hpp"
#include "coshard/models/unit_io.hpp"

namespace coshard::llama {

// What the units compute with under bf16 mixed precision: f32 (an f32 copy the engine makes) or
// the bf16 parameters themselves (GEMMs with bf16 weights and f32 sums; norms widened).
enum class Compute { f32, bf16 };

class LlamaUnits {
 public:
  LlamaUnits(Config config, std::uint64_t seed, Compute compute = Compute::f32);
  ~LlamaUnits();
  LlamaUnits(const LlamaUnits&) = delete;
  LlamaUnits& operator=(const LlamaUnits&) = delete;

  const Config& config() const noexcept { return c_; }
  std::vector<fsdp::Unit*> units();  // in engine order (pass to Engine::create)
  std::vector<std::string> unit_names() const;

  // The next iteration's batch ([B, T] tokens and targets), validated here; installed on the
  // compute stream when the embedding runs.
  void set_batch(std::vector<std::int32_t> tokens, std::vector<std::int32_t> targets, std::size_t B, std::size_t T);
  void set_loss_scale(float dloss) noexcept { dloss_ = dloss; }
  Task<float> loss() const { return loss_.get(); }

  struct Batch {
    std::vector<std::int32_t> tokens, targets;
    std::size_t B = 0, T = 0;
  };

 private:
  friend class EmbeddingUnit;
  friend class BlockUnit;
  friend class HeadUnit;
  ops::Kernels kernels(fsdp::Scope& scope, std::string span);
  void head_forward(fsdp::Scope& scope, const Tensor& norm_weight, const Tensor& head);
  Config c_;
  std::uint64_t seed_;
  Compute compute_;
  models::ComputeLauncher launch_;
  std::unique_ptr<Activations> acts_;
  std::shared_ptr<const Batch> pending_;
  float dloss_ = 1.0f;
  models::HostLoss loss_;
  std::vector<std::unique_ptr<fsdp::Unit>> units_;
};

}  // namespace coshard::llama
