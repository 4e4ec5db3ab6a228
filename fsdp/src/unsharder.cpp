#include "unsharder.hpp"

#include <algorithm>
#include <string>

#include "device_work.hpp"
#include "coshard/runtime/copy.hpp"

namespace coshard::fsdp::detail {

Unsharder::Unsharder(Context& ctx, std::vector<UnitState>& units, CommGroups& comms, Offload* offload)
    : ctx_(ctx), units_(units), comms_(comms), offload_(offload) {
  // Sharded: the all-gathered parameters. NO_SHARD under mixed precision: the master cast to
  // param_dtype for units that compute in it.
  if (ctx_.sharded() || ctx_.mixed()) params_ = std::make_unique<BufferPool>(ctx_.param_dtype);
  if (ctx_.mixed()) f32_ = std::make_unique<BufferPool>(DType::f32);
}

std::size_t Unsharder::resident_count() const {
  std::size_t n = 0;
  for (const auto& u : units_) n += u.unsharded.residency == Residency::unsharded && !u.progress.open ? 1 : 0;
  return n;
}

namespace {
// A unit's unsharded parameters: param_dtype, plus the f32 copy of a unit that computes in f32.
std::size_t param_bytes(const UnitState& u, DType param_dtype) {
  const auto n = static_cast<std::size_t>(u.layout.padded);
  return n * size_of(param_dtype) + (u.f32_copy ? n * 4 : 0);
}
}  // namespace

std::size_t Unsharder::max_unit_bytes() const noexcept {
  std::size_t worst = 0;
  for (const auto& u : units_) {
    worst = std::max(worst, param_bytes(u, ctx_.param_dtype) + static_cast<std::size_t>(u.layout.padded) * 4);
  }
  return worst;
}

std::size_t Unsharder::all_units_param_bytes() const noexcept {
  std::size_t n = 0;
  for (const auto& u : units_) n += param_bytes(u, ctx_.param_dtype);
  return n;
}

void Unsharder::unshard(std::size_t ui, const char* phase, bool from_post_forward_shard) {
  UnitState& u = units_[ui];
  Stream& stream = *ctx_.streams.unshard;
  if (!ctx_.sharded()) {
    // NO_SHARD: the master is the parameter (f32); under mixed precision it is rounded to
    // param_dtype, in f32 for a unit that computes in f32 and cast for the others.
    publish(u, !ctx_.mixed() ? u.shard.master : u.f32_copy ? rounded_master(u) : cast_master(u));
    return;
  }
  auto lease = params_->acquire(ctx_.rt.allocator(), u.layout.padded);
  u.unsharded.param_slot = lease.slot;
  // The stream that writes the buffer first: h2d when the master shard lives on the host.
  const bool via_host = offload_ && !from_post_forward_shard;
  if (lease.previous_use) (via_host ? offload_->h2d() : stream).wait(*lease.previous_use);
  Tensor flat = gather(u, lease.buffer, from_post_forward_shard);
  ctx_.log.push_back(std::string(phase) + " " + u.name + " all_gather");
  publish(u, u.f32_copy ? f32_copy(u, flat) : flat);
}

Tensor Unsharder::gather(UnitState& u, const Tensor& buf, bool from_post_forward_shard) {
  if (offload_ && !from_post_forward_shard) {
    gather_via_host(u, buf);
  } else if (from_post_forward_shard) {
    gather_from_post_forward_shard(u, buf);
  } else {
    gather_from_master(u, buf);
  }
  return buf.view(0, {u.layout.padded});
}

void Unsharder::gather_via_host(UnitState& u, const Tensor& buf) {
  auto staged = offload_->stage_master(u);
  Event ev = comms_.all_gather->all_gather(staged.device, buf.view(0, {u.layout.padded}), offload_->h2d(), u.name);
  offload_->release(staged.slot, ev);
  ctx_.streams.unshard->wait(ev);
}

void Unsharder::gather_from_post_forward_shard(UnitState& u, const Tensor& buf) {
  Stream& stream = *ctx_.streams.unshard;
  const std::int64_t len = u.layout.padded / ctx_.reshard_group;
  const std::int64_t at = (ctx_.shard_rank % ctx_.reshard_group) * len;
  Tensor src = u.unsharded.post_forward_shard;
  copy_tensor(stream, buf.view(at, {len}), src, "copy-in " + u.name);
  Event ev = comms_.post_forward->all_gather(buf.view(at, {len}), buf.view(0, {u.layout.padded}), stream, u.name);
  stream.wait(ev);
}

void Unsharder::gather_from_master(UnitState& u, const Tensor& buf) {
  Stream& stream = *ctx_.streams.unshard;
  const std::int64_t at = ctx_.shard_rank * u.layout.chunk;
  cast_scaled(stream, buf.view(at, {u.layout.chunk}), u.shard.master, 1.0f, "copy-in " + u.name);
  Event ev = comms_.all_gather->all_gather(buf.view(at, {u.layout.chunk}), buf.view(0, {u.layout.padded}), stream, u.name);
  stream.wait(ev);
}

// A slot of `pool` for `u`'s unsharded parameters, held in `slot`, written next by the unshard
// stream (which waits for the slot's previous use).
Tensor Unsharder::unshard_slot(UnitState& u, BufferPool& pool, int& slot) {
  auto lease = pool.acquire(ctx_.rt.allocator(), u.layout.padded);
  slot = lease.slot;
  if (lease.previous_use) ctx_.streams.unshard->wait(*lease.previous_use);
  return lease.buffer.view(0, {u.layout.padded});
}

// Mixed precision: the unit computes in f32 on the param_dtype-rounded values.
Tensor Unsharder::f32_copy(UnitState& u, const Tensor& flat) {
  Tensor out = unshard_slot(u, *f32_, u.unsharded.f32_slot);
  widen(*ctx_.streams.unshard, out, flat, "copy-out " + u.name);
  return out;
}

// NO_SHARD with mixed precision: parameters rounded to param_dtype, computed in f32.
Tensor Unsharder::rounded_master(UnitState& u) {
  Tensor out = unshard_slot(u, *f32_, u.unsharded.f32_slot);
  round_through(*ctx_.streams.unshard, out, u.shard.master, ctx_.param_dtype, "cast " + u.name);
  return out;
}

// NO_SHARD, for a unit that computes in param_dtype: the master cast into a pool slot.
Tensor Unsharder::cast_master(UnitState& u) {
  Tensor out = unshard_slot(u, *params_, u.unsharded.param_slot);
  cast_scaled(*ctx_.streams.unshard, out, u.shard.master, 1.0f, "cast " + u.name);
  return out;
}

void Unsharder::publish(UnitState& u, const Tensor& flat) {
  u.unsharded.views.clear();
  for (const auto& p : u.layout.params) u.unsharded.views.push_back(flat.view(p.offset, p.spec.shape));
  u.unsharded.ready = Event();
  u.unsharded.ready.record(*ctx_.streams.unshard);
  u.unsharded.residency = Residency::unsharded;
  report_occupancy();
}

void Unsharder::reshard(std::size_t ui, const Event& last_use, bool keep_post_forward_shard) {
  UnitState& u = units_[ui];
  Unsharded& s = u.unsharded;
  if (!s.resident()) return;
  if (keep_post_forward_shard && ctx_.reshard_group > 0 && s.param_slot >= 0) {
    // Keep this rank's part of the group's unsharded buffer for the backward all-gather.
    Stream& stream = *ctx_.streams.unshard;
    const std::int64_t len = u.layout.padded / ctx_.reshard_group, at = (ctx_.shard_rank % ctx_.reshard_group) * len;
    if (!s.post_forward_shard.defined()) s.post_forward_shard = Tensor::empty(ctx_.rt.allocator(), ctx_.param_dtype, {len});
    Tensor dst = s.post_forward_shard;
    Tensor src = params_->buffer(s.param_slot);
    stream.wait(last_use);
    copy_tensor(stream, dst, src.view(at, {len}), "keep " + u.name);
    Event kept;
    kept.record(stream);
    params_->release(s.param_slot, kept);
  } else if (s.param_slot >= 0) {
    params_->release(s.param_slot, last_use);
  }
  if (s.f32_slot >= 0) f32_->release(s.f32_slot, last_use);
  s.param_slot = s.f32_slot = -1;
  s.views.clear();
  s.residency = Residency::sharded;
  report_occupancy();
}

void Unsharder::keep_after_forward(std::size_t ui) {
  Unsharded& s = units_[ui].unsharded;
  if (s.resident()) s.residency = Residency::kept_after_forward;
}

void Unsharder::run_again(std::size_t ui) {
  Unsharded& s = units_[ui].unsharded;
  if (s.resident()) s.residency = Residency::unsharded;
}

void Unsharder::prefetch(std::size_t target, const char* phase) {
  const UnitState& u = units_[target];
  if (u.unsharded.resident()) return;
  if (resident_count() >= static_cast<std::size_t>(std::max(1, ctx_.opt.in_flight))) {
    ctx_.metrics.limiter_waits->add();
    return;
  }
  const bool from_shard = std::string(phase) == "backward" && ctx_.reshard_group > 0 &&
                          u.unsharded.post_forward_shard.defined();
  unshard(target, phase, from_shard);
}

void Unsharder::report_occupancy() {
  if (ctx_.metrics.pool_occupancy) ctx_.metrics.pool_occupancy->set(static_cast<double>(params_ ? params_->held() : 0));
}

}  // namespace coshard::fsdp::detail
