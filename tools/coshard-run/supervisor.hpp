#pragma once
// Watches the local ranks of one attempt until every one has ended and its output is drained:
// relays their output and the launcher's SIGINT/SIGTERM (SIGUSR2 to the ranks that stop after a
// checkpoint on it, whose exit code 75 is no failure), and when a rank fails here or another
// node reports a failure, stops the others: SIGUSR1 first to the ranks that take it (they write
// their flight records; a second later SIGTERM, then SIGKILL after the grace period). A failure
// here is reported to the other nodes. When another node asks to be taken in, ranks that take
// SIGUSR2 are asked to stop after a checkpoint instead, and get --take-in-timeout to do so.
#include <poll.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "child.hpp"
#include "console.hpp"
#include "coordinator.hpp"
#include "options.hpp"
#include "stopping.hpp"

namespace coshard::run {

class Supervisor {
 public:
  // `flight_dir`: where this attempt's ranks write their flight records (and say they take SIGUSR1).
  // `console`: where the ranks' lines and the launcher's messages go, never blocking the loop.
  Supervisor(const Options& o, std::vector<Child>& children, std::string flight_dir, Coordinator& coordinator,
             int attempt, Console& console)
      : o_(o),
        children_(children),
        flight_dir_(std::move(flight_dir)),
        coordinator_(coordinator),
        attempt_(attempt),
        console_(console) {}

  // Returns once every rank has ended and its pipes are closed (what the ranks started and left
  // behind is stopped: see leftovers_ended); their last lines may still wait in the console.
  // `sigfd`: a signalfd for SIGINT,
  // SIGTERM, SIGUSR2 and SIGCHLD.
  void watch(int sigfd);
  // The launcher's exit code; names the ranks that failed when one did.
  int result() const;
  // True when the launcher itself was told to stop (SIGINT/SIGTERM): no restart then.
  bool interrupted() const noexcept { return phase_.phase == Phase::interrupted; }
  // True when this launcher got SIGUSR2 and passed it on, or its ranks stopped on it: no restart
  // then either. (A SIGUSR2 that no rank takes changes nothing: the job goes on, restarts included.
  // Ranks that stop after a checkpoint with no SIGUSR2 here followed their peers elsewhere, or a
  // node taken in: result() says 75, and node 0 tells which.)
  bool stop_requested() const noexcept;

 private:
  using Clock = std::chrono::steady_clock;

  std::vector<Output*> open_outputs(std::vector<pollfd>& fds);
  bool any_running() const;
  void stop_all(int sig);
  void ask_for_flight_records();
  void take_signals(int sigfd);
  void note_stop_takers();
  void pass_on_stop_request();
  void relay(Output& out);
  // --grace, as the clock counts.
  Clock::duration grace() const {
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o_.grace_seconds));
  }
  LineSink& sink(const Output& out) { return out.to_stderr ? console_.err : console_.out; }
  bool leftovers_ended();
  void signal_leftovers(const std::vector<char>& alive);
  void drain(Output& out, int rank);
  void reap();
  void stop_steps();
  void check_other_nodes();
  void stop_at_checkpoint(const Failure& f);
  void check_stop_now();
  void lose_store(const Failure& f);
  void stop_for(const Failure& f);

  const Options& o_;
  std::vector<Child>& children_;
  std::string flight_dir_;
  Coordinator& coordinator_;
  int attempt_;
  Console& console_;
  AttemptPhase phase_;  // where the attempt stands here (stopping.hpp), changed by attempt_step only
  RankStop stop_;  // when the running ranks are stopped (stopping.hpp)
  Clock::time_point next_check_{};  // when to ask again whether another node failed
  std::optional<Clock::time_point> stop_requested_;  // got SIGUSR2 then: passed on to each rank once it takes it
  bool said_none_stops_ = false;  // said that no rank takes SIGUSR2
  bool stopped_on_request_ = false;  // a rank exited with launch::StopSignal::kExitCode
  Leftovers leftovers_;  // every rank had ended, but not what they started
  std::vector<pid_t> died_first_;  // the pids SIGCHLD named since the last reap, in order
};

}  // namespace coshard::run
