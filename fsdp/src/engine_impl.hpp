#pragma once
// The engine's state: the shared context, one UnitState per unit, and the collaborators that
// own the phases of a step. Engine (engine.cpp) coordinates them; each keeps the ordering
// invariants listed in its header and in docs/architecture.md.
//
// Members are declared in the order they must be built and, reversed, destroyed: the offload
// host pool outlives the units' tensors that live in it; the collaborators refer to the units.
#include <memory>
#include <vector>

#include "comm_groups.hpp"
#include "context.hpp"
#include "coshard/fsdp/engine.hpp"
#include "gradient_reducer.hpp"
#include "offload.hpp"
#include "plan.hpp"
#include "shard_optimizer.hpp"
#include "sharded_checkpoint.hpp"
#include "unit_state.hpp"
#include "unsharder.hpp"

namespace coshard::fsdp {

struct Engine::Impl {
  Impl(Runtime& rt, Options options) : ctx(rt, std::move(options)) {}

  detail::Context ctx;
  detail::CommGroups comms;
  std::unique_ptr<detail::Offload> offload;
  std::vector<detail::UnitState> units;
  std::unique_ptr<detail::Plan> plan;
  std::unique_ptr<detail::Unsharder> unsharder;
  std::unique_ptr<detail::GradientReducer> reducer;
  std::unique_ptr<detail::ShardOptimizer> optimizer;
  std::unique_ptr<detail::ShardedCheckpoint> checkpoint;
  bool sync = true;           // set_requires_gradient_sync
  bool last_backward = true;  // set_is_last_backward
  bool warned_deviation = false;
  CommStats reported;         // comm_stats() at the last optimizer step
};

}  // namespace coshard::fsdp
