#include "coshard/fsdp/engine.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <numeric>

#include "buffer_pool.hpp"
#include "coshard/ops/cast.hpp"
#include "coshard/ops/grad_norm.hpp"
#include "flat_layout.hpp"

namespace coshard::fsdp {

using transport::Communicator;
using transport::Reduction;

std::string_view to_string(Strategy s) noexcept {
  switch (s) {
    case Strategy::full_shard: return "full_shard";
    case Strategy::shard_grad_op: return "shard_grad_op";
    case Strategy::no_shard: return "no_shard";
    case Strategy::hybrid_shard: return "hybrid_shard";
    case Strategy::hybrid_shard_zero2: return "hybrid_shard_zero2";
  }
  return "?";
}

namespace {

[[noreturn]] void scope_misuse(const char* what, std::size_t i) {
  throw Error(Errc::invalid_argument, std::string(what) + " " + std::to_string(i) +
                                          " used outside its unit's phase (before pre-forward, after post-backward, "
                                          "or a gradient in forward); use Scope only inside forward/backward");
}

std::span<float> span_of(const Tensor& t) { return {t.data_as<float>(), static_cast<std::size_t>(t.numel())}; }

// dst (dtype) <- src (f32), rounding to nearest even.
void cast_from_f32(const float* src, void* dst, DType dtype, std::size_t n) {
  switch (dtype) {
    case DType::f32: std::memcpy(dst, src, n * sizeof(float)); break;
    case DType::bf16: ops::cast_f32_to_bf16({src, n}, {static_cast<std::uint16_t*>(dst), n}); break;
    case DType::f16: ops::cast_f32_to_f16({src, n}, {static_cast<std::uint16_t*>(dst), n}); break;
    default: throw Error(Errc::invalid_argument, "unsupported dtype for parameters: " + std::string(to_string(dtype)));
  }
}

void cast_to_f32(const void* src, DType dtype, float* dst, std::size_t n) {
  switch (dtype) {
    case DType::f32: std::memcpy(dst, src, n * sizeof(float)); break;
    case DType::bf16: ops::cast_bf16_to_f32({static_cast<const std::uint16_t*>(src), n}, {dst, n}); break;
    case DType::f16: ops::cast_f16_to_f32({static_cast<const std::uint16_t*>(src), n}, {dst, n}); break;
    default: throw Error(Errc::invalid_argument, "unsupported dtype: " + std::string(to_string(dtype)));
  }
}

float round_through(DType dtype, float x) {
  switch (dtype) {
    case DType::bf16: return ops::bf16_to_f32(ops::f32_to_bf16(x));
    case DType::f16: return ops::f16_to_f32(ops::f32_to_f16(x));
    default: return x;
  }
}

// FSDP's DefaultState: the largest power of two f with world % f == 0 and world / f > f.
double predivide_factor(int world) {
  int f = 1;
  while (world % f == 0 && world / f > f) f *= 2;
  return f;
}

std::uint64_t fnv(std::uint64_t h, const void* data, std::size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

}  // namespace

std::span<float> Scope::param(std::size_t i) const {
  if (!params_ || i >= params_->size() || !(*params_)[i].defined()) scope_misuse("parameter", i);
  return span_of((*params_)[i]);
}

std::span<float> Scope::grad(std::size_t i) const {
  if (!grads_ || i >= grads_->size() || !(*grads_)[i].defined()) scope_misuse("gradient of parameter", i);
  return span_of((*grads_)[i]);
}

struct UnitState {
  Unit* unit = nullptr;
  std::string name;
  detail::FlatLayout layout;
  // Sharded state: f32 master shard, its gradient and optimizer state (all [chunk]; NO_SHARD: [padded]).
  Tensor master, grad_shard, opt_a, opt_b;
  std::int64_t opt_step = 0;
  bool sgd_started = false;
  Tensor post_forward_shard;  // reshard_after_forward = group size: this rank's part
  // Unsharded state while resident.
  bool resident = false;
  int param_slot = -1, f32_slot = -1;
  Event ready;
  std::vector<Tensor> param_views;
  // Gradients while in backward.
  int grad_slot = -1;
  Tensor grad_buffer;              // f32 [padded]: a pool slot, or `accumulated` under no_sync
  Tensor accumulated;              // no_sync: unsharded gradients kept across backwards
  bool accumulated_pending = false;  // holds gradients not yet reduced
  std::vector<Tensor> grad_views;
  std::optional<Event> reduced;    // gradient shard updated
  int phases = 1;
  int forward_calls = 0;   // forward phases run this iteration
  int backward_calls = 0;  // backward phases run this iteration
  bool open = false;       // between two of its phases: stays unsharded, outside the in-flight count
  bool stepped = false;    // the pipelined optimizer already updated it this step
  std::optional<Event> updated;  // its last optimizer update (an H2D of its master waits for it)
};

// Host optimizer time split by whether backward compute was still running (offload telemetry).
struct OptimizerClock {
  std::atomic<bool> backward_running{false};
  std::atomic<std::int64_t> overlapped_ns{0}, exposed_ns{0};
};

struct Engine::Impl {
  Runtime& rt;
  transport::ProcessGroup& group;
  Options opt;
  // Before `units`: the offloaded tensors go back to it when the units are destroyed.
  std::unique_ptr<Allocator> host;  // offloaded sharded state
  std::vector<UnitState> units;
  std::unique_ptr<Communicator> ag, rs, ar, control, post_forward_group;
  int shard_rank = 0, shard_size = 1, replicas = 1, world = 1, rank = 0;
  int reshard_group = 0;  // > 0: reshard after forward to groups of this size
  DType param_dtype = DType::f32, reduce_dtype = DType::f32;
  std::unique_ptr<detail::BufferPool> param_pool, f32_pool, grad_pool;
  Stream* compute = nullptr;
  Stream* unshard_stream = nullptr;
  Stream* reduce_stream = nullptr;
  Stream* optimizer_stream = nullptr;
  Stream* h2d = nullptr;
  Stream* d2h = nullptr;
  std::unique_ptr<detail::BufferPool> shard_pool;   // device copies of offloaded master shards
  bool last_backward = true;
  std::shared_ptr<OptimizerClock> clock = std::make_shared<OptimizerClock>();
  Counter *h2d_bytes = nullptr, *d2h_bytes = nullptr, *h2d_seconds = nullptr, *d2h_seconds = nullptr;
  Counter *optimizer_overlapped = nullptr, *optimizer_exposed = nullptr;
  std::int64_t reported_overlapped_ns = 0, reported_exposed_ns = 0;
  std::optional<Event> optimizer_done;
  bool sync = true;
  // Execution order: recorded in the first iteration, then the plan.
  std::vector<std::size_t> order;
  bool plan_ready = false;
  std::size_t forward_position = 0, backward_position = 0;
  bool warned_deviation = false;
  std::vector<std::string> log;
  Counter* exposed_total = nullptr;
  Gauge* overlap = nullptr;
  CommStats reported;
  Counter* prefetch_hits = nullptr;
  Counter* limiter_waits = nullptr;
  Counter* prefetch_misses = nullptr;
  Gauge* pool_occupancy = nullptr;

