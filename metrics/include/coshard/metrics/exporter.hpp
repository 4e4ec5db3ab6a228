#pragma once
// Serves a registry over HTTP at /metrics (prometheus-cpp's Exposer, a service with its own
// threads). Port 0 picks a free port; a port in use is a clear error naming it.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace prometheus {
class Collectable;
class Exposer;
class Registry;
}  // namespace prometheus

namespace coshard::metrics {

/// Serves one Prometheus registry over HTTP at /metrics, on threads of its own, while it lives.
/// RankMetrics uses it; use it directly for an endpoint without ranks.
class Exporter {
 public:
  /// Starts serving at once. Port 0 picks a free port; throws Error(io) naming the address, the
  /// port and why when it cannot bind. `before_scrape`, when set, runs on the server's thread at
  /// every scrape before the registry is read: gauges read at scrape time are set there.
  Exporter(std::shared_ptr<prometheus::Registry> registry, const std::string& bind_address, std::uint16_t port,
           std::function<void()> before_scrape = {});
  ~Exporter();
  Exporter(const Exporter&) = delete;
  Exporter& operator=(const Exporter&) = delete;

  /// The port it listens on: the one picked when 0 was asked.
  std::uint16_t port() const noexcept { return port_; }
  /// "http://ADDRESS:PORT/metrics", with the real port.
  std::string url() const;

 private:
  std::shared_ptr<prometheus::Collectable> hook_;  // runs before_scrape; registered first
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::string bind_;
  std::uint16_t port_ = 0;
};

}  // namespace coshard::metrics
