#pragma once
// The Prometheus series of a UCX communicator's operations (docs/metrics.md): durations, bytes,
// bus bandwidth and errors per operation, how each ran (ring, direct, hierarchical, mesh, p2p), and
// how late the peers entered them.
#include <array>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "coshard/runtime/error.hpp"
#include "coshard/runtime/telemetry.hpp"
#include "coshard/transport/communicator.hpp"
#include "wire.hpp"

namespace coshard::transport::detail {

class OpMetrics {
 public:
  explicit OpMetrics(Telemetry& telemetry);
  // `info` ran on `size` ranks by `algorithm` and took `seconds`. Stream thread only.
  void finished(const OpInfo& info, int size, double seconds, const std::string& algorithm);
  // An operation failed with `e`.
  void failed(const Error& e);
  // Per peer heard from in the operation that just ran on `wire`, how late it entered it. A series
  // exists only for the peers a rank hears from first (its ring neighbour, direct-path peers, the
  // mesh's neighbour on each of its wires): a few per rank, not the world. Named by job rank, so
  // that the slow rank is named whichever group or wire it is in.
  void count_peer_waits(const Wire& wire);

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
  std::map<int, Counter*> peer_wait_;  // by job rank; made when first heard from
};

}  // namespace coshard::transport::detail
