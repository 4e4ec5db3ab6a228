#pragma once
// What the launcher says about a job that failed: which ranks were stopped when the failure came,
// and from the ranks' flight records, which collective each rank was in and who is behind (the
// analysis PyTorch's flight recorder script does after the fact, printed at once).
#include <sys/types.h>

#include <string>
#include <vector>

#include "child.hpp"

namespace coshard::run {

// The one-letter state of a process from /proc/PID/stat ('R', 'S', 'D', 'T' stopped, 't' traced,
// 'Z'...), or '?' when it cannot be read.
char process_state(pid_t pid);

// For each process group in `pgids`, whether a process other than a zombie is in it (one /proc
// scan). kill(-pgid, 0) cannot tell: a zombie counts, and an orphan's zombie waits for a PID 1
// that may take its time to reap it (a container's entrypoint).
std::vector<bool> groups_alive(const std::vector<pid_t>& pgids);

// True when `pid` asked for `sig` (SIGUSR1 or SIGUSR2: a transport::DiagnosticsSignal or
// StopSignal leaves its launch::SignalMarker in `flight_dir`) and catches it now, so sending it
// cannot kill the rank nor set off another meaning the program gives the signal.
bool takes_signal(pid_t pid, const std::string& flight_dir, int sig);

// Lines naming the still-running ranks that are stopped or traced: such a rank cannot answer its
// peers, which then fail at their collective deadline.
std::vector<std::string> stopped_ranks(const std::vector<Child>& children);

// Reads every flight record (coshard-flight-<comm>-rank<r>.json, which a rank writes when one of its
// collectives fails, and on SIGUSR1) in `dir` and returns lines that say, per communicator with an
// operation that did not complete, which operation (op#seq and state) each rank was last in, which
// of `local_ranks` wrote no record, and which ranks are behind the others; then, per rank that
// wrote coshard-coroutines-rank<r>.json (transport::dump_suspended), what its suspended tasks
// await. Ranks are job ranks. Empty when no communicator was stuck.
std::vector<std::string> flight_report(const std::string& dir, const std::vector<int>& local_ranks);

}  // namespace coshard::run
