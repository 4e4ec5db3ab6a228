#pragma once
// The Prometheus series of a UCX communicator's operations (docs/metrics.md): durations, bytes,
// bus bandwidth and errors per operation, and how each ran (ring, direct, hierarchical, p2p).
#include <array>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "coshard/runtime/error.hpp"
#include "coshard/runtime/telemetry.hpp"
#include "coshard/transport/communicator.hpp"

namespace coshard::transport::detail {

class OpMetrics {
 public:
  explicit OpMetrics(Telemetry& telemetry);
  // `info` ran on `size` ranks by `algorithm` and took `seconds`. Stream thread only.
  void finished(const OpInfo& info, int size, double seconds, const std::string& algorithm);
  // An operation failed with `e`.
  void failed(const Error& e);

 private:
  static constexpr std::size_t kOps = 7;
  struct Instruments {
    Histogram* duration = nullptr;
    Counter* bytes = nullptr;
    Gauge* busbw = nullptr;
  };
  Telemetry& telemetry_;
  std::array<Instruments, kOps> ops_{};
  std::vector<Counter*> errors_;
  std::map<std::pair<CollectiveOp, std::string>, Counter*> algorithms_;  // made when first used
};

}  // namespace coshard::transport::detail