  Impl(Runtime& r, transport::ProcessGroup& g, Options o) : rt(r), group(g), opt(std::move(o)) {}

  bool sharded() const { return opt.strategy != Strategy::no_shard; }
  bool mixed() const { return param_dtype != DType::f32; }
  // Units unsharded for prefetching or running now; a multi-phase unit between its phases is
  // long-lived (like FSDP's root) and not counted.
  std::size_t resident_count() const {
    std::size_t n = 0;
    for (const auto& u : units) n += u.resident && !u.open ? 1 : 0;
    return n;
  }
  std::size_t total_steps() const {
    std::size_t n = 0;
    for (const auto& u : units) n += static_cast<std::size_t>(u.phases);
    return n;
  }
  // Without a plan: phase 0 of every unit in order, then later phases innermost first.
  std::vector<std::size_t> default_order() const {
    std::vector<std::size_t> o(units.size());
    std::iota(o.begin(), o.end(), std::size_t{0});
    for (std::size_t u = units.size(); u-- > 0;) {
      for (int p = 1; p < units[u].phases; ++p) o.push_back(u);
    }
    return o;
  }
  bool reshard_after_forward(std::size_t u) const {
    if (opt.strategy == Strategy::no_shard) return false;
    if (opt.reshard_after_forward) {
      if (auto* b = std::get_if<bool>(&*opt.reshard_after_forward)) return *b;
      return true;  // to a group size
    }
    if (opt.strategy == Strategy::shard_grad_op || opt.strategy == Strategy::hybrid_shard_zero2) return false;
    // As FSDP's root: the unit that runs last in forward runs first in backward, so keep it.
    return !(plan_ready && !order.empty() && order.back() == u);
  }

  transport::CommOptions comm_options(const std::string& name) {
    transport::CommOptions c;
    c.name = name;
    c.timeout = opt.timeout;
    c.telemetry = &rt.telemetry();
    if (opt.comm_hook) {
      c.before_op = [hook = opt.comm_hook, name](const transport::OpInfo& info) { hook(name, info); };
    }
    return c;
  }

  Error error(Errc code, std::string msg, const std::string& unit, std::string op) const {
    return Error(code, std::move(msg), ErrorContext{.rank = rank, .op = std::move(op), .unit = unit});
  }

  // ---- unshard / reshard ----

