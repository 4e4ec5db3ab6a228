#pragma once
// SIGUSR2 asks a training job to stop at a step boundary after a checkpoint, to be continued
// later: what Slurm sends ahead of a time limit with `--signal=USR2@SECONDS` (and at a preemption
// where PreemptParameters=send_user_signal), to every process of the job's steps, ranks and any
// coshard-run alike; coshard-run also passes its own SIGUSR2 on to its ranks. The handler only
// records the request. The ranks must then agree on the step, because a signal reaches them at
// different times and may reach only some of them: gpt2-train reduces the flag with each step's
// loss, and every rank stops after the first step whose reduction carries it.
#include <optional>

#include "coshard/launch/signal_marker.hpp"

namespace coshard::launch {

/// Serves SIGUSR2 while it lives (a process-wide setting: at most one StopSignal exists at a time).
class StopSignal {
 public:
  /// A rank that stopped on request after its checkpoint exits with this code (EX_TEMPFAIL of
  /// sysexits.h: try again later). coshard-run does not take it for a failure: it does not
  /// restart, and exits with it too.
  static constexpr int kExitCode = 75;

  /// Installs the handler; throws Error(internal) if another StopSignal exists.
  StopSignal();
  /// From then on SIGUSR2 is ignored: a rank that is ending must not die of a late request.
  ~StopSignal();
  StopSignal(const StopSignal&) = delete;
  StopSignal& operator=(const StopSignal&) = delete;

  /// Whether SIGUSR2 arrived since construction.
  bool requested() const noexcept;

 private:
  std::optional<SignalMarker> marker_;  // tells coshard-run that this process takes SIGUSR2
};

}  // namespace coshard::launch
