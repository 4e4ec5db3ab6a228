#pragma once
// Gradients: the unsharded gradient buffer a unit's backward accumulates into, its reduction
// (cast to the reduce dtype, reduce-scatter, all-reduce across replicas or, for NO_SHARD, over the
// world), the divide factors, accumulation into the f32 gradient shard, zero_grad and clipping.
//
// Ordering it keeps (docs/architecture.md lists them with their tests):
//  - a gradient pool slot is zeroed on compute only after the event of its previous use (the
//    reduction that read it) completes;
//  - the reduction of a unit starts on the reduce stream after the event of its last backward
//    phase on compute;
//  - Gradients::reduced is recorded after the reduced shard is accumulated (on d2h with offloaded
//    gradients): the optimizer, clipping and zero_grad of that shard wait for it;
//  - under no_sync the accumulator is zeroed behind the reduction that read it, and the next
//    backward into it waits for that.
#include <cstddef>
#include <memory>
#include <vector>

#include "buffer_pool.hpp"
#include "comm_groups.hpp"
#include "context.hpp"
#include "offload.hpp"
#include "unit_state.hpp"

namespace coshard::fsdp::detail {

// How gradients are divided by the data-parallel size: AVG in one collective, a custom factor as
// a pre-multiplied sum, or for f16 FSDP's split into a power-of-two pre-factor before the sum and
// the rest after it (neither overflow before nor underflow after).
struct DivideFactors {
  double pre = 1.0;   // the gradient is multiplied by 1/pre before the collective
  double post = 1.0;  // the reduced shard by `post` when it is accumulated
  transport::Reduction reduce_scatter = transport::Reduction::avg();
  transport::Reduction all_reduce = transport::Reduction::avg();

  static DivideFactors of(std::optional<double> custom_factor, DType reduce_dtype, int world);
};

// FSDP's DefaultState: the largest power of two f with world % f == 0 and world / f > f.
double predivide_factor(int world);

class GradientReducer {
 public:
  // `offload` is null unless gradients are offloaded.
  GradientReducer(Context& ctx, std::vector<UnitState>& units, CommGroups& comms, Offload* offload);

  // Before unit `u`'s first backward phase: its gradient buffer (the no_sync accumulator when
  // `sync` is off or it holds unreduced gradients, else a zeroed pool slot) and views.
  void open(std::size_t u, bool sync);
  // After its last backward phase: keep the gradients in the accumulator (no_sync).
  void keep(std::size_t u);
  // After its last backward phase, with sync: reduce into the gradient shard.
  void reduce(std::size_t u, const Event& grads_ready);
  // After the last backward phase of an iteration: the gradient slot held back for overlap (see
  // held_grad_slot_) goes back to the pool.
  void end_backward();
  // Enqueues zeroing of every gradient shard after its reduction.
  void zero_grad();
  // The total p-norm of the gradient shards (one all-reduce over `control`), and scales them to
  // at most `max_norm`. Waits for every unit's reduction.
  Task<double> clip(double max_norm, double p);
  // What the gradient and temporary pools hold allocated now (held and free slots).
  std::size_t pool_bytes() const noexcept {
    return (pool_ ? pool_->bytes() : 0) + staging_.bytes() + outputs_.bytes();
  }

 private:
  Tensor cast_for_reduction(const UnitState& u, double pre);
  Event collective(UnitState& u, const Tensor& input, Tensor& out, const DivideFactors& f);
  Stream& sink() noexcept;
  void accumulate(UnitState& u, const Tensor& out, double post);
  void release_buffer(UnitState& u, const Event& done);
  Tensor temporary(BufferPool& pool, std::int64_t numel, std::int64_t capacity);
  void release_temporaries(const Event& done);

  Context& ctx_;
  std::vector<UnitState>& units_;
  CommGroups& comms_;
  Offload* offload_;
  DivideFactors factors_;
  std::unique_ptr<BufferPool> pool_;  // f32 unsharded gradient buffers, sized per unit
  // A reduction's temporaries, in the reduce dtype: the cast input (unsharded) and the
  // reduce-scatter output (a shard). Fresh tensors per unit would all be alive at once, since the
  // host issues backward ahead of the streams: one more copy of the sharded parameters, and with a
  // 16-bit reduce dtype half the unsharded model. One set serves every reduction when the
  // accumulation runs on the reduce stream (release_temporaries); with gradient offload they are
  // double buffered: a reduction's slots go back when the next one is issued, so a reduce-scatter
  // reuses those of the reduction before last, whose accumulation on d2h had a whole reduction's
  // time to finish.
  // With offloaded gradients where the host cannot reach device memory, `landing_` holds the
  // reduced shard copied to host memory (pinned on CUDA) for the host to accumulate, double
  // buffered with the others.
  BufferPool staging_, outputs_, landing_;
  std::int64_t max_padded_ = 0, max_chunk_ = 0;  // the largest unit's: what every slot holds
  struct Held {
    BufferPool* pool;
    int slot;
  };
  std::vector<Held> acquired_, held_;  // the reduction being issued's slots, the previous one's
  Event held_done_;
  // The gradient slot of the unit reduced last, held until the next unit's reduction is issued:
  // the next backward then computes into the slot of the unit before, and its kernels overlap
  // this reduce-scatter instead of waiting for it (one more gradient buffer, as FSDP holds).
  int held_grad_slot_ = -1;
  Event held_grad_done_;
};

}  // namespace coshard::fsdp::detail
