#include <gtest/gtest.h>


#include <set>
#include <nlohmann/json.hpp>
#include <string>

#include "coshard/metrics/exporter.hpp"
#include "coshard/metrics/prometheus_telemetry.hpp"
#include "coshard/metrics/timeline.hpp"
#include "coshard/runtime/error.hpp"
#include "support/loopback.hpp"

using namespace coshard;
using namespace coshard::metrics;

namespace {

// A real HTTP GET over loopback, as Prometheus would scrape.
std::string http_get(std::uint16_t port, const std::string& path) {
  return coshard::testing::loopback_exchange(port, "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
}

TEST(PrometheusTelemetry, InstrumentsAppearWithConstantLabels) {
  PrometheusTelemetry t(Labels{{"rank", "3"}});
  auto& c = t.counter("coshard_test_ops_total", "ops", {{"op", "all_gather"}});
  c.add(2);
  t.counter("coshard_test_ops_total", "ops", {{"op", "all_gather"}}).add();  // same series
  t.gauge("coshard_test_loss", "loss", {}).set(1.5);
  const double buckets[] = {0.1, 1.0};
  t.histogram("coshard_test_step_seconds", "step", {}, buckets).observe(0.5);
  auto text = t.serialize();
  EXPECT_NE(text.find("coshard_test_ops_total{op=\"all_gather\",rank=\"3\"} 3"), std::string::npos) << text;
  EXPECT_NE(text.find("coshard_test_loss{rank=\"3\"} 1.5"), std::string::npos) << text;
  EXPECT_NE(text.find("coshard_test_step_seconds_bucket{rank=\"3\",le=\"1\"} 1"), std::string::npos) << text;
  EXPECT_THROW(t.gauge("coshard_test_ops_total", "clash", {}), Error);
}

TEST(Exporter, ServesMetricsOverHttpOnAPickedPort) {
  PrometheusTelemetry t(Labels{{"rank", "0"}});
  t.counter("coshard_test_scrapes_total", "x", {}).add(7);
  Exporter ex(t.registry(), "127.0.0.1", 0);
  ASSERT_NE(ex.port(), 0);
  auto body = http_get(ex.port(), "/metrics");
  EXPECT_NE(body.find("200 OK"), std::string::npos);
  EXPECT_NE(body.find("coshard_test_scrapes_total{rank=\"0\"} 7"), std::string::npos) << body;
}

TEST(Exporter, PortInUseIsAClearError) {
  PrometheusTelemetry t;
  Exporter first(t.registry(), "127.0.0.1", 0);
  try {
    Exporter second(t.registry(), "127.0.0.1", first.port());
    FAIL() << "expected the port to be in use";
  } catch (const Error& e) {
    std::string w = e.what();
    EXPECT_NE(w.find(std::to_string(first.port())), std::string::npos) << w;
    EXPECT_NE(w.find("--metrics-port"), std::string::npos) << w;
  }
}

TEST(Timeline, ChromeTraceIsValidJsonWithOneTrackPerStream) {
  Timeline tl;
  auto t0 = std::chrono::steady_clock::now();
  tl.add({"all_gather h.1", "forward", "all_gather", 1, t0, t0 + std::chrono::milliseconds(2)});
  tl.add({"fwd \"h.0\"", "forward", "compute", 1, t0, t0 + std::chrono::milliseconds(3)});
  tl.add({"fwd h.0", "forward", "compute", 0, t0, t0 + std::chrono::milliseconds(3)});
  auto j = nlohmann::json::parse(tl.chrome_trace_json());
  int spans = 0;
  std::set<std::pair<int, int>> tracks;
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] == "X") {
      ++spans;
      tracks.insert({e["pid"].get<int>(), e["tid"].get<int>()});
      EXPECT_GT(e["dur"].get<double>(), 1000.0);
    }
  }
  EXPECT_EQ(spans, 3);
  EXPECT_EQ(tracks.size(), 3u);
}

TEST(Timeline, IsBounded) {
  Timeline tl(2);
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 5; ++i) tl.add({"x", "c", "s", 0, t0, t0});
  EXPECT_EQ(tl.size(), 2u);
  EXPECT_EQ(tl.dropped(), 3u);
}

}  // namespace
