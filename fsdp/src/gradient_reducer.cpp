#include "gradient_reducer.hpp"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <string>

#include "convert.hpp"
#include "cuda_ops.hpp"
#include "device_work.hpp"
#include "coshard/runtime/copy.hpp"
#include "coshard/ops/grad_norm.hpp"

namespace coshard::fsdp::detail {

using transport::Reduction;

double predivide_factor(int world) {
  int f = 1;
  while (world % f == 0 && world / f > f) f *= 2;
  return f;
}

DivideFactors DivideFactors::of(std::optional<double> custom_factor, DType reduce_dtype, int world) {
  DivideFactors f;
  if (custom_factor) {
    f.reduce_scatter = Reduction::premul_sum(1.0 / *custom_factor);
    f.all_reduce = Reduction::sum();
  } else if (reduce_dtype == DType::f16) {
    f.pre = predivide_factor(world);
    f.post = f.pre / world;
    f.reduce_scatter = Reduction::sum();
    f.all_reduce = Reduction::sum();
  }
  return f;
}

GradientReducer::GradientReducer(Context& ctx, std::vector<UnitState>& units, CommGroups& comms, Offload* offload)
    : ctx_(ctx), units_(units), comms_(comms), offload_(offload),
      factors_(DivideFactors::of(ctx.opt.gradient_divide_factor, ctx.reduce_dtype, ctx.world)),
      staging_(ctx.reduce_dtype), outputs_(ctx.reduce_dtype), landing_(ctx.reduce_dtype) {
  pool_ = std::make_unique<BufferPool>(DType::f32);
  for (const auto& u : units_) {
    max_padded_ = std::max(max_padded_, u.layout.padded);
    max_chunk_ = std::max(max_chunk_, u.layout.chunk);
  }
}

void GradientReducer::open(std::size_t ui, bool sync) {
  UnitState& u = units_[ui];
  Gradients& g = u.grads;
  Stream& compute = *ctx_.streams.compute;
  if (!sync || g.accumulated_pending) {
    if (!g.accumulated.defined()) {
      g.accumulated = Tensor::empty(ctx_.rt.allocator(), DType::f32, {u.layout.padded});
      Tensor acc = g.accumulated;
      fill_zero(compute, acc, "zero grads " + u.name);
    }
    if (g.reduced) compute.wait(*g.reduced);  // the last reduction read (and zeroed) it
    g.buffer = g.accumulated;
    g.accumulated_pending = true;
  } else {
    auto lease = pool_->acquire(ctx_.rt.allocator(), u.layout.padded);
    g.slot = lease.slot;
    if (lease.previous_use) compute.wait(*lease.previous_use);
    g.buffer = lease.buffer.view(0, {u.layout.padded});
    Tensor buf = g.buffer;
    fill_zero(compute, buf, "zero grads " + u.name);
  }
  g.views.clear();
  for (const auto& p : u.layout.params) g.views.push_back(g.buffer.view(p.offset, p.spec.shape));
}

void GradientReducer::keep(std::size_t ui) {
  units_[ui].grads.views.clear();
  units_[ui].grads.buffer = Tensor();
}

void GradientReducer::reduce(std::size_t ui, const Event& grads_ready) {
  UnitState& u = units_[ui];
  u.grads.views.clear();
  ctx_.streams.reduce->wait(grads_ready);
  Tensor input = cast_for_reduction(u, factors_.pre);
  Tensor out;
  Event last = collective(u, input, out, factors_);
  sink().wait(last);
  accumulate(u, out, factors_.post);
  Event done;
  done.record(sink());
  u.grads.reduced = done;
  release_buffer(u, done);
  release_temporaries(done);
}

// A buffer of the reduce stream from `pool`; the stream waits for the slot's previous use. Slots
// are sized for the largest unit (`capacity`) from the first reduction on: grown only at the
// largest unit's reduction, a smaller slot would be replaced while its last use is pending, and
// both would be held at that moment (on GPT-2 124M a block's shard more at the peak). There is
// one set of slots (two with offload), so this costs nothing once the largest unit has reduced.
Tensor GradientReducer::temporary(BufferPool& pool, std::int64_t numel, std::int64_t capacity) {
  auto lease = pool.acquire(ctx_.rt.allocator(), capacity);
  if (lease.previous_use) ctx_.streams.reduce->wait(*lease.previous_use);
  acquired_.push_back({&pool, lease.slot});
  return lease.buffer.view(0, {numel});
}

// Without gradient offload the accumulation runs on the reduce stream itself, so the next
// reduction's cast and reduce-scatter come after it in stream order anyway: the slots go back at
// once and one set serves every reduction. (Kept double buffered there, blocks alternated between
// the two slots and the root's request replaced whichever small one was free: on GPT-2 124M two
// root-sized outputs, 79 MB more at the peak.) With offload the accumulation runs on d2h, where it
// may still read a slot while the next reduce-scatter writes: there a reduction's slots go back
// when the next one is issued.
void GradientReducer::release_temporaries(const Event& done) {
  if (!offload_) {
    for (const Held& h : acquired_) h.pool->release(h.slot, done);
    acquired_.clear();
    return;
  }
  for (const Held& h : held_) h.pool->release(h.slot, held_done_);
  held_ = std::move(acquired_);
  acquired_.clear();
  held_done_ = done;
}

// The reduction's input: the f32 buffer itself, or a copy cast to the reduce dtype and scaled by
// 1/pre, made in cache-sized blocks (no full-size f32 temporary: fresh pages cost more than the cast).
Tensor GradientReducer::cast_for_reduction(const UnitState& u, double pre) {
  Tensor grad = u.grads.buffer;
  if (ctx_.reduce_dtype == DType::f32 && pre == 1.0) return grad;
  Tensor input = temporary(staging_, u.layout.padded, max_padded_);
  cast_scaled(*ctx_.streams.reduce, input, grad, static_cast<float>(1.0 / pre), "cast grads " + u.name);
  return input;
}

// Reduce-scatter within the shard group, then all-reduce across replicas (hybrid); NO_SHARD
// all-reduces the whole buffer. Returns the event of the last collective.
Event GradientReducer::collective(UnitState& u, const Tensor& input, Tensor& out, const DivideFactors& f) {
  Stream& stream = *ctx_.streams.reduce;
  if (!ctx_.sharded()) {
    out = input;
    ctx_.log.push_back("backward " + u.name + " all_reduce");
    return comms_.all_reduce->all_reduce(out, f.reduce_scatter, stream, u.name);
  }
  out = temporary(outputs_, u.layout.chunk, max_chunk_);
  Event last = comms_.reduce_scatter->reduce_scatter(input, out, f.reduce_scatter, stream, u.name);
  ctx_.log.push_back("backward " + u.name + " reduce_scatter");
  if (comms_.all_reduce) {
    stream.wait(last);
    last = comms_.all_reduce->all_reduce(out, f.all_reduce, stream, u.name);
    ctx_.log.push_back("backward " + u.name + " all_reduce");
  }
  return last;
}

// Offloaded gradients are accumulated on the host, behind the d2h stream.
Stream& GradientReducer::sink() noexcept { return offload_ ? offload_->d2h() : *ctx_.streams.reduce; }

// shard += out * post, in f32; keep_low_precision_grads rounds each added gradient to param_dtype.
// Offloaded, the accumulation is the device-to-host move: its bytes and time are counted. Where
// the host cannot reach device memory, the shard lands in a host slot first (a DMA on CUDA).
void GradientReducer::accumulate(UnitState& u, const Tensor& out, double post) {
  const DType round = ctx_.opt.mixed_precision.keep_low_precision_grads ? ctx_.param_dtype : DType::f32;
  if (!offload_) {
    accumulate_scaled(sink(), u.shard.grad, out, static_cast<float>(post), round, "accumulate grads " + u.name);
    return;
  }
  Traffic d2h{ctx_.metrics.d2h_bytes, ctx_.metrics.d2h_seconds};
  Tensor x = out;
  if (!ctx_.rt.host_accessible()) {
    auto lease = landing_.acquire(offload_->host(), max_chunk_);
    if (lease.previous_use) sink().wait(*lease.previous_use);
    acquired_.push_back({&landing_, lease.slot});
    x = lease.buffer.view(0, {out.numel()});
    copy_counted(sink(), x, out, "d2h " + u.name, d2h);
    d2h.bytes = nullptr;  // counted by the copy; the accumulation adds its time
  }
  accumulate_scaled(sink(), u.shard.grad, x, static_cast<float>(post), round, "d2h " + u.name, d2h);
}

// The pool slot goes back with the reduction's event, one reduction later (held_grad_slot_); the
// no_sync accumulator is zeroed for the next accumulation once the reduction read it.
void GradientReducer::release_buffer(UnitState& u, const Event& done) {
  Gradients& g = u.grads;
  if (g.slot >= 0) {
    if (held_grad_slot_ >= 0) pool_->release(held_grad_slot_, held_grad_done_);
    held_grad_slot_ = g.slot;
    held_grad_done_ = done;
    g.slot = -1;
  } else {
    Tensor acc = g.accumulated;
    fill_zero(sink(), acc, "zero " + u.name);
    g.reduced = Event();
    g.reduced->record(sink());
    g.accumulated_pending = false;
  }
  g.buffer = Tensor();
}

void GradientReducer::end_backward() {
  if (held_grad_slot_ < 0) return;
  pool_->release(held_grad_slot_, held_grad_done_);
  held_grad_slot_ = -1;
}

void GradientReducer::zero_grad() {
  Stream& stream = *ctx_.streams.reduce;
  for (auto& u : units_) {
    if (u.grads.reduced) stream.wait(*u.grads.reduced);
    Tensor g = u.shard.grad;
    fill_zero(stream, g, "zero grads");
    u.grads.reduced = Event();
    u.grads.reduced->record(stream);
  }
}

Task<double> GradientReducer::clip(double max_norm, double p) {
  if (!(p == 2.0 || p == 1.0 || std::isinf(p))) {
    throw Error(Errc::invalid_argument, "clip_grad_norm supports p = 2, 1 or inf, not " + std::to_string(p));
  }
  const ops::NormType type = p == 2.0 ? ops::NormType::l2 : p == 1.0 ? ops::NormType::l1 : ops::NormType::inf;
  for (auto& u : units_) {
    if (u.shard.stepped) {
      throw Error(Errc::invalid_argument, "clip_grad_norm after the pipelined host optimizer already stepped unit '" +
                                              u.name + "': set Options::clip so the optimizer waits for the norm");
    }
  }
  // The partial norm is device work on the reduce stream, after every unit's reduction; only the
  // scalar comes back to the host.
  Stream& stream = *ctx_.streams.reduce;
  std::vector<NormPiece> pieces;  // padding excluded
  for (auto& u : units_) {
    if (u.grads.reduced) stream.wait(*u.grads.reduced);
    const std::int64_t begin = ctx_.sharded() ? ctx_.shard_rank * u.layout.chunk : 0;
    for (const auto& r : u.layout.ranges(begin, u.shard.grad.numel())) pieces.push_back({u.shard.grad, r.offset, r.size});
  }
  Tensor t = Tensor::empty(ctx_.rt.allocator(), DType::f32, {1});
  auto partial = std::make_shared<double>(0.0);
  if (!units_.empty() && on_cuda(units_.front().shard.grad)) {
    // Kernels into a double on the device (an i64 tensor's 8 bytes), read back, as f32 into `t`.
    Tensor partial_bits = Tensor::empty(ctx_.rt.allocator(), DType::i64, {1});
    std::vector<std::span<const float>> spans;
    for (const auto& piece : pieces) spans.emplace_back(piece.grad.data_as<float>() + piece.offset, piece.size);
    cuda_ops::norm_partial(stream.impl().native(), spans, type,
                           std::span<double>(static_cast<double*>(partial_bits.data()), 1));
    const std::vector<std::int64_t> bits = co_await download<std::int64_t>(stream, partial_bits);
    *partial = std::bit_cast<double>(bits[0]);
    upload(stream, t, std::vector<float>{static_cast<float>(*partial)});
  } else {
    // A host loop over host gradients (offloaded) or a CPU device's; its result reaches device
    // memory the host cannot touch through a copy.
    const bool land = offload_ && !t.host_accessible();  // offloaded gradients are host memory
    Tensor out = land ? Tensor::empty(offload_->host(), DType::f32, {1}) : t;
    norm_partial(stream, std::move(pieces), type, out, partial, "grad norm");
    if (land) copy_tensor(stream, t, out, "grad norm up");
  }
  double reduced = 0.0;
  if (ctx_.sharded() && ctx_.world > 1) {
    // Replicas hold the same shards: sum over everyone, then take one replica's share.
    stream.wait(comms_.control->all_reduce(t, type == ops::NormType::inf ? Reduction::max() : Reduction::sum(), stream));
    reduced = (co_await download<float>(stream, t))[0];
    if (type != ops::NormType::inf) reduced /= ctx_.replicas;
  } else {
    Event done(stream.device());
    done.record(stream);
    co_await done;
    reduced = *partial;
  }
  const double total = ops::norm_finish(reduced, type);
  const double coef = ops::clip_coefficient(total, max_norm);
  if (coef < 1.0) {
    for (auto& u : units_) {
      Tensor g = u.shard.grad;
      const auto c = static_cast<float>(coef);
      if (u.grads.reduced) stream.wait(*u.grads.reduced);
      scale(stream, g, c, "clip " + u.name);
      u.grads.reduced = Event();
      u.grads.reduced->record(stream);
    }
  }
  co_return total;
}

}  // namespace coshard::fsdp::detail
