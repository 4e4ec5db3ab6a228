#pragma once
// What every collaborator of the engine shares, fixed at creation: the options, this rank's place
// in the world and its shard group, the dtypes, the streams, the telemetry families; and the one
// mutable thing they all append to, the issue log.
#include <map>
#include <string>
#include <vector>

#include "coshard/fsdp/options.hpp"
#include "coshard/runtime/error.hpp"
#include "coshard/runtime/runtime.hpp"
#include "coshard/runtime/task.hpp"

namespace coshard::fsdp::detail {

// The Prometheus families the engine reports into (docs/metrics.md).
struct EngineMetrics {
  Counter* prefetch_hits = nullptr;
  Counter* prefetch_misses = nullptr;
  Counter* limiter_waits = nullptr;
  Gauge* pool_occupancy = nullptr;
  Counter* exposed_total = nullptr;
  Gauge* overlap = nullptr;
  Counter* h2d_bytes = nullptr;
  Counter* h2d_seconds = nullptr;
  Counter* d2h_bytes = nullptr;
  Counter* d2h_seconds = nullptr;
  Counter* optimizer_overlapped = nullptr;
  Counter* optimizer_exposed = nullptr;
  // coshard_compute_stall_seconds_total by the stream the compute stream waited for.
  std::map<std::string, Counter*, std::less<>> compute_stall;

  static EngineMetrics register_in(Telemetry& t);
};

// The runtime's streams the engine issues on. h2d and d2h exist only with offload.
struct EngineStreams {
  Stream* compute = nullptr;    // the units' kernels
  Stream* unshard = nullptr;    // copy-in and all-gathers
  Stream* reduce = nullptr;     // gradient casts, reduce-scatters and all-reduces, clipping
  Stream* optimizer = nullptr;  // optimizer updates
  Stream* h2d = nullptr;        // offload: master shards to the device
  Stream* d2h = nullptr;        // offload: reduced gradient shards to the host

  static EngineStreams of(Runtime& rt, bool offload);
  std::vector<Stream*> all() const;
};

struct Context {
  Context(Runtime& r, Options o) : rt(r), opt(std::move(o)) {}

  Runtime& rt;
  Options opt;
  int rank = 0, world = 1;
  int shard_rank = 0, shard_size = 1;  // in the shard group (hybrid: a node group; else the world)
  int replicas = 1;                    // world / shard_size
  int reshard_group = 0;               // > 0: reshard after forward to groups of this size
  DType param_dtype = DType::f32, reduce_dtype = DType::f32;
  EngineStreams streams;
  EngineMetrics metrics;
  // "<phase> <unit> <collective>" in issue order (Engine::issue_log).
  std::vector<std::string> log;

  bool sharded() const noexcept { return opt.strategy != Strategy::no_shard; }
  bool mixed() const noexcept { return param_dtype != DType::f32; }
  Error error(Errc code, std::string msg, const std::string& unit, std::string op) const {
    return Error(code, std::move(msg), ErrorContext{.rank = rank, .op = std::move(op), .unit = unit});
  }
};

// Returns once all work issued so far on every engine stream is done (the shards are free).
Task<void> quiesce(Context& ctx);

}  // namespace coshard::fsdp::detail
