#pragma once
// CPU offload (Options::offload): the host pool that holds offloaded sharded state, the h2d and
// d2h streams, and the device copies of offloaded master shards.
//
// Ordering it keeps:
//  - a master shard is copied to the device (cast to the parameter dtype: by the host loop where
//    the host reaches device memory, else copied in f32 and cast on the device) on h2d only after the
//    shard's last optimizer update (ShardTensors::updated) and after the previous user of the
//    device copy's slot (the all-gather that read it) completed;
//  - the device copy's slot is handed back with the all-gather's event, so the next copy into it
//    waits for that all-gather;
//  - reduced gradient shards are accumulated on the host behind d2h (GradientReducer::sink), after
//    a copy into host landing slots where the host cannot reach device memory.
#include <cstddef>
#include <memory>
#include <vector>

#include "buffer_pool.hpp"
#include "context.hpp"
#include "unit_state.hpp"

namespace coshard::fsdp::detail {

// Host bytes the offloaded sharded state of `units` takes (before allocator rounding).
std::size_t offloaded_bytes(const std::vector<UnitState>& units, const Context& ctx);
// Host bytes where reduced gradient shards land before the host accumulates them, on a device
// whose memory the host cannot reach (two slots of the largest shard, in the reduce dtype); else 0.
std::size_t landing_bytes(const std::vector<UnitState>& units, const Context& ctx);
// Optimizer state tensors per shard: AdamW 2, SGD with momentum 1, plain SGD 0.
int optimizer_buffers(const Optimizer& optimizer);

class Offload {
 public:
  // Fails with a clear error when the state cannot fit under Offload::host_memory_cap_bytes.
  Offload(Context& ctx, const std::vector<UnitState>& units);

  Allocator& host() noexcept { return *host_; }
  Stream& h2d() noexcept { return *ctx_.streams.h2d; }
  Stream& d2h() noexcept { return *ctx_.streams.d2h; }

  struct Staged {
    Tensor device;  // the master shard in the parameter dtype, written by h2d
    int slot = -1;  // give back with release() and the event of its last reader
  };
  // Enqueues the copy of `u`'s master shard to the device on h2d.
  Staged stage_master(const UnitState& u);
  void release(int slot, const Event& last_use) { shard_pool_->release(slot, last_use); }
  // Device bytes of one staged master shard at its largest: the parameter-dtype copy, and the f32
  // slot it went up in where that is needed.
  std::size_t device_copy_bytes() const noexcept;

 private:
  Context& ctx_;
  std::unique_ptr<Allocator> host_;
  std::int64_t max_chunk_ = 0;              // the largest master shard
  std::unique_ptr<BufferPool> shard_pool_;  // device copies of master shards, each slot sized for its shard
  // Where the host cannot reach device memory and the parameters are not f32: the one f32 slot a
  // master shard goes up in before its cast.
  std::unique_ptr<BufferPool> f32_pool_;
};

}  // namespace coshard::fsdp::detail
