#pragma once
// The FSDP engine: PyTorch FSDP's runtime as coroutines. It owns one flat parameter per unit
// (parameters 16-byte aligned, padded to divide by the shard group; rank r keeps chunk r as an
// f32 master shard with its gradient and optimizer state), all-gathers a unit just before it runs
// (prefetching the next ones on their own streams), frees it after use, reduce-scatters gradients
// as units finish backward, and steps the optimizer on the shards.
//
//   auto engine = co_await fsdp::Engine::create(rt, pg, units, options);
//   for (...) {
//     co_await engine->forward();          // units in order; all-gathers prefetched
//     co_await engine->backward();         // reverse order; reduce-scatters as units finish
//     co_await engine->optimizer_step();   // on shards; the next all-gather waits for it
//     float loss = co_await model.loss.get();  // a Readback: waits for the kernel that wrote it
//   }
//
// Everything is issued from the scheduler thread; the host never blocks on device work, except
// where a result must come back to it (clip_grad_norm, state dicts). forward() and backward()
// return once their kernels are issued, not run: the host runs ahead of the streams. Memory the
// units' kernels write is not ready when they return; a value the host needs goes through a
// Readback (readback.hpp), whose get() waits for the kernel that computed it.
#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "coshard/fsdp/checkpoint.hpp"
#include "coshard/fsdp/options.hpp"
#include "coshard/fsdp/unit.hpp"
#include "coshard/transport/process_group.hpp"

namespace coshard::fsdp {

/// Bytes the engine holds, by kind (memory_report()): for checking memory bounds and offload.
struct MemoryReport {
  std::size_t sharded_state_bytes = 0;    ///< on the device: master shards, gradient shards, optimizer state
  std::size_t host_state_bytes = 0;       ///< the same, offloaded to host memory
  /// Offload: one device copy of the largest master shard, and where the host cannot reach device
  /// memory (CUDA, cpu-discrete) with 16-bit parameters, the f32 slot it goes up in.
  std::size_t shard_copy_bytes = 0;
  /// Gradient offload where the host cannot reach device memory: the two host slots that reduced
  /// gradient shards land in before the host accumulates them.
  std::size_t host_landing_bytes = 0;
  std::size_t max_unit_unsharded_bytes = 0;  ///< largest unit: parameters (+ f32 copy) and gradients
  /// Every unit's parameters (+ f32 copies) unsharded at once: what SHARD_GRAD_OP keeps from forward
  /// to backward. The pool sizes each buffer for its unit, so this, not units x the largest, bounds it.
  std::size_t all_units_unsharded_bytes = 0;
  std::size_t pool_slots = 0;             ///< unsharded buffers the pool holds
  /// Bytes every pool of the engine keeps allocated on the device, in use or free for reuse: the
  /// unsharded parameters (+ f32 copies), the f32 gradient buffers, and the reduction's cast
  /// inputs and reduce-scatter outputs. With sharded_state_bytes, what the engine holds between
  /// steps.
  std::size_t pool_bytes = 0;
};

/// Full (unsharded) f32 parameters by name, each flattened row-major.
using StateDict = std::map<std::string, std::vector<float>>;

/// Totals since the engine was created (CPU backend: measured on the streams).
struct CommStats {
  double communication_seconds = 0;  ///< the communicators' streams running collectives
  /// The compute stream stalled waiting for collectives: for an all-gather (the unshard stream),
  /// or for a reduction still holding the gradient buffer it needs (the reduce stream, or d2h
  /// where offloaded gradients are accumulated).
  double exposed_seconds = 0;
  /// Every stall of the compute stream, by the stream it waited for: "unshard", "reduce" and
  /// "d2h" (the exposed communication above), "optimizer" (the previous step, and the reductions
  /// it waits for at the end of backward).
  std::map<std::string, double> compute_stall_seconds;
  /// Share of communication time hidden behind compute: 1 - exposed / communication (1 without
  /// communication). Exported as coshard_overlap_ratio.
  double overlap_ratio() const {     // share of communication hidden behind compute
    return communication_seconds > 0 ? std::max(0.0, 1.0 - exposed_seconds / communication_seconds) : 1.0;
  }
};

/// PyTorch FSDP's runtime for one rank: keeps the units' parameters sharded, gathers each unit
/// around its phases, reduces gradients and steps the optimizer on the shards.
class Engine {
 public:
  /// Collective: every rank passes the same units (same names and shapes, in the same order).
  /// Name the list before the co_await: g++ 12 rejects a braced list inside a co_await expression
  /// ("array used as initializer"), so write `std::vector<fsdp::Unit*> units{&a, &b};` and pass
  /// `units`. The same holds for every braced argument of an awaited call (checkpoint metadata).
  static Task<std::unique_ptr<Engine>> create(Runtime& runtime, transport::ProcessGroup& group, std::vector<Unit*> units,
                                              Options options);
  ~Engine();
  /// Not copyable: the engine owns the shards and streams.
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  /// Runs every unit's forward in order (the first iteration records the order and compiles the
  /// plan; ranks check that they agree).
  Task<void> forward();
  /// Runs every unit's backward in reverse forward order and reduces gradients.
  Task<void> backward();
  /// For models that are not a simple sequence: run one unit's phase. forward()/backward() are
  /// these in order.
  Task<void> run_forward(std::size_t unit);
  /// Runs the next backward phase of one unit (phases in reverse); its forward must have run this
  /// iteration. Call finish_backward() after the last unit.
  Task<void> run_backward(std::size_t unit);
  /// Ends a backward made of run_backward calls (backward() calls it). After a forward without
  /// backward (evaluation) it releases the units that forward left unsharded.
  Task<void> finish_backward();

