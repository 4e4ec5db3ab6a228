#pragma once
// What the engine shards: a model is an ordered set of units, each a group of named parameters
// with a forward and a backward phase. While a phase runs, the engine hands the unit views of its
// unsharded parameters and, in backward, of its f32 gradient buffers. A unit enqueues its kernels
// on the compute stream (scope.compute()) and returns; it never blocks the scheduler, never
// synchronises a stream, and never touches device memory from the host (docs/fsdp.md). What the
// host must read back (a loss) the unit publishes through a Readback on scope.compute() after its
// kernels:
//   loss.publish(scope.compute(), [acts] { return acts->loss; });
//
// Parameters come in one of two dtypes, as the unit declares (Unit::computes_in_f32):
//  - f32 (the default): Scope::param(i) spans of f32; under mixed precision they hold the
//    param_dtype-rounded values, in an f32 copy the engine keeps while the unit is resident. A
//    convenience for units that run host code (CPU kernels) in their work;
//  - param_dtype: Scope::param_tensor(i) is the all-gathered parameter itself (bf16 under bf16
//    mixed precision), read by the unit's kernels on the stream; no f32 copy is made.
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "coshard/runtime/runtime.hpp"
#include "coshard/runtime/task.hpp"
#include "coshard/runtime/tensor.hpp"

namespace coshard::fsdp {

/// Fills elements [first, first + out.size()) of a parameter (row-major). Called once per rank
/// for the part of the parameter in that rank's shard, so it must depend only on the element
/// index: the model is never materialised whole on one rank.
using InitFn = std::function<void(std::span<float> out, std::int64_t first)>;

/// One parameter of a unit: what the engine needs to allocate, initialise and optimise it.
struct ParamSpec {
  std::string name;  ///< unique in the model, e.g. "h.0.attn.c_attn.weight"
  Shape shape;       ///< global (unsharded) shape; every dimension positive
  InitFn init{};              ///< empty: zeros
  bool weight_decay = true;   ///< false for biases and norms
};

/// What a unit's phase gets from the engine: views of its unsharded parameters and gradients, and
/// the compute stream. Valid only while the phase runs.
class Scope {
 public:
  /// Built by the engine for each phase; `grads` is null in forward.
  Scope(Runtime& rt, Stream& compute, const std::vector<Tensor>* params, const std::vector<Tensor>* grads,
        int phase = 0)
      : rt_(rt), compute_(compute), params_(params), grads_(grads), phase_(phase) {}
  /// The runtime the engine runs on (allocator, telemetry).
  Runtime& runtime() noexcept { return rt_; }
  /// Which of the unit's phases runs (0 for single-phase units; see Unit::phases).
  int phase() const noexcept { return phase_; }
  /// The stream the unit's kernels run on; publish Readbacks on it after them.
  Stream& compute() noexcept { return compute_; }
  /// Unsharded parameter i of the unit, in params() order, as the unit computes with it: f32 when
  /// Unit::computes_in_f32(), else param_dtype. A view of device memory: read it in stream work.
  Tensor param_tensor(std::size_t i) const;
  /// Gradient buffer of parameter i (f32 tensor); kernels accumulate (+=) into it. Backward only.
  Tensor grad_tensor(std::size_t i) const;
  /// param_tensor(i) as f32 host-code spans, for units that compute in f32 (an error otherwise).
  std::span<float> param(std::size_t i) const;
  /// grad_tensor(i) as a span, for host code in the unit's work. Backward only.
  std::span<float> grad(std::size_t i) const;
  /// Enqueues work on the compute stream, named `span` on the timeline.
  void enqueue(std::function<void()> work, std::string span = {}) { compute_.enqueue(std::move(work), std::move(span)); }

 private:
  Runtime& rt_;
  Stream& compute_;
  const std::vector<Tensor>* params_;
  const std::vector<Tensor>* grads_;
  int phase_;
};

/// One shardable piece of a model, implemented by the model: its parameters and its forward and
/// backward phases.
class Unit {
 public:
  virtual ~Unit() = default;
  /// Unique in the model; names the unit in errors, checkpoints and explicit prefetch lists.
  virtual std::string name() const = 0;
  /// The unit's parameters, in the order Scope::param() indexes them; the same on every rank.
  virtual std::vector<ParamSpec> params() const = 0;
  /// Enqueues phase scope.phase() of the forward on the compute stream and returns without
  /// waiting for it.
  virtual Task<void> forward(Scope& scope) = 0;
  /// Enqueues phase scope.phase() of the backward, accumulating into scope.grad(); returns
  /// without waiting for it.
  virtual Task<void> backward(Scope& scope) = 0;
  /// A unit may run more than once per step, like FSDP's root that wraps the others: phase 0 of
  /// forward before the units after it, later phases after them (a GPT-2 whose LM head is tied to
  /// the token embedding: embedding in phase 0, head in phase 1). Backward runs the phases in
  /// reverse. Such a unit stays unsharded from its first forward phase to its last backward phase,
  /// and its gradients are reduced once, after that.
  virtual int phases() const { return 1; }
  /// True (the default): the unit computes on f32 parameters (Scope::param spans), so under mixed
  /// precision the engine keeps an f32 copy of them while the unit is resident. False: its
  /// kernels read Scope::param_tensor in param_dtype and no f32 copy is made (what a GPU unit
  /// wants: the unsharded parameters take half the memory under bf16).
  virtual bool computes_in_f32() const { return true; }
};

}  // namespace coshard::fsdp
