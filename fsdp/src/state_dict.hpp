#pragma once
// Full state dicts: every parameter unsharded in f32, by name. Saving all-gathers each unit's
// master shard after the last optimizer update; loading checks every name and shape first, then
// writes each rank's part of every parameter into its shard once the streams are done with it.
#include <vector>

#include "comm_groups.hpp"
#include "context.hpp"
#include "coshard/fsdp/engine.hpp"
#include "unit_state.hpp"

namespace coshard::fsdp::detail {

// Collective. `rank0_only`: the other ranks return {}.
Task<StateDict> gather_full_state(std::vector<UnitState>& units, Context& ctx, CommGroups& comms, bool rank0_only);
// Throws naming the first missing, misshapen or unknown entry.
void check_state_dict(const std::vector<UnitState>& units, const StateDict& state, const Context& ctx);
// Waits for the streams that use the shards, then overwrites every master shard from `state`
// (checked first). Parameter shards only: optimizer state and gradients are unchanged.
Task<void> load_full_state(std::vector<UnitState>& units, Context& ctx, StateDict state);

}  // namespace coshard::fsdp::detail
