#include "coordinator.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <vector>

#include "coordinator_internal.hpp"
#include "coshard/runtime/error.hpp"
#include "coshard/runtime/scheduler.hpp"
#include "coshard/launch/stop_signal.hpp"
#include "coshard/launch/store.hpp"

namespace coshard::run {
namespace {

using namespace coord;

// A failure record that no launcher of this build wrote ends the job: another program or build
// writes this store, and nothing it says can be trusted.
Failure read_failure(const std::string& key, const std::string& said) {
  if (auto f = decode_failure(said)) return *f;
  return Failure{.node = -1, .code = 1, .restartable = false, .what = unreadable_record(key, said)};
}

}  // namespace

std::optional<Failure> Coordinator::failure(int attempt) {
  auto lost = [&]() -> std::optional<Failure> {
    if (!link_.lost() || std::exchange(link_.told, true)) return std::nullopt;
    return lost_failure();
  };
  try {
    if (!usable()) return lost();
    const std::string key = attempt_key(attempt, "failure");
    if (auto v = sched_->sync_wait(store().get(key))) return read_failure(key, *v);
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
                                 .what = "its coshard-run fell silent " + std::to_string(rules_.silent_for.count()) +
                                         " s ago (its host is down, or cut off from node 0)"});
}

Failure Coordinator::report(int attempt, Failure f) {
  try {
    if (usable()) {
      const std::string key = attempt_key(attempt, "failure");
      return read_failure(key, sched_->sync_wait(store().compare_set(key, "", encode(f))));
    }
  } catch (const Error& e) {
    broke(e);
  }
  if (!link_.lost() && !unsent_) unsent_.emplace(attempt, f);  // sent once the store answers again
  return f;
}

void Coordinator::say_ended(int attempt) {
  sched_->sync_wait(
      store().set(attempt_key(attempt, "done/" + std::to_string(o_.node_rank)), encode(DoneReport{.asked_in = true})));
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
  if (!link_.lost() && !unsent_) unsent_.emplace(attempt, f);  // both go out once the store answers (usable)
}

