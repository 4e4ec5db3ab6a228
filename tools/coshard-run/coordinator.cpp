#include "coordinator.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <sstream>
#include <vector>

#include "coordinator_internal.hpp"
#include "coshard/runtime/error.hpp"
#include "coshard/runtime/parse_whole.hpp"
#include "coshard/runtime/scheduler.hpp"
#include "coshard/transport/stop_signal.hpp"
#include "coshard/transport/store.hpp"

namespace coshard::run {
namespace {

using namespace coord;

// "<node> <rank> <code> <restartable> <at checkpoint> <what>"
std::string encode(const Failure& f) {
  return std::to_string(f.node) + " " + std::to_string(f.rank) + " " + std::to_string(f.code) + " " +
         (f.restartable ? "1" : "0") + " " + (f.at_checkpoint ? "1" : "0") + " " + f.what;
}

Failure decode(const std::string& s) {
  Failure f;
  std::istringstream in(s);
  int restartable = 0, at_checkpoint = 0;
  in >> f.node >> f.rank >> f.code >> restartable >> at_checkpoint;
  f.restartable = restartable != 0;
  f.at_checkpoint = at_checkpoint != 0;
  in.get();
  std::getline(in, f.what, '\0');
  return f;
}

// "restart|stop|exit <code> <failed rank>[ <node>...]\n<reason>": a restart names its nodes.
std::string encode(const Verdict& v) {
  return std::string(v.restart ? "restart " : v.stopped ? "stop " : "exit ") + std::to_string(v.code) + " " +
         std::to_string(v.failed_rank) + (v.nodes.empty() ? "" : " " + node_words(v.nodes)) + "\n" + v.reason;
}

Verdict decode_verdict(const std::string& s) {
  Verdict v;
  std::istringstream in(s);
  std::string what;
  v.code = 1;
  in >> what >> v.code >> v.failed_rank;
  v.restart = what == "restart";
  v.stopped = what == "stop";
  const auto nl = s.find('\n');
  std::string nodes;
  std::getline(in, nodes);
  v.nodes = parse_nodes(nodes);
  if (nl != std::string::npos) v.reason = s.substr(nl + 1);
  return v;
}

// What node `n` said when its ranks ended: "<rc>[ interrupted][ stop]".
void note_end(NodesEnded& ended, int n, const std::string& said) {
  // What cannot be read counts as a failure (atoi of a number beyond an int was undefined).
  const int rc = parse_whole<int>(std::string_view(said).substr(0, said.find(' '))).value_or(1);
  if (said.find(" interrupted") != std::string::npos) {
    ended.interrupted.push_back(n);
    if (!ended.interrupted_code) ended.interrupted_code = rc;
  }
  ended.stop_requested |= said.find(" stop") != std::string::npos;
  // Without " stop" the ranks followed peers that were asked, or stopped for a node taken in.
  ended.stopped_on_request |= rc == transport::StopSignal::kExitCode;
  ended.succeeded &= rc == 0;
}

}  // namespace

std::optional<Failure> Coordinator::failure(int attempt) {
  auto lost = [&]() -> std::optional<Failure> {
    if (!lost_ || std::exchange(lost_told_, true)) return std::nullopt;
    return lost_failure();
  };
  try {
    if (!usable()) return lost();
    auto v = sched_->sync_wait(store().get(attempt_key(attempt, "failure")));
    if (v) return decode(*v);
    if (o_.node_rank != 0 || Clock::now() < next_watch_) return std::nullopt;
    next_watch_ = Clock::now() + std::chrono::seconds(1);
    read_refusals();
    if (auto why = foreign_node(per_node("node", every_node(o_.nnodes)))) {
      return report(attempt, Failure{.code = 1, .restartable = false, .what = *why});
    }
    const auto n = silent_node(attempt, nodes_);
    if (!n) return std::nullopt;
    return report_silent(attempt, *n);
  } catch (const Error& e) {
    broke(e);
    return lost();
  }
}

void Coordinator::stop_now(int attempt, const std::string& why) {
  try {
    if (usable()) {
      sched_->sync_wait(store().compare_set(attempt_key(attempt, "stop-now"), "",
                                            why.empty() ? "node " + std::to_string(o_.node_rank) +
                                                              " stopped its ranks without a checkpoint"
                                                        : why));
    }
  } catch (const Error& e) {
    broke(e);
  }
}

std::optional<std::string> Coordinator::stopping_now(int attempt) {
  try {
    if (!usable()) return std::nullopt;
    if (auto why = sched_->sync_wait(store().get(attempt_key(attempt, "stop-now")))) return why;
    // Node 0 judges the others here too (failure() no longer does once the take-in stands): the
    // ranks of a node that fell silent cannot save their share.
    if (o_.node_rank != 0 || Clock::now() < next_watch_) return std::nullopt;
    next_watch_ = Clock::now() + std::chrono::seconds(1);
    if (const auto n = silent_node(attempt, nodes_)) {
      const std::string why = "node " + std::to_string(*n) + " fell silent";
      stop_now(attempt, why);
      return why;
    }
  } catch (const Error& e) {
    broke(e);
  }
  return std::nullopt;
}

// This launcher was told to stop (`sig`): no node restarts `attempt`.
Failure Coordinator::stopped(int attempt, int sig) {
  return report(attempt, Failure{.node = o_.node_rank, .code = 128 + sig, .restartable = false,
                                 .what = "coshard-run on " + this_host() + " got " + strsignal(sig)});
}

// While restarts remain the node may be cut off rather than gone: restartable if it comes back.
Failure Coordinator::report_silent(int attempt, int node) {
  return report(attempt, Failure{.node = node, .code = 1, .restartable = attempt < o_.max_restarts,
                                 .what = "its coshard-run fell silent " + std::to_string(kSilentFor.count()) +
                                         " s ago (its host is down, or cut off from node 0)"});
}

Failure Coordinator::report(int attempt, Failure f) {
  try {
    if (usable()) return decode(sched_->sync_wait(store().compare_set(attempt_key(attempt, "failure"), "", encode(f))));
  } catch (const Error& e) {
    broke(e);
  }
  if (!lost_ && !unsent_) unsent_.emplace(attempt, f);  // sent once the store answers again
  return f;
}

void Coordinator::say_ended(int attempt) {
  sched_->sync_wait(store().set(attempt_key(attempt, "done/" + std::to_string(o_.node_rank)), "1"));
}

void Coordinator::ask_in(int attempt, const std::string& why, bool at_checkpoint) {
  asked_in_ = attempt;
  console_.say("coshard-run: node %d: %s; attempt %d ends so that every node restarts, taking node %d in\n",
               o_.node_rank, why.c_str(), attempt, o_.node_rank);
  const Failure f{.node = o_.node_rank, .code = 1, .restartable = true, .at_checkpoint = at_checkpoint, .what = why};
  try {  // the end before the report, which node 0 may act on at once
    if (usable()) {
      say_ended(attempt);
      report(attempt, f);
      return;
    }
  } catch (const Error& e) {
    broke(e);
  }
  if (!lost_ && !unsent_) unsent_.emplace(attempt, f);  // both go out once the store answers (usable)
}

Verdict Coordinator::finish(int attempt, const AttemptEnd& end) {
  const int code = end.rc ? end.rc : 1;
  // No restart can follow an interrupt: nothing to wait for, but on node 0, whose own store
  // answers again once the stall that cut it off is over, and who owes the others a verdict.
  if (end.interrupted && cut_since_ && o_.node_rank != 0) {
    return Verdict{.code = code, .reason = "interrupted while the store at " + where_ + " did not answer"};
  }
  Verdict v;
  for (;;) {  // again after each time the store stops answering, until it is lost
    if (const int sig = await_store()) {
      return Verdict{.code = 128 + sig,
                     .reason = std::string("got ") + strsignal(sig) + " while trying to reach the store at " + where_};
    }
    if (lost_) return Verdict{.code = code, .reason = lost_failure().what};
    try {
      sched_->sync_wait(store().set(attempt_key(attempt, "done/" + std::to_string(o_.node_rank)),
                                    std::to_string(end.rc) + (end.interrupted ? " interrupted" : "") +
                                        (end.stop_requested || stop_pending() ? " stop" : "")));
      v = o_.node_rank == 0 ? decide(attempt) : await_verdict(attempt);
      if (v.restart) nodes_ = v.nodes;
      if (o_.node_rank == 0) return v;
      break;
    } catch (const Error& e) {
      broke(e);
    }
  }
  try {  // node 0 keeps its store up for the job's end until every node has read it
    if (!v.restart) sched_->sync_wait(store().set(attempt_key(attempt, "read/" + std::to_string(o_.node_rank)), ""));
  } catch (const Error&) {
    // the verdict was read: node 0 stopping its store at this moment changes nothing
  }
  return v;
}

// Node 0: waits until every node of the attempt has said its ranks ended (after a failure, for the
// grace period and a minute more), until one falls silent (while restarts remain, for
// --rejoin-timeout more: it may be cut off rather than gone), until --join-timeout passed with
// the missing nodes never heard from, or until this launcher is told to stop; then decides.
Verdict Coordinator::decide(int attempt) {
  if (auto said = sched_->sync_wait(store().get(attempt_key(attempt, "verdict")))) return decided(attempt, *said);
  NodesEnded ended;
  std::vector<int>& missing = ended.missing;
  missing = nodes_;
  std::vector<int> done;
  std::optional<Clock::time_point> deadline;  // set by a failure; before one, liveness bounds the wait
  std::optional<Failure> failed;
  std::vector<int> rejoining;    // nodes that fell silent, given --rejoin-timeout to come back
  std::optional<Clock::time_point> rejoin_by;  // the last of them to fall silent has until then
  int stop = 0;
  const auto join_deadline = Clock::now() + o_.join_timeout;  // for nodes never heard from
  for (;;) {
    heartbeat();  // the others, awaiting the verdict, judge node 0 by it
    ended_now(attempt, failed.has_value(), ended, done);
    if (missing.empty() || (deadline && Clock::now() >= *deadline)) break;
    // Nodes that fell silent have --rejoin-timeout, not the minute a beating node gets to stop its ranks.
    // One that beats again (it came back and stops its ranks) is waited for as any other.
    if (rejoin_by && Clock::now() >= *rejoin_by && std::all_of(missing.begin(), missing.end(), [&](int n) {
          return std::find(rejoining.begin(), rejoining.end(), n) != rejoining.end() && silent(n);
        })) {
      break;
    }
    if (Clock::now() >= join_deadline && std::none_of(missing.begin(), missing.end(), [&](int n) { return heard_.count(n); })) {
      break;
    }
    std::vector<int> judged;
    std::copy_if(missing.begin(), missing.end(), std::back_inserter(judged),
                 [&](int n) { return std::find(rejoining.begin(), rejoining.end(), n) == rejoining.end(); });
    if (const auto n = silent_node(attempt, judged)) {
      failed = report_silent(attempt, *n);  // the attempt's first failure, which may be another
      if (attempt >= o_.max_restarts) break;  // no restart could follow: nothing to wait for
      rejoining.push_back(*n);
      rejoin_by = Clock::now() + Clock::duration(o_.rejoin_timeout);
      deadline = std::max({deadline.value_or(Clock::now()), *rejoin_by, ending_by(*failed)});
      console_.say("coshard-run: node %d fell silent; waiting up to %lld s (--rejoin-timeout) for it to come "
                   "back\n", *n, static_cast<long long>(o_.rejoin_timeout.count()));
      continue;
    }
    if ((stop = pending_stop())) {
      failed = stopped(attempt, stop);
      break;
    }
    if (!failed && (failed = failure(attempt))) {
      deadline = ending_by(*failed);
      continue;
    }
    console_.wait(kPoll);  // writing what waits meanwhile
  }
  if (!stop && (stop = pending_stop())) failed = stopped(attempt, stop);  // also when node 0 ended last
  if (!failed) failed = failure(attempt);
  ended.stop_requested |= stop_pending();  // SIGUSR2 while no rank ran here: the job is to end all the same
  auto& interrupted = ended.interrupted;
  if (stop && std::find(interrupted.begin(), interrupted.end(), 0) == interrupted.end()) interrupted.push_back(0);
  if (stop && !ended.interrupted_code) ended.interrupted_code = 128 + stop;
  std::copy_if(rejoining.begin(), rejoining.end(), std::back_inserter(ended.silent), [&](int n) {
    return std::find(missing.begin(), missing.end(), n) != missing.end();
  });
  ended.rejoined = rejoined(attempt);
  done.insert(done.end(), ended.rejoined.begin(), ended.rejoined.end());
  read_refusals();  // one may have come since the last watch, or after the ranks ended
  Verdict v = verdict(attempt, failed, ended);
  sched_->sync_wait(store().set(attempt_key(attempt, "verdict"), encode(v)));
  if (!v.restart) await_readers(attempt, done);
  return v;
}

// The verdict that node 0 wrote before a stall of its launcher failed the call (finish() then
// decides again): the nodes may have read it already, so node 0 keeps to it.
Verdict Coordinator::decided(int attempt, const std::string& said) {
  const Verdict v = decode_verdict(said);
  if (v.restart) return v;
  const auto ended = per_node(attempt_key(attempt, "done"), every_node(o_.nnodes));
  std::vector<int> done;
  for (int n = 1; n < o_.nnodes; ++n) {
    if (ended[static_cast<std::size_t>(n)]) done.push_back(n);
  }
  await_readers(attempt, done);
  return v;
}

// Until when the nodes may take to stop their ranks once `f` ended the attempt: --grace and a
// minute more, and --take-in-timeout more while they stop after a checkpoint for a node taken in.
Clock::time_point Coordinator::ending_by(const Failure& f) const {
  const auto saving = f.at_checkpoint ? o_.take_in_timeout : std::chrono::seconds(0);
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(
                            std::chrono::duration<double>(o_.grace_seconds + 60) + saving);
}

Verdict Coordinator::verdict(int attempt, const std::optional<Failure>& reported, const NodesEnded& ended) const {
  const auto& [missing, interrupted, stopped_on_request, stop_requested, silent, rejoined, never, succeeded,
               interrupted_code] = ended;
  // A node asked in (Coordinator::ask_in), which is no failure of the attempt's ranks. As every
  // rank ended well, the job is done, not restarted.
  const bool asked_in = reported && reported->rank < 0 &&
                        std::find(nodes_.begin(), nodes_.end(), reported->node) == nodes_.end();
  const bool finished = asked_in && succeeded && missing.empty();
  const std::optional<Failure> failed = finished ? std::nullopt : reported;
  Verdict v;
  if (failed) {
    v.code = failed->code;
    v.failed_rank = failed->rank;
    v.reason = (failed->node >= 0 ? "node " + std::to_string(failed->node) + ": " : "") + failed->what;
    v.restart = failed->restartable && attempt < o_.max_restarts && missing.empty() && interrupted.empty() &&
                !stop_requested;
  } else if (stopped_on_request) {  // not a failure: no restart, on a signal meant to end the job here
    v.code = transport::StopSignal::kExitCode;
    v.stopped = true;
    v.reason = "the ranks stopped on request (SIGUSR2) after a checkpoint; run the job again (with --resume auto) "
               "to continue from it";
  }
  if (!interrupted.empty() && failed && failed->restartable) {
    if (asked_in && interrupted_code) v.code = interrupted_code;  // 128 + the signal, as for any interrupt
    v.reason += "; not restarted: the launcher of node(s) " + node_list(interrupted) + " was told to stop";
  } else if (stop_requested && failed && failed->restartable && missing.empty()) {
    // The allocation is ending: a restart would be cut short. A new one continues (exit code 75).
    v.code = transport::StopSignal::kExitCode;
    v.stopped = true;
    v.reason += "; not restarted: a stop was requested (SIGUSR2), so the job stops here; run it again (with "
                "--resume auto) to continue from the latest complete checkpoint";
  }
  if (failed && !never.empty()) v.reason += "; " + never_joined(never);
  if (v.restart || dropped(attempt, failed, ended)) {
    v.restart = true;
    v.nodes = next_nodes(ended, v.reason);
  } else if (!missing.empty()) {
    v.code = failed ? failed->code : 1;
    v.reason += (v.reason.empty() ? "" : "; ") + std::string("node(s) ") + node_list(missing) +
                " did not say in time that their ranks ended (their coshard-run is gone, stuck, or cut off from the "
                "store), so the job is not restarted";
  } else if (failed && !v.restart && failed->restartable && interrupted.empty() && !stop_requested) {
    v.reason += "; no restarts left (--max-restarts " + std::to_string(o_.max_restarts) + ")";
  }
  return v;
}

// Nodes not in `attempt` whose launcher, started again after they were dropped, said it ended
// (Coordinator::join): they rejoin at the restart.
std::vector<int> Coordinator::rejoined(int attempt) {
  std::vector<int> others;
  for (int n = 0; n < o_.nnodes; ++n) {
    if (std::find(nodes_.begin(), nodes_.end(), n) == nodes_.end()) others.push_back(n);
  }
  const auto said = per_node(attempt_key(attempt, "done"), others);
  std::vector<int> out;
  for (std::size_t i = 0; i < others.size(); ++i) {
    if (said[i]) out.push_back(others[i]);
  }
  return out;
}

// Takes the nodes of ended.missing that said their ranks of `attempt` ended out of it (into
// `done`, but for node 0), and after a failure those that never joined: they have no ranks to stop.
void Coordinator::ended_now(int attempt, bool failed, NodesEnded& ended, std::vector<int>& done) {
  auto& missing = ended.missing;
  const auto said = per_node(attempt_key(attempt, "done"), missing);
  const auto claims = failed ? per_node("node", missing) : std::vector<std::optional<std::string>>(missing.size());
  std::vector<int> still;
  for (std::size_t i = 0; i < missing.size(); ++i) {
    const int n = missing[i];
    if (said[i]) {
      note_end(ended, n, *said[i]);
      if (n != 0) done.push_back(n);
    } else if (!failed || claims[i]) {
      still.push_back(n);
    } else {
      ended.never_joined.push_back(n);
    }
  }
  missing = std::move(still);
}

// Whether the job goes on without the nodes missing at the end of `attempt` (--nnodes MIN:MAX):
// a restart would follow but for them, each fell silent and stayed so for --rejoin-timeout, and
// at least MIN nodes are left. Node 0 serves the store, so it is never among them.
bool Coordinator::dropped(int attempt, const std::optional<Failure>& failed, const NodesEnded& ended) const {
  // Named through `ended`, not bound: clang 14 lambdas cannot capture structured bindings.
  const auto& missing = ended.missing;
  const auto& silent = ended.silent;
  if (!failed || !failed->restartable || attempt >= o_.max_restarts || !ended.interrupted.empty() ||
      ended.stop_requested) {
    return false;
  }
  if (missing.empty() ||
      nodes_.size() - missing.size() + ended.rejoined.size() < static_cast<std::size_t>(o_.min_nodes)) {
    return false;
  }
  return std::all_of(missing.begin(), missing.end(),
                     [&](int n) { return std::find(silent.begin(), silent.end(), n) != silent.end(); });
}

// The nodes of the next attempt: this one's less those missing (dropped), and those that rejoin.
std::vector<int> Coordinator::next_nodes(const NodesEnded& ended, std::string& reason) const {
  std::vector<int> next;
  std::copy_if(nodes_.begin(), nodes_.end(), std::back_inserter(next), [&](int n) {
    return std::find(ended.missing.begin(), ended.missing.end(), n) == ended.missing.end();
  });
  if (!ended.missing.empty()) {
    reason += "; node(s) " + node_list(ended.missing) + " did not come back within " +
              std::to_string(o_.rejoin_timeout.count()) + " s (--rejoin-timeout), so the job goes on without them (" +
              std::to_string(next.size()) + " of " + std::to_string(o_.nnodes) + " nodes, --nnodes " +
              std::to_string(o_.min_nodes) + ":" + std::to_string(o_.nnodes) + ")";
  }
  if (!ended.rejoined.empty()) reason += "; node(s) " + node_list(ended.rejoined) + " rejoin the job";
  next.insert(next.end(), ended.rejoined.begin(), ended.rejoined.end());
  std::sort(next.begin(), next.end());
  return next;
}

// A node among `nodes` (not 0) whose count has not changed for kSilentFor and that has not said
// its ranks of `attempt` ended. Every node beats once when it joins, so a joined node is judged.
std::optional<int> Coordinator::silent_node(int attempt, const std::vector<int>& nodes) {
  std::vector<int> others;
  std::copy_if(nodes.begin(), nodes.end(), std::back_inserter(others), [](int n) { return n != 0; });
  const auto counts = per_node("alive", others);
  for (std::size_t i = 0; i < others.size(); ++i) {
    const int n = others[i];
    if (silent(n, counts[i]) && !sched_->sync_wait(store().get(attempt_key(attempt, "done/" + std::to_string(n))))) {
      return n;
    }
  }
  return std::nullopt;
}

bool Coordinator::silent(int n) { return silent(n, sched_->sync_wait(store().get("alive/" + std::to_string(n)))); }

// Whether node `n`'s count, read as `count`, stood still for kSilentFor (false for a node not
// heard from yet; judged afresh after this launcher stood still: heartbeat).
bool Coordinator::silent(int n, const std::optional<std::string>& count) {
  if (!count) return false;
  auto [it, first] = heard_.try_emplace(n, Beat{*count, Clock::now()});
  if (!first && it->second.count != *count) it->second = Beat{*count, Clock::now()};
  return Clock::now() - it->second.since >= kSilentFor;
}

// The job ends: the store stops with node 0's launcher, once the others have read the verdict.
void Coordinator::await_readers(int attempt, const std::vector<int>& nodes) {
  std::vector<std::string> keys;
  for (int n : nodes) keys.push_back(attempt_key(attempt, "read/" + std::to_string(n)));
  if (keys.empty()) return;
  try {
    sched_->sync_wait(store().wait(std::move(keys), std::chrono::milliseconds(30000)));
  } catch (const Error& e) {  // the verdict is out: a late reader only misses the store's last reply
    console_.say("coshard-run: not every node read how the job ended within 30 s: %s\n", e.message().c_str());
  }
}

// Other nodes: as long as node 0 beats (its ranks may run on well after these ended), and this
// launcher is not told to stop.
Verdict Coordinator::await_verdict(int attempt) {
  heard_.clear();
  for (;;) {
    heartbeat();  // so that a second launcher for this node rank sees this one alive, not silent
    if (lost_) return Verdict{.code = 1, .reason = lost_failure().what};  // another took its place
    if (auto v = sched_->sync_wait(store().get(attempt_key(attempt, "verdict")))) return decode_verdict(*v);
    if (silent(0)) {
      return Verdict{.code = 1, .reason = "node 0's coshard-run fell silent " + std::to_string(kSilentFor.count()) +
                                          " s ago, before it said whether the job restarts"};
    }
    if (const int stop = pending_stop()) {
      // Should node 0 restart, its next attempt ends at once rather than waiting for this node.
      stopped(attempt + 1, stop);
      return Verdict{.code = 128 + stop,
                     .reason = std::string("got ") + strsignal(stop) + " while waiting for node 0's verdict"};
    }
    console_.wait(kPoll);  // writing what waits meanwhile
  }
}

}  // namespace coshard::run
