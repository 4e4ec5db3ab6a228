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

class PrometheusTelemetry final : public Telemetry {
 public:
  /// `constant_labels` (e.g. rank, local_rank) are added to every series.
  explicit PrometheusTelemetry(Labels constant_labels = {}, Timeline* timeline = nullptr);
  ~PrometheusTelemetry() override;
  PrometheusTelemetry(const PrometheusTelemetry&) = delete;
  PrometheusTelemetry& operator=(const PrometheusTelemetry&) = delete;

  Counter& counter(std::string_view name, std::string_view help, const Labels& labels) override;
  Gauge& gauge(std::string_view name, std::string_view help, const Labels& labels) override;
  Histogram& histogram(std::string_view name, std::string_view help, const Labels& labels,
                       std::span<const double> buckets) override;
  void span(Span span) override;
  bool tracing() const noexcept override { return timeline_ != nullptr; }

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
