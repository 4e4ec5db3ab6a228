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

#include "coshard/runtime/scheduler.hpp"
#include "coshard/transport/communicator.hpp"

namespace coshard::transport {

/// Where a recorded operation is: queued behind others, running on the stream, done or failed.
enum class OpState : std::uint8_t { queued, running, done, failed };
/// The state's name as the flight record writes it, e.g. "running".
std::string_view to_string(OpState s) noexcept;

/// One operation in the flight recorder: what it is, how far it got, and when.
struct OpRecord {
  OpInfo info;                                         ///< the operation as it was issued
  OpState state = OpState::queued;                     ///< how far it got
  std::chrono::system_clock::time_point queued_at{};   ///< when the caller issued it
  std::chrono::system_clock::time_point started_at{};  ///< when it began to run; unset (null in the JSON) until then
  std::chrono::system_clock::time_point ended_at{};    ///< when it finished or failed; unset until then
  std::string error;                                   ///< why it failed; empty unless state is failed
  std::string algorithm;  ///< how it ran, e.g. "ring" or "direct" (UCX); empty when not said
};

/// A communicator's last operations in a fixed-size ring, dumped as JSON on a failure so that the
/// ranks' records can be compared. Thread-safe.
class FlightRecorder {
 public:
  /// Keeps the last `capacity` operations (at least 1); older records are overwritten.
  explicit FlightRecorder(std::size_t capacity = 64) : capacity_(capacity == 0 ? 1 : capacity) {}

  /// Returns the record's id for the updates below.
  std::uint64_t queued(const OpInfo& info);
  /// Marks operation `id` running and stamps started_at; ignored once its record was overwritten.
  void started(std::uint64_t id);
  /// Marks operation `id` done, or failed with `error` when that is not empty, and stamps ended_at.
  void finished(std::uint64_t id, const std::string& error = {});
  /// Says how operation `id` ran; also counted over the communicator's life (algorithm_counts()).
  void set_algorithm(std::uint64_t id, const std::string& algorithm);
  /// How many operations ran with each algorithm over the recorder's life, not only those in the ring.
  std::map<std::string, std::uint64_t> algorithm_counts() const;

  std::vector<OpRecord> snapshot() const;  ///< oldest first
  /// Who a record belongs to: the communicator, this rank in it and in the job.
  struct Owner {
    std::string comm;          ///< the communicator's name
    int rank = 0;              ///< this process's rank in the communicator
    int size = 0;              ///< ranks in the communicator
    std::string_view backend;  ///< "ucx", "nccl"
    int job_rank = 0;          ///< this process's rank in the job (unique across communicators' groups)
  };
  /// {"comm":..., "rank":..., "size":..., "job_rank":..., "backend":..., "algorithms":{"ring":N,...},
  /// "ops":[{...}, ...]}
  std::string json(const Owner& owner) const;
  /// Writes json() to `<dir>/coshard-flight-<comm>-rank<job_rank>.json` (dir: $COSHARD_FLIGHT_DIR,
  /// which coshard-run sets and reads after a failure, else the temp dir) and returns the path, or an
  /// empty string when it could not be written.
  std::string dump(const Owner& owner) const;

 private:
  OpRecord* find(std::uint64_t id);
  mutable std::mutex m_;
  std::size_t capacity_;
  std::uint64_t next_id_ = 0;
  std::vector<OpRecord> ring_;  ///< ring_[id % capacity_]
  std::map<std::string, std::uint64_t> algorithm_counts_;
};

/// The tasks of `scheduler` suspended now and what each awaits (Scheduler::suspended), as JSON:
/// {"job_rank":R,"suspended":[{"what":"stream 'compute' after ...","waited_s":12.5},...]}.
std::string suspended_json(const Scheduler& scheduler, int job_rank);
/// Writes suspended_json() to `<dir>/coshard-coroutines-rank<job_rank>.json` beside the flight
/// records; returns the path, or empty when it could not be written.
std::string dump_suspended(const Scheduler& scheduler, int job_rank);

}  // namespace coshard::transport
