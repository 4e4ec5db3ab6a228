#pragma once
// The sharded state of a model: each unit's flat layout, the check that every rank built the same
// model, and the tensors each rank owns (f32 master shard, gradient shard, optimizer state; in
// the host pool where offloaded), initialised shard by shard or from rank 0's values.
#include <cstdint>
#include <vector>

#include "comm_groups.hpp"
#include "context.hpp"
#include "offload.hpp"
#include "unit_state.hpp"

namespace coshard::fsdp::detail {

// The tensors of a shard, by the name a checkpoint gives them: "param" (the master), then the
// optimizer's states in ShardTensors' order: AdamW's exp_avg and exp_avg_sq, SGD's momentum_buffer
// (held in exp_avg) when it has momentum.
std::vector<std::string> state_kinds(const Optimizer& optimizer);
// "adamw" or "sgd".
std::string optimizer_name(const Optimizer& optimizer);

// One state per unit, with its layout (validated: names, shapes, phases).
std::vector<UnitState> layout_units(const std::vector<Unit*>& units, const Context& ctx);
// A hash of unit names, parameter names and shapes, in order.
std::uint64_t model_signature(const std::vector<UnitState>& units);
// Collective: fails on every rank, naming a rank whose model differs.
Task<void> check_same_model(std::vector<UnitState>& units, Context& ctx, transport::Communicator& control);
// Collective when Options::sync_module_states: allocates and initialises every unit's shard.
Task<void> allocate_shards(std::vector<UnitState>& units, Context& ctx, transport::Communicator& control, Offload* offload);

}  // namespace coshard::fsdp::detail
