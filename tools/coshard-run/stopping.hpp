#pragma once
// How the Supervisor ends its local ranks, as decisions with the time and what it saw given, and
// no I/O: what a rank's exit means, what another node's failure asks of this node, and how what
// the ranks left behind is stopped. The Supervisor (supervisor.cpp) reads the processes, asks
// these, and signals; tests/tools/stopping_test.cpp drives them in process.
#include <chrono>
#include <optional>

#include "records.hpp"

namespace coshard::run {

using StopClock = std::chrono::steady_clock;

// Where this node's attempt stands, as the Supervisor keeps it: one phase, with the data that
// phase has, changed only by attempt_step. Which ranks take SIGUSR2, or stopped on it, is the
// ranks' own (Child), not the attempt's.
//
//   running ──take_in──► taking_in ──deadline (--take-in-timeout)──► stopping (deadline)
//      │                    │
//      ├────store_lost──────┴──► store_lost ──deadline (kLostStoreWait)──► stopping (deadline)
//      │
//   running, taking_in, store_lost ──rank_failed──► stopping (rank_failed)
//                                  ──other_failed─► stopping (other_node)
//   any phase but interrupted ──interrupt──► interrupted
enum class Phase {
  running,      // the ranks run; the Supervisor watches for another node's failure
  taking_in,    // asked to stop after a checkpoint for a node taken in; it watches for a node that
                // stopped its ranks without one
  store_lost,   // the store is gone: the ranks get until RankStop::begin_at to end by themselves
  stopping,     // the attempt failed here (StopCause says how): the running ranks are being stopped
  interrupted,  // the launcher got SIGINT/SIGTERM and passed it on: no restart
};
enum class StopCause {
  none,
  rank_failed,  // a local rank failed: this node reported it
  other_node,   // another node failed, or this launcher was replaced: its ranks' ends are not named
  deadline,     // the take-in's --take-in-timeout, or the wait after losing the store, passed
};
struct AttemptPhase {
  Phase phase = Phase::running;
  StopCause cause = StopCause::none;  // stopping
  int code = 0;                       // stopping: the launcher's exit code, never 0
  int signal = 0;                     // interrupted: the signal, which also gives the exit code
  bool operator==(const AttemptPhase&) const = default;
};
enum class PhaseEvent {
  take_in,       // another node asks to be taken in, and every local rank takes SIGUSR2
  store_lost,    // the Coordinator lost the store
  other_failed,  // another node's failure (value: its code) stops the ranks now
  rank_failed,   // a local rank failed (value: its RankEnd::code)
  deadline,      // RankStop::begin_at came
  interrupt,     // SIGINT, SIGTERM, SIGHUP or SIGQUIT (value: the signal)
};
// The phase after `e`; the same phase when `e` means nothing there (a rank that fails while the
// ranks are stopped already, a second interrupt).
AttemptPhase attempt_step(const AttemptPhase& p, PhaseEvent e, int value);
// Whether the Supervisor asks the Coordinator about the other nodes: only while the ranks run or
// stop after a checkpoint for a take-in (stopping_now then). Not once the attempt ended here.
bool watches_others(const AttemptPhase& p);
// Whether a SIGUSR2 the launcher got is passed on: not once a failure or an interrupt stops the ranks.
bool passes_stop_request(const AttemptPhase& p);
// The launcher's exit code for the attempt: 128 + the signal, the failure's code, 75 when ranks
// stopped on request (`stopped_on_request`), else 0.
int exit_code(const AttemptPhase& p, bool stopped_on_request);
// Whether the launcher names its ranks that did not end well: when the failure was this node's.
bool names_failed_ranks(const AttemptPhase& p);

// A rank's end, from its wait status and whether it was seen taking SIGUSR2.
struct RankEnd {
  bool ok = false;       // exit 0, or a stop on request
  bool stopped = false;  // exit 75 from a rank that takes SIGUSR2: the ranks agreed to stop after a checkpoint
  int code = 0;          // the launcher's exit code should this end the attempt: the status's, never 0 for a failure
};
RankEnd rank_end(int wait_status, bool takes_stop);

// What this node does about the attempt's failure `f` that another node (or node 0's verdict on
// this one) reported while the local ranks ran.
enum class OnFailure {
  stop_at_checkpoint,  // a node is taken in and every local rank takes SIGUSR2: they stop after a checkpoint
  lose_store,          // this launcher lost the store (f.node < 0): the ranks get a while to end first
  stop_now,            // the ranks stop now: flight records, SIGTERM, SIGKILL after --grace
};
// `all_take_stop`: every running local rank takes SIGUSR2; `take_in_timeout`: 0 stops them at once.
OnFailure on_failure(const Failure& f, bool all_take_stop, std::chrono::seconds take_in_timeout);

// After losing the store the ranks get this long to end (their collectives name the peer they
// miss), or less if a stop was set for sooner.
inline constexpr std::chrono::seconds kLostStoreWait{10};
StopClock::time_point lost_store_stop(std::optional<StopClock::time_point> set, StopClock::time_point now);

// The stop of the ranks still running, as deadlines: when to begin it (after losing the store, or
// the take-in's --take-in-timeout), SIGTERM a second after the flight records were asked for, and
// SIGKILL --grace after the first signal. Each step is due once; an interrupt or a failure that
// stops the ranks at once clears what was planned.
struct RankStop {
  std::optional<StopClock::time_point> begin_at;  // stop the ranks then, unless they end first
  std::optional<StopClock::time_point> term_at;   // SIGTERM then: the flight records were asked a second before
  std::optional<StopClock::time_point> kill_at;   // SIGKILL then: set by the first signal
  bool killed = false;
};
enum class RankStopStep {
  none,   // nothing due
  begin,  // begin_at came: ask the running ranks for their flight records, then stop them
  term,   // SIGTERM to the running ranks
  kill,   // SIGKILL to the running ranks
};
// The step due at `now`, earliest first, each once: call until none.
RankStopStep rank_stop_step(RankStop& s, StopClock::time_point now);
// The running ranks were asked for their flight records (`asked`: one took SIGUSR1): SIGTERM a
// second later. Returns true when it is due now instead (no rank takes SIGUSR1).
bool records_asked(RankStop& s, bool asked, StopClock::time_point now);
// A signal went to the running ranks (SIGINT, SIGTERM): SIGKILL after `grace`, from the first one.
void signalled(RankStop& s, StopClock::time_point now, StopClock::duration grace);

// Every rank has ended, but processes they started may live on in their process groups (a helper
// in the background, a data-loader worker) and hold their output open. They get a second to end,
// then SIGTERM, SIGKILL after the grace (at most 5 s: node 0 waits --grace and a minute for a
// node's ranks, which may have taken --grace already), and a second later the launcher stops
// reading what a process outside the groups (one that called setsid) still holds.
struct Leftovers {
  std::optional<StopClock::time_point> since;  // when every rank had ended but not what they started
  int signal = 0;                              // the last signal sent to what they started
  StopClock::time_point signalled_at{};
};
enum class LeftoverAction {
  done,  // nothing is left to wait for
  wait,  // look again at the next tick
  term,  // SIGTERM (then SIGCONT) to the groups with a process alive
  kill,  // SIGKILL to them
  drain, // read what the pipes still hold, close them, and be done
};
// `any_alive`: a rank's process group still has a live process; `any_held`: a rank's output is
// still open; `grace`: --grace.
LeftoverAction leftover_step(Leftovers& l, bool any_alive, bool any_held, StopClock::time_point now,
                             StopClock::duration grace);

}  // namespace coshard::run
