#include "coshard/metrics/exporter.hpp"

#include <prometheus/exposer.h>
#include <prometheus/registry.h>

#include "coshard/runtime/error.hpp"

namespace coshard::metrics {

Exporter::Exporter(std::shared_ptr<prometheus::Registry> registry, const std::string& bind_address,
                   std::uint16_t port)
    : bind_(bind_address) {
  const std::string where = bind_address + ":" + std::to_string(port);
  try {
    exposer_ = std::make_unique<prometheus::Exposer>(where, 2);
  } catch (const std::exception& e) {
    throw Error(Errc::io, "cannot serve metrics on " + where + " (" + e.what() +
                              "): the port is in use or the address is not local. Choose another port with "
                              "--metrics-port (0 picks a free one) or another --metrics-bind address");
  }
  exposer_->RegisterCollectable(registry);
  auto ports = exposer_->GetListeningPorts();
  port_ = ports.empty() ? port : static_cast<std::uint16_t>(ports.front());
}

Exporter::~Exporter() = default;

std::string Exporter::url() const { return "http://" + bind_ + ":" + std::to_string(port_) + "/metrics"; }

}  // namespace coshard::metrics
