#include "context.hpp"

namespace coshard::fsdp::detail {

EngineMetrics EngineMetrics::register_in(Telemetry& t) {
  EngineMetrics m;
  m.prefetch_hits = &t.counter("coshard_prefetch_hits_total", "Units already unsharded when their phase began", {});
  m.limiter_waits = &t.counter("coshard_limiter_waits_total",
                               "Prefetches deferred because the in-flight limit of unsharded units was reached", {});
  m.prefetch_misses = &t.counter("coshard_prefetch_misses_total", "Units unsharded on demand when their phase began", {});
  m.exposed_total = &t.counter("coshard_exposed_communication_seconds_total",
                               "Time the compute stream stalled waiting for collectives (all-gathers, and reductions "
                               "holding a gradient buffer, accumulated on d2h when offloaded)", {});
  for (const char* on : {"unshard", "reduce", "d2h", "optimizer"}) {
    m.compute_stall[on] = &t.counter("coshard_compute_stall_seconds_total",
                                     "Time the compute stream stalled, by the stream it waited for", {{"stream", on}});
  }
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
  return m;
}

EngineStreams EngineStreams::of(Runtime& rt, bool offload) {
  EngineStreams s;
  s.compute = &rt.stream("compute");
  s.unshard = &rt.stream("unshard");
  s.reduce = &rt.stream("reduce");
  s.optimizer = &rt.stream("optimizer");
  if (offload) {
    s.h2d = &rt.stream("h2d");
    s.d2h = &rt.stream("d2h");
  }
  return s;
}

std::vector<Stream*> EngineStreams::all() const {
  std::vector<Stream*> v;
  for (Stream* s : {compute, unshard, reduce, optimizer, h2d, d2h}) {
    if (s) v.push_back(s);
  }
  return v;
}

Task<void> quiesce(Context& ctx) {
  for (Stream* s : ctx.streams.all()) {
    Event e;
    e.record(*s);
    co_await e;
  }
}

}  // namespace coshard::fsdp::detail