  void unshard(std::size_t ui, const char* phase, bool from_post_forward_shard) {
    UnitState& u = units[ui];
    const auto& l = u.layout;
    u.param_views.clear();
    if (!sharded() && !mixed()) {
      // NO_SHARD in f32: the master is the parameter.
      for (const auto& p : l.params) u.param_views.push_back(u.master.view(p.offset, p.spec.shape));
      u.ready = Event();
      u.ready.record(*unshard_stream);
      u.resident = true;
      return;
    }
    Tensor f32buf;
    if (sharded()) {
      auto lease = param_pool->acquire(rt.allocator());
      u.param_slot = lease.slot;
      // The stream the all-gather is ordered after: h2d when the master shard lives on the host.
      const bool via_host = opt.offload.params && !from_post_forward_shard;
      Stream* feeder = via_host ? h2d : unshard_stream;
      if (lease.previous_use) feeder->wait(*lease.previous_use);
      Tensor buf = lease.buffer;
      if (via_host) {
        auto sl = shard_pool->acquire(rt.allocator());
        if (sl.previous_use) h2d->wait(*sl.previous_use);
        if (u.updated) h2d->wait(*u.updated);
        Tensor dev = sl.buffer.view(0, {l.chunk});
        Tensor master = u.master;
        const DType pd = param_dtype;
        Counter* bytes = h2d_bytes;
        Counter* seconds = h2d_seconds;
        h2d->enqueue([master, dev, pd, bytes, seconds] {
          const auto t0 = std::chrono::steady_clock::now();
          cast_from_f32(master.data_as<float>(), dev.data(), pd, static_cast<std::size_t>(master.numel()));
          bytes->add(static_cast<double>(dev.nbytes()));
          seconds->add(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        }, "h2d " + u.name);
        Event ev = ag->all_gather(dev, buf.view(0, {l.padded}), *h2d, u.name);
        shard_pool->release(sl.slot, ev);
        unshard_stream->wait(ev);
      } else if (from_post_forward_shard) {
        const std::int64_t len = l.padded / reshard_group, at = (shard_rank % reshard_group) * len;
        Tensor src = u.post_forward_shard;
        unshard_stream->enqueue([buf, src, at, len] {
          std::memcpy(static_cast<std::byte*>(buf.data()) + at * static_cast<std::int64_t>(size_of(buf.dtype())),
                      src.data(), static_cast<std::size_t>(len) * size_of(buf.dtype()));
        }, "copy-in " + u.name);
        Event ev = post_forward_group->all_gather(buf.view(at, {len}), buf.view(0, {l.padded}), *unshard_stream, u.name);
        unshard_stream->wait(ev);
      } else {
        const std::int64_t at = shard_rank * l.chunk;
        Tensor master = u.master;
        const DType pd = param_dtype;
        unshard_stream->enqueue([buf, master, at, pd] {
          cast_from_f32(master.data_as<float>(),
                        static_cast<std::byte*>(buf.data()) + at * static_cast<std::int64_t>(size_of(pd)), pd,
                        static_cast<std::size_t>(master.numel()));
        }, "copy-in " + u.name);
        Event ev = ag->all_gather(buf.view(at, {l.chunk}), buf.view(0, {l.padded}), *unshard_stream, u.name);
        unshard_stream->wait(ev);
      }
      log.push_back(std::string(phase) + " " + u.name + " all_gather");
      if (!mixed()) {
        for (const auto& p : l.params) u.param_views.push_back(buf.view(p.offset, p.spec.shape));
      } else {
        auto f = f32_pool->acquire(rt.allocator());
        u.f32_slot = f.slot;
        if (f.previous_use) unshard_stream->wait(*f.previous_use);
        f32buf = f.buffer.view(0, {l.padded});
        const DType pd = param_dtype;
        unshard_stream->enqueue([buf, f32buf, pd] {
          cast_to_f32(buf.data(), pd, f32buf.data_as<float>(), static_cast<std::size_t>(f32buf.numel()));
        }, "copy-out " + u.name);
      }
    } else {
      // NO_SHARD with mixed precision: parameters rounded to param_dtype, computed in f32.
      auto f = f32_pool->acquire(rt.allocator());
      u.f32_slot = f.slot;
      if (f.previous_use) unshard_stream->wait(*f.previous_use);
      f32buf = f.buffer.view(0, {l.padded});
      Tensor master = u.master;
      const DType pd = param_dtype;
      unshard_stream->enqueue([master, f32buf, pd] {
        const float* s = master.data_as<float>();
        float* d = f32buf.data_as<float>();
        for (std::int64_t i = 0; i < master.numel(); ++i) d[i] = round_through(pd, s[i]);
      }, "cast " + u.name);
    }
    if (f32buf.defined()) {
      for (const auto& p : l.params) u.param_views.push_back(f32buf.view(p.offset, p.spec.shape));
    }
    u.ready = Event();
    u.ready.record(*unshard_stream);
    u.resident = true;
    if (pool_occupancy) pool_occupancy->set(static_cast<double>(param_pool ? param_pool->held() : 0));
  }

  void reshard(std::size_t ui, const Event& last_use, bool keep_post_forward_shard) {
    UnitState& u = units[ui];
    if (!u.resident) return;
    if (keep_post_forward_shard && reshard_group > 0 && u.param_slot >= 0) {
      // Keep this rank's part of the group's unsharded buffer for the backward all-gather.
      const std::int64_t len = u.layout.padded / reshard_group, at = (shard_rank % reshard_group) * len;
      if (!u.post_forward_shard.defined()) u.post_forward_shard = Tensor::empty(rt.allocator(), param_dtype, {len});
      Tensor dst = u.post_forward_shard;
      Tensor src = param_pool->buffer(u.param_slot);
      unshard_stream->wait(last_use);
      unshard_stream->enqueue([dst, src, at, len] {
        const auto esize = static_cast<std::int64_t>(size_of(dst.dtype()));
        std::memcpy(dst.data(), static_cast<const std::byte*>(src.data()) + at * esize,
                    static_cast<std::size_t>(len * esize));
      }, "keep " + u.name);
      Event kept;
      kept.record(*unshard_stream);
      param_pool->release(u.param_slot, kept);
    } else if (u.param_slot >= 0) {
      param_pool->release(u.param_slot, last_use);
    }
    if (u.f32_slot >= 0) f32_pool->release(u.f32_slot, last_use);
    u.param_slot = u.f32_slot = -1;
    u.param_views.clear();
    u.resident = false;
    if (pool_occupancy) pool_occupancy->set(static_cast<double>(param_pool ? param_pool->held() : 0));
  }

  void prefetch(std::size_t target, const char* phase) {
    if (units[target].resident) return;
    if (resident_count() >= static_cast<std::size_t>(std::max(1, opt.in_flight))) {
      limiter_waits->add();
      return;
    }
    const bool from_shard = std::string(phase) == "backward" && reshard_group > 0 &&
                            units[target].post_forward_shard.defined();
    unshard(target, phase, from_shard);
  }

  // ---- gradient reduction ----

  void reduce(std::size_t ui, const Event& grads_ready) {
    UnitState& u = units[ui];
    const auto& l = u.layout;
    reduce_stream->wait(grads_ready);
    Tensor grad = u.grad_buffer;
    const bool fp16 = reduce_dtype == DType::f16;
    const int dp = world;
    double pre = 1.0, post = 1.0;
    Reduction rs_op = Reduction::avg(), ar_op = Reduction::avg();
    if (opt.gradient_divide_factor) {
      rs_op = Reduction::premul_sum(1.0 / *opt.gradient_divide_factor);
      ar_op = Reduction::sum();
    } else if (fp16) {
      // Split the divide so that f16 neither overflows before nor underflows after the sum.
      pre = predivide_factor(dp);
      post = pre / dp;
      rs_op = Reduction::sum();
      ar_op = Reduction::sum();
    }
    Tensor input = grad;
    if (reduce_dtype != DType::f32 || pre != 1.0) {
      input = Tensor::empty(rt.allocator(), reduce_dtype, {l.padded});
      const DType rd = reduce_dtype;
      const float scale = static_cast<float>(1.0 / pre);
      reduce_stream->enqueue([grad, input, rd, scale] {
        // In cache-sized blocks: no full-size temporary (fresh pages cost more than the cast).
        constexpr std::size_t kBlock = 4096;
        float tmp[kBlock];
        const float* g = grad.data_as<float>();
        const auto n = static_cast<std::size_t>(grad.numel());
        const std::size_t esize = size_of(rd);
        for (std::size_t at = 0; at < n; at += kBlock) {
          const std::size_t m = std::min(kBlock, n - at);
          for (std::size_t i = 0; i < m; ++i) tmp[i] = g[at + i] * scale;
          cast_from_f32(tmp, static_cast<std::byte*>(input.data()) + at * esize, rd, m);
        }
      }, "cast grads " + u.name);
    }
    Tensor out;
    Event last;
    if (sharded()) {
      out = Tensor::empty(rt.allocator(), reduce_dtype, {l.chunk});
      last = rs->reduce_scatter(input, out, rs_op, *reduce_stream, u.name);
      log.push_back("backward " + u.name + " reduce_scatter");
      if (ar) {
        reduce_stream->wait(last);
        last = ar->all_reduce(out, ar_op, *reduce_stream, u.name);
        log.push_back("backward " + u.name + " all_reduce");
      }
    } else {
      out = input;
      last = ar->all_reduce(out, rs_op, *reduce_stream, u.name);
      log.push_back("backward " + u.name + " all_reduce");
    }
    // Offloaded gradients are accumulated on the host, behind the d2h stream.
    Stream* sink = opt.offload.grads ? d2h : reduce_stream;
    sink->wait(last);
    Tensor shard = u.grad_shard;
    const DType rd = reduce_dtype;
    const bool keep_low = opt.mixed_precision.keep_low_precision_grads;
    const DType pd = param_dtype;
    const auto scale = static_cast<float>(post);
    Counter* moved = opt.offload.grads ? d2h_bytes : nullptr;
    Counter* moved_s = opt.offload.grads ? d2h_seconds : nullptr;
    sink->enqueue([out, shard, rd, scale, keep_low, pd, moved, moved_s] {
      const auto t0 = std::chrono::steady_clock::now();
      struct Account {
        Counter* bytes;
        Counter* seconds;
        std::size_t n;
        std::chrono::steady_clock::time_point t0;
        ~Account() {
          if (bytes) bytes->add(static_cast<double>(n));
          if (seconds) seconds->add(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        }
      } account{moved, moved_s, out.nbytes(), t0};
      const auto n = static_cast<std::size_t>(shard.numel());
      float* __restrict s = shard.data_as<float>();
      if (rd == DType::f32 && !keep_low) {
        const float* __restrict o = out.data_as<float>();
        for (std::size_t i = 0; i < n; ++i) s[i] += o[i] * scale;
        return;
      }
      constexpr std::size_t kBlock = 4096;
      float tmp[kBlock];
      const std::size_t esize = size_of(rd);
      for (std::size_t at = 0; at < n; at += kBlock) {
        const std::size_t m = std::min(kBlock, n - at);
        cast_to_f32(static_cast<const std::byte*>(out.data()) + at * esize, rd, tmp, m);
        for (std::size_t i = 0; i < m; ++i) {
          const float g = tmp[i] * scale;
          s[at + i] += keep_low ? round_through(pd, g) : g;
        }
      }
    }, (opt.offload.grads ? "d2h " : "accumulate grads ") + u.name);
    Event done;
    done.record(*sink);
    input.record_use(done);
    out.record_use(done);
    u.reduced = done;
    if (u.grad_slot >= 0) {
      grad_pool->release(u.grad_slot, done);
      u.grad_slot = -1;
    } else {
      // The no_sync buffer is zeroed for the next accumulation once the reduction read it.
      Tensor acc = u.accumulated;
      sink->enqueue([acc] { std::fill_n(acc.data_as<float>(), acc.numel(), 0.0f); }, "zero " + u.name);
      u.reduced = Event();
      u.reduced->record(*sink);
      u.accumulated_pending = false;
    }
    u.grad_buffer = Tensor();
    // Pipelined host optimizer: this unit's update overlaps the rest of backward.
    if (opt.offload.optimizer && opt.offload.pipelined_optimizer && last_backward && !opt.clip) {
      step_unit(ui);
      u.stepped = true;
    }
  }

  // Enqueues unit `ui`'s optimizer update on the optimizer stream, after its gradient shard.
  void step_unit(std::size_t ui) {
    UnitState& u = units[ui];
    if (u.reduced) optimizer_stream->wait(*u.reduced);
    const std::int64_t begin = sharded() ? shard_rank * u.layout.chunk : 0;
    auto ranges = u.layout.ranges(begin, u.master.numel());
    Tensor p = u.master, g = u.grad_shard, a = u.opt_a, b = u.opt_b;
    std::function<void()> update;
    if (auto* adam = std::get_if<AdamW>(&opt.optimizer)) {
      const auto o = adam->options;
      const std::int64_t step = ++u.opt_step;
      update = [p, g, a, b, o, step, ranges] {
        for (const auto& r : ranges) {
          ops::adamw_update(span_of(p).subspan(r.offset, r.size), span_of(g).subspan(r.offset, r.size),
                            span_of(a).subspan(r.offset, r.size), span_of(b).subspan(r.offset, r.size), step, o.lr,
                            o.beta1, o.beta2, o.eps, r.weight_decay ? o.weight_decay : 0.0);
        }
      };
    } else {
      const auto o = std::get<SGD>(opt.optimizer).options;
      const bool first = !u.sgd_started;
      u.sgd_started = true;
      update = [p, g, a, o, first, ranges] {
        for (const auto& r : ranges) {
          std::span<float> buf = a.defined() ? span_of(a).subspan(r.offset, r.size) : std::span<float>{};
          ops::sgd_update(span_of(p).subspan(r.offset, r.size), span_of(g).subspan(r.offset, r.size), buf, first,
                          o.lr, o.momentum, o.dampening, r.weight_decay ? o.weight_decay : 0.0, o.nesterov);
        }
      };
    }
    optimizer_stream->enqueue([update = std::move(update), g, clk = clock] {
      const auto t0 = std::chrono::steady_clock::now();
      update();
      std::fill_n(g.data_as<float>(), g.numel(), 0.0f);
      const auto ns = (std::chrono::steady_clock::now() - t0).count();
      (clk->backward_running.load() ? clk->overlapped_ns : clk->exposed_ns).fetch_add(ns);
    }, "optimizer " + u.name);
    u.updated = Event();
    u.updated->record(*optimizer_stream);
  }
};

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Engine::~Engine() {
  // Work still queued on the streams refers to the engine's state: let it finish first.
  Impl& m = *impl_;
  for (Stream* s : {m.compute, m.unshard_stream, m.reduce_stream, m.optimizer_stream, m.h2d, m.d2h}) {
    if (!s) continue;
    try {
      s->synchronize(m.opt.timeout);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "coshard: rank %d: engine shutdown: %s\n", m.rank, e.what());
    }
  }
}

Task<std::unique_ptr<Engine>> Engine::create(Runtime& runtime, transport::ProcessGroup& group, std::vector<Unit*> units,
                                             Options options) {
  auto impl = std::make_unique<Impl>(runtime, group, std::move(options));
  Impl& m = *impl;
  m.rank = group.rank();
  m.world = group.size();
  m.param_dtype = m.opt.mixed_precision.param;
  m.reduce_dtype = m.opt.mixed_precision.reduce.value_or(m.param_dtype);
  for (DType d : {m.param_dtype, m.reduce_dtype}) {
    if (d != DType::f32 && d != DType::bf16 && d != DType::f16) {
      throw Error(Errc::bad_config, "mixed precision dtypes must be f32, bf16 or f16, not " + std::string(to_string(d)));
    }
  }
  if (units.empty()) throw Error(Errc::bad_config, "the engine needs at least one unit");
  const Offload& off = m.opt.offload;
  if ((off.grads || off.optimizer) && !off.params) {
    throw Error(Errc::bad_config, "offload of the " + std::string(off.optimizer ? "optimizer" : "gradients") +
                                      " needs offload.params too: the master shards they update must live in host "
                                      "memory as well (set offload.params = true)");
  }
  if (off.optimizer && !off.grads) {
    throw Error(Errc::bad_config, "offload.optimizer steps on the host and needs the gradients there: set "
                                  "offload.grads = true");
  }
  if (off.any() && m.opt.strategy == Strategy::no_shard) {
    throw Error(Errc::bad_config, "CPU offload works on sharded strategies; no_shard keeps every parameter on every "
                                  "rank's device");
  }
  if (m.opt.in_flight < 1) throw Error(Errc::bad_config, "in_flight must be at least 1, not " + std::to_string(m.opt.in_flight));
  if (m.opt.prefetch.forward < 0) throw Error(Errc::bad_config, "forward prefetch depth must be >= 0");

  // Communicators: separate ones for all-gather and reduce-scatter so neither waits on the other.
  auto& world = group.world();
  const bool hybrid = m.opt.strategy == Strategy::hybrid_shard || m.opt.strategy == Strategy::hybrid_shard_zero2;
  if (hybrid) {
    int s = m.opt.shard_group_size > 0 ? m.opt.shard_group_size : group.env().local_world_size;
    if (s < 1 || m.world % s != 0) {
      throw Error(Errc::bad_config, "hybrid sharding with shard groups of " + std::to_string(s) + " ranks needs a world size "
                                    "divisible by it, but the world has " + std::to_string(m.world) +
                                    " ranks. Pick a shard group size that divides " + std::to_string(m.world));
    }
    m.ag = co_await world.split(m.rank / s, m.rank, m.comm_options("all_gather"));
    m.rs = co_await world.split(m.rank / s, m.rank, m.comm_options("reduce_scatter"));
    m.ar = co_await world.split(m.rank % s, m.rank, m.comm_options("all_reduce"));
  } else if (m.opt.strategy == Strategy::no_shard) {
    m.ar = co_await group.new_communicator(m.comm_options("all_reduce"));
  } else {
    m.ag = co_await group.new_communicator(m.comm_options("all_gather"));
    m.rs = co_await group.new_communicator(m.comm_options("reduce_scatter"));
  }
  m.control = co_await group.new_communicator(m.comm_options("control"));
  if (m.ag) {
    m.shard_rank = m.ag->rank();
    m.shard_size = m.ag->size();
  }
  m.replicas = m.world / m.shard_size;
  if (m.opt.reshard_after_forward) {
    if (auto* g = std::get_if<int>(&*m.opt.reshard_after_forward)) {
      if (!m.ag || *g < 1 || *g >= m.shard_size || m.shard_size % *g != 0) {
        throw Error(Errc::bad_config, "reshard_after_forward = " + std::to_string(*g) +
                                          " must be a divisor of the shard group size (" + std::to_string(m.shard_size) +
                                          ") other than itself; use true or false otherwise");
      }
      if (*g > 1) {
        m.reshard_group = *g;
        m.post_forward_group = co_await m.ag->split(m.shard_rank / *g, m.shard_rank, m.comm_options("all_gather"));
      }
    }
  }

  m.compute = &runtime.stream("compute");
  m.unshard_stream = &runtime.stream("unshard");
  m.reduce_stream = &runtime.stream("reduce");
  m.optimizer_stream = &runtime.stream("optimizer");
  if (off.any()) {
    m.h2d = &runtime.stream("h2d");
    m.d2h = &runtime.stream("d2h");
    m.host = std::make_unique<Allocator>(cpu_memory(), Allocator::Options{.cap_bytes = off.host_memory_cap_bytes});
  }
  auto& t = runtime.telemetry();
  m.prefetch_hits = &t.counter("coshard_prefetch_hits_total", "Units already unsharded when their phase began", {});
  m.limiter_waits = &t.counter("coshard_limiter_waits_total",
                               "Prefetches deferred because the in-flight limit of unsharded units was reached", {});
  m.prefetch_misses = &t.counter("coshard_prefetch_misses_total", "Units unsharded on demand when their phase began", {});
  m.exposed_total = &t.counter("coshard_exposed_communication_seconds_total",
                               "Time compute and optimizer streams stalled waiting for communication", {});
  m.overlap = &t.gauge("coshard_overlap_ratio", "Share of collective time hidden behind compute, since the start", {});
  m.h2d_bytes = &t.counter("coshard_h2d_bytes_total", "Bytes copied host to device (offloaded master shards)", {});
  m.d2h_bytes = &t.counter("coshard_d2h_bytes_total", "Bytes copied device to host (offloaded gradient shards)", {});
  m.h2d_seconds = &t.counter("coshard_h2d_seconds_total", "Time spent in host-to-device copies", {});
  m.d2h_seconds = &t.counter("coshard_d2h_seconds_total", "Time spent in device-to-host copies", {});
  m.optimizer_overlapped = &t.counter("coshard_optimizer_seconds_total", "Optimizer time, by whether backward was "
                                      "still computing (overlapped) or not (exposed)", {{"mode", "overlapped"}});
  m.optimizer_exposed = &t.counter("coshard_optimizer_seconds_total", "Optimizer time, by whether backward was "
                                   "still computing (overlapped) or not (exposed)", {{"mode", "exposed"}});
  m.pool_occupancy = &t.gauge("coshard_buffer_pool_occupancy", "Unsharded parameter buffers held", {});

  // Flat parameters: the signature of every unit must agree across ranks.
  const std::int64_t align = 16 / static_cast<std::int64_t>(size_of(m.param_dtype));
  const int shards = m.sharded() ? m.shard_size : 1;
  std::uint64_t signature = 1469598103934665603ull;
  std::int64_t max_padded = 0;
  for (Unit* unit : units) {
    UnitState u;
    u.unit = unit;
    u.name = unit->name();
    u.layout = detail::FlatLayout::build(u.name, unit->params(), shards, align);
    u.phases = unit->phases();
    if (u.phases < 1) throw Error(Errc::bad_config, "unit '" + u.name + "' declares " + std::to_string(u.phases) + " phases");
    signature = fnv(signature, u.name.data(), u.name.size());
    for (const auto& p : u.layout.params) {
      signature = fnv(signature, p.spec.name.data(), p.spec.name.size());
      signature = fnv(signature, p.spec.shape.data(), p.spec.shape.size() * sizeof(std::int64_t));
    }
    max_padded = std::max(max_padded, u.layout.padded);
    m.units.push_back(std::move(u));
  }
  {
    Tensor sig = Tensor::empty(runtime.allocator(), DType::i64, {1});
    Tensor all = Tensor::empty(runtime.allocator(), DType::i64, {m.world});
    sig.data_as<std::int64_t>()[0] = static_cast<std::int64_t>(signature);
    co_await m.control->all_gather(sig, all, *m.compute);
    for (int r = 0; r < m.world; ++r) {
      if (all.data_as<std::int64_t>()[r] != static_cast<std::int64_t>(signature)) {
        throw Error(Errc::bad_config, "rank " + std::to_string(r) + " built a different model (unit names or parameter "
                                      "shapes differ from rank " + std::to_string(m.rank) + "'s). Every rank must pass "
                                      "the same units",
                    ErrorContext{.rank = m.rank, .op = "create", .unit = {}});
      }
    }
  }
  // Sharded state, initialised shard by shard (or from rank 0's values); offloaded parts in the
  // host pool, whose cap is checked now rather than in the middle of a step.
  const bool sgd = std::holds_alternative<SGD>(m.opt.optimizer);
  const bool momentum = sgd && std::get<SGD>(m.opt.optimizer).options.momentum != 0.0;
  const int opt_buffers = sgd ? (momentum ? 1 : 0) : 2;
  if (off.any() && off.host_memory_cap_bytes > 0) {
    std::size_t need = 0;
    for (const auto& u : m.units) {
      const auto n = static_cast<std::size_t>(m.sharded() ? u.layout.chunk : u.layout.padded) * sizeof(float);
      need += n * ((off.params ? 1 : 0) + (off.grads ? 1 : 0) + (off.optimizer ? opt_buffers : 0));
    }
    // The caching allocator rounds blocks up; leave it room.
    if (need + need / 8 > off.host_memory_cap_bytes) {
      throw Error(Errc::bad_config, "the offloaded sharded state needs " + std::to_string(need) +
                                        " bytes of host memory on this rank (plus allocator rounding), but the host "
                                        "memory cap is " + std::to_string(off.host_memory_cap_bytes) +
                                        " bytes. Raise the cap, offload less, or shard over more ranks");
    }
  }
  Allocator& device_alloc = runtime.allocator();
  Allocator& master_alloc = off.params ? *m.host : device_alloc;
  Allocator& grad_alloc = off.grads ? *m.host : device_alloc;
  Allocator& opt_alloc = off.optimizer ? *m.host : device_alloc;
  for (auto& u : m.units) {
    const auto& l = u.layout;
    const std::int64_t n = m.sharded() ? l.chunk : l.padded;
    const std::int64_t begin = m.sharded() ? m.shard_rank * l.chunk : 0;
    u.master = Tensor::empty(master_alloc, DType::f32, {n});
    u.grad_shard = Tensor::empty(grad_alloc, DType::f32, {n});
    std::fill_n(u.grad_shard.data_as<float>(), n, 0.0f);
    if (m.opt.sync_module_states && m.world > 1) {
      Tensor full = Tensor::empty(runtime.allocator(), DType::f32, {l.padded});
      if (m.rank == 0) l.init(span_of(full), 0);
      co_await m.control->broadcast(full, 0, *m.compute);
      std::memcpy(u.master.data(), full.data_as<float>() + begin, static_cast<std::size_t>(n) * sizeof(float));
    } else {
      l.init(span_of(u.master), begin);
    }
    if (opt_buffers >= 1) {
      u.opt_a = Tensor::empty(opt_alloc, DType::f32, {n});
      std::fill_n(u.opt_a.data_as<float>(), n, 0.0f);
    }
    if (opt_buffers >= 2) {
      u.opt_b = Tensor::empty(opt_alloc, DType::f32, {n});
      std::fill_n(u.opt_b.data_as<float>(), n, 0.0f);
    }
  }
  if (m.sharded()) m.param_pool = std::make_unique<detail::BufferPool>(m.param_dtype, max_padded);
  if (m.mixed()) m.f32_pool = std::make_unique<detail::BufferPool>(DType::f32, max_padded);
  m.grad_pool = std::make_unique<detail::BufferPool>(DType::f32, max_padded);
  if (off.params) {
    std::int64_t max_chunk = 0;
    for (const auto& u : m.units) max_chunk = std::max(max_chunk, u.layout.chunk);
    m.shard_pool = std::make_unique<detail::BufferPool>(m.param_dtype, max_chunk);
  }
  co_return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

// ---- forward ----

Task<void> Engine::forward() {
  Impl& m = *impl_;
  const std::vector<std::size_t> order = m.plan_ready ? m.order : m.default_order();
  for (std::size_t ui : order) co_await run_forward(ui);
}

Task<void> Engine::run_forward(std::size_t ui) {
  Impl& m = *impl_;
  if (ui >= m.units.size()) throw Error(Errc::invalid_argument, "run_forward: no unit " + std::to_string(ui));
  UnitState& u = m.units[ui];
  const std::size_t pos = m.forward_position++;
  if (pos == 0) {
    // Root pre-forward: the first all-gather (and NO_SHARD's direct use of the master) waits for
    // the previous optimizer step.
    if (m.optimizer_done) {
      m.unshard_stream->wait(*m.optimizer_done);
      m.compute->wait(*m.optimizer_done);
      if (m.h2d) m.h2d->wait(*m.optimizer_done);
    }
    m.backward_position = 0;
    for (auto& s : m.units) s.forward_calls = s.backward_calls = 0;
  }
  if (u.forward_calls >= u.phases) {
    throw m.error(Errc::invalid_argument, "unit '" + u.name + "' ran forward " + std::to_string(u.forward_calls + 1) +
                                              " times in one step but has " + std::to_string(u.phases) + " phase(s)",
                  u.name, "pre-forward");
  }
  const int phase = u.forward_calls;
  if (!m.plan_ready) {
    // First iteration: every rank must be at the same unit, checked before its all-gather so
    // that a different order fails by name instead of all-gathering the wrong unit.
    Tensor mine = Tensor::empty(m.rt.allocator(), DType::i32, {2});
    Tensor all = Tensor::empty(m.rt.allocator(), DType::i32, {2 * m.world});
    mine.data_as<std::int32_t>()[0] = static_cast<std::int32_t>(pos);
    mine.data_as<std::int32_t>()[1] = static_cast<std::int32_t>(ui);
    co_await m.control->all_gather(mine, all, *m.compute);
    const auto* a = all.data_as<std::int32_t>();
    for (int r = 0; r < m.world; ++r) {
      if (a[2 * r + 1] != static_cast<std::int32_t>(ui)) {
        auto other = static_cast<std::size_t>(a[2 * r + 1]);
        const std::string theirs = other < m.units.size() ? "'" + m.units[other].name + "'" : "unit #" + std::to_string(other);
        throw m.error(Errc::invalid_argument,
                      "forward order differs across ranks: at position " + std::to_string(pos) +
                          " of the first forward, rank " + std::to_string(r) + " runs unit " + theirs + " where rank " +
                          std::to_string(m.rank) + " runs '" + u.name + "'. Every rank must run the units in the same order",
                      u.name, "pre-forward");
      }
    }
    m.order.push_back(ui);
  } else if (pos >= m.order.size() || m.order[pos] != ui) {
    if (!m.warned_deviation) {
      m.warned_deviation = true;
      std::fprintf(stderr,
                   "coshard: rank %d: the forward order differs from the first iteration's at position %zu (unit '%s'); "
                   "prefetching follows the recorded plan, so this iteration may run slower\n",
                   m.rank, pos, u.name.c_str());
    }
  }
  // Pre-forward: unshard unless prefetched (or kept from an earlier phase), and make compute wait.
  if (phase > 0) {
    // Unsharded since its first phase.
  } else if (u.resident) {
    m.prefetch_hits->add();
  } else {
    m.prefetch_misses->add();
    m.unshard(ui, "forward", false);
  }
  m.compute->wait(u.ready);
  // Forward prefetch: explicit list, else the next units of the plan.
  if (auto it = m.opt.prefetch.forward_explicit.find(u.name); it != m.opt.prefetch.forward_explicit.end()) {
    for (const auto& name : it->second) {
      for (std::size_t j = 0; j < m.units.size(); ++j) {
        if (m.units[j].name == name) m.prefetch(j, "forward");
      }
    }
  } else if (m.plan_ready) {
    for (int k = 1; k <= m.opt.prefetch.forward && pos + static_cast<std::size_t>(k) < m.order.size(); ++k) {
      m.prefetch(m.order[pos + static_cast<std::size_t>(k)], "forward");
    }
  }
  Scope scope(m.rt, *m.compute, &u.param_views, nullptr, phase);
  m.log.push_back("forward " + u.name + " compute");
  co_await u.unit->forward(scope);
  ++u.forward_calls;
  // Post-forward: reshard per strategy once compute is done with the buffer. The recorded order
  // is the plan once every step ran (and tells which unit is last).
  if (pos + 1 == m.total_steps() && !m.plan_ready) m.plan_ready = true;
  Event used;
  used.record(*m.compute);
  u.open = u.forward_calls < u.phases;
  if (!u.open && m.reshard_after_forward(ui)) m.reshard(ui, used, true);
}

// ---- backward ----

Task<void> Engine::backward() {
  Impl& m = *impl_;
  std::vector<std::size_t> order = m.order;
  if (order.empty()) {
    throw Error(Errc::invalid_argument, "backward() without a forward: run forward() first");
  }
  for (auto it = order.rbegin(); it != order.rend(); ++it) co_await run_backward(*it);
  co_await finish_backward();
}

Task<void> Engine::run_backward(std::size_t ui) {
  Impl& m = *impl_;
  if (ui >= m.units.size()) throw Error(Errc::invalid_argument, "run_backward: no unit " + std::to_string(ui));
  UnitState& u = m.units[ui];
  if (u.forward_calls < u.phases || u.backward_calls >= u.phases) {
    throw m.error(Errc::invalid_argument, "backward of unit '" + u.name + "' without its forward in this iteration (or "
                                          "more backward than forward phases): run the forward first, activations "
                                          "would be missing", u.name, "pre-backward");
  }
  const std::size_t pos = m.backward_position++;
  if (pos == 0) m.compute->enqueue([clk = m.clock] { clk->backward_running.store(true); });
  const int phase = u.phases - 1 - u.backward_calls;
  const bool first_phase = u.backward_calls == 0;
  // Pre-backward: unshard again if resharded after forward.
  if (!first_phase) {
    // Unsharded, with its gradient buffers, since its first backward phase.
  } else if (u.resident) {
    m.prefetch_hits->add();
  } else {
    m.prefetch_misses->add();
    m.unshard(ui, "backward", m.reshard_group > 0 && u.post_forward_shard.defined());
  }
  m.compute->wait(u.ready);
  // Gradient buffers: the no_sync accumulator, or a zeroed pool slot.
  const auto& l = u.layout;
  if (!first_phase) {
    // kept from the first backward phase
  } else if (!m.sync || u.accumulated_pending) {
    if (!u.accumulated.defined()) {
      u.accumulated = Tensor::empty(m.rt.allocator(), DType::f32, {l.padded});
      Tensor acc = u.accumulated;
      m.compute->enqueue([acc] { std::fill_n(acc.data_as<float>(), acc.numel(), 0.0f); }, "zero grads " + u.name);
    }
    if (u.reduced) m.compute->wait(*u.reduced);  // the last reduction read (and zeroed) it
    u.grad_buffer = u.accumulated;
    u.accumulated_pending = true;
  } else {
    auto lease = m.grad_pool->acquire(m.rt.allocator());
    u.grad_slot = lease.slot;
    if (lease.previous_use) m.compute->wait(*lease.previous_use);
    u.grad_buffer = lease.buffer.view(0, {l.padded});
    Tensor g = u.grad_buffer;
    m.compute->enqueue([g] { std::fill_n(g.data_as<float>(), g.numel(), 0.0f); }, "zero grads " + u.name);
  }
  if (first_phase) {
    u.grad_views.clear();
    for (const auto& p : l.params) u.grad_views.push_back(u.grad_buffer.view(p.offset, p.spec.shape));
  }
  // Backward prefetch (PRE): the next unit's all-gather overlaps this unit's gradient compute.
  const std::size_t next_pos = m.order.size() - 2 - pos;  // reverse plan order
  auto backward_prefetch = [&] {
    if (auto it = m.opt.prefetch.backward_explicit.find(u.name); it != m.opt.prefetch.backward_explicit.end()) {
      for (const auto& name : it->second) {
        for (std::size_t j = 0; j < m.units.size(); ++j) {
          if (m.units[j].name == name) m.prefetch(j, "backward");
        }
      }
    } else if (pos + 1 < m.order.size()) {
      m.prefetch(m.order[next_pos], "backward");
    }
  };
  const bool has_explicit = m.opt.prefetch.backward_explicit.count(u.name) > 0;
  if (has_explicit || m.opt.prefetch.backward == BackwardPrefetch::pre) backward_prefetch();
  Scope scope(m.rt, *m.compute, &u.param_views, &u.grad_views, phase);
  m.log.push_back("backward " + u.name + " compute");
  co_await u.unit->backward(scope);
  ++u.backward_calls;
  u.open = phase > 0;
  if (u.open) co_return;  // more phases to come: keep parameters and gradients
  // Post-backward: reshard, prefetch (POST), reduce.
  Event used;
  used.record(*m.compute);
  u.grad_views.clear();
  m.reshard(ui, used, false);
  if (!has_explicit && m.opt.prefetch.backward == BackwardPrefetch::post) backward_prefetch();
  if (m.sync) {
    m.reduce(ui, used);
  } else {
    u.grad_buffer = Tensor();  // stays in the no_sync accumulator
  }
}

Task<void> Engine::finish_backward() {
  Impl& m = *impl_;
  // Units still unsharded (prefetched but not used) go back to the pool.
  m.compute->enqueue([clk = m.clock] { clk->backward_running.store(false); });
  Event now;
  now.record(*m.compute);
  for (std::size_t i = 0; i < m.units.size(); ++i) m.reshard(i, now, false);
  m.forward_position = 0;
  co_return;
}

void Engine::set_requires_gradient_sync(bool sync) { impl_->sync = sync; }

// ---- optimizer, clipping ----

Task<void> Engine::optimizer_step() {
  Impl& m = *impl_;
  // Run-ahead is bounded to one step: the host waits for the previous step's optimizer before
  // issuing this one, so per-step temporaries cannot pile up.
  if (m.optimizer_done) co_await *m.optimizer_done;
  if (m.opt.clip) co_await clip_grad_norm(m.opt.clip->max_norm, m.opt.clip->p);
  for (std::size_t i = 0; i < m.units.size(); ++i) {
    if (!m.units[i].stepped) m.step_unit(i);
    m.units[i].stepped = false;
  }
  Event done;
  done.record(*m.optimizer_stream);
  m.optimizer_done = done;
  const std::int64_t ov = m.clock->overlapped_ns.load(), ex = m.clock->exposed_ns.load();
  m.optimizer_overlapped->add(static_cast<double>(ov - m.reported_overlapped_ns) * 1e-9);
  m.optimizer_exposed->add(static_cast<double>(ex - m.reported_exposed_ns) * 1e-9);
  m.reported_overlapped_ns = ov;
  m.reported_exposed_ns = ex;
  const CommStats now = comm_stats();
  m.exposed_total->add(std::max(0.0, now.exposed_seconds - m.reported.exposed_seconds));
  m.overlap->set(now.overlap_ratio());
  m.reported = now;
  co_return;
}

CommStats Engine::comm_stats() const {
  const Impl& m = *impl_;
  CommStats s;
  for (Communicator* c : {m.ag.get(), m.rs.get(), m.ar.get(), m.post_forward_group.get()}) {
    if (c) s.communication_seconds += std::chrono::duration<double>(c->stream().busy()).count();
  }
  s.exposed_seconds = std::chrono::duration<double>(m.compute->stalled()).count();
  return s;
}

void Engine::set_is_last_backward(bool last) { impl_->last_backward = last; }

void Engine::set_learning_rate(double lr) {
  std::visit([lr](auto& o) { o.options.lr = lr; }, impl_->opt.optimizer);
}

void Engine::zero_grad() {
  Impl& m = *impl_;
  for (auto& u : m.units) {
    if (u.reduced) m.reduce_stream->wait(*u.reduced);
    Tensor g = u.grad_shard;
    m.reduce_stream->enqueue([g] { std::fill_n(g.data_as<float>(), g.numel(), 0.0f); }, "zero grads");
    u.reduced = Event();
    u.reduced->record(*m.reduce_stream);
  }
}

Task<double> Engine::clip_grad_norm(double max_norm, double p) {
  Impl& m = *impl_;
  ops::NormType type = p == 2.0 ? ops::NormType::l2 : p == 1.0 ? ops::NormType::l1 : ops::NormType::inf;
  if (!(p == 2.0 || p == 1.0 || std::isinf(p))) {
    throw Error(Errc::invalid_argument, "clip_grad_norm supports p = 2, 1 or inf, not " + std::to_string(p));
  }
  for (auto& u : m.units) {
    if (u.stepped) {
      throw Error(Errc::invalid_argument, "clip_grad_norm after the pipelined host optimizer already stepped unit '" +
                                              u.name + "': set Options::clip so the optimizer waits for the norm");
    }
    if (u.reduced) co_await *u.reduced;
  }
  std::vector<std::span<const float>> spans;  // padding excluded
  for (auto& u : m.units) {
    const std::int64_t begin = m.sharded() ? m.shard_rank * u.layout.chunk : 0;
    for (const auto& r : u.layout.ranges(begin, u.grad_shard.numel())) {
      spans.push_back(std::span<const float>(u.grad_shard.data_as<float>() + r.offset, r.size));
    }
  }
  double local = ops::norm_partial(spans, type);
  double reduced = local;
  if (m.sharded() && m.world > 1) {
    Tensor t = Tensor::empty(m.rt.allocator(), DType::f32, {1});
    // Replicas hold the same shards: sum over everyone, then take one replica's share.
    t.data_as<float>()[0] = static_cast<float>(local);
    co_await m.control->all_reduce(t, type == ops::NormType::inf ? Reduction::max() : Reduction::sum(), *m.reduce_stream);
    reduced = t.data_as<float>()[0];
    if (type != ops::NormType::inf) reduced /= m.replicas;
  }
  const double total = ops::norm_finish(reduced, type);
  const double coef = ops::clip_coefficient(total, max_norm);
  if (coef < 1.0) {
    for (auto& u : m.units) {
      Tensor g = u.grad_shard;
      const auto c = static_cast<float>(coef);
      if (u.reduced) m.reduce_stream->wait(*u.reduced);
      m.reduce_stream->enqueue([g, c] { ops::scale_inplace(span_of(g), c); }, "clip " + u.name);
      u.reduced = Event();
      u.reduced->record(*m.reduce_stream);
    }
  }
  co_return total;
}

// ---- state dicts ----

Task<StateDict> Engine::full_state_dict(bool rank0_only) {
  Impl& m = *impl_;
  Event ready;
  ready.record(*m.optimizer_stream);
  co_await ready;
  StateDict out;
  for (auto& u : m.units) {
    const auto& l = u.layout;
    Tensor full = u.master;
    if (m.sharded() && m.shard_size > 1) {
      full = Tensor::empty(m.rt.allocator(), DType::f32, {l.padded});
      co_await m.ag->all_gather(u.master, full, *m.compute);
    }
    if (rank0_only && m.rank != 0) continue;
    for (const auto& p : l.params) {
      const float* s = full.data_as<float>() + p.offset;
      out[p.spec.name] = std::vector<float>(s, s + p.numel);
    }
  }
  co_return out;
}

Task<void> Engine::load_full_state_dict(const StateDict& state) {
  Impl& m = *impl_;
  std::size_t expected = 0;
  for (auto& u : m.units) {
    for (const auto& p : u.layout.params) {
      ++expected;
      auto it = state.find(p.spec.name);
      if (it == state.end()) {
        throw m.error(Errc::invalid_argument, "state dict has no '" + p.spec.name + "' (unit '" + u.name + "')", u.name,
                      "load_state_dict");
      }
      if (static_cast<std::int64_t>(it->second.size()) != p.numel) {
        throw m.error(Errc::invalid_argument, "state dict entry '" + p.spec.name + "' has " + std::to_string(it->second.size()) +
                                                  " values but the parameter has shape " + coshard::to_string(p.spec.shape) +
                                                  " (unit '" + u.name + "')", u.name, "load_state_dict");
      }
    }
  }
  if (state.size() != expected) {
    for (const auto& [name, values] : state) {
      bool known = false;
      for (auto& u : m.units) {
        for (const auto& p : u.layout.params) known |= p.spec.name == name;
      }
      if (!known) {
        throw Error(Errc::invalid_argument, "state dict entry '" + name + "' is not a parameter of this model",
                    op_context("load_state_dict"));
      }
    }
  }
  Event ready;
  ready.record(*m.optimizer_stream);
  co_await ready;
  for (auto& u : m.units) {
    const std::int64_t begin = m.sharded() ? m.shard_rank * u.layout.chunk : 0;
    float* dst = u.master.data_as<float>();
    std::fill_n(dst, u.master.numel(), 0.0f);
    for (const auto& p : u.layout.params) {
      const auto& v = state.at(p.spec.name);
      std::int64_t lo = std::max(begin, p.offset), hi = std::min(begin + u.master.numel(), p.offset + p.numel);
      for (std::int64_t i = lo; i < hi; ++i) dst[i - begin] = v[static_cast<std::size_t>(i - p.offset)];
    }
  }
}

Task<void> Engine::summon_full_params(std::function<void(StateDict&)> fn, bool writeback) {
  StateDict full = co_await full_state_dict(false);
  fn(full);
  if (writeback) co_await load_full_state_dict(full);
}

// ---- introspection ----

Event Engine::compute_event() {
  Event e;
  e.record(*impl_->compute);
  return e;
}

Task<void> Engine::synchronize() {
  Impl& m = *impl_;
  for (Stream* s : {m.compute, m.unshard_stream, m.reduce_stream, m.optimizer_stream}) {
    Event e;
    e.record(*s);
    co_await e;
  }
}

const std::vector<std::string>& Engine::issue_log() const noexcept { return impl_->log; }
void Engine::clear_issue_log() { impl_->log.clear(); }
std::size_t Engine::unit_count() const noexcept { return impl_->units.size(); }
const std::string& Engine::unit_name(std::size_t unit) const { return impl_->units.at(unit).name; }

MemoryReport Engine::memory_report() const {
  const Impl& m = *impl_;
  MemoryReport r;
  std::int64_t max_padded = 0;
  const auto& off = m.opt.offload;
  std::int64_t max_chunk = 0;
  for (const auto& u : m.units) {
    auto add = [&](const Tensor& t, bool on_host) {
      if (t.defined()) (on_host ? r.host_state_bytes : r.sharded_state_bytes) += t.nbytes();
    };
    add(u.master, off.params);
    add(u.grad_shard, off.grads);
    add(u.opt_a, off.optimizer);
    add(u.opt_b, off.optimizer);
    max_padded = std::max(max_padded, u.layout.padded);
    max_chunk = std::max(max_chunk, u.layout.chunk);
  }
  if (off.params) r.shard_copy_bytes = static_cast<std::size_t>(max_chunk) * size_of(m.param_dtype);
  const auto n = static_cast<std::size_t>(max_padded);
  r.max_unit_unsharded_bytes = n * size_of(m.param_dtype) + (m.mixed() ? n * 4 : 0) + n * 4;
  r.pool_slots = m.param_pool ? m.param_pool->slots() : 0;
  return r;
}

}  // namespace coshard::fsdp
