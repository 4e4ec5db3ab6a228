#pragma once
// The optimizer on the shards: one update per unit on the optimizer stream (AdamW or SGD, on the
// f32 master shard, padding excluded), after which the gradient shard is zeroed. With offloaded
// optimizer state the same update runs on host memory, and the engine issues it per unit as soon
// as the unit's gradient is reduced (pipelined), not after backward.
//
// Ordering it keeps:
//  - a unit's update waits for Gradients::reduced (its gradient shard is complete, and clipped
//    when clipping runs first);
//  - ShardTensors::updated is recorded after the update: an offloaded master's copy to the device
//    waits for it;
//  - step_done() is recorded after every update of a step: the next step's first all-gather (and
//    its compute, and h2d) wait for it, and the host issues no further step before it completed.
#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "context.hpp"
#include "unit_state.hpp"

namespace coshard::fsdp::detail {

// Host optimizer time split by whether backward compute was still running (offload telemetry).
struct OptimizerClock {
  std::atomic<bool> backward_running{false};
  std::atomic<std::int64_t> overlapped_ns{0}, exposed_ns{0};
};

class ShardOptimizer {
 public:
  ShardOptimizer(Context& ctx, std::vector<UnitState>& units) : ctx_(ctx), units_(units) {}

  // The pipelined host optimizer: unit `u`'s update now, as its gradient shard is ready in the last
  // backward; finish_step leaves it out.
  void step_early(std::size_t u);
  // Every unit not yet stepped this step, then records the step's event.
  void finish_step();
  const std::optional<Event>& step_done() const noexcept { return done_; }
  // Marks on compute where backward's gradient compute starts and ends (for the clock).
  void mark_backward(bool running);
  // Adds the optimizer time since the last report to coshard_optimizer_seconds_total.
  void report();

 private:
  // Enqueues unit `u`'s update after its gradient shard.
  void step_unit(std::size_t u);
  std::function<void(void* cuda_stream)> update_of(UnitState& u);

  Context& ctx_;
  std::vector<UnitState>& units_;
  std::shared_ptr<OptimizerClock> clock_ = std::make_shared<OptimizerClock>();
  std::int64_t reported_overlapped_ns_ = 0, reported_exposed_ns_ = 0;
  std::optional<Event> done_;
};

}  // namespace coshard::fsdp::detail
