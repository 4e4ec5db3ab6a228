#pragma once
// SIGUSR1 asks a rank for its diagnostics (Runtime::write_diagnostics: every communicator's flight
// record, into $COSHARD_FLIGHT_DIR). coshard-run sends it to the other ranks when one fails, and a
// user may send it to a rank that seems hung. A handler wakes a thread of its own, so the records
// are written even when the scheduler thread is stuck.
#include <array>
#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <thread>

#include "coshard/runtime/runtime.hpp"
#include "coshard/runtime/unique_fd.hpp"
#include "coshard/launch/signal_marker.hpp"

namespace coshard::transport {

/// Serves SIGUSR1 for a rank while it lives: the signal's handler (a process-wide setting, so at
/// most one DiagnosticsSignal exists at a time) wakes a thread that runs
/// `Runtime::write_diagnostics()`. Blocking the signal would not do: threads that libraries start
/// before main() (OpenBLAS's) do not block it, and the kernel may pick one of them, whose default
/// action ends the process. transport::run_rank makes one for its body. While it lives, the file
/// `$COSHARD_FLIGHT_DIR/coshard-sigusr1-<pid>` tells coshard-run that this rank wants SIGUSR1 for
/// this (programs that give SIGUSR1 another meaning, as some schedulers' requeue hooks do, do not
/// get it from the launcher).
class DiagnosticsSignal {
 public:
  /// Installs the handler; throws Error(internal) if another DiagnosticsSignal exists.
  DiagnosticsSignal();
  /// Stops serving; SIGUSR1 is ignored from then on (coshard-run may still ask a rank that is
  /// exiting, which must not die of it).
  ~DiagnosticsSignal();
  DiagnosticsSignal(const DiagnosticsSignal&) = delete;
  DiagnosticsSignal& operator=(const DiagnosticsSignal&) = delete;

  /// Serving SIGUSR1 for one Runtime; stops when destroyed, so declare it after the Runtime.
  class [[nodiscard]] Serving {
   public:
    /// Made by DiagnosticsSignal::serve().
    Serving(DiagnosticsSignal& d, Runtime& rt, std::uint64_t suspended) : d_(d), rt_(rt), suspended_(suspended) {}
    ~Serving() {  ///< stops serving
      d_.stop();
      rt_.remove_diagnostic(suspended_);
    }
    Serving(const Serving&) = delete;
    Serving& operator=(const Serving&) = delete;

   private:
    DiagnosticsSignal& d_;
    Runtime& rt_;
    std::uint64_t suspended_;
  };

  /// From now on SIGUSR1 runs `rt.write_diagnostics()` on a thread of this object's and prints
  /// "rank R: flight records written (SIGUSR1)" on stderr, until the result is destroyed. Among
  /// the diagnostics, beside the communicators' flight records: what the rank's suspended tasks
  /// await (transport::dump_suspended, under the rank of `rt`).
  Serving serve(Runtime& rt);
  /// Stops serving (a SIGUSR1 arriving later wakes nobody and is dropped). Idempotent.
  void stop() noexcept;

 private:
  std::array<UniqueFd, 2> wake_;  // the handler writes a byte to wake_[1]
  std::optional<launch::SignalMarker> marker_;  // tells coshard-run that this process takes SIGUSR1
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace coshard::transport
