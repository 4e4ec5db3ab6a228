#pragma once
// The unshard/reshard path: all-gathers a unit's flat parameter into a pool buffer before it
// runs and hands the buffer back after its last use, within the in-flight limit.
//
// Ordering it keeps (docs/architecture.md lists them with their tests):
//  - a pool slot is reused only after the event of its previous use completes: the stream that
//    writes it next (unshard, or h2d with offload) waits for that event, so the host never blocks;
//  - Unsharded::ready is recorded on the unshard stream after the all-gather (and, under mixed
//    precision, the cast to f32 for a unit that computes in f32); compute waits for it before the
//    unit's phase runs;
//  - a unit is resharded with the event of its last use on compute (end of forward, end of
//    backward); a multi-phase unit between its phases is not resharded and not counted;
//  - at most Options::in_flight units are unsharded at once: a prefetch beyond it is deferred
//    (counted in coshard_limiter_waits_total), never waited for.
#include <cstddef>
#include <memory>
#include <vector>

#include "buffer_pool.hpp"
#include "comm_groups.hpp"
#include "context.hpp"
#include "offload.hpp"
#include "unit_state.hpp"

namespace coshard::fsdp::detail {

class Unsharder {
 public:
  // `offload` is null without Offload::params. Pools are sized for the largest unit.
  Unsharder(Context& ctx, std::vector<UnitState>& units, CommGroups& comms, Offload* offload);

  // Enqueues the all-gather of unit `u` (from its post-forward shard when `from_post_forward_shard`)
  // and makes it resident; `phase` ("forward"/"backward") names it in the issue log.
  void unshard(std::size_t u, const char* phase, bool from_post_forward_shard);
  // Hands the unit's buffers back with `last_use`. With `keep_post_forward_shard` and
  // reshard_after_forward = a group size, first copies this rank's part of the group's buffer.
  void reshard(std::size_t u, const Event& last_use, bool keep_post_forward_shard);
  // A unit left unsharded after its forward for its backward (no reshard after forward): outside
  // the in-flight count until its backward runs it again (run_again).
  void keep_after_forward(std::size_t u);
  void run_again(std::size_t u);
  // unshard() unless resident or the in-flight limit is reached.
  void prefetch(std::size_t u, const char* phase);
  // Units unsharded for prefetching or running now (not multi-phase units between phases).
  std::size_t resident_count() const;
  std::size_t slots() const noexcept { return params_ ? params_->slots() : 0; }
  // One unit's unsharded bytes at the largest: parameters, their f32 copy (units computing in f32), gradients.
  std::size_t max_unit_bytes() const noexcept;
  // Parameters (+ f32 copies) of every unit, unsharded.
  std::size_t all_units_param_bytes() const noexcept;
  // What the parameter pools hold allocated now (both dtypes, held and free slots).
  std::size_t pool_bytes() const noexcept { return (params_ ? params_->bytes() : 0) + (f32_ ? f32_->bytes() : 0); }

 private:
  Tensor gather(UnitState& u, const Tensor& buf, bool from_post_forward_shard);
  void gather_via_host(UnitState& u, const Tensor& buf);
  void gather_from_post_forward_shard(UnitState& u, const Tensor& buf);
  void gather_from_master(UnitState& u, const Tensor& buf);
  Tensor unshard_slot(UnitState& u, BufferPool& pool, int& slot);
  Tensor f32_copy(UnitState& u, const Tensor& buf);
  Tensor rounded_master(UnitState& u);
  Tensor cast_master(UnitState& u);
  void publish(UnitState& u, const Tensor& flat);
  void report_occupancy();

  Context& ctx_;
  std::vector<UnitState>& units_;
  CommGroups& comms_;
  Offload* offload_;
  std::unique_ptr<BufferPool> params_;  // all-gathered parameters, or NO_SHARD's cast master (param dtype)
  std::unique_ptr<BufferPool> f32_;     // mixed precision: the f32 copy for units computing in f32
};

}  // namespace coshard::fsdp::detail
