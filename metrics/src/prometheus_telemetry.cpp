#include "coshard/metrics/prometheus_telemetry.hpp"

#include <deque>
#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>
#include <variant>

#include "coshard/runtime/error.hpp"

namespace coshard::metrics {
namespace {

struct CounterAdapter final : Counter {
  explicit CounterAdapter(prometheus::Counter& counter) : c(counter) {}
  void add(double v) override { c.Increment(v); }
  prometheus::Counter& c;
};
struct GaugeAdapter final : Gauge {
  explicit GaugeAdapter(prometheus::Gauge& gauge) : g(gauge) {}
  void set(double v) override { g.Set(v); }
  prometheus::Gauge& g;
};
struct HistogramAdapter final : Histogram {
  explicit HistogramAdapter(prometheus::Histogram& histogram) : h(histogram) {}
  void observe(double v) override { h.Observe(v); }
  prometheus::Histogram& h;
};

std::map<std::string, std::string> to_map(const Labels& constant, const Labels& labels) {
  std::map<std::string, std::string> m(constant.begin(), constant.end());
  for (const auto& [k, v] : labels) m[k] = v;
  return m;
}

std::string key_of(std::string_view name, const std::map<std::string, std::string>& labels) {
  std::string k(name);
  for (const auto& [l, v] : labels) k += "\x1f" + l + "=" + v;
  return k;
}

}  // namespace

struct PrometheusTelemetry::Instruments {
  using Family = std::variant<prometheus::Family<prometheus::Counter>*, prometheus::Family<prometheus::Gauge>*,
                              prometheus::Family<prometheus::Histogram>*>;
  std::map<std::string, Family, std::less<>> families;
  std::map<std::string, Counter*> counters;
  std::map<std::string, Gauge*> gauges;
  std::map<std::string, Histogram*> histograms;
  std::deque<CounterAdapter> counter_store;
  std::deque<GaugeAdapter> gauge_store;
  std::deque<HistogramAdapter> histogram_store;
};

PrometheusTelemetry::PrometheusTelemetry(Labels constant_labels, Timeline* timeline)
    : registry_(std::make_shared<prometheus::Registry>()),
      constant_labels_(std::move(constant_labels)),
      timeline_(timeline),
      instruments_(std::make_unique<Instruments>()) {}

PrometheusTelemetry::~PrometheusTelemetry() = default;

namespace {
template <class F>
F* family_for(std::map<std::string, std::variant<prometheus::Family<prometheus::Counter>*,
                                                  prometheus::Family<prometheus::Gauge>*,
                                                  prometheus::Family<prometheus::Histogram>*>,
                        std::less<>>& families,
              std::string_view name, auto build) {
  auto it = families.find(name);
  if (it == families.end()) it = families.emplace(std::string(name), &build()).first;
  if (auto** f = std::get_if<F*>(&it->second)) return *f;
  throw Error(Errc::invalid_argument, "metric '" + std::string(name) + "' was registered before with another type");
}
}  // namespace

Counter& PrometheusTelemetry::counter(std::string_view name, std::string_view help, const Labels& labels) {
  auto lm = to_map(constant_labels_, labels);
  std::lock_guard lock(m_);
  auto key = key_of(name, lm);
  if (auto it = instruments_->counters.find(key); it != instruments_->counters.end()) return *it->second;
  auto* fam = family_for<prometheus::Family<prometheus::Counter>>(instruments_->families, name, [&]() -> auto& {
    return prometheus::BuildCounter().Name(std::string(name)).Help(std::string(help)).Register(*registry_);
  });
  auto& a = instruments_->counter_store.emplace_back(fam->Add(lm));
  instruments_->counters.emplace(key, &a);
  return a;
}

Gauge& PrometheusTelemetry::gauge(std::string_view name, std::string_view help, const Labels& labels) {
  auto lm = to_map(constant_labels_, labels);
  std::lock_guard lock(m_);
  auto key = key_of(name, lm);
  if (auto it = instruments_->gauges.find(key); it != instruments_->gauges.end()) return *it->second;
  auto* fam = family_for<prometheus::Family<prometheus::Gauge>>(instruments_->families, name, [&]() -> auto& {
    return prometheus::BuildGauge().Name(std::string(name)).Help(std::string(help)).Register(*registry_);
  });
  auto& a = instruments_->gauge_store.emplace_back(fam->Add(lm));
  instruments_->gauges.emplace(key, &a);
  return a;
}

Histogram& PrometheusTelemetry::histogram(std::string_view name, std::string_view help, const Labels& labels,
                                          std::span<const double> buckets) {
  auto lm = to_map(constant_labels_, labels);
  std::lock_guard lock(m_);
  auto key = key_of(name, lm);
  if (auto it = instruments_->histograms.find(key); it != instruments_->histograms.end()) return *it->second;
  auto* fam = family_for<prometheus::Family<prometheus::Histogram>>(instruments_->families, name, [&]() -> auto& {
    return prometheus::BuildHistogram().Name(std::string(name)).Help(std::string(help)).Register(*registry_);
  });
  auto& a = instruments_->histogram_store.emplace_back(
      fam->Add(lm, prometheus::Histogram::BucketBoundaries(buckets.begin(), buckets.end())));
  instruments_->histograms.emplace(key, &a);
  return a;
}

void PrometheusTelemetry::span(Span span) {
  if (timeline_) timeline_->add(std::move(span));
}

std::string PrometheusTelemetry::serialize() const {
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

}  // namespace coshard::metrics
