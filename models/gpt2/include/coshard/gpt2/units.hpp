#pragma once
// GPT-2 as FSDP units for coshard::fsdp::Engine.
//
// Untied head (Config::tie_head = false): a plain sequence, usable with engine.forward() and
// engine.backward() directly:
//   "embedding" {wte.weight, wpe.weight}, "h.0" .. "h.{L-1}" (12 parameters each),
//   "head" {ln_f.weight, ln_f.bias, lm_head.weight}.
//
// Tied head (GPT-2 proper, the default): wte is used at both ends of the model (token embedding
// first, logits last) and a parameter belongs to exactly one unit. As with PyTorch FSDP, the
// shared weight lives in a root unit that wraps the blocks, here a two-phase unit (Unit::phases):
//   "embedding_and_head" {wte.weight, wpe.weight, ln_f.weight, ln_f.bias}, "h.0" .. "h.{L-1}".
// Forward runs the root's phase 0 (embedding), the blocks, then its phase 1 (ln_f, logits =
// x wte^T, loss); backward runs phase 1 (head), the blocks in reverse, phase 0 (embedding). The
// engine keeps the root unsharded from its first forward phase to its last backward phase and
// reduces its gradient once, so wte's gradient (head part + embedding part) is reduced as one sum.
// engine.forward()/backward() handle both layouts; Gpt2Units::forward()/backward() call them.
//
// The units run their kernels through ops::Kernels on the engine's compute stream, and keep the
// activations in the runtime's device memory: the same code on the CPU, cpu-discrete and CUDA
// devices, none of it touching device memory from the host.
//
// The batch goes in with set_batch() before forward(); the loss comes back with
// co_await units.loss(), which waits for the kernel that computed it and its copy to the host
// (models::UnitSet, which Llama's units share).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "coshard/fsdp/engine.hpp"
#include "coshard/fsdp/unit.hpp"
#include "coshard/gpt2/model.hpp"
#include "coshard/models/unit_set.hpp"
#include "coshard/ops/kernels.hpp"
#include "coshard/runtime/readback.hpp"

namespace coshard::gpt2 {

// What the units compute with under bf16 mixed precision (models::Compute).
using models::Compute;

class Gpt2Units : public models::UnitSet<Config, Activations> {
 public:
  Gpt2Units(Config config, std::uint64_t seed, Compute compute = Compute::f32);
  ~Gpt2Units();

  // engine.forward() / engine.backward() (the units' order is the model's).
  Task<void> forward(fsdp::Engine& engine);
  Task<void> backward(fsdp::Engine& engine);

 private:
  friend class EmbeddingUnit;
  template <class, std::size_t>
  friend class models::LayerUnit;
  friend class HeadUnit;
  // ln_f, logits and loss, and the loss's copy to the host for loss().
  void head_forward(fsdp::Scope& scope, const Tensor& ln_f_weight, const Tensor& ln_f_bias, const Tensor& head);
};

using models::param_specs;

}  // namespace coshard::gpt2
