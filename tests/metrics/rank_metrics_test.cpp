#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <regex>
#include <string>

#include "coshard/metrics/build_info.hpp"
#include "coshard/metrics/rank_metrics.hpp"
#include "coshard/metrics/timeline.hpp"
#include "coshard/runtime/error.hpp"
#include "coshard/launch/rendezvous.hpp"
#include "metrics/catalogue.hpp"
#include "support/loopback.hpp"

using namespace coshard;
using namespace coshard::metrics;

namespace {

std::string scrape(std::uint16_t port) {
  return coshard::testing::loopback_exchange(port, "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
}

RankMetrics::Options on_port(int rank, int local_rank, std::uint16_t port) {
  RankMetrics::Options o;
  o.rank = rank;
  o.local_rank = local_rank;
  o.port = port;
  return o;
}

}  // namespace

TEST(RankMetrics, DefaultsToPort9400OnLoopback) {
  RankMetrics::Options o;
  EXPECT_EQ(o.port, 9400);
  EXPECT_EQ(o.bind_address, "127.0.0.1");
}

TEST(RankMetrics, PortZeroPicksAFreePortAndReportsIt) {
  RankMetrics m(on_port(3, 1, 0));
  EXPECT_EQ(m.state(), RankMetrics::State::stopped);
  EXPECT_EQ(m.port(), 0);
  m.start();
  EXPECT_TRUE(m.serving());
  ASSERT_NE(m.port(), 0);
  EXPECT_EQ(m.url(), "http://127.0.0.1:" + std::to_string(m.port()) + "/metrics");
  auto body = scrape(m.port());
  EXPECT_NE(body.find("200 OK"), std::string::npos) << body;
  EXPECT_NE(body.find("coshard_build_info{"), std::string::npos) << body;
  EXPECT_NE(body.find("local_rank=\"1\""), std::string::npos) << body;
  EXPECT_NE(body.find("rank=\"3\""), std::string::npos) << body;
}

TEST(RankMetrics, ServesOnBasePortPlusLocalRank) {
  const std::uint16_t target = coshard::testing::free_loopback_port();
  RankMetrics m(on_port(5, 2, static_cast<std::uint16_t>(target - 2)));
  m.start();
  EXPECT_EQ(m.port(), target);
  EXPECT_NE(scrape(target).find("coshard_build_info"), std::string::npos);
}

TEST(RankMetrics, PortInUseIsAnErrorNamingThePortAndTheFlag) {
  RankMetrics first(on_port(0, 0, 0));
  first.start();
  RankMetrics second(on_port(1, 1, static_cast<std::uint16_t>(first.port() - 1)));
  try {
    second.start();
    FAIL() << "expected the port to be in use";
  } catch (const Error& e) {
    const std::string w = e.what();
    EXPECT_EQ(e.code(), Errc::io);
    EXPECT_NE(w.find(std::to_string(first.port())), std::string::npos) << w;
    EXPECT_NE(w.find("already in use"), std::string::npos) << w;
    EXPECT_NE(w.find("--metrics-port"), std::string::npos) << w;
    EXPECT_NE(w.find("local rank"), std::string::npos) << w;
    EXPECT_EQ(e.context().rank, 1);
  }
  EXPECT_FALSE(second.serving());
}

TEST(RankMetrics, PortPlusLocalRankAbove65535IsBadConfig) {
  RankMetrics m(on_port(1, 1, 65535));
  try {
    m.start();
    FAIL() << "expected a bad_config error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::bad_config);
    EXPECT_NE(std::string(e.what()).find("--metrics-port"), std::string::npos) << e.what();
  }
}

TEST(RankMetrics, AnAddressThatIsNotLocalIsNamed) {
  RankMetrics::Options o = on_port(0, 0, 0);
  o.bind_address = "203.0.113.77";  // TEST-NET-3: documentation range, never a local address
  RankMetrics m(o);
  try {
    m.start();
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("203.0.113.77"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--metrics-bind"), std::string::npos) << e.what();
  }
}

// An IPv6 address was told "not an IPv4 literal this host has, or the port is in use".
TEST(RankMetrics, AnIpv6AddressIsRefusedSayingTheEndpointServesIpv4) {
  for (const char* address : {"::1", "[::1]"}) {
    RankMetrics::Options o = on_port(0, 0, 0);
    o.bind_address = address;
    RankMetrics m(o);
    try {
      m.start();
      FAIL() << "expected an error for " << address;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("the metrics endpoint serves IPv4 only; give an IPv4 address"),
                std::string::npos)
          << e.what();
    }
  }
}

TEST(RankMetrics, StopClosesTheEndpointAndStartOpensItAgain) {
  RankMetrics m(on_port(0, 0, 0));
  m.start();
  m.start();  // no-op
  auto& c = m.telemetry().counter("coshard_tokens_total", "tokens", {});
  c.add(5);
  const auto port = m.port();
  m.stop();
  m.stop();  // idempotent
  EXPECT_FALSE(m.serving());
  EXPECT_EQ(m.port(), 0);
  EXPECT_EQ(m.url(), "");
  EXPECT_EQ(scrape(port), "connect failed");
  c.add(2);  // instruments outlive stop()
  m.start();
  auto body = scrape(m.port());
  EXPECT_NE(body.find("coshard_tokens_total{local_rank=\"0\",rank=\"0\"} 7"), std::string::npos) << body;
}

TEST(RankMetrics, BuildInfoCarriesVersionAndLibraries) {
  const auto info = build_info();
  EXPECT_EQ(info.version, COSHARD_PROJECT_VERSION);
  EXPECT_EQ(info.wire_protocol, std::to_string(launch::kWireProtocol));
  EXPECT_TRUE(std::regex_match(info.ucx, std::regex(R"(\d+\.\d+\.\d+.*)"))) << info.ucx;
#ifdef COSHARD_HAVE_CUDA
  EXPECT_TRUE(std::regex_match(info.cuda, std::regex(R"(\d+\.\d+)"))) << info.cuda;
  EXPECT_TRUE(std::regex_match(info.nccl, std::regex(R"(\d+\.\d+\.\d+)"))) << info.nccl;
#else
  EXPECT_EQ(info.cuda, "none");
  EXPECT_EQ(info.nccl, "none");
#endif
  RankMetrics m(on_port(0, 0, 0));
  const auto text = m.telemetry().serialize();
  const std::string series = "coshard_build_info{cuda=\"" + info.cuda + "\",local_rank=\"0\",nccl=\"" + info.nccl +
                             "\",rank=\"0\",ucx=\"" + info.ucx + "\",version=\"" + info.version +
                             "\",wire_protocol=\"" + info.wire_protocol + "\"} 1";
  EXPECT_NE(text.find(series), std::string::npos) << text;
}

TEST(RankMetrics, AllocatorGaugesFollowTheStats) {
  RankMetrics m(on_port(2, 0, 0));
  Allocator alloc(cpu_memory());
  {
    auto a = alloc.allocate(3 << 20);
    auto b = alloc.allocate(1 << 20);
    m.update(alloc);
  }
  auto fams = coshard::testing::parse_exposition(m.telemetry().serialize());
  const auto stats = alloc.stats();
  ASSERT_EQ(fams["coshard_allocator_peak_bytes"].samples.size(), 1u);
  EXPECT_EQ(fams["coshard_allocator_peak_bytes"].samples[0].first.at("device"), "cpu:0");
  EXPECT_GE(fams["coshard_allocator_peak_bytes"].samples[0].second, double(4 << 20));
  EXPECT_GE(fams["coshard_allocator_allocated_bytes"].samples[0].second, double(4 << 20));
  m.update(alloc);  // both buffers freed since
  fams = coshard::testing::parse_exposition(m.telemetry().serialize());
  EXPECT_EQ(fams["coshard_allocator_allocated_bytes"].samples[0].second, double(stats.allocated_bytes));
  EXPECT_EQ(fams["coshard_allocator_allocated_bytes"].samples[0].second, 0.0);
  EXPECT_EQ(fams["coshard_allocator_reserved_bytes"].samples[0].second, double(stats.reserved_bytes));
  EXPECT_EQ(fams["coshard_allocator_peak_bytes"].samples[0].second, double(stats.peak_allocated_bytes));
  m.update(AllocatorStats{.allocated_bytes = 1, .reserved_bytes = 2, .peak_allocated_bytes = 3}, "cuda:1");
  fams = coshard::testing::parse_exposition(m.telemetry().serialize());
  EXPECT_EQ(fams["coshard_allocator_reserved_bytes"].samples.size(), 2u);
}

// The allocated bytes a scrape of `port` serves (the body of the HTTP reply, parsed).
double served_allocated(std::uint16_t port) {
  const auto response = scrape(port);
  const auto fams = coshard::testing::parse_exposition(response.substr(response.find("\r\n\r\n") + 4));
  const auto it = fams.find("coshard_allocator_allocated_bytes");
  return it == fams.end() || it->second.samples.empty() ? -1 : it->second.samples[0].second;
}

TEST(RankMetrics, AWatchedAllocatorIsReadAtEveryScrapeAndItsLastFiguresStay) {
  RankMetrics m(on_port(0, 0, 0));
  m.start();
  Allocator alloc(cpu_memory());
  auto a = alloc.allocate(1 << 20);
  {
    auto watching = m.watch(alloc);
    EXPECT_EQ(served_allocated(m.port()), double(alloc.stats().allocated_bytes));
    auto b = alloc.allocate(2 << 20);  // no update() call: the scrape reads it
    EXPECT_EQ(served_allocated(m.port()), double(alloc.stats().allocated_bytes));
    EXPECT_GE(served_allocated(m.port()), double(3 << 20));
    EXPECT_THROW((void)m.watch(alloc), Error);
  }
  const double last = served_allocated(m.port());
  EXPECT_EQ(last, double(alloc.stats().allocated_bytes));  // b was freed before the watch ended
  auto c = alloc.allocate(4 << 20);
  EXPECT_EQ(served_allocated(m.port()), last) << "no longer watched: the figures stay as they were";
}

TEST(RankMetrics, SpansGoToTheTimeline) {
  Timeline tl;
  RankMetrics::Options o = on_port(1, 0, 0);
  o.timeline = &tl;
  RankMetrics m(o);
  EXPECT_TRUE(m.telemetry().tracing());
  auto t0 = std::chrono::steady_clock::now();
  m.telemetry().span({"fwd h.0", "forward", "compute", 1, t0, t0 + std::chrono::milliseconds(1)});
  EXPECT_EQ(tl.size(), 1u);
}