  /// Gradient accumulation: with sync off, backwards accumulate unsharded gradients locally and
  /// reduce nothing; the first backward with sync on reduces them all (FSDP's no_sync()).
  void set_requires_gradient_sync(bool sync);
  /// With several synced backwards per step, say which is the last: the pipelined host optimizer
  /// (offload) steps units only during that one (FSDP2's set_is_last_backward). Default true.
  void set_is_last_backward(bool last);

  /// Scales the gradient shards so that their total p-norm (2, 1 or inf) is at most `max_norm`,
  /// with one all-reduce; returns the norm before clipping.
  Task<double> clip_grad_norm(double max_norm, double p);
  /// clip_grad_norm() with the 2-norm.
  Task<double> clip_grad_norm(double max_norm) { return clip_grad_norm(max_norm, 2.0); }
  /// Steps the optimizer on the shards. The host may run one step ahead of the streams: this waits
  /// (without blocking the scheduler) for the previous step's update to finish.
  Task<void> optimizer_step();
  /// The learning rate of the updates issued from now on (schedules).
  void set_learning_rate(double lr);
  /// Zeroes the gradient shards (optimizer_step does it after updating).
  void zero_grad();

  /// Full (unsharded, f32) parameters by name: on every rank, or only rank 0 (others get {}).
  Task<StateDict> full_state_dict(bool rank0_only);
  /// full_state_dict() on every rank.
  Task<StateDict> full_state_dict() { return full_state_dict(false); }
  /// Loads a full state dict into the shards once the streams are done with them; every name and
  /// shape must match (errors name them).
  Task<void> load_full_state_dict(StateDict state);
  /// Sharded checkpoints (checkpoint.hpp): every rank of the first replica writes the shards and
  /// optimizer state it owns to DIR/rank-NNNNN.bin, in parallel; rank 0 writes DIR/manifest.json
  /// last, with `metadata` (the trainer's step, schedule, data position). Collective; call after
  /// optimizer_step(). Returns once the manifest is durable; errors say which rank failed, and
  /// leave no manifest (the previous checkpoint stays the latest).
  Task<void> save_sharded(std::string dir, CheckpointMetadata metadata);
  /// The same, returning once the shards are staged in host memory: the files are written while
  /// training goes on, and the save is finished (manifest, errors) by the next optimizer_step(),
  /// save or wait_for_checkpoint(). A failed write is thrown there.
  Task<void> save_sharded_async(std::string dir, CheckpointMetadata metadata);
  /// Finishes a pending save_sharded_async() (writes the manifest, throws its errors); returns at
  /// once when none is pending. Collective.
  Task<void> wait_for_checkpoint();
  /// Loads a sharded checkpoint saved on any world size, strategy or shard group: each rank reads
  /// the pieces it owns (checksums checked). Collective; returns the saved metadata. Errors name
  /// the file and the problem: not a checkpoint, another model's shapes, another optimizer, a
  /// newer format, a missing, truncated or corrupt file.
  Task<CheckpointMetadata> load_sharded(std::string dir);

  /// FSDP's summon_full_params: gathers every parameter in full precision on every rank, runs
  /// `fn` on them (by name), and with `writeback` scatters what `fn` changed back into the shards
  /// (every rank must make the same change). Collective; not during a step.
  Task<void> summon_full_params(std::function<void(StateDict&)> fn, bool writeback);

  /// An event on the compute stream after everything enqueued so far. To read a value a unit
  /// computed, publish it through a Readback instead: its get() cannot be called too early.
  Event compute_event();
  /// Waits until all work the engine issued so far (compute, collectives, reductions, optimizer,
  /// offload copies) is done.
  Task<void> synchronize();
  /// "<phase> <unit> <collective>" in issue order, for tests of the schedule (cleared by clear).
  const std::vector<std::string>& issue_log() const noexcept;
  /// Empties issue_log().
  void clear_issue_log();
  /// What the engine holds now: sharded state on the device and on the host, and the pool.
  MemoryReport memory_report() const;
  /// Also exported as coshard_exposed_communication_seconds_total and coshard_overlap_ratio
  /// (updated at every optimizer step).
  CommStats comm_stats() const;
  /// Number of units: the indices run_forward() and unit_name() take are below it.
  std::size_t unit_count() const noexcept;
  /// The name of unit `unit` (the order create() was given); std::out_of_range past the end.
  const std::string& unit_name(std::size_t unit) const;
  /// Ranks over which each unit's parameters are sharded: the world for full_shard and
  /// shard_grad_op, the shard group for the hybrid strategies (by default the ranks of a host), 1
  /// for no_shard.
  int shard_group_size() const noexcept;

  /// @cond INTERNAL
  struct Impl;
  /// @endcond

 private:
  explicit Engine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace coshard::fsdp
