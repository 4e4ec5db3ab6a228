#include "sharded_state.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "coshard/runtime/copy.hpp"
#include "coshard/transport/gather_integers.hpp"

namespace coshard::fsdp::detail {
namespace {

std::uint64_t fnv(std::uint64_t h, const void* data, std::size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

Tensor zeros(Allocator& alloc, std::int64_t n, Stream& stream) {
  Tensor t = Tensor::empty(alloc, DType::f32, {n});
  fill_zero(stream, t);
  return t;
}

// The master shard's first values: its part of each parameter's init, or rank 0's whole unit.
// Computed on the host and copied in on the compute stream. The whole unit of sync_module_states
// is awaited before the next one's is made: one unit's full size at a time, never the model's.
Task<void> initialise(UnitState& u, Context& ctx, transport::Communicator& control, std::int64_t begin) {
  Stream& compute = *ctx.streams.compute;
  const std::int64_t n = u.shard.master.numel();
  if (!ctx.opt.sync_module_states || ctx.world == 1) {
    std::vector<float> values(static_cast<std::size_t>(n));
    u.layout.init(values, begin);
    upload(compute, u.shard.master, std::move(values));
    co_return;
  }
  Tensor full = Tensor::empty(ctx.rt.allocator(), DType::f32, {u.layout.padded});
  if (ctx.rank == 0) {
    std::vector<float> values(static_cast<std::size_t>(full.numel()));
    u.layout.init(values, 0);
    upload(compute, full, std::move(values));
  }
  compute.wait(control.broadcast(full, 0, compute));
  copy_tensor(compute, u.shard.master, full.view(begin, {n}));
  Event copied(compute.device());
  copied.record(compute);
  co_await copied;
}

}  // namespace

std::vector<std::string> state_kinds(const Optimizer& optimizer) {
  if (const auto* sgd = std::get_if<SGD>(&optimizer)) {
    return sgd->options.momentum != 0.0 ? std::vector<std::string>{"param", "momentum_buffer"}
                                        : std::vector<std::string>{"param"};
  }
  return {"param", "exp_avg", "exp_avg_sq"};
}

std::string optimizer_name(const Optimizer& optimizer) { return std::holds_alternative<SGD>(optimizer) ? "sgd" : "adamw"; }

std::vector<UnitState> layout_units(const std::vector<Unit*>& units, const Context& ctx) {
  const std::int64_t align = 16 / static_cast<std::int64_t>(size_of(ctx.param_dtype));
  const int shards = ctx.sharded() ? ctx.shard_size : 1;
  std::vector<UnitState> out;
  for (Unit* unit : units) {
    UnitState u;
    u.unit = unit;
    u.name = unit->name();
    u.layout = FlatLayout::build(u.name, unit->params(), shards, align);
    u.phases = unit->phases();
    u.f32_copy = ctx.mixed() && unit->computes_in_f32();
    if (u.phases < 1) throw Error(Errc::bad_config, "unit '" + u.name + "' declares " + std::to_string(u.phases) + " phases");
    out.push_back(std::move(u));
  }
  return out;
}

std::uint64_t model_signature(const std::vector<UnitState>& units) {
  std::uint64_t signature = 1469598103934665603ull;
  for (const auto& u : units) {
    signature = fnv(signature, u.name.data(), u.name.size());
    for (const auto& p : u.layout.params) {
      signature = fnv(signature, p.spec.name.data(), p.spec.name.size());
      signature = fnv(signature, p.spec.shape.data(), p.spec.shape.size() * sizeof(std::int64_t));
    }
  }
  return signature;
}

Task<void> check_same_model(std::vector<UnitState>& units, Context& ctx, transport::Communicator& control) {
  const auto signature = static_cast<std::int64_t>(model_signature(units));
  std::vector<std::int64_t> mine{signature};
  const std::vector<std::int64_t> all =
      co_await transport::gather_integers(control, *ctx.streams.compute, ctx.rt.allocator(), std::move(mine));
  for (int r = 0; r < ctx.world; ++r) {
    if (all[static_cast<std::size_t>(r)] != signature) {
      throw Error(Errc::bad_config, "rank " + std::to_string(r) + " built a different model (unit names or parameter "
                                    "shapes differ from rank " + std::to_string(ctx.rank) + "'s). Every rank must pass "
                                    "the same units",
                  ErrorContext{.rank = ctx.rank, .op = "create", .unit = {}});
    }
  }
}

Task<void> allocate_shards(std::vector<UnitState>& units, Context& ctx, transport::Communicator& control, Offload* offload) {
  const auto& off = ctx.opt.offload;
  Allocator& device = ctx.rt.allocator();
  Allocator& master_alloc = off.params ? offload->host() : device;
  Allocator& grad_alloc = off.grads ? offload->host() : device;
  Allocator& opt_alloc = off.optimizer ? offload->host() : device;
  const int opt_buffers = optimizer_buffers(ctx.opt.optimizer);
  Stream& compute = *ctx.streams.compute;
  for (auto& u : units) {
    const std::int64_t n = ctx.sharded() ? u.layout.chunk : u.layout.padded;
    const std::int64_t begin = ctx.sharded() ? ctx.shard_rank * u.layout.chunk : 0;
    u.shard.master = Tensor::empty(master_alloc, DType::f32, {n});
    u.shard.grad = zeros(grad_alloc, n, compute);
    co_await initialise(u, ctx, control, begin);
    if (opt_buffers >= 1) u.shard.exp_avg = zeros(opt_alloc, n, compute);
    if (opt_buffers >= 2) u.shard.exp_avg_sq = zeros(opt_alloc, n, compute);
  }
  // Every other stream reads the shards without waiting on compute: they are ready on return.
  Event ready(compute.device());
  ready.record(compute);
  co_await ready;
}

}  // namespace coshard::fsdp::detail
