#pragma once
// How a rank tells coshard-run which signals it serves: while it does, the file
// `$COSHARD_FLIGHT_DIR/coshard-sigusr1-<pid>` (or `-sigusr2-`) exists. coshard-run sends SIGUSR1
// (flight records) and SIGUSR2 (stop after a checkpoint) only to ranks that say so: any other
// program would die of them, or give them another meaning.
#include <string>

namespace coshard::launch {

/// The marker's file name for `sig` (SIGUSR1 or SIGUSR2) served by process `pid`; throws
/// Error(internal) for another signal.
std::string signal_marker_name(int sig, long pid);

/// The marker of this process for `sig`, in $COSHARD_FLIGHT_DIR (none when it is unset or not
/// writable: the process still serves a signal sent by hand), removed when destroyed.
class SignalMarker {
 public:
  /// Makes the marker for `sig` (SIGUSR1 or SIGUSR2; throws Error(internal) for another); install
  /// the handler first, since coshard-run may send the signal from then on.
  explicit SignalMarker(int sig);
  ~SignalMarker();  ///< removes the marker
  SignalMarker(const SignalMarker&) = delete;
  SignalMarker& operator=(const SignalMarker&) = delete;

 private:
  std::string path_;  // empty: none was made
};

}  // namespace coshard::launch
