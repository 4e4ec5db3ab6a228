#include "stopping.hpp"

#include <signal.h>
#include <sys/wait.h>

#include <algorithm>

#include "coshard/launch/stop_signal.hpp"

namespace coshard::run {

RankEnd rank_end(int wait_status, bool takes_stop) {
  RankEnd e;
  e.stopped = takes_stop && WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == launch::StopSignal::kExitCode;
  e.ok = e.stopped || (WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0);
  if (WIFEXITED(wait_status)) {
    e.code = WEXITSTATUS(wait_status);
  } else if (WIFSIGNALED(wait_status)) {
    e.code = 128 + WTERMSIG(wait_status);
  }
  if (!e.ok && e.code == 0) e.code = 1;
  return e;
}

AttemptPhase attempt_step(const AttemptPhase& p, PhaseEvent e, int value) {
  const bool live = p.phase == Phase::running || p.phase == Phase::taking_in || p.phase == Phase::store_lost;
  switch (e) {
    case PhaseEvent::take_in:
      if (p.phase == Phase::running) return AttemptPhase{.phase = Phase::taking_in};
      break;
    case PhaseEvent::store_lost:
      if (p.phase == Phase::running || p.phase == Phase::taking_in) return AttemptPhase{.phase = Phase::store_lost};
      break;
    case PhaseEvent::other_failed:
    case PhaseEvent::rank_failed:
      if (live) {
        return AttemptPhase{.phase = Phase::stopping,
                            .cause = e == PhaseEvent::rank_failed ? StopCause::rank_failed : StopCause::other_node,
                            .code = value ? value : 1};
      }
      break;
    case PhaseEvent::deadline:
      if (p.phase == Phase::taking_in || p.phase == Phase::store_lost) {
        return AttemptPhase{.phase = Phase::stopping, .cause = StopCause::deadline, .code = 1};
      }
      break;
    case PhaseEvent::interrupt:
      if (p.phase != Phase::interrupted) return AttemptPhase{.phase = Phase::interrupted, .signal = value};
      break;
  }
  return p;
}

bool watches_others(const AttemptPhase& p) { return p.phase == Phase::running || p.phase == Phase::taking_in; }

bool passes_stop_request(const AttemptPhase& p) { return watches_others(p) || p.phase == Phase::store_lost; }

int exit_code(const AttemptPhase& p, bool stopped_on_request) {
  if (p.phase == Phase::interrupted) return 128 + p.signal;
  if (p.phase == Phase::stopping) return p.code;
  return stopped_on_request ? launch::StopSignal::kExitCode : 0;
}

bool names_failed_ranks(const AttemptPhase& p) {
  return p.phase == Phase::stopping && p.cause != StopCause::other_node;
}

OnFailure on_failure(const Failure& f, bool all_take_stop, std::chrono::seconds take_in_timeout) {
  if (f.at_checkpoint && take_in_timeout.count() > 0 && all_take_stop) return OnFailure::stop_at_checkpoint;
  if (f.node < 0) return OnFailure::lose_store;
  return OnFailure::stop_now;
}

StopClock::time_point lost_store_stop(std::optional<StopClock::time_point> set, StopClock::time_point now) {
  return set ? std::min(*set, now + kLostStoreWait) : now + kLostStoreWait;
}

RankStopStep rank_stop_step(RankStop& s, StopClock::time_point now) {
  if (s.begin_at && now >= *s.begin_at) {
    s.begin_at.reset();
    return RankStopStep::begin;
  }
  if (s.term_at && now >= *s.term_at) {
    s.term_at.reset();
    return RankStopStep::term;
  }
  if (s.kill_at && !s.killed && now >= *s.kill_at) {
    s.killed = true;
    return RankStopStep::kill;
  }
  return RankStopStep::none;
}

bool records_asked(RankStop& s, bool asked, StopClock::time_point now) {
  if (!asked) return true;
  s.term_at = now + std::chrono::seconds(1);
  return false;
}

void signalled(RankStop& s, StopClock::time_point now, StopClock::duration grace) {
  if (!s.kill_at) s.kill_at = now + grace;
}

LeftoverAction leftover_step(Leftovers& l, bool any_alive, bool any_held, StopClock::time_point now,
                             StopClock::duration grace) {
  using std::chrono::seconds;
  if (!any_alive && !any_held) return LeftoverAction::done;
  if (!l.since) l.since = now;
  if (now < *l.since + seconds(1)) return LeftoverAction::wait;
  const auto bounded = std::min<StopClock::duration>(grace, seconds(5));
  if (any_alive && (l.signal == 0 || (l.signal == SIGTERM && now >= l.signalled_at + bounded))) {
    l.signal = l.signal == 0 ? SIGTERM : SIGKILL;
    l.signalled_at = now;
    return l.signal == SIGTERM ? LeftoverAction::term : LeftoverAction::kill;
  }
  if (any_alive && l.signal == SIGTERM) return LeftoverAction::wait;                  // within the grace
  if (l.signal != 0 && now < l.signalled_at + seconds(1)) return LeftoverAction::wait;  // pipes to close
  return LeftoverAction::drain;
}

}  // namespace coshard::run
