// e2e: a real Prometheus server scrapes a two-rank gpt2-train run; its HTTP API shows each rank's
// series, the step counter and the collective bytes growing, and the last loss the step log wrote.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "metrics/catalogue.hpp"
#include "support/prometheus_server.hpp"
#include "support/run_command.hpp"

using namespace std::chrono_literals;
using coshard::testing::by_rank;
using coshard::testing::PrometheusServer;
using nlohmann::json;

namespace {

bool port_free(std::uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

}  // namespace

TEST(TrainerE2E, PrometheusScrapesEveryRankOfATrainingRun) {
  ASSERT_FALSE(coshard::testing::find_prometheus().empty())
      << "Debian's prometheus is not installed: scripts/setup installs it (this test must not skip in CI)";
  std::uint16_t base = 0;
  for (int i = 0; i < 20 && !base; ++i) {
    auto p = coshard::testing::free_loopback_port();
    if (p && p < 65535 && port_free(static_cast<std::uint16_t>(p + 1))) base = p;
  }
  ASSERT_NE(base, 0) << "no two free neighbouring ports on loopback";
  PrometheusServer prom(std::vector<std::string>{"127.0.0.1:" + std::to_string(base),
                                                 "127.0.0.1:" + std::to_string(base + 1)});
  const auto dir = std::filesystem::path(::testing::TempDir()) / ("coshard-train-e2e-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string log = (dir / "log.jsonl").string();
  coshard::testing::CommandResult run;
  // 4 micro-batches per step: 400 steps of the tiny model alone took 5 s on a quiet machine, short
  // enough to end between Prometheus's first scrapes and the growth checks below (which then failed).
  std::thread trainer([&] {
    run = coshard::testing::run_command(std::string(COSHARD_RUN_BIN) + " --nproc-per-node 2 -- " + GPT2_TRAIN_BIN +
                                        " --steps 400 --grad-accum 4 --samples 0 --metrics-port " + std::to_string(base) +
                                        " --metrics-linger 6 --log-json " + log);
  });
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  auto left = [&] {
    return std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
  };
  auto both = [](const json& r) { return by_rank(r).size() == 2; };
  const std::string steps_q = "coshard_step_duration_seconds_count{job=\"coshard\"}";
  const std::string bytes_q = "sum by (rank) (coshard_collective_bytes_total{job=\"coshard\",op=\"all_gather\"})";
  const auto steps_first = by_rank(prom.wait_for(steps_q, both, left()));
  const auto bytes_first = by_rank(prom.wait_for(bytes_q, both, left()));
  auto grew = [](std::map<std::string, double> first) {
    return [first](const json& r) {
      auto now = by_rank(r);
      for (const auto& [rank, v] : first) {
        if (!now.count(rank) || now[rank] <= v) return false;
      }
      return now.size() == first.size();
    };
  };
  const auto steps_later = by_rank(prom.wait_for(steps_q, grew(steps_first), left()));
  const auto bytes_later = by_rank(prom.wait_for(bytes_q, grew(bytes_first), left()));
  // Mid-run, every metric of the catalogue is served by every rank (the allocator gauges too:
  // they are read at each scrape, not set once after training).
  for (const char* rank : {"0", "1"}) {
    std::set<std::string> served;
    for (const auto& s : prom.query("count by (__name__) ({job=\"coshard\",rank=\"" + std::string(rank) + "\"})")) {
      served.insert(s["metric"]["__name__"].get<std::string>());
    }
    for (const auto& e : coshard::testing::read_catalogue(std::string(COSHARD_SOURCE_DIR) + "/docs/metrics.md")) {
      if (e.pending) continue;
      EXPECT_TRUE(served.count(e.name) || served.count(e.name + "_count"))
          << e.name << " is not served by rank " << rank << " in the middle of the run";
    }
  }
  // Over the scrapes so far, not at this instant: training may have ended (and freed its memory)
  // between the last wait and this query, which failed a fresh-clone CI run with 0 bytes.
  const auto allocated =
      by_rank(prom.query("max_over_time(coshard_allocator_allocated_bytes{job=\"coshard\"}[5m])"));
  EXPECT_GT(allocated.at("0"), 0) << "the allocator gauges must be live while training";
  trainer.join();
  ASSERT_EQ(run.rc, 0) << run.output;
  ASSERT_EQ(steps_first.size(), 2u) << prom.targets_report() << "\n" << run.output;
  for (const char* rank : {"0", "1"}) {
    EXPECT_GT(steps_later.at(rank), steps_first.at(rank)) << "rank " << rank << "'s step count did not grow";
    EXPECT_GT(bytes_later.at(rank), bytes_first.at(rank)) << "rank " << rank << "'s all-gather bytes did not grow";
  }
  // The step log agrees with the metrics: 400 steps counted, the last loss as served.
  std::ifstream f(log);
  json last;
  int lines = 0;
  for (std::string line; std::getline(f, line); ++lines) last = json::parse(line);
  EXPECT_EQ(lines, 400);
  auto count = by_rank(prom.query("max_over_time(coshard_step_duration_seconds_count{job=\"coshard\"}[1m])"));
  EXPECT_EQ(count["0"], 400) << prom.targets_report();
  auto loss = by_rank(prom.query("last_over_time(coshard_loss{job=\"coshard\"}[1m])"));
  EXPECT_NEAR(loss["0"], last["loss"].get<double>(), 1e-4);
  EXPECT_NEAR(loss["1"], last["loss"].get<double>(), 1e-4);  // every rank holds the mean over ranks
  std::filesystem::remove_all(dir);
}
