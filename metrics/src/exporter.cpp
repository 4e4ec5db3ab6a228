#include "coshard/metrics/exporter.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <prometheus/collectable.h>
#include <prometheus/exposer.h>
#include <prometheus/metric_family.h>
#include <prometheus/registry.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "coshard/runtime/error.hpp"
#include "coshard/runtime/unique_fd.hpp"

namespace coshard::metrics {
namespace {

// civetweb only says "null context when constructing CivetServer": find the reason by binding
// the same address ourselves (IPv4 literals; anything else gets the generic reason).
std::string why_not_bindable(const std::string& address, std::uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  if (::inet_pton(AF_INET, address.c_str(), &a.sin_addr) != 1) {
    return "the address is not an IPv4 literal this host has, or the port is in use";
  }
  const UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) return "cannot open a socket";
  const int err = ::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 ? 0 : errno;
  if (err == EADDRINUSE) return "port " + std::to_string(port) + " is already in use";
  if (err == EADDRNOTAVAIL) return "address " + address + " is not an address of this host";
  if (err == EACCES) return "binding port " + std::to_string(port) + " needs privileges";
  if (err != 0) return std::strerror(err);
  return "the server could not start (the port was busy a moment ago)";
}

// A collectable that contributes nothing and runs a function: the Exposer collects in the order
// of registration, so registered before the registry it runs right before the registry is read.
class ScrapeHook final : public prometheus::Collectable {
 public:
  explicit ScrapeHook(std::function<void()> f) : f_(std::move(f)) {}
  std::vector<prometheus::MetricFamily> Collect() const override {
    try {
      f_();
    } catch (...) {
      // a scrape serves what it has rather than failing
    }
    return {};
  }

 private:
  std::function<void()> f_;
};

}  // namespace

namespace detail {
int thread_stack_floor_linked();
}  // namespace detail

namespace {
constexpr int kServeThreads = 16;
constexpr std::chrono::milliseconds kRequestTimeout{2000};
}  // namespace

Exporter::Exporter(std::shared_ptr<prometheus::Registry> registry, const std::string& bind_address,
                   std::uint16_t port, std::function<void()> before_scrape)
    : bind_(bind_address) {
  (void)detail::thread_stack_floor_linked();  // keeps the civetweb stack fix in static links
  const std::string where = bind_address + ":" + std::to_string(port);
  // civetweb's builds differ in IPv6 support, and url() writes no brackets: one behaviour for all.
  if (bind_address.find(':') != std::string::npos) {
    throw Error(Errc::bad_config, "cannot serve metrics on " + bind_address + ": the metrics endpoint serves IPv4 only; "
                                  "give an IPv4 address with --metrics-bind (0.0.0.0 for every interface, 127.0.0.1 "
                                  "for this host only)");
  }
  try {
    // civetweb gives each connection a thread until its request is read: with prometheus-cpp's
    // two, two clients trickling a request (or idle) shut every scrape out. kServeThreads hold
    // that many such clients while scrapes still find a thread, and each waits kRequestTimeout
    // at most for a request it cannot finish.
    exposer_ = std::make_unique<prometheus::Exposer>(std::vector<std::string>{
        "listening_ports", where, "num_threads", std::to_string(kServeThreads), "request_timeout_ms",
        std::to_string(kRequestTimeout.count())});
  } catch (const std::exception& e) {
    throw Error(Errc::io, "cannot serve metrics on " + where + ": " + why_not_bindable(bind_address, port) +
                              ". Choose another port with --metrics-port (0 picks a free one) or another "
                              "--metrics-bind address");
  }
  if (before_scrape) {
    hook_ = std::make_shared<ScrapeHook>(std::move(before_scrape));
    exposer_->RegisterCollectable(hook_);
  }
  exposer_->RegisterCollectable(registry);
  auto ports = exposer_->GetListeningPorts();
  port_ = ports.empty() ? port : static_cast<std::uint16_t>(ports.front());
}

Exporter::~Exporter() = default;

std::string Exporter::url() const { return "http://" + bind_ + ":" + std::to_string(port_) + "/metrics"; }

}  // namespace coshard::metrics
