#pragma once
// The per-step plan: which unit runs at which position, what to prefetch when a unit starts, and
// whether a unit reshards after forward. The first iteration records the order in which units
// run (after the engine checked that every rank runs the same one); once its last phase has run,
// the recorded order is the plan. Until then there is no prefetch: nothing is known yet.
//
// Pure bookkeeping on the scheduler thread: no streams, no tensors, so it is tested on its own.
#include <cstddef>
#include <string>
#include <vector>

#include "coshard/fsdp/options.hpp"

namespace coshard::fsdp::detail {

class Plan {
 public:
  // Per unit, in the model's order: its name and number of phases.
  Plan(std::vector<std::string> names, std::vector<int> phases, Options options);

  bool ready() const noexcept { return ready_; }
  // The order forward() runs: the plan once recorded; before that, phase 0 of every unit in
  // order, then the later phases innermost first (the root's head after the blocks).
  std::vector<std::size_t> forward_order() const;
  // The recorded order (the plan, or the first iteration so far).
  const std::vector<std::size_t>& recorded() const noexcept { return order_; }
  std::size_t steps_per_iteration() const noexcept { return steps_; }

  // The position of the forward phase that starts now; 0 starts an iteration.
  std::size_t next_forward_position() noexcept { return forward_position_++; }
  std::size_t next_backward_position() noexcept { return backward_position_++; }
  // Before the plan is ready: the unit at the next position of the first iteration.
  void record(std::size_t unit) { order_.push_back(unit); }
  // After a forward phase at `position`: the plan becomes ready after the iteration's last one.
  void forward_done(std::size_t position) noexcept;
  // True when a ready plan expected another unit at `position` (the caller warns once).
  bool deviates(std::size_t position, std::size_t unit) const noexcept;
  // Resets the positions at the iteration's start (forward) and end (finish_backward).
  void start_iteration() noexcept { backward_position_ = 0; }
  void end_iteration() noexcept { forward_position_ = 0; }

  // Units to unshard when `unit` starts its forward phase at `position`: the explicit list for
  // it, else the next `prefetch.forward` units of the plan.
  std::vector<std::size_t> forward_prefetch(std::size_t unit, std::size_t position) const;
  // Units to unshard around `unit`'s backward at backward `position` (reverse plan order): the
  // explicit list for it, else the next unit of the reverse plan.
  std::vector<std::size_t> backward_prefetch(std::size_t unit, std::size_t position) const;
  // When backward prefetching happens for `unit`: before its gradient compute (pre, and every
  // explicit list), after it (post), or never.
  bool prefetch_before_backward(std::size_t unit) const;
  bool prefetch_after_backward(std::size_t unit) const;

  // Whether `unit` frees its unsharded parameters after forward: per strategy, unless
  // Options::reshard_after_forward says otherwise; as FSDP's root, the unit that runs last in
  // forward (and so first in backward) keeps them when the strategy decides.
  bool reshard_after_forward(std::size_t unit) const;

 private:
  std::vector<std::size_t> named(const std::map<std::string, std::vector<std::string>>& lists, std::size_t unit) const;
  bool has_explicit_backward(std::size_t unit) const;

  std::vector<std::string> names_;
  std::vector<int> phases_;
  Options options_;
  std::size_t steps_ = 0;
  std::vector<std::size_t> order_;
  bool ready_ = false;
  std::size_t forward_position_ = 0, backward_position_ = 0;
};

}  // namespace coshard::fsdp::detail