Verdict Coordinator::finish(int attempt, const AttemptEnd& end) {
  const int code = end.rc ? end.rc : 1;
  // No restart can follow an interrupt: nothing to wait for, but on node 0, whose own store
  // answers again once the stall that cut it off is over, and who owes the others a verdict.
  if (end.interrupted && link_.cut_off() && o_.node_rank != 0) {
    return Verdict{.code = code, .reason = "interrupted while the store at " + where_ + " did not answer"};
  }
  Verdict v;
  for (;;) {  // again after each time the store stops answering, until it is lost
    if (const int sig = await_store()) {
      return Verdict{.code = 128 + sig,
                     .reason = std::string("got ") + strsignal(sig) + " while trying to reach the store at " + where_};
    }
    if (link_.lost()) return Verdict{.code = code, .reason = lost_failure().what};
    try {
      sched_->sync_wait(store().set(attempt_key(attempt, "done/" + std::to_string(o_.node_rank)),
                                    encode(DoneReport{.rc = end.rc,
                                                      .interrupted = end.interrupted,
                                                      .stop_requested = end.stop_requested || stop_pending()})));
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

// Node 0: waits for the nodes of the attempt to end (decisions.hpp: EndWait), then decides.
Verdict Coordinator::decide(int attempt) {
  if (auto said = sched_->sync_wait(store().get(attempt_key(attempt, "verdict")))) return decided(attempt, *said);
  EndWait w(attempt, nodes_, Clock::now(), rules_);
  for (bool over = false; !over;) {
    heartbeat();  // the others, awaiting the verdict, judge node 0 by it
    const EndStep step = end_step(w, poll_ends(attempt, w));
    switch (step.action) {
      case EndAction::decide:
        over = true;
        break;
      case EndAction::report_silent:
        over = fell_silent(w, step.node, report_silent(attempt, step.node), Clock::now(), rules_);
        if (!over) {
          console_.say("coshard-run: node %d fell silent; waiting up to %lld s (--rejoin-timeout) for it to come "
                       "back\n", step.node, static_cast<long long>(o_.rejoin_timeout.count()));
        }
        break;
      case EndAction::report_stop:
        w.failed = stopped(attempt, w.stop);
        over = true;
        break;
      case EndAction::read_failure:
        if (auto f = failure(attempt)) {
          took_failure(w, *f, Clock::now(), rules_);
        } else {
          console_.wait(kPoll);
        }
        break;
      case EndAction::wait:
        console_.wait(kPoll);  // writing what waits meanwhile
        break;
    }
  }
  int stop = w.stop;
  if (!stop && (stop = pending_stop())) w.failed = stopped(attempt, stop);  // also when node 0 ended last
  if (!w.failed) w.failed = failure(attempt);
  const NodesEnded ended = close_wait(w, stop, stop_pending(), rejoined(attempt));
  read_refusals();  // one may have come since the last watch, or after the ranks ended
  const Verdict v = verdict(rules_, attempt, nodes_, w.failed, ended, never_joined(ended.never_joined));
  sched_->sync_wait(store().set(attempt_key(attempt, "verdict"), encode(v)));
  if (!v.restart) await_readers(attempt, w.done);
  return v;
}

// What node 0 reads in one poll of the nodes that have not said yet that their ranks ended: their
// done reports, their claims once the attempt failed, and their beats.
EndPoll Coordinator::poll_ends(int attempt, const EndWait& w) {
  const auto& missing = w.ended.missing;
  const auto said = per_node(attempt_key(attempt, "done"), missing);
  const auto claims = w.failed ? per_node("node", missing) : std::vector<std::optional<std::string>>(missing.size());
  const auto counts = per_node("alive", missing);
  EndPoll p{.now = Clock::now(), .seen = {}, .stop = pending_stop()};
  for (std::size_t i = 0; i < missing.size(); ++i) {
    const int n = missing[i];
    const bool silent = n != 0 && silence_.judge(n, counts[i], p.now);
    p.seen[n] = NodeSeen{.said = said[i], .claimed = claims[i].has_value(), .silent = silent, .heard = silence_.heard(n)};
  }
  return p;
}

// The verdict that node 0 wrote before a stall of its launcher failed the call (finish() then
// decides again): the nodes may have read it already, so node 0 keeps to it.
Verdict Coordinator::decided(int attempt, const std::string& said) {
  const Verdict v = read_verdict(attempt_key(attempt, "verdict"), said);
  if (v.restart) return v;
  const auto ended = per_node(attempt_key(attempt, "done"), every_node(o_.nnodes));
  std::vector<int> done;
  for (int n = 1; n < o_.nnodes; ++n) {
    if (ended[static_cast<std::size_t>(n)]) done.push_back(n);
  }
  await_readers(attempt, done);
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

// A node among `nodes` (not 0) whose count has not changed for the silence time and that has not said
// its ranks of `attempt` ended. Every node beats once when it joins, so a joined node is judged.
std::optional<int> Coordinator::silent_node(int attempt, const std::vector<int>& nodes) {
  std::vector<int> others;
  std::copy_if(nodes.begin(), nodes.end(), std::back_inserter(others), [](int n) { return n != 0; });
  const auto counts = per_node("alive", others);
  for (std::size_t i = 0; i < others.size(); ++i) {
    const int n = others[i];
    if (silence_.judge(n, counts[i], Clock::now()) && !sched_->sync_wait(store().get(attempt_key(attempt, "done/" + std::to_string(n))))) {
      return n;
    }
  }
  return std::nullopt;
}

bool Coordinator::silent(int n) {
  return silence_.judge(n, sched_->sync_wait(store().get("alive/" + std::to_string(n))), Clock::now());
}

Verdict Coordinator::read_verdict(const std::string& key, const std::string& said) {
  if (auto v = decode_verdict(said)) return *v;
  return Verdict{.code = 1, .reason = unreadable_record(key, said)};
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
  silence_.forget_all();
  for (;;) {
    heartbeat();  // so that a second launcher for this node rank sees this one alive, not silent
    if (link_.lost()) return Verdict{.code = 1, .reason = lost_failure().what};  // another took its place
    const std::string key = attempt_key(attempt, "verdict");
    if (auto v = sched_->sync_wait(store().get(key))) return read_verdict(key, *v);
    if (silent(0)) {
      return Verdict{.code = 1, .reason = "node 0's coshard-run fell silent " + std::to_string(rules_.silent_for.count()) +
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
