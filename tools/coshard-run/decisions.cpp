#include "decisions.hpp"

#include <algorithm>
#include <iterator>
#include <utility>

#include "coordinator_internal.hpp"
#include "coshard/launch/stop_signal.hpp"

namespace coshard::run {
namespace {

using coord::node_list;

bool has(const std::vector<int>& nodes, int n) { return std::find(nodes.begin(), nodes.end(), n) != nodes.end(); }

// Whether the job goes on without the nodes missing at the end of `attempt` (--nnodes MIN:MAX):
// a restart would follow but for them, each fell silent and stayed so for --rejoin-timeout, and
// at least MIN nodes are left. Node 0 serves the store, so it is never among them.
bool dropped(const JobRules& r, int attempt, const std::vector<int>& nodes, const std::optional<Failure>& failed,
             const NodesEnded& ended) {
  if (!failed || !failed->restartable || attempt >= r.max_restarts || !ended.interrupted.empty() ||
      ended.stop_requested) {
    return false;
  }
  if (ended.missing.empty() ||
      nodes.size() - ended.missing.size() + ended.rejoined.size() < static_cast<std::size_t>(r.min_nodes)) {
    return false;
  }
  return std::all_of(ended.missing.begin(), ended.missing.end(), [&](int n) { return has(ended.silent, n); });
}

// The nodes of the next attempt: this one's less those missing (dropped), and those that rejoin.
std::vector<int> next_nodes(const JobRules& r, const std::vector<int>& nodes, const NodesEnded& ended,
                            std::string& reason) {
  std::vector<int> next;
  std::copy_if(nodes.begin(), nodes.end(), std::back_inserter(next), [&](int n) { return !has(ended.missing, n); });
  if (!ended.missing.empty()) {
    reason += "; node(s) " + node_list(ended.missing) + " did not come back within " +
              std::to_string(r.rejoin_timeout.count()) + " s (--rejoin-timeout), so the job goes on without them (" +
              std::to_string(next.size()) + " of " + std::to_string(r.nnodes) + " nodes, --nnodes " +
              std::to_string(r.min_nodes) + ":" + std::to_string(r.nnodes) + ")";
  }
  if (!ended.rejoined.empty()) reason += "; node(s) " + node_list(ended.rejoined) + " rejoin the job";
  next.insert(next.end(), ended.rejoined.begin(), ended.rejoined.end());
  std::sort(next.begin(), next.end());
  return next;
}

}  // namespace

bool Silence::judge(int n, const std::optional<std::string>& count, LaunchClock::time_point now) {
  if (!count) return false;
  auto [it, first] = beats_.try_emplace(n, Beat{*count, now});
  if (!first && it->second.count != *count) it->second = Beat{*count, now};
  return now - it->second.since >= after_;
}

void Silence::stood_still(LaunchClock::time_point now) {
  for (auto& [node, beat] : beats_) beat.since = now;
}

void note_end(NodesEnded& ended, int n, const std::optional<DoneReport>& said) {
  const DoneReport d = said.value_or(DoneReport{});
  if (d.interrupted) {
    ended.interrupted.push_back(n);
    if (!ended.interrupted_code) ended.interrupted_code = d.rc;
  }
  ended.stop_requested |= d.stop_requested;
  // Without stop_requested the ranks followed peers that were asked, or stopped for a node taken in.
  ended.stopped_on_request |= d.rc == launch::StopSignal::kExitCode;
  ended.succeeded &= d.rc == 0;
}

EndWait::EndWait(int a, const std::vector<int>& nodes, LaunchClock::time_point now, const JobRules& rules)
    : attempt(a), join_deadline(now + rules.join_timeout) {
  ended.missing = nodes;
}

EndStep end_step(EndWait& w, const EndPoll& p) {
  auto& missing = w.ended.missing;
  const auto seen = [&](int n) { return p.seen.count(n) ? p.seen.at(n) : NodeSeen{}; };
  std::vector<int> still;
  for (int n : missing) {
    const NodeSeen s = seen(n);
    if (s.said) {
      note_end(w.ended, n, decode_done(*s.said));
      if (n != 0) w.done.push_back(n);
    } else if (!w.failed || s.claimed) {
      still.push_back(n);
    } else {
      w.ended.never_joined.push_back(n);
    }
  }
  missing = std::move(still);
  if (missing.empty() || (w.deadline && p.now >= *w.deadline)) return {EndAction::decide};
  // Nodes that fell silent have --rejoin-timeout, not the minute a beating node gets to stop its
  // ranks. One that beats again (it came back and stops its ranks) is waited for as any other.
  if (w.rejoin_by && p.now >= *w.rejoin_by &&
      std::all_of(missing.begin(), missing.end(), [&](int n) { return has(w.rejoining, n) && seen(n).silent; })) {
    return {EndAction::decide};
  }
  if (p.now >= w.join_deadline && std::none_of(missing.begin(), missing.end(), [&](int n) { return seen(n).heard; })) {
    return {EndAction::decide};
  }
  for (int n : missing) {
    if (n != 0 && !has(w.rejoining, n) && seen(n).silent) return {EndAction::report_silent, n};
  }
  if (p.stop) {
    w.stop = p.stop;
    return {EndAction::report_stop};
  }
  if (!w.failed) return {EndAction::read_failure};
  return {EndAction::wait};
}

bool fell_silent(EndWait& w, int node, const Failure& standing, LaunchClock::time_point now, const JobRules& rules) {
  w.failed = standing;  // the attempt's first failure, which may be another
  if (w.attempt >= rules.max_restarts) return true;
  w.rejoining.push_back(node);
  w.rejoin_by = now + LaunchClock::duration(rules.rejoin_timeout);
  w.deadline = std::max({w.deadline.value_or(now), *w.rejoin_by, ending_by(standing, now, rules)});
  return false;
}

void took_failure(EndWait& w, const Failure& f, LaunchClock::time_point now, const JobRules& rules) {
  w.failed = f;
  w.deadline = ending_by(f, now, rules);
}

LaunchClock::time_point ending_by(const Failure& f, LaunchClock::time_point now, const JobRules& rules) {
  const auto saving = f.at_checkpoint ? rules.take_in_timeout : std::chrono::seconds(0);
  return now + std::chrono::duration_cast<LaunchClock::duration>(
                   std::chrono::duration<double>(rules.grace_seconds + 60) + saving);
}

NodesEnded close_wait(EndWait& w, int stop, bool stop_pending, const std::vector<int>& rejoined) {
  NodesEnded& ended = w.ended;
  ended.stop_requested |= stop_pending;  // SIGUSR2 while no rank ran here: the job is to end all the same
  if (stop && !has(ended.interrupted, 0)) ended.interrupted.push_back(0);
  if (stop && !ended.interrupted_code) ended.interrupted_code = 128 + stop;
  std::copy_if(w.rejoining.begin(), w.rejoining.end(), std::back_inserter(ended.silent),
               [&](int n) { return has(ended.missing, n); });
  ended.rejoined = rejoined;
  w.done.insert(w.done.end(), rejoined.begin(), rejoined.end());
  return ended;
}

Verdict verdict(const JobRules& rules, int attempt, const std::vector<int>& nodes,
                const std::optional<Failure>& reported, const NodesEnded& ended, const std::string& never_joined) {
  const auto& missing = ended.missing;
  const auto& interrupted = ended.interrupted;
  // A node asked in (Coordinator::ask_in), which is no failure of the attempt's ranks. As every
  // rank ended well, the job is done, not restarted.
  const bool asked_in = reported && reported->rank < 0 && !has(nodes, reported->node);
  const bool finished = asked_in && ended.succeeded && missing.empty();
  const std::optional<Failure> failed = finished ? std::nullopt : reported;
  Verdict v;
  if (failed) {
    v.code = failed->code;
    v.failed_rank = failed->rank;
    v.reason = (failed->node >= 0 ? "node " + std::to_string(failed->node) + ": " : "") + failed->what;
    v.restart = failed->restartable && attempt < rules.max_restarts && missing.empty() && interrupted.empty() &&
                !ended.stop_requested;
  } else if (ended.stopped_on_request) {  // not a failure: no restart, on a signal meant to end the job here
    v.code = launch::StopSignal::kExitCode;
    v.stopped = true;
    v.reason = "the ranks stopped on request (SIGUSR2) after a checkpoint; run the job again (with --resume auto) "
               "to continue from it";
  }
  if (!interrupted.empty() && failed && failed->restartable) {
    if (asked_in && ended.interrupted_code) v.code = ended.interrupted_code;  // 128 + the signal, as for any interrupt
    v.reason += "; not restarted: the launcher of node(s) " + node_list(interrupted) + " was told to stop";
  } else if (ended.stop_requested && failed && failed->restartable && missing.empty()) {
    // The allocation is ending: a restart would be cut short. A new one continues (exit code 75).
    v.code = launch::StopSignal::kExitCode;
    v.stopped = true;
    v.reason += "; not restarted: a stop was requested (SIGUSR2), so the job stops here; run it again (with "
                "--resume auto) to continue from the latest complete checkpoint";
  }
  if (failed && !ended.never_joined.empty()) v.reason += "; " + never_joined;
  if (v.restart || dropped(rules, attempt, nodes, failed, ended)) {
    v.restart = true;
    v.nodes = next_nodes(rules, nodes, ended, v.reason);
  } else if (!missing.empty()) {
    v.code = failed ? failed->code : 1;
    v.reason += (v.reason.empty() ? "" : "; ") + std::string("node(s) ") + node_list(missing) +
                " did not say in time that their ranks ended (their coshard-run is gone, stuck, or cut off from the "
                "store), so the job is not restarted";
  } else if (failed && !v.restart && failed->restartable && interrupted.empty() && !ended.stop_requested) {
    v.reason += "; no restarts left (--max-restarts " + std::to_string(rules.max_restarts) + ")";
  }
  return v;
}

std::chrono::milliseconds store_call_limit(const JobRules& rules) {
  return std::min<std::chrono::milliseconds>(std::chrono::seconds(5), std::chrono::milliseconds(rules.silent_for) / 3);
}

RejoinWindow rejoin_window(const JobRules& rules, int node_rank, int attempt) {
  const auto window = std::chrono::duration_cast<std::chrono::seconds>(rules.silent_for - store_call_limit(rules));
  if (node_rank == 0 || attempt < rules.max_restarts || rules.rejoin_timeout <= window) {
    return {rules.rejoin_timeout, "--rejoin-timeout"};
  }
  return {window, "no restart left: node 0 ends the job once a node is silent for " +
                      std::to_string(rules.silent_for.count()) + " s"};
}

BreakMeans on_break(const StoreLink& l, bool own_store, bool timed_out) {
  if (l.state != Link::up) return BreakMeans::still_cut;
  return own_store && !timed_out ? BreakMeans::lost : BreakMeans::cut;
}

void take_break(StoreLink& l, BreakMeans means, LaunchClock::time_point now) {
  if (means == BreakMeans::lost) {
    l.state = Link::broken;
  } else if (means == BreakMeans::cut) {
    l.state = Link::cut;
    l.since = now;
    l.next_try = now;
  }
}

bool try_again_now(const StoreLink& l, LaunchClock::time_point now) {
  return l.state == Link::cut && now >= l.next_try;
}

bool try_failed(StoreLink& l, LaunchClock::time_point now, std::chrono::seconds window) {
  l.next_try = now + kReconnectEvery;
  if (l.state != Link::cut || now - l.since < window) return false;
  l.state = Link::given_up;
  l.cut_for = std::chrono::duration_cast<std::chrono::seconds>(now - l.since).count();
  return true;
}

void reached_again(StoreLink& l) {
  if (l.state == Link::cut) l.state = Link::up;
}

void replaced_by(StoreLink& l, std::string who) {
  l.state = Link::replaced;
  l.reason = std::move(who);
}

}  // namespace coshard::run
