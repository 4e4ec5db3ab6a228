#pragma once
// What the engine keeps per unit, in sections by owner. A section is written only by its owner;
// the others read it (scripts/checks/sections.py checks it). The owners are the engine's
// collaborators (see docs/architecture.md):
//   shard     ShardedState creates it, ShardOptimizer updates it, checkpoints and state dicts load it
//   unsharded Unsharder: the unit's residency and its all-gathered parameters while resident
//   grads     GradientReducer: the unsharded gradient buffer of a backward and its reduction
//   progress  Engine: the phases run this iteration
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "coshard/fsdp/unit.hpp"
#include "coshard/runtime/stream.hpp"
#include "coshard/runtime/tensor.hpp"
#include "flat_layout.hpp"

namespace coshard::fsdp::detail {

struct ShardTensors {
  // f32 master shard, its gradient and optimizer state (all [chunk]; NO_SHARD: [padded]): AdamW's
  // exp_avg and exp_avg_sq; SGD with momentum keeps its momentum_buffer in exp_avg.
  Tensor master, grad, exp_avg, exp_avg_sq;
  std::int64_t opt_step = 0;
  bool sgd_started = false;
  bool stepped = false;  // the pipelined optimizer already updated it this step (ShardOptimizer::step_early)
  std::optional<Event> updated;  // its last optimizer update (a copy of the master waits for it)
};

// Where a unit's parameters are; the Unsharder alone sets it.
enum class Residency {
  sharded,             // its shard only: unsharded before it runs
  unsharded,           // all-gathered (prefetched, or running): counted against Options::in_flight
  kept_after_forward,  // left unsharded after forward for backward (SHARD_GRAD_OP, the root): not counted
};

struct Unsharded {
  Residency residency = Residency::sharded;
  bool resident() const noexcept { return residency != Residency::sharded; }
  int param_slot = -1, f32_slot = -1;  // pool slots held while resident
  Event ready;                          // the unsharded parameters are complete
  std::vector<Tensor> views;            // one per parameter, handed to the unit's Scope (f32 or param dtype)
  Tensor post_forward_shard;            // reshard_after_forward = group size: this rank's part
};

struct Gradients {
  int slot = -1;                      // pool slot held during backward, or -1
  Tensor buffer;                      // f32 [padded]: the pool slot, or `accumulated` under no_sync
  Tensor accumulated;                 // no_sync: unsharded gradients kept across backwards
  bool accumulated_pending = false;   // `accumulated` holds gradients not yet reduced
  std::vector<Tensor> views;          // one per parameter, handed to the unit's Scope
  std::optional<Event> reduced;       // the gradient shard is up to date
};

struct Progress {
  int forward_calls = 0;   // forward phases run this iteration
  int backward_calls = 0;  // backward phases run this iteration
  bool open = false;       // between two of its phases: stays unsharded, outside the in-flight count
};

struct UnitState {
  Unit* unit = nullptr;
  std::string name;
  FlatLayout layout;
  int phases = 1;
  bool f32_copy = false;  // mixed precision and Unit::computes_in_f32(): the unit reads an f32 copy
  ShardTensors shard;
  Unsharded unsharded;
  Gradients grads;
  Progress progress;
};

}  // namespace coshard::fsdp::detail
