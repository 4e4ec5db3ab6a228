// The engine as a coordinator: what happens at each point of a step (pre-forward, post-forward,
// pre-backward, post-backward, optimizer), delegated to the collaborators of engine_impl.hpp.
#include "coshard/fsdp/engine.hpp"

#include <algorithm>
#include <cstdio>

#include "coshard/runtime/copy.hpp"
#include "coshard/transport/gather_integers.hpp"
#include "engine_impl.hpp"
#include "state_dict.hpp"

namespace coshard::fsdp {
namespace {

// First iteration: every rank must be at the same unit, checked before its all-gather so that a
// different order fails by name instead of all-gathering the wrong unit.
Task<void> check_same_unit(Engine::Impl& m, std::size_t ui, std::size_t pos) {
  detail::Context& ctx = m.ctx;
  std::vector<std::int64_t> mine{static_cast<std::int64_t>(pos), static_cast<std::int64_t>(ui)};
  const std::vector<std::int64_t> a =
      co_await transport::gather_integers(*m.comms.control, *ctx.streams.compute, ctx.rt.allocator(), std::move(mine));
  for (int r = 0; r < ctx.world; ++r) {
    if (a[2 * r + 1] == static_cast<std::int64_t>(ui)) continue;
    auto other = static_cast<std::size_t>(a[2 * r + 1]);
    const std::string theirs = other < m.units.size() ? "'" + m.units[other].name + "'" : "unit #" + std::to_string(other);
    throw ctx.error(Errc::invalid_argument,
                    "forward order differs across ranks: at position " + std::to_string(pos) + " of the first forward, rank " +
                        std::to_string(r) + " runs unit " + theirs + " where rank " + std::to_string(ctx.rank) + " runs '" +
                        m.units[ui].name + "'. Every rank must run the units in the same order",
                    m.units[ui].name, "pre-forward");
  }
}

// Root pre-forward: the first all-gather (and NO_SHARD's direct use of the master) waits for the
// previous optimizer step.
void start_iteration(Engine::Impl& m) {
  const auto& streams = m.ctx.streams;
  if (const auto& done = m.optimizer->step_done()) {
    streams.unshard->wait(*done);
    streams.compute->wait(*done);
    if (streams.h2d) streams.h2d->wait(*done);
  }
  m.plan->start_iteration();
  for (auto& s : m.units) s.progress.forward_calls = s.progress.backward_calls = 0;
}

// Follows the plan, or records it in the first iteration.
Task<void> follow_plan(Engine::Impl& m, std::size_t ui, std::size_t pos) {
  if (!m.plan->ready()) {
    co_await check_same_unit(m, ui, pos);
    m.plan->record(ui);
  } else if (m.plan->deviates(pos, ui) && !m.warned_deviation) {
    m.warned_deviation = true;
    m.ctx.rt.log(LogLevel::warning, "rank " + std::to_string(m.ctx.rank) +
                                        ": the forward order differs from the first iteration's at position " +
                                        std::to_string(pos) + " (unit '" + m.units[ui].name +
                                        "'); prefetching follows the recorded plan, so this iteration may run slower");
  }
}

// Pre-phase: unshard unless prefetched (or kept from an earlier phase), and make compute wait.
void ensure_unsharded(Engine::Impl& m, std::size_t ui, const char* phase, bool first_phase, bool from_post_forward_shard) {
  detail::UnitState& u = m.units[ui];
  if (!first_phase) {
    // Unsharded since its first phase.
  } else if (u.unsharded.resident()) {
    m.ctx.metrics.prefetch_hits->add();
  } else {
    m.ctx.metrics.prefetch_misses->add();
    m.unsharder->unshard(ui, phase, from_post_forward_shard);
  }
  m.ctx.streams.compute->wait(u.unsharded.ready);
}

void prefetch(Engine::Impl& m, const std::vector<std::size_t>& targets, const char* phase) {
  for (std::size_t t : targets) m.unsharder->prefetch(t, phase);
}

Event record_on(Stream& s) {
  Event e;
  e.record(s);
  return e;
}

}  // namespace

// ---- forward ----

Task<void> Engine::forward() {
  const std::vector<std::size_t> order = impl_->plan->forward_order();
  for (std::size_t ui : order) co_await run_forward(ui);
}

Task<void> Engine::run_forward(std::size_t ui) {
  Impl& m = *impl_;
  if (ui >= m.units.size()) throw Error(Errc::invalid_argument, "run_forward: no unit " + std::to_string(ui));
  detail::UnitState& u = m.units[ui];
  const std::size_t pos = m.plan->next_forward_position();
  if (pos == 0) start_iteration(m);
  if (u.progress.forward_calls >= u.phases) {
    throw m.ctx.error(Errc::invalid_argument, "unit '" + u.name + "' ran forward " + std::to_string(u.progress.forward_calls + 1) +
                                                  " times in one step but has " + std::to_string(u.phases) + " phase(s)",
                      u.name, "pre-forward");
  }
  const int phase = u.progress.forward_calls;
  co_await follow_plan(m, ui, pos);
  ensure_unsharded(m, ui, "forward", phase == 0, false);
  prefetch(m, m.plan->forward_prefetch(ui, pos), "forward");
  Scope scope(m.ctx.rt, *m.ctx.streams.compute, &u.unsharded.views, nullptr, phase);
  m.ctx.log.push_back("forward " + u.name + " compute");
  co_await u.unit->forward(scope);
  ++u.progress.forward_calls;
  // Post-forward: reshard per strategy once compute is done with the buffer.
  m.plan->forward_done(pos);
  u.progress.open = u.progress.forward_calls < u.phases;
  if (u.progress.open) co_return;
  if (m.plan->reshard_after_forward(ui)) {
    m.unsharder->reshard(ui, record_on(*m.ctx.streams.compute), true);
  } else {
    m.unsharder->keep_after_forward(ui);  // SHARD_GRAD_OP, the root: not a prefetch, so the limiter ignores it
  }
}

// ---- backward ----

Task<void> Engine::backward() {
  std::vector<std::size_t> order = impl_->plan->recorded();
  if (order.empty()) throw Error(Errc::invalid_argument, "backward() without a forward: run forward() first");
  for (auto it = order.rbegin(); it != order.rend(); ++it) co_await run_backward(*it);
  co_await finish_backward();
}

Task<void> Engine::run_backward(std::size_t ui) {
  Impl& m = *impl_;
  if (ui >= m.units.size()) throw Error(Errc::invalid_argument, "run_backward: no unit " + std::to_string(ui));
  detail::UnitState& u = m.units[ui];
  if (u.progress.forward_calls < u.phases || u.progress.backward_calls >= u.phases) {
    throw m.ctx.error(Errc::invalid_argument, "backward of unit '" + u.name + "' without its forward in this iteration (or "
                                              "more backward than forward phases): run the forward first, activations "
                                              "would be missing", u.name, "pre-backward");
  }
  const std::size_t pos = m.plan->next_backward_position();
  if (pos == 0) m.optimizer->mark_backward(true);
  const int phase = u.phases - 1 - u.progress.backward_calls;
  const bool first_phase = u.progress.backward_calls == 0;
  // Pre-backward: unshard again if resharded after forward; gradient buffers; prefetch (PRE).
  ensure_unsharded(m, ui, "backward", first_phase, m.ctx.reshard_group > 0 && u.unsharded.post_forward_shard.defined());
  m.unsharder->run_again(ui);  // the current unit again
  if (first_phase) m.reducer->open(ui, m.sync);
  if (m.plan->prefetch_before_backward(ui)) prefetch(m, m.plan->backward_prefetch(ui, pos), "backward");
  Scope scope(m.ctx.rt, *m.ctx.streams.compute, &u.unsharded.views, &u.grads.views, phase);
  m.ctx.log.push_back("backward " + u.name + " compute");
  co_await u.unit->backward(scope);
  ++u.progress.backward_calls;
  u.progress.open = phase > 0;
  if (u.progress.open) co_return;  // more phases to come: keep parameters and gradients
  // Post-backward: reshard, prefetch (POST), reduce; the pipelined host optimizer steps the unit
  // while backward goes on with the others.
  const Event used = record_on(*m.ctx.streams.compute);
  m.unsharder->reshard(ui, used, false);
  if (m.plan->prefetch_after_backward(ui)) prefetch(m, m.plan->backward_prefetch(ui, pos), "backward");
  if (!m.sync) {
    m.reducer->keep(ui);
    co_return;
  }
  m.reducer->reduce(ui, used);
  const auto& off = m.ctx.opt.offload;
  if (off.optimizer && off.pipelined_optimizer && m.last_backward && !m.ctx.opt.clip) {
    m.optimizer->step_early(ui);
  }
}

Task<void> Engine::finish_backward() {
  Impl& m = *impl_;
  // Units still unsharded (prefetched but not used) go back to the pool.
  m.optimizer->mark_backward(false);
  m.reducer->end_backward();
  const Event now = record_on(*m.ctx.streams.compute);
  for (std::size_t i = 0; i < m.units.size(); ++i) m.unsharder->reshard(i, now, false);
  m.plan->end_iteration();
  co_return;
}

void Engine::set_requires_gradient_sync(bool sync) { impl_->sync = sync; }
void Engine::set_is_last_backward(bool last) { impl_->last_backward = last; }

// ---- optimizer, clipping ----

Task<void> Engine::optimizer_step() {
  Impl& m = *impl_;
  // Run-ahead is bounded to one step: the host waits for the previous step's optimizer before
  // issuing this one, so per-step temporaries cannot pile up.
  if (const auto& done = m.optimizer->step_done()) co_await *done;
  co_await m.checkpoint->finish();  // an asynchronous save of the previous step: manifest or error now
  if (m.ctx.opt.clip) co_await clip_grad_norm(m.ctx.opt.clip->max_norm, m.ctx.opt.clip->p);
  m.optimizer->finish_step();
  m.optimizer->report();
  const CommStats now = comm_stats();
  m.ctx.metrics.exposed_total->add(std::max(0.0, now.exposed_seconds - m.reported.exposed_seconds));
  for (const auto& [on, seconds] : now.compute_stall_seconds) {
    const auto counter = m.ctx.metrics.compute_stall.find(on);
    if (counter == m.ctx.metrics.compute_stall.end()) continue;
    counter->second->add(std::max(0.0, seconds - m.reported.compute_stall_seconds[on]));
  }
  m.ctx.metrics.overlap->set(now.overlap_ratio());
  m.reported = now;
}

Task<double> Engine::clip_grad_norm(double max_norm, double p) { return impl_->reducer->clip(max_norm, p); }

void Engine::set_learning_rate(double lr) {
  std::visit([lr](auto& o) { o.options.lr = lr; }, impl_->ctx.opt.optimizer);
}

void Engine::zero_grad() { impl_->reducer->zero_grad(); }

// ---- state dicts ----

Task<StateDict> Engine::full_state_dict(bool rank0_only) {
  return detail::gather_full_state(impl_->units, impl_->ctx, impl_->comms, rank0_only);
}

Task<void> Engine::load_full_state_dict(StateDict state) {
  return detail::load_full_state(impl_->units, impl_->ctx, std::move(state));
}

Task<void> Engine::summon_full_params(std::function<void(StateDict&)> fn, bool writeback) {
  StateDict full = co_await full_state_dict(false);
  fn(full);
  if (writeback) co_await load_full_state_dict(std::move(full));
}

// ---- checkpoints ----

Task<void> Engine::save_sharded(std::string dir, CheckpointMetadata metadata) {
  return impl_->checkpoint->save(std::move(dir), std::move(metadata), false);
}

Task<void> Engine::save_sharded_async(std::string dir, CheckpointMetadata metadata) {
  return impl_->checkpoint->save(std::move(dir), std::move(metadata), true);
}

Task<void> Engine::wait_for_checkpoint() { return impl_->checkpoint->finish(); }

Task<CheckpointMetadata> Engine::load_sharded(std::string dir) { return impl_->checkpoint->load(std::move(dir)); }

// ---- introspection ----

Event Engine::compute_event() { return record_on(*impl_->ctx.streams.compute); }

Task<void> Engine::synchronize() { return detail::quiesce(impl_->ctx); }

CommStats Engine::comm_stats() const {
  CommStats s;
  s.communication_seconds = impl_->comms.busy_seconds();
  const auto& streams = impl_->ctx.streams;
  for (const auto& [on, t] : streams.compute->stalls()) {
    const double seconds = std::chrono::duration<double>(t).count();
    s.compute_stall_seconds[on] = seconds;
    const bool collective = on == streams.unshard->name() || on == streams.reduce->name() ||
                            (streams.d2h && on == streams.d2h->name());  // where offloaded reductions end
    if (collective) s.exposed_seconds += seconds;
  }
  return s;
}

const std::vector<std::string>& Engine::issue_log() const noexcept { return impl_->ctx.log; }
void Engine::clear_issue_log() { impl_->ctx.log.clear(); }
std::size_t Engine::unit_count() const noexcept { return impl_->units.size(); }
const std::string& Engine::unit_name(std::size_t unit) const { return impl_->units.at(unit).name; }
int Engine::shard_group_size() const noexcept { return impl_->ctx.sharded() ? impl_->ctx.shard_size : 1; }

MemoryReport Engine::memory_report() const {
  const Impl& m = *impl_;
  const auto& off = m.ctx.opt.offload;
  MemoryReport r;
  for (const auto& u : m.units) {
    auto add = [&](const Tensor& t, bool on_host) {
      if (t.defined()) (on_host ? r.host_state_bytes : r.sharded_state_bytes) += t.nbytes();
    };
    add(u.shard.master, off.params);
    add(u.shard.grad, off.grads);
    add(u.shard.exp_avg, off.optimizer);
    add(u.shard.exp_avg_sq, off.optimizer);
  }
  r.shard_copy_bytes = m.offload ? m.offload->device_copy_bytes() : 0;
  r.host_landing_bytes = m.offload ? detail::landing_bytes(m.units, m.ctx) : 0;
  r.max_unit_unsharded_bytes = m.unsharder->max_unit_bytes();
  r.all_units_unsharded_bytes = m.unsharder->all_units_param_bytes();
  r.pool_slots = m.unsharder->slots();
  r.pool_bytes = m.unsharder->pool_bytes() + m.reducer->pool_bytes();
  return r;
}

}  // namespace coshard::fsdp
