#pragma once
// The engine's communicators, one per kind of traffic so that issue order never serialises them
// (FSDP's separate all-gather and reduce-scatter process groups):
//   all_gather      unshard: the shard group (hybrid: ranks of one node group; else the world)
//   reduce_scatter  gradients, over the same group
//   all_reduce      hybrid: across replicas of a shard; no_shard: the world
//   control         small messages (signatures, order checks, norms, state dicts, init)
//   post_forward    reshard_after_forward = a group size: the backward all-gather in that group
//   checkpoint      checkpoint reports and outcomes, with Options::checkpoint_timeout (file I/O)
#include <memory>

#include "context.hpp"
#include "coshard/transport/process_group.hpp"

namespace coshard::fsdp::detail {

struct CommGroups {
  std::unique_ptr<transport::Communicator> all_gather, reduce_scatter, all_reduce, control, post_forward, checkpoint;

  // Collective. Builds the communicators of ctx.opt.strategy and fills in the shard group of
  // `ctx` (shard_rank, shard_size, replicas, reshard_group). Bad group sizes fail by name.
  static Task<CommGroups> create(transport::ProcessGroup& group, Context& ctx);
  // Collective seconds on the communicators that move gradients and parameters.
  double busy_seconds() const;
};

}  // namespace coshard::fsdp::detail
