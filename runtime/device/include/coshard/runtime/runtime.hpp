#pragma once
// Runtime owns the services of one rank: telemetry sink, scheduler, the device's event poller,
// allocator and named streams. It starts them in dependency order and stops them in reverse.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <memory>
#include <string>
#include <string_view>

#include "coshard/runtime/allocator.hpp"
#include "coshard/runtime/log.hpp"
#include "coshard/runtime/scheduler.hpp"
#include "coshard/runtime/stream.hpp"
#include "coshard/runtime/telemetry.hpp"

namespace coshard {

namespace cuda {
class EventPoller;
}

/// The services of one rank, started in the constructor and stopped by stop() or the destructor.
class Runtime {
 public:
  /// What to run on and how to label it.
  struct Options {
    std::string name = "coshard";   ///< prefix of the scheduler's name (NAME/rankN)
    int rank = 0;                   ///< this process's rank: scheduler name, stream spans
    Device device = Device::cpu();  ///< CPU or CUDA device for the allocator and streams
    std::size_t memory_cap_bytes = 0;  ///< 0: no cap
    Telemetry* telemetry = nullptr;     ///< not owned; nullptr: no-op
    /// CPU device: allocations of at least `shared_host_min_bytes` are memfd segments that other
    /// ranks on this host can map (shared_memory.hpp), so that collectives between them copy once.
    bool shared_host_memory = true;
    std::size_t shared_host_min_bytes = std::size_t{1} << 20;  ///< see shared_host_memory
    /// Fault injection for soak and stress runs: every stream sleeps a random time in
    /// [0, stream_jitter] before each work item (Stream::Options::jitter; the delays depend on the
    /// rank and the stream's name). CPU backend; refused on CUDA. Zero: off.
    std::chrono::microseconds stream_jitter{0};
    /// CPU device only: memory that the host cannot touch, as on a GPU (discrete_memory.hpp; the
    /// "cpu-discrete" device of the tools). Only work running on this runtime's streams can read
    /// or write it; a host access aborts with a message and a backtrace. For proving that the
    /// engine, the ops and the units only enqueue device work; slower than the plain CPU device.
    bool discrete_memory = false;
    /// Where the library writes what it says of its own accord on this rank (warnings, notes, errors
    /// it cannot throw to anyone): the scheduler, the communicators and the engine (log.hpp). Empty:
    /// stderr, each line "coshard: ...".
    LogSink log = {};
  };

  /// Starts the services; throws Error(device) when a CUDA device is asked for but not visible.
  explicit Runtime(Options options);
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;
  ~Runtime();  ///< calls stop()

  /// Stops streams (draining their work), then the scheduler, then the poller. Idempotent.
  void stop();

  Scheduler& scheduler() noexcept { return *scheduler_; }     ///< runs this rank's tasks
  Telemetry& telemetry() noexcept { return *telemetry_; }     ///< the given sink, or a no-op one
  Allocator& allocator() noexcept { return *allocator_; }     ///< the caching allocator of device()
  Device device() const noexcept { return options_.device; }  ///< Options::device
  int rank() const noexcept { return options_.rank; }         ///< Options::rank
  /// `message` to Options::log (stderr when none is set).
  void log(LogLevel level, std::string_view message) const { coshard::log(options_.log, level, message); }
  /// Options::log, for the services that write from threads of their own (a communicator's wire).
  const LogSink& log_sink() const noexcept { return options_.log; }
  /// How this runtime's streams are set up (telemetry, rank, jitter, discrete memory's gate), for
  /// the streams other services make: a communicator's own stream (CPU backend).
  Stream::Options stream_options() const noexcept;
  /// False when device memory cannot be read or written by the host: a CUDA device, or the CPU
  /// device with Options::discrete_memory. Host-side code then goes through stream work.
  bool host_accessible() const noexcept {
    return options_.device.kind == DeviceKind::cpu && !options_.discrete_memory;
  }

  /// The stream called `name` ("compute", "all_gather", ...), created on first use. Call from the
  /// scheduler thread or before tasks run: the map is not locked.
  Stream& stream(std::string_view name);

  /// Registers `write`, run by write_diagnostics() (on SIGUSR1 under transport::run_rank): a
  /// communicator writes its flight record. Returns the id to remove it with. Thread-safe.
  std::uint64_t add_diagnostic(std::function<void()> write);
  /// Unregisters a writer; after it returns the writer is not running and will not run. Thread-safe.
  void remove_diagnostic(std::uint64_t id) noexcept;
  /// Runs every registered writer, in registration order; a writer's exception is swallowed so
  /// that the others still write. Thread-safe.
  void write_diagnostics() noexcept;

 private:
  Options options_;
  NoopTelemetry noop_;
  Telemetry* telemetry_;
  std::unique_ptr<cuda::EventPoller> poller_;
  MemoryGate* gate_ = nullptr;  // the discrete memory's, owned by allocator_
  std::unique_ptr<Allocator> allocator_;
  std::unique_ptr<Scheduler> scheduler_;
  std::map<std::string, Stream, std::less<>> streams_;
  std::mutex diagnostics_m_;  // held while writers run, so removal waits for a running one
  std::uint64_t next_diagnostic_ = 0;
  std::map<std::uint64_t, std::function<void()>> diagnostics_;
};

}  // namespace coshard
