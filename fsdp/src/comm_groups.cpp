#include "comm_groups.hpp"

#include <string>

#include "coshard/launch/hosts.hpp"

namespace coshard::fsdp::detail {
namespace {

transport::CommOptions comm_options(const Context& ctx, const std::string& name) {
  transport::CommOptions c;
  c.name = name;
  c.timeout = ctx.opt.timeout;
  c.telemetry = &ctx.rt.telemetry();
  if (ctx.opt.comm_hook) {
    c.before_op = [hook = ctx.opt.comm_hook, name](const transport::OpInfo& info) { hook(name, info); };
  }
  return c;
}

// By default the ranks of one host, which every rank must count alike: a job whose hosts hold
// different numbers of ranks (srun -N2 -n3) had ranks disagree on the groups, one failing here
// and the others at their store.
int shard_group_size(const transport::ProcessGroup& group, const Context& ctx) {
  if (ctx.opt.shard_group_size <= 0) {
    auto per_host = launch::ranks_per_host(group.hosts());
    if (!per_host) {
      throw Error(Errc::bad_config,
                  "hybrid sharding's shard group is the ranks of a host by default, but " + per_host.error().message() +
                      ". Run as many ranks on every host, each host's consecutive (coshard-run --nproc-per-node N, "
                      "srun --ntasks-per-node=N), or give a shard group size that divides the " +
                      std::to_string(ctx.world) + " ranks (shard_group_size, gpt2-train --shard-group)");
    }
    return per_host.value();
  }
  const int s = ctx.opt.shard_group_size;
  if (s < 1 || ctx.world % s != 0) {
    throw Error(Errc::bad_config, "hybrid sharding with shard groups of " + std::to_string(s) + " ranks needs a world size "
                                  "divisible by it, but the world has " + std::to_string(ctx.world) +
                                  " ranks. Pick a shard group size that divides " + std::to_string(ctx.world));
  }
  return s;
}

// reshard_after_forward = g: a group of g ranks inside the shard group, for the backward all-gather.
Task<void> make_post_forward_group(CommGroups& c, Context& ctx) {
  const auto* g = ctx.opt.reshard_after_forward ? std::get_if<int>(&*ctx.opt.reshard_after_forward) : nullptr;
  if (!g) co_return;
  if (!c.all_gather || *g < 1 || *g >= ctx.shard_size || ctx.shard_size % *g != 0) {
    throw Error(Errc::bad_config, "reshard_after_forward = " + std::to_string(*g) +
                                      " must be a divisor of the shard group size (" + std::to_string(ctx.shard_size) +
                                      ") other than itself; use true or false otherwise");
  }
  if (*g == 1) co_return;
  ctx.reshard_group = *g;
  c.post_forward = co_await c.all_gather->split(ctx.shard_rank / *g, ctx.shard_rank, comm_options(ctx, "all_gather_post_forward"));
}

}  // namespace

Task<CommGroups> CommGroups::create(transport::ProcessGroup& group, Context& ctx) {
  CommGroups c;
  const Strategy s = ctx.opt.strategy;
  if (s == Strategy::hybrid_shard || s == Strategy::hybrid_shard_zero2) {
    const int size = shard_group_size(group, ctx);
    auto& world = group.world();
    c.all_gather = co_await world.split(ctx.rank / size, ctx.rank, comm_options(ctx, "all_gather"));
    c.reduce_scatter = co_await world.split(ctx.rank / size, ctx.rank, comm_options(ctx, "reduce_scatter"));
    c.all_reduce = co_await world.split(ctx.rank % size, ctx.rank, comm_options(ctx, "all_reduce"));
  } else if (s == Strategy::no_shard) {
    c.all_reduce = co_await group.new_communicator(comm_options(ctx, "all_reduce"));
  } else {
    c.all_gather = co_await group.new_communicator(comm_options(ctx, "all_gather"));
    c.reduce_scatter = co_await group.new_communicator(comm_options(ctx, "reduce_scatter"));
  }
  c.control = co_await group.new_communicator(comm_options(ctx, "control"));
  auto checkpoint = comm_options(ctx, "checkpoint");
  checkpoint.timeout = ctx.opt.checkpoint_timeout;
  c.checkpoint = co_await group.new_communicator(std::move(checkpoint));
  if (c.all_gather) {
    ctx.shard_rank = c.all_gather->rank();
    ctx.shard_size = c.all_gather->size();
  }
  ctx.replicas = ctx.world / ctx.shard_size;
  co_await make_post_forward_group(c, ctx);
  co_return c;
}

double CommGroups::busy_seconds() const {
  double s = 0;
  for (auto* c : {all_gather.get(), reduce_scatter.get(), all_reduce.get(), post_forward.get()}) {
    if (c) s += std::chrono::duration<double>(c->stream().busy()).count();
  }
  return s;
}

}  // namespace coshard::fsdp::detail
