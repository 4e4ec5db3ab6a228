// Engine::create: the options checked, the communicators built, the model laid out and checked
// across ranks, the sharded state allocated, the collaborators made.
#include <cstdio>
#include <string>

#include "engine_impl.hpp"
#include "sharded_state.hpp"

namespace coshard::fsdp {
namespace {

void check_dtypes(const detail::Context& ctx) {
  for (DType d : {ctx.param_dtype, ctx.reduce_dtype}) {
    if (d != DType::f32 && d != DType::bf16 && d != DType::f16) {
      throw Error(Errc::bad_config, "mixed precision dtypes must be f32, bf16 or f16, not " + std::string(to_string(d)));
    }
  }
}

void check_offload(const Options& opt, const Runtime& rt) {
  const Offload& off = opt.offload;
  if (off.params && !(off.grads && off.optimizer) && !rt.host_accessible()) {
    throw Error(Errc::bad_config, "offload.params without offload.grads and offload.optimizer on " +
                                      rt.device().to_string() + ": the host cannot reach this device's memory, so the "
                                      "optimizer steps on the host only when master shards, gradients and optimizer "
                                      "state all live there (as PyTorch's CPUOffload moves them together). Set "
                                      "offload.grads and offload.optimizer too");
  }
  if ((off.grads || off.optimizer) && !off.params) {
    throw Error(Errc::bad_config, "offload of the " + std::string(off.optimizer ? "optimizer" : "gradients") +
                                      " needs offload.params too: the master shards they update must live in host "
                                      "memory as well (set offload.params = true)");
  }
  if (off.optimizer && !off.grads) {
    throw Error(Errc::bad_config, "offload.optimizer steps on the host and needs the gradients there: set "
                                  "offload.grads = true");
  }
  if (off.any() && opt.strategy == Strategy::no_shard) {
    throw Error(Errc::bad_config, "CPU offload works on sharded strategies; no_shard keeps every parameter on every "
                                  "rank's device");
  }
}

// Everything that can be checked before talking to the other ranks.
void check_options(const detail::Context& ctx, const std::vector<Unit*>& units) {
  check_dtypes(ctx);
  if (units.empty()) throw Error(Errc::bad_config, "the engine needs at least one unit");
  check_offload(ctx.opt, ctx.rt);
  if (ctx.opt.in_flight < 1) {
    throw Error(Errc::bad_config, "in_flight must be at least 1, not " + std::to_string(ctx.opt.in_flight));
  }
  if (ctx.opt.prefetch.forward < 0) throw Error(Errc::bad_config, "forward prefetch depth must be >= 0");
}

void make_collaborators(Engine::Impl& m) {
  std::vector<std::string> names;
  std::vector<int> phases;
  for (const auto& u : m.units) {
    names.push_back(u.name);
    phases.push_back(u.phases);
  }
  const auto& off = m.ctx.opt.offload;
  m.plan = std::make_unique<detail::Plan>(std::move(names), std::move(phases), m.ctx.opt);
  m.unsharder = std::make_unique<detail::Unsharder>(m.ctx, m.units, m.comms, off.params ? m.offload.get() : nullptr);
  m.reducer = std::make_unique<detail::GradientReducer>(m.ctx, m.units, m.comms, off.grads ? m.offload.get() : nullptr);
  m.optimizer = std::make_unique<detail::ShardOptimizer>(m.ctx, m.units);
  m.checkpoint = std::make_unique<detail::ShardedCheckpoint>(m.ctx, m.units, m.comms);
}

}  // namespace

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Engine::~Engine() {
  // Work still queued on the streams refers to the engine's state: let it finish first.
  for (Stream* s : impl_->ctx.streams.all()) {
    try {
      s->synchronize(impl_->ctx.opt.timeout);
    } catch (const std::exception& e) {
      impl_->ctx.rt.log(LogLevel::error, "rank " + std::to_string(impl_->ctx.rank) + ": engine shutdown: " + e.what());
    }
  }
}

Task<std::unique_ptr<Engine>> Engine::create(Runtime& runtime, transport::ProcessGroup& group, std::vector<Unit*> units,
                                             Options options) {
  auto impl = std::make_unique<Impl>(runtime, std::move(options));
  Impl& m = *impl;
  detail::Context& ctx = m.ctx;
  ctx.rank = group.rank();
  ctx.world = group.size();
  ctx.param_dtype = ctx.opt.mixed_precision.param;
  ctx.reduce_dtype = ctx.opt.mixed_precision.reduce.value_or(ctx.param_dtype);
  check_options(ctx, units);
  m.comms = co_await detail::CommGroups::create(group, ctx);
  ctx.streams = detail::EngineStreams::of(runtime, ctx.opt.offload.any());
  ctx.metrics = detail::EngineMetrics::register_in(runtime.telemetry());
  m.units = detail::layout_units(units, ctx);
  co_await detail::check_same_model(m.units, ctx, *m.comms.control);
  // The host pool's cap is checked now rather than in the middle of a step.
  if (ctx.opt.offload.any()) m.offload = std::make_unique<detail::Offload>(ctx, m.units);
  co_await detail::allocate_shards(m.units, ctx, *m.comms.control, m.offload.get());
  make_collaborators(m);
  co_return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

}  // namespace coshard::fsdp
