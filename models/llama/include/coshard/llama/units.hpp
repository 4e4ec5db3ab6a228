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
#include "coshard/models/unit_set.hpp"

namespace coshard::llama {

// What the units compute with under bf16 mixed precision (models::Compute).
using models::Compute;

class LlamaUnits : public models::UnitSet<Config, Activations> {
 public:
  LlamaUnits(Config config, std::uint64_t seed, Compute compute = Compute::f32);
  ~LlamaUnits();

 private:
  friend class EmbeddingUnit;
  template <class, std::size_t>
  friend class models::LayerUnit;
  friend class HeadUnit;
  void head_forward(fsdp::Scope& scope, const Tensor& norm_weight, const Tensor& head);
};

}  // namespace coshard::llama
