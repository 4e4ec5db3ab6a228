#include "state_dict.hpp"

#include <algorithm>
#include <string>

#include "coshard/runtime/copy.hpp"

namespace coshard::fsdp::detail {
namespace {

// Each shard's values from the full state dict, copied in on the compute stream.
Task<void> scatter_into_shards(std::vector<UnitState>& units, StateDict state, Context& ctx) {
  Stream& compute = *ctx.streams.compute;
  for (auto& u : units) {
    const std::int64_t begin = ctx.sharded() ? ctx.shard_rank * u.layout.chunk : 0;
    std::vector<float> shard(static_cast<std::size_t>(u.shard.master.numel()), 0.0f);
    for (const auto& p : u.layout.params) {
      const auto& v = state.at(p.spec.name);
      const std::int64_t lo = std::max(begin, p.offset), hi = std::min(begin + u.shard.master.numel(), p.offset + p.numel);
      for (std::int64_t i = lo; i < hi; ++i) shard[static_cast<std::size_t>(i - begin)] = v[static_cast<std::size_t>(i - p.offset)];
    }
    upload(compute, u.shard.master, std::move(shard));
  }
  Event loaded(compute.device());
  loaded.record(compute);
  co_await loaded;
}

}  // namespace

Task<StateDict> gather_full_state(std::vector<UnitState>& units, Context& ctx, CommGroups& comms, bool rank0_only) {
  Event ready;
  ready.record(*ctx.streams.optimizer);
  co_await ready;
  StateDict out;
  for (auto& u : units) {
    Tensor full = u.shard.master;
    if (ctx.sharded() && ctx.shard_size > 1) {
      // An offloaded shard is host memory: NCCL gathers device memory only, so it goes up first.
      Tensor shard = u.shard.master;
      if (shard.host_accessible() && !ctx.rt.host_accessible()) {
        shard = Tensor::empty(ctx.rt.allocator(), DType::f32, {shard.numel()});
        copy_tensor(*ctx.streams.compute, shard, u.shard.master, "state dict up " + u.name);
      }
      full = Tensor::empty(ctx.rt.allocator(), DType::f32, {u.layout.padded});
      co_await comms.all_gather->all_gather(shard, full, *ctx.streams.compute);
    }
    if (rank0_only && ctx.rank != 0) continue;
    const std::vector<float> values = co_await download<float>(*ctx.streams.compute, full);
    for (const auto& p : u.layout.params) {
      const auto first = values.begin() + p.offset;
      out[p.spec.name] = std::vector<float>(first, first + p.numel);
    }
  }
  co_return out;
}

void check_state_dict(const std::vector<UnitState>& units, const StateDict& state, const Context& ctx) {
  std::size_t expected = 0;
  for (const auto& u : units) {
    for (const auto& p : u.layout.params) {
      ++expected;
      auto it = state.find(p.spec.name);
      if (it == state.end()) {
        throw ctx.error(Errc::invalid_argument, "state dict has no '" + p.spec.name + "' (unit '" + u.name + "')", u.name,
                        "load_state_dict");
      }
      if (static_cast<std::int64_t>(it->second.size()) != p.numel) {
        throw ctx.error(Errc::invalid_argument, "state dict entry '" + p.spec.name + "' has " +
                                                    std::to_string(it->second.size()) + " values but the parameter has shape " +
                                                    coshard::to_string(p.spec.shape) + " (unit '" + u.name + "')",
                        u.name, "load_state_dict");
      }
    }
  }
  if (state.size() == expected) return;
  for (const auto& [name, values] : state) {
    bool known = false;
    for (const auto& u : units) {
      for (const auto& p : u.layout.params) known |= p.spec.name == name;
    }
    if (!known) {
      throw Error(Errc::invalid_argument, "state dict entry '" + name + "' is not a parameter of this model",
                  op_context("load_state_dict"));
    }
  }
}

Task<void> load_full_state(std::vector<UnitState>& units, Context& ctx, StateDict state) {
  check_state_dict(units, state, ctx);
  co_await quiesce(ctx);
  co_await scatter_into_shards(units, std::move(state), ctx);
}

}  // namespace coshard::fsdp::detail
