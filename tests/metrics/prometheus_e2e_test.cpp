// A real Prometheus server scrapes two ranks' RankMetrics exporters over loopback; its HTTP API
// must show each rank's series and the counters growing.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <set>
#include <stop_token>
#include <string>
#include <thread>

#include "coshard/metrics/rank_metrics.hpp"
#include "support/prometheus_server.hpp"

using namespace coshard;
using namespace std::chrono_literals;
using coshard::testing::by_rank;
using coshard::testing::PrometheusServer;
using nlohmann::json;

namespace {

// A stand-in for one rank's training loop: tokens and all-gather bytes grow every 50 ms.
void produce(std::stop_token stop, metrics::RankMetrics& m) {
  auto& tokens = m.telemetry().counter("coshard_tokens_total", "Tokens trained on", {});
  auto& bytes = m.telemetry().counter("coshard_collective_bytes_total", "Bytes per rank moved by collectives",
                                      {{"op", "all_gather"}, {"transport", "ucx"}});
  while (!stop.stop_requested()) {
    tokens.add(512);
    bytes.add(1 << 20);
    std::this_thread::sleep_for(50ms);
  }
}

}  // namespace

TEST(PrometheusE2E, ScrapesTwoRanksAndSeesTheirCountersGrow) {
  ASSERT_FALSE(coshard::testing::find_prometheus().empty())
      << "Debian's prometheus is not installed: scripts/setup installs it (this test must not skip in CI)";
  metrics::RankMetrics rank0({.rank = 0, .local_rank = 0, .port = 0, .bind_address = "127.0.0.1", .timeline = nullptr});
  metrics::RankMetrics rank1({.rank = 1, .local_rank = 1, .port = 0, .bind_address = "127.0.0.1", .timeline = nullptr});
  rank0.start();
  rank1.start();
  std::jthread p0(produce, std::ref(rank0));  // destroyed (stopped, joined) after the server below
  std::jthread p1(produce, std::ref(rank1));

  PrometheusServer prom(std::vector<std::string>{"127.0.0.1:" + std::to_string(rank0.port()),
                                                 "127.0.0.1:" + std::to_string(rank1.port())});
  const auto deadline = std::chrono::steady_clock::now() + 25s;
  auto left = [&] {
    return std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
  };
  auto both_ranks = [](const json& r) {
    auto v = by_rank(r);
    return v.count("0") && v.count("1");
  };

  auto up = prom.wait_for("up{job=\"coshard\"} == 1", [](const json& r) { return r.size() == 2; }, left());
  ASSERT_EQ(up.size(), 2u) << "targets: " << prom.targets_report() << "\nlog:\n" << prom.log();

  const std::string tokens_q = "coshard_tokens_total{job=\"coshard\"}";
  const std::string bytes_q = "coshard_collective_bytes_total{job=\"coshard\",op=\"all_gather\",transport=\"ucx\"}";
  const auto tokens_first = by_rank(prom.wait_for(tokens_q, both_ranks, left()));
  const auto bytes_first = by_rank(prom.wait_for(bytes_q, both_ranks, left()));
  ASSERT_EQ(tokens_first.size(), 2u) << prom.targets_report();
  ASSERT_EQ(bytes_first.size(), 2u) << prom.targets_report();

  auto grew_from = [](const std::map<std::string, double>& first) {
    return [first](const json& r) {
      auto now = by_rank(r);
      for (const auto& [rank, v] : first) {
        if (!now.count(rank) || now[rank] <= v) return false;
      }
      return true;
    };
  };
  const auto tokens_later = by_rank(prom.wait_for(tokens_q, grew_from(tokens_first), left()));
  const auto bytes_later = by_rank(prom.wait_for(bytes_q, grew_from(bytes_first), left()));
  for (const char* rank : {"0", "1"}) {
    EXPECT_GT(tokens_later.at(rank), tokens_first.at(rank)) << "rank " << rank << "'s tokens did not grow";
    EXPECT_GT(bytes_later.at(rank), bytes_first.at(rank)) << "rank " << rank << "'s all-gather bytes did not grow";
  }

  // Constant labels and build info arrive as served.
  auto info = prom.query("coshard_build_info{job=\"coshard\"}");
  ASSERT_EQ(info.size(), 2u);
  std::set<std::string> local_ranks;
  for (const auto& s : info) {
    local_ranks.insert(s["metric"]["local_rank"].get<std::string>());
    EXPECT_EQ(s["metric"]["version"], rank0.build_info().version);
    EXPECT_EQ(s["metric"]["ucx"], rank0.build_info().ucx);
    EXPECT_EQ(s["metric"]["wire_protocol"], rank0.build_info().wire_protocol);
  }
  EXPECT_EQ(local_ranks, (std::set<std::string>{"0", "1"}));
  // A rate over the scraped samples is positive: what the dashboard's throughput panel draws.
  auto rate = by_rank(prom.query("rate(coshard_tokens_total{job=\"coshard\"}[5s])"));
  EXPECT_GT(rate["0"], 0.0);
  EXPECT_GT(rate["1"], 0.0);

  prom.stop();
  EXPECT_EQ(coshard::testing::http_request(prom.port(), "GET", "/-/ready", 1).status, 0) << "the server still answers";
}
