#pragma once
// Serves a registry over HTTP at /metrics (prometheus-cpp's Exposer, a service with its own
// threads). Port 0 picks a free port; a port in use is a clear error naming it.
#include <cstdint>
#include <memory>
#include <string>

namespace prometheus {
class Exposer;
class Registry;
}  // namespace prometheus

namespace coshard::metrics {

class Exporter {
 public:
  Exporter(std::shared_ptr<prometheus::Registry> registry, const std::string& bind_address, std::uint16_t port);
  ~Exporter();
  Exporter(const Exporter&) = delete;
  Exporter& operator=(const Exporter&) = delete;

  std::uint16_t port() const noexcept { return port_; }
  std::string url() const;

 private:
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::string bind_;
  std::uint16_t port_ = 0;
};

}  // namespace coshard::metrics
