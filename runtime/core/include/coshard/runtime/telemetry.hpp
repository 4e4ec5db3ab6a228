#pragma once
// The telemetry interface every layer reports through. Lower layers never see prometheus-cpp:
// metrics/ implements this interface (Prometheus registry, timeline); NoopTelemetry is the default.
#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace coshard {

/// Label name/value pairs that tell apart the series of one metric (e.g. {"rank", "0"}).
using Labels = std::vector<std::pair<std::string, std::string>>;

/// A monotonically increasing metric (bytes sent, steps run).
class Counter {
 public:
  virtual ~Counter() = default;
  virtual void add(double v = 1.0) = 0;  ///< thread-safe
};

/// A metric that is set to its current value (memory in use, queue depth).
class Gauge {
 public:
  virtual ~Gauge() = default;
  virtual void set(double v) = 0;  ///< thread-safe
};

/// A metric whose observations are counted into buckets (latencies, sizes).
class Histogram {
 public:
  virtual ~Histogram() = default;
  virtual void observe(double v) = 0;  ///< thread-safe
};

/// One interval of work on one stream of one rank (a timeline span).
struct Span {
  std::string name;      ///< e.g. "all_gather h.3"
  std::string category;  ///< e.g. "forward"
  std::string stream;    ///< e.g. "compute", "all_gather"
  int rank = 0;                                 ///< the rank whose timeline it belongs to
  std::chrono::steady_clock::time_point begin;  ///< when the work started
  std::chrono::steady_clock::time_point end;    ///< when the work finished
};

/// Where a layer reports metrics and timeline spans; implementations must be thread-safe.
class Telemetry {
 public:
  virtual ~Telemetry() = default;
  /// Instruments are created once and then updated on hot paths; the returned reference lives as
  /// long as the Telemetry. Thread-safe.
  virtual Counter& counter(std::string_view name, std::string_view help, const Labels& labels) = 0;
  /// Like counter(), for a gauge.
  virtual Gauge& gauge(std::string_view name, std::string_view help, const Labels& labels) = 0;
  /// Like counter(), for a histogram with the given bucket upper bounds.
  virtual Histogram& histogram(std::string_view name, std::string_view help, const Labels& labels,
                               std::span<const double> buckets) = 0;
  /// Records one finished span on the timeline. Thread-safe.
  virtual void span(Span span) = 0;
  /// Whether spans are wanted; when false, callers may skip timing work for span().
  virtual bool tracing() const noexcept { return false; }  // spans wanted? lets callers skip timing
};

/// The default Telemetry: hands out instruments that ignore updates and drops spans.
class NoopTelemetry final : public Telemetry {
  struct Noop final : Counter, Gauge, Histogram {
    void add(double) override {}
    void set(double) override {}
    void observe(double) override {}
  };

 public:
  /// A counter that ignores add().
  Counter& counter(std::string_view, std::string_view, const Labels&) override { return noop_; }
  /// A gauge that ignores set().
  Gauge& gauge(std::string_view, std::string_view, const Labels&) override { return noop_; }
  /// A histogram that ignores observe().
  Histogram& histogram(std::string_view, std::string_view, const Labels&, std::span<const double>) override {
    return noop_;
  }
  /// Drops the span.
  void span(Span) override {}

 private:
  Noop noop_;
};

}  // namespace coshard
