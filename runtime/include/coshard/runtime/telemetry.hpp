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

using Labels = std::vector<std::pair<std::string, std::string>>;

class Counter {
 public:
  virtual ~Counter() = default;
  virtual void add(double v = 1.0) = 0;  ///< thread-safe
};

class Gauge {
 public:
  virtual ~Gauge() = default;
  virtual void set(double v) = 0;  ///< thread-safe
};

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
  int rank = 0;
  std::chrono::steady_clock::time_point begin;
  std::chrono::steady_clock::time_point end;
};

class Telemetry {
 public:
  virtual ~Telemetry() = default;
  /// Instruments are created once and then updated on hot paths; the returned reference lives as
  /// long as the Telemetry. Thread-safe.
  virtual Counter& counter(std::string_view name, std::string_view help, const Labels& labels) = 0;
  virtual Gauge& gauge(std::string_view name, std::string_view help, const Labels& labels) = 0;
  virtual Histogram& histogram(std::string_view name, std::string_view help, const Labels& labels,
                               std::span<const double> buckets) = 0;
  virtual void span(Span span) = 0;
  virtual bool tracing() const noexcept { return false; }  // spans wanted? lets callers skip timing
};

class NoopTelemetry final : public Telemetry {
  struct Noop final : Counter, Gauge, Histogram {
    void add(double) override {}
    void set(double) override {}
    void observe(double) override {}
  };

 public:
  Counter& counter(std::string_view, std::string_view, const Labels&) override { return noop_; }
  Gauge& gauge(std::string_view, std::string_view, const Labels&) override { return noop_; }
  Histogram& histogram(std::string_view, std::string_view, const Labels&, std::span<const double>) override {
    return noop_;
  }
  void span(Span) override {}

 private:
  Noop noop_;
};

}  // namespace coshard
