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
  std::map<std::string, std::variant<prometheus::Family<prometheus::Counter>*, prometheus::Family<prometheus::Gauge>*,
                                     prometheus::Family<prometheus::Histogram>*>,
           std::less<>>
      families;
  std::map<std::string, CounterAdapter*> counters;
  std::map<std::string, GaugeAdapter*> gauges;
  std::map<std::string, HistogramAdapter*> histograms;
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

using AnyFamily = std::variant<prometheus::Family<prometheus::Counter>*, prometheus::Family<prometheus::Gauge>*,
                               prometheus::Family<prometheus::Histogram>*>;

// Finds or creates the instrument `name`+`labels`: one prometheus family per name (a name
// registered with another type is an error), one adapter per series, handed out again on reuse.
template <class Metric, class Adapter, class Builder, class... AddArgs>
Adapter& instrument(std::map<std::string, AnyFamily, std::less<>>& families, std::map<std::string, Adapter*>& index,
                    std::deque<Adapter>& store, prometheus::Registry& registry, std::string_view name,
                    std::string_view help, const std::map<std::string, std::string>& labels, Builder build,
                    AddArgs&&... add_args) {
  auto key = key_of(name, labels);
  if (auto it = index.find(key); it != index.end()) return *it->second;
  auto fit = families.find(name);
  if (fit == families.end()) {
    auto& fam = build().Name(std::string(name)).Help(std::string(help)).Register(registry);
    fit = families.emplace(std::string(name), &fam).first;
  }
  auto** fam = std::get_if<prometheus::Family<Metric>*>(&fit->second);
  if (!fam) {
    throw Error(Errc::invalid_argument, "metric '" + std::string(name) + "' was registered before with another type");
  }
  auto& a = store.emplace_back((*fam)->Add(labels, std::forward<AddArgs>(add_args)...));
  index.emplace(key, &a);
  return a;
}

}  // namespace

Counter& PrometheusTelemetry::counter(std::string_view name, std::string_view help, const Labels& labels) {
  std::lock_guard lock(m_);
  auto& in = *instruments_;
  return instrument<prometheus::Counter>(in.families, in.counters, in.counter_store, *registry_, name, help,
                                         to_map(constant_labels_, labels), [] { return prometheus::BuildCounter(); });
}

Gauge& PrometheusTelemetry::gauge(std::string_view name, std::string_view help, const Labels& labels) {
  std::lock_guard lock(m_);
  auto& in = *instruments_;
  return instrument<prometheus::Gauge>(in.families, in.gauges, in.gauge_store, *registry_, name, help,
                                       to_map(constant_labels_, labels), [] { return prometheus::BuildGauge(); });
}

Histogram& PrometheusTelemetry::histogram(std::string_view name, std::string_view help, const Labels& labels,
                                          std::span<const double> buckets) {
  std::lock_guard lock(m_);
  auto& in = *instruments_;
  return instrument<prometheus::Histogram>(in.families, in.histograms, in.histogram_store, *registry_, name, help,
                                           to_map(constant_labels_, labels),
                                           [] { return prometheus::BuildHistogram(); },
                                           prometheus::Histogram::BucketBoundaries(buckets.begin(), buckets.end()));
}

void PrometheusTelemetry::span(Span span) {
  if (timeline_) timeline_->add(std::move(span));
}

std::string PrometheusTelemetry::serialize() const {
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

}  // namespace coshard::metrics
