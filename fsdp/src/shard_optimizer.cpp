#include "shard_optimizer.hpp"

#include <algorithm>
#include <chrono>

#include "coshard/runtime/copy.hpp"
#include "cuda_ops.hpp"
#include "device_work.hpp"

namespace coshard::fsdp::detail {
namespace {
std::span<float> span_of(const Tensor& t, std::int64_t offset, std::int64_t size) {
  return {t.data_as<float>() + offset, static_cast<std::size_t>(size)};
}
}  // namespace

// The update of `u`'s shard over its parameter ranges (padding excluded; no weight decay where a
// parameter asks for none): CUDA kernels enqueued on `cuda_stream` when it is given (the shard in
// device memory), else the CPU ops, run by the caller's stream work.
std::function<void(void* cuda_stream)> ShardOptimizer::update_of(UnitState& u) {
  const std::int64_t begin = ctx_.sharded() ? ctx_.shard_rank * u.layout.chunk : 0;
  auto ranges = u.layout.ranges(begin, u.shard.master.numel());
  Tensor p = u.shard.master, g = u.shard.grad, a = u.shard.exp_avg, b = u.shard.exp_avg_sq;
  if (auto* adam = std::get_if<AdamW>(&ctx_.opt.optimizer)) {
    const auto o = adam->options;
    const std::int64_t step = ++u.shard.opt_step;
    return [p, g, a, b, o, step, ranges](void* cuda_stream) {
      for (const auto& r : ranges) {
        const double wd = r.weight_decay ? o.weight_decay : 0.0;
        auto ps = span_of(p, r.offset, r.size), gs = span_of(g, r.offset, r.size);
        auto as = span_of(a, r.offset, r.size), bs = span_of(b, r.offset, r.size);
        if (cuda_stream) {
          cuda_ops::adamw_update(cuda_stream, ps, gs, as, bs, step, o.lr, o.beta1, o.beta2, o.eps, wd);
        } else {
          ops::adamw_update(ps, gs, as, bs, step, o.lr, o.beta1, o.beta2, o.eps, wd);
        }
      }
    };
  }
  const auto o = std::get<SGD>(ctx_.opt.optimizer).options;
  const bool first = !u.shard.sgd_started;
  u.shard.sgd_started = true;
  return [p, g, a, o, first, ranges](void* cuda_stream) {
    for (const auto& r : ranges) {
      std::span<float> buf = a.defined() ? span_of(a, r.offset, r.size) : std::span<float>{};
      const double wd = r.weight_decay ? o.weight_decay : 0.0;
      auto ps = span_of(p, r.offset, r.size), gs = span_of(g, r.offset, r.size);
      if (cuda_stream) {
        cuda_ops::sgd_update(cuda_stream, ps, gs, buf, first, o.lr, o.momentum, o.dampening, wd, o.nesterov);
      } else {
        ops::sgd_update(ps, gs, buf, first, o.lr, o.momentum, o.dampening, wd, o.nesterov);
      }
    }
  };
}

void ShardOptimizer::step_early(std::size_t ui) {
  step_unit(ui);
  units_[ui].shard.stepped = true;
}

void ShardOptimizer::step_unit(std::size_t ui) {
  UnitState& u = units_[ui];
  Stream& stream = *ctx_.streams.optimizer;
  if (u.grads.reduced) stream.wait(*u.grads.reduced);
  Tensor g = u.shard.grad;
  if (runs_as_kernels(stream, "optimizer", {&u.shard.master, &u.shard.grad, &u.shard.exp_avg, &u.shard.exp_avg_sq})) {
    // Kernels on the optimizer stream; their time is the device's (the overlap counters count
    // host-side optimizer work only).
    update_of(u)(stream.impl().native());
    fill_zero(stream, g, "optimizer " + u.name);
    record_use(stream, {u.shard.master, u.shard.exp_avg, u.shard.exp_avg_sq});
  } else {
    stream.enqueue([update = update_of(u), g, clk = clock_] {
      const auto t0 = std::chrono::steady_clock::now();
      update(nullptr);
      std::fill_n(g.data_as<float>(), g.numel(), 0.0f);
      const auto ns = (std::chrono::steady_clock::now() - t0).count();
      (clk->backward_running.load() ? clk->overlapped_ns : clk->exposed_ns).fetch_add(ns);
    }, "optimizer " + u.name);
  }
  u.shard.updated = Event();
  u.shard.updated->record(stream);
}

void ShardOptimizer::finish_step() {
  for (std::size_t i = 0; i < units_.size(); ++i) {
    if (!units_[i].shard.stepped) step_unit(i);
    units_[i].shard.stepped = false;
  }
  Event done;
  done.record(*ctx_.streams.optimizer);
  done_ = done;
}

void ShardOptimizer::mark_backward(bool running) {
  ctx_.streams.compute->enqueue([clk = clock_, running] { clk->backward_running.store(running); });
}

void ShardOptimizer::report() {
  const std::int64_t ov = clock_->overlapped_ns.load(), ex = clock_->exposed_ns.load();
  ctx_.metrics.optimizer_overlapped->add(static_cast<double>(ov - reported_overlapped_ns_) * 1e-9);
  ctx_.metrics.optimizer_exposed->add(static_cast<double>(ex - reported_exposed_ns_) * 1e-9);
  reported_overlapped_ns_ = ov;
  reported_exposed_ns_ = ex;
}

}  // namespace coshard::fsdp::detail
