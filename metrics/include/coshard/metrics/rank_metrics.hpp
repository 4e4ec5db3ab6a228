#pragma once
// The metrics service of one rank: a PrometheusTelemetry whose series all carry the constant
// labels rank and local_rank, an Exporter serving it on port + local_rank, coshard_build_info, and
// the allocator gauges on demand. A service with start/stop; the telemetry outlives stop(), so
// instruments handed out before keep working (nothing is served until the next start()).
//
//   metrics::RankMetrics m({.rank = env.rank, .local_rank = env.local_rank, .port = flags.metrics_port});
//   m.start();                                   // throws Error naming the port and --metrics-port
//   std::cout << "metrics: " << m.url() << "\n";  // the real port, also when port 0 picked one
//   Runtime rt({.rank = env.rank, .telemetry = &m.telemetry()});
//   auto watching = m.watch(rt.allocator());     // allocator gauges read at every scrape
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "coshard/metrics/build_info.hpp"
#include "coshard/metrics/prometheus_telemetry.hpp"
#include "coshard/runtime/allocator.hpp"

namespace coshard::metrics {

class Exporter;
class Timeline;

/// The metrics service of one rank: telemetry whose series carry its rank, served over HTTP on
/// port + local_rank between start() and stop().
class RankMetrics {
 public:
  /// How the rank is labelled and where it serves; suits designated initialisers.
  struct Options {
    int rank = 0;        ///< value of the constant label rank; not negative
    int local_rank = 0;  ///< value of the constant label local_rank; also offsets the port
    /// Base port: this rank serves on port + local_rank. 0 picks a free port (read it with port()).
    std::uint16_t port = 9400;
    std::string bind_address = "127.0.0.1";  ///< "0.0.0.0" lets a Prometheus on another host scrape
    Timeline* timeline = nullptr;  ///< not owned; spans are recorded there when set
  };
  /// Whether the HTTP endpoint is open.
  enum class State : std::uint8_t { stopped, serving };

  /// Registers coshard_build_info; serves nothing until start(). Throws Error(bad_config) for a
  /// negative rank or local rank.
  explicit RankMetrics(Options options);
  ~RankMetrics();  ///< stop()
  RankMetrics(const RankMetrics&) = delete;
  RankMetrics& operator=(const RankMetrics&) = delete;

  /// Opens the HTTP endpoint. Throws Error(io) when the port is taken or the address is not local,
  /// naming the address, the port and the flag to change (--metrics-port / --metrics-bind), and
  /// Error(bad_config) when port + local_rank is above 65535. Starting twice is a no-op.
  void start();
  /// Closes the endpoint (joins its threads). Idempotent; start() may be called again.
  void stop() noexcept;
  /// Whether the endpoint is open now. Thread-safe.
  State state() const noexcept;
  /// state() == State::serving.
  bool serving() const noexcept { return state() == State::serving; }

  /// The Telemetry to hand the Runtime; lives as long as this object, across stop() and start().
  PrometheusTelemetry& telemetry() noexcept { return *telemetry_; }
  std::uint16_t port() const noexcept;  ///< the bound port while serving, else 0
  std::string url() const;              ///< "http://127.0.0.1:9400/metrics" while serving, else ""
  /// The options it was made with.
  const Options& options() const noexcept { return options_; }
  /// What its coshard_build_info reports.
  const BuildInfo& build_info() const noexcept { return build_; }

  /// Sets coshard_allocator_{allocated,reserved,peak}_bytes{device=...} from the stats. Thread-safe.
  void update(const AllocatorStats& stats, std::string_view device);
  /// update() with the allocator's stats, labelled with its device (e.g. "cpu:0").
  void update(const Allocator& allocator);

  /// Watching an allocator: its gauges are read at every scrape. Ends (with a last update, so the
  /// final figures stay served) when destroyed, so declare it after the allocator's Runtime.
  class [[nodiscard]] Watching {
   public:
    explicit Watching(RankMetrics& m) : m_(m) {}  ///< made by RankMetrics::watch()
    ~Watching();  ///< a last update, then scrapes no longer read the allocator
    Watching(const Watching&) = delete;
    Watching& operator=(const Watching&) = delete;

   private:
    RankMetrics& m_;
  };
  /// Makes every scrape update the allocator gauges from `allocator` first, until the result is
  /// destroyed: live figures while training, not only after it. One allocator at a time.
  Watching watch(const Allocator& allocator);

 private:
  Options options_;
  BuildInfo build_;
  std::unique_ptr<PrometheusTelemetry> telemetry_;
  mutable std::mutex m_;
  std::unique_ptr<Exporter> exporter_;
  std::mutex watch_m_;  // held while a scrape reads the watched allocator, so unwatching waits
  const Allocator* watched_ = nullptr;
};

}  // namespace coshard::metrics
