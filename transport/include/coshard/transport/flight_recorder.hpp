#pragma once
// The last operations of one communicator, kept in a ring so that after a timeout or a peer
// failure every rank can write what it was doing and the ranks can be compared (the idea of
// PyTorch's NCCL flight recorder). Thread-safe: operations are queued from the caller's thread
// and run on the communicator's stream.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "coshard/transport/communicator.hpp"

namespace coshard::transport {

enum class OpState : std::uint8_t { queued, running, done, failed };
std::string_view to_string(OpState s) noexcept;

struct OpRecord {
  OpInfo info;
  OpState state = OpState::queued;
  std::chrono::system_clock::time_point queued_at{};
  std::chrono::system_clock::time_point started_at{};
  std::chrono::system_clock::time_point ended_at{};
  std::string error;
  std::string algorithm;  ///< how it ran, e.g. "ring" or "direct" (UCX); empty when not said
};

class FlightRecorder {
 public:
  explicit FlightRecorder(std::size_t capacity = 64) : capacity_(capacity == 0 ? 1 : capacity) {}

  /// Returns the record's id for the updates below.
  std::uint64_t queued(const OpInfo& info);
  void started(std::uint64_t id);
  void finished(std::uint64_t id, const std::string& error = {});
  /// Says how operation `id` ran; also counted over the communicator's life (algorithm_counts()).
  void set_algorithm(std::uint64_t id, const std::string& algorithm);
  std::map<std::string, std::uint64_t> algorithm_counts() const;

  std::vector<OpRecord> snapshot() const;  ///< oldest first
  /// {"comm":..., "rank":..., "size":..., "backend":..., "algorithms":{"ring":N,...}, "ops":[{...}, ...]}
  std::string json(const std::string& comm, int rank, int size, std::string_view backend) const;
  /// Writes json() to `dir`/coshard-flight-<comm>-rank<r>.json (dir: $COSHARD_FLIGHT_DIR, else
  /// the temp dir) and returns the path, or an empty string when it could not be written.
  std::string dump(const std::string& comm, int rank, int size, std::string_view backend) const;

 private:
  OpRecord* find(std::uint64_t id);
  mutable std::mutex m_;
  std::size_t capacity_;
  std::uint64_t next_id_ = 0;
  std::vector<OpRecord> ring_;  ///< ring_[id % capacity_]
  std::map<std::string, std::uint64_t> algorithm_counts_;
};

}  // namespace coshard::transport
