// The runtime at work on one rank, shaped like an FSDP forward pass: each unit's parameters are
// "gathered" on the all_gather stream into a buffer from a pool of two, the compute stream waits
// for that and runs the unit, and the buffer goes back to the pool once compute is done with it.
// The same units then run serialised on one stream. The demo prints both times, the overlap won,
// the allocator's peak against the pool formula, and writes a Chrome trace of the overlapped run.
//
// Usage: coshard-pipeline-demo [--units N] [--unit-mib M] [--compute-ms D] [--trace FILE]
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "coshard/metrics/prometheus_telemetry.hpp"
#include "coshard/metrics/timeline.hpp"
#include "coshard/runtime/parse_whole.hpp"
#include "coshard/runtime/runtime.hpp"
#include "coshard/runtime/semaphore.hpp"
#include "coshard/runtime/when_all.hpp"

using namespace coshard;
using Clock = std::chrono::steady_clock;

namespace {

struct Config {
  int units = 8;
  std::size_t unit_bytes = 32u << 20;
  double compute_ms = 4;
  std::string trace = "coshard-pipeline-trace.json";
};

[[noreturn]] void usage(const std::string& problem) {
  std::fprintf(stderr,
               "coshard-pipeline-demo: %s\n"
               "usage: coshard-pipeline-demo [--units N (1-1000)] [--unit-mib M (1-1024)] [--compute-ms D (0-10000)] "
               "[--trace FILE]\n",
               problem.c_str());
  std::exit(2);
}

Config parse(int argc, char** argv) {
  Config c;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") usage("runs a pipelined pass and a serial one, and compares them");
    if (i + 1 >= argc) usage("flag " + flag + " needs a value");
    const std::string v = argv[++i];
    const std::string bad = "bad value '" + v + "' for " + flag;
    if (flag == "--units") {
      const auto n = parse_whole<int>(v);
      if (!n || *n < 1 || *n > 1000) usage(bad);
      c.units = *n;
    } else if (flag == "--unit-mib") {
      const auto m = parse_whole<std::size_t>(v);
      if (!m || *m < 1 || *m > 1024) usage(bad);
      c.unit_bytes = *m << 20;
    } else if (flag == "--compute-ms") {
      const auto ms = parse_whole<double>(v);
      if (!ms || !(*ms >= 0 && *ms <= 10000)) usage(bad);
      c.compute_ms = *ms;
    } else if (flag == "--trace") {
      c.trace = v;
    } else {
      usage("unknown flag " + flag);
    }
  }
  return c;
}

// The "all-gather": fills the unsharded buffer from the unit's shards (a real memory copy).
void gather(float* dst, const std::vector<float>& shard, std::size_t n) {
  for (std::size_t off = 0; off < n; off += shard.size()) {
    std::memcpy(dst + off, shard.data(), std::min(shard.size(), n - off) * sizeof(float));
  }
}

// The "unit": reads its parameters, then holds the compute stream for the configured time. The
// hold stands in for time on an accelerator, which leaves the host's cores free; a busy loop here
// would measure this 2-vCPU machine's cores fighting each other instead of the runtime's overlap.
double compute(const float* params, std::size_t n, double ms) {
  double acc = 0;
  for (std::size_t i = 0; i < n; i += 64) acc += params[i];
  std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms));
  return acc;
}

// `shard` is the caller's and outlives the pass (the gathers enqueued here read it).
Task<double> pass(Runtime& rt, Config cfg, std::vector<float>& shard, bool overlap) {
  Stream& ag = rt.stream(overlap ? "all_gather" : "serial");
  Stream& cp = rt.stream(overlap ? "compute" : "serial");
  const std::size_t n = cfg.unit_bytes / sizeof(float);
  Semaphore pool(2);  // in-flight limit: at most two unsharded units at once
  std::vector<Event> computed(static_cast<std::size_t>(cfg.units));
  auto start = Clock::now();
  for (int u = 0; u < cfg.units; ++u) {
    co_await pool.acquire();  // suspends this task, never the thread
    auto buf = std::make_shared<Buffer>(rt.allocator().allocate(cfg.unit_bytes));
    auto* p = static_cast<float*>(buf->data());
    ag.enqueue([p, &shard, n] { gather(p, shard, n); }, "all_gather unit" + std::to_string(u));
    Event gathered;
    gathered.record(ag);
    cp.wait(gathered);
    cp.enqueue([p, n, ms = cfg.compute_ms] { (void)compute(p, n, ms); }, "forward unit" + std::to_string(u));
    auto& done = computed[static_cast<std::size_t>(u)];
    done.record(cp);
    buf->record_use(done);
    // Hand the slot back once compute is done with it, without blocking anything.
    rt.scheduler().spawn([](Event e, std::shared_ptr<Buffer> b, Semaphore* s) -> Task<void> {
      co_await e;
      b->reset();
      s->release();
    }(done, std::move(buf), &pool));
  }
  co_await computed.back();
  while (pool.available() < 2) co_await sleep_for(std::chrono::microseconds(50));
  co_return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  Config cfg = parse(argc, argv);
  metrics::Timeline timeline;
  metrics::PrometheusTelemetry telemetry({{"rank", "0"}}, &timeline);
  Runtime rt({.name = "pipeline-demo", .telemetry = &telemetry});
  std::vector<float> shard(cfg.unit_bytes / sizeof(float) / 4, 1.0f);  // 4 "ranks": a quarter each

  std::printf("coshard pipeline demo: %d units of %zu MiB, %.1f ms of compute each, in-flight limit 2\n", cfg.units,
              cfg.unit_bytes >> 20, cfg.compute_ms);
  try {
    (void)rt.scheduler().sync_wait(pass(rt, cfg, shard, false));  // warm-up: first-touch page faults
    double serial = rt.scheduler().sync_wait(pass(rt, cfg, shard, false));
    timeline.clear();
    rt.allocator().reset_peak();
    double overlapped = rt.scheduler().sync_wait(pass(rt, cfg, shard, true));
    auto peak = rt.allocator().stats().peak_allocated_bytes;
    auto spans = timeline.size();
    timeline.write(cfg.trace);
    std::printf("  serial (one stream)            %8.1f ms\n", serial * 1e3);
    std::printf("  overlapped (all_gather+compute) %7.1f ms   speed-up %.2fx\n", overlapped * 1e3, serial / overlapped);
    std::printf("  peak unsharded memory          %8.1f MiB  (bound: 2 x %zu MiB)\n", peak / 1048576.0,
                cfg.unit_bytes >> 20);
    std::printf("  timeline: %zu spans on %s (open in https://ui.perfetto.dev or chrome://tracing)\n",
                spans, cfg.trace.c_str());
    return peak <= 2 * Allocator::size_class(cfg.unit_bytes) ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "coshard-pipeline-demo: %s\n", e.what());
    return 1;
  }
}
