#include "offload.hpp"

#include <algorithm>
#include <string>

#include "device_work.hpp"
#include "coshard/runtime/cuda.hpp"
#include "sharded_state.hpp"

namespace coshard::fsdp::detail {

int optimizer_buffers(const Optimizer& optimizer) { return static_cast<int>(state_kinds(optimizer).size()) - 1; }

std::size_t offloaded_bytes(const std::vector<UnitState>& units, const Context& ctx) {
  const auto& off = ctx.opt.offload;
  const int per_element = (off.params ? 1 : 0) + (off.grads ? 1 : 0) + (off.optimizer ? optimizer_buffers(ctx.opt.optimizer) : 0);
  std::size_t need = 0;
  for (const auto& u : units) {
    const auto n = static_cast<std::size_t>(ctx.sharded() ? u.layout.chunk : u.layout.padded) * sizeof(float);
    need += n * static_cast<std::size_t>(per_element);
  }
  return need;
}

std::size_t landing_bytes(const std::vector<UnitState>& units, const Context& ctx) {
  if (!ctx.opt.offload.grads || ctx.rt.host_accessible()) return 0;
  std::int64_t max_chunk = 0;
  for (const auto& u : units) max_chunk = std::max(max_chunk, u.layout.chunk);
  return 2 * static_cast<std::size_t>(max_chunk) * size_of(ctx.reduce_dtype);
}

Offload::Offload(Context& ctx, const std::vector<UnitState>& units) : ctx_(ctx) {
  const auto& off = ctx.opt.offload;
  if (off.host_memory_cap_bytes > 0) {
    // The caching allocator rounds blocks up; leave it room.
    const std::size_t need = offloaded_bytes(units, ctx) + landing_bytes(units, ctx);
    if (need + need / 8 > off.host_memory_cap_bytes) {
      throw Error(Errc::bad_config, "the offloaded sharded state needs " + std::to_string(need) +
                                        " bytes of host memory on this rank (plus allocator rounding), but the host "
                                        "memory cap is " + std::to_string(off.host_memory_cap_bytes) +
                                        " bytes. Raise the cap, offload less, or shard over more ranks");
    }
  }
  // Host memory apart from device memory, as on a GPU: pinned on CUDA, so that h2d and d2h copies
  // are DMAs that overlap compute; cpu-discrete keeps it separate the same way.
  auto memory = ctx.rt.device().kind == DeviceKind::cuda ? cuda::pinned_host_memory() : cpu_memory();
  host_ = std::make_unique<Allocator>(std::move(memory), Allocator::Options{.cap_bytes = off.host_memory_cap_bytes});
  if (off.params) {
    for (const auto& u : units) max_chunk_ = std::max(max_chunk_, u.layout.chunk);
    shard_pool_ = std::make_unique<BufferPool>(ctx.param_dtype);
    if (!ctx.rt.host_accessible() && ctx.param_dtype != DType::f32) f32_pool_ = std::make_unique<BufferPool>(DType::f32);
  }
}

Offload::Staged Offload::stage_master(const UnitState& u) {
  auto lease = shard_pool_->acquire(ctx_.rt.allocator(), u.layout.chunk);
  if (lease.previous_use) h2d().wait(*lease.previous_use);
  if (u.shard.updated) h2d().wait(*u.shard.updated);
  Tensor dev = lease.buffer.view(0, {u.layout.chunk});
  const Traffic traffic{ctx_.metrics.h2d_bytes, ctx_.metrics.h2d_seconds};
  if (ctx_.rt.host_accessible()) {
    cast_scaled(h2d(), dev, u.shard.master, 1.0f, "h2d " + u.name, traffic);
  } else if (ctx_.param_dtype == DType::f32) {
    copy_counted(h2d(), dev, u.shard.master, "h2d " + u.name, traffic);
  } else {
    // Device memory the host cannot reach: the f32 shard goes up as it is (pinned, a DMA), then is
    // cast on the device, as FSDP does. One f32 slot serves every unit: it goes back behind the
    // cast, and the next copy into it is on the same stream.
    auto up = f32_pool_->acquire(ctx_.rt.allocator(), max_chunk_);
    if (up.previous_use) h2d().wait(*up.previous_use);
    Tensor f32 = up.buffer.view(0, {u.layout.chunk});
    copy_counted(h2d(), f32, u.shard.master, "h2d " + u.name, traffic);
    cast_scaled(h2d(), dev, f32, 1.0f, "cast " + u.name);
    Event cast(h2d().device());
    cast.record(h2d());
    f32_pool_->release(up.slot, cast);
  }
  return {dev, lease.slot};
}

std::size_t Offload::device_copy_bytes() const noexcept {
  const auto chunk = static_cast<std::size_t>(max_chunk_);
  return (shard_pool_ ? chunk * size_of(ctx_.param_dtype) : 0) + (f32_pool_ ? chunk * sizeof(float) : 0);
}

}  // namespace coshard::fsdp::detail
