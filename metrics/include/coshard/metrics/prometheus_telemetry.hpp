#pragma once
// Telemetry backed by a prometheus-cpp registry; spans go to a Timeline.
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "coshard/metrics/timeline.hpp"
#include "coshard/runtime/telemetry.hpp"

namespace prometheus {
class Registry;
}

namespace coshard::metrics {

/// The Telemetry of metrics/: instruments in a prometheus-cpp registry (what an Exporter serves),
/// spans handed to an optional Timeline. Thread-safe.
class PrometheusTelemetry final : public Telemetry {
 public:
  /// `constant_labels` (e.g. rank, local_rank) are added to every series.
  explicit PrometheusTelemetry(Labels constant_labels = {}, Timeline* timeline = nullptr);
  ~PrometheusTelemetry() override;
  PrometheusTelemetry(const PrometheusTelemetry&) = delete;
  PrometheusTelemetry& operator=(const PrometheusTelemetry&) = delete;

  /// Finds or creates the series `name` with `labels` plus the constant labels; the same series
  /// is handed out again. A name registered before with another type throws
  /// Error(invalid_argument).
  Counter& counter(std::string_view name, std::string_view help, const Labels& labels) override;
  /// Like counter(), for a gauge.
  Gauge& gauge(std::string_view name, std::string_view help, const Labels& labels) override;
  /// Like counter(), for a histogram with the given bucket upper bounds.
  Histogram& histogram(std::string_view name, std::string_view help, const Labels& labels,
                       std::span<const double> buckets) override;
  /// Adds the span to the Timeline; drops it when there is none.
  void span(Span span) override;
  /// True when a Timeline was given.
  bool tracing() const noexcept override { return timeline_ != nullptr; }

  /// The registry the instruments live in, for an Exporter to serve.
  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }
  /// The text exposition format, as /metrics serves it.
  std::string serialize() const;

 private:
  struct Instruments;
  std::shared_ptr<prometheus::Registry> registry_;
  Labels constant_labels_;
  Timeline* timeline_;
  std::mutex m_;
  std::unique_ptr<Instruments> instruments_;
};

}  // namespace coshard::metrics
