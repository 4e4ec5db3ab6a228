#pragma once
// Node 0's decisions over the end of an attempt, as functions of what the store said and of the
// time, with no I/O: the Coordinator polls the store, hands each poll here, and does what comes
// back (report a node silent, report its own interrupt, read the attempt's failure, wait, or
// decide). Its tests (tests/tools/decisions_test.cpp) drive them in process, row by row.
//
//   poll ──► end_step ──► wait           poll again after kPoll
//                    ├──► report_silent  Coordinator reports it; fell_silent(): decide now?
//                    ├──► report_stop    Coordinator reports this launcher's SIGINT/SIGTERM; decide
//                    ├──► read_failure   Coordinator reads the attempt's failure; took_failure()
//                    └──► decide         close_wait() ──► verdict() ──► written to the store
#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "records.hpp"

namespace coshard::run {

using LaunchClock = std::chrono::steady_clock;

// What the decisions read of the job's flags (the same on every node: the claim checks them).
struct JobRules {
  int nnodes = 1;
  int min_nodes = 1;
  int max_restarts = 0;
  double grace_seconds = 5;
  std::chrono::seconds join_timeout{600};
  std::chrono::seconds rejoin_timeout{60};
  std::chrono::seconds take_in_timeout{300};
  // A launcher whose beat count stood still this long is lost (its host crashed, or it was cut off):
  // --silence-timeout.
  std::chrono::seconds silent_for{15};
};

// How long one store call may take: a third of the silence time, at most 5 s, so that one slow
// call never passes for silence and a launcher away for longer stood still itself.
std::chrono::milliseconds store_call_limit(const JobRules& rules);

// How long a launcher cut off from node 0's store tries to reach it again, and why that long.
struct RejoinWindow {
  std::chrono::seconds length;
  std::string why;
  bool operator==(const RejoinWindow&) const = default;
};
// While restarts remain (attempt below --max-restarts), and always on node 0, --rejoin-timeout.
// With none left, a node other than 0 tries no longer than node 0 waits before it ends the job:
// the silence time from its last beat, which came about a store call's limit before the call that
// broke. A cut shorter than that is ridden out; after it nothing but node 0's verdict can follow.
RejoinWindow rejoin_window(const JobRules& rules, int node_rank, int attempt);

// This launcher's link to node 0's store: one state, with the data that state has. A cut is
// tried again every kReconnectEvery until rejoin_window, then given up; the three lost states end
// what this launcher asks of the store.
//
//   up ──on_break: cut──► cut ──reached_again──► up
//    │                     └──try_failed past the window──► given_up
//    ├──on_break: lost (node 0's own store failed) ──► broken
//    └──another launcher holds this node rank (Coordinator::replaced) ──► replaced
enum class Link {
  up,        // the store answers
  cut,       // it stopped answering at `since`
  given_up,  // the cut lasted rejoin_window: lost, `cut_for` seconds after `since`
  broken,    // node 0's own store failed, not for a stall: lost
  replaced,  // another launcher took this one's node rank after it fell silent: lost, `reason` says who
};
struct StoreLink {
  Link state = Link::up;
  LaunchClock::time_point since{};     // cut, given_up: when the store stopped answering
  LaunchClock::time_point next_try{};  // cut: when to try to reach it again
  long long cut_for = 0;               // given_up: seconds from `since` to giving up
  std::string reason;                  // the store's last error, or who took this launcher's place
  bool told = false;                   // lost: Coordinator::failure() has said so
  bool lost() const noexcept { return state == Link::given_up || state == Link::broken || state == Link::replaced; }
  // The store stopped answering and has not since (cut, or given up after a cut).
  bool cut_off() const noexcept { return state == Link::cut || state == Link::given_up; }
};
// A launcher cut off tries to reach the store again this often (each try is short: the
// supervisor's loop, which relays the ranks' output, waits for it).
inline constexpr std::chrono::seconds kReconnectEvery{1};
enum class BreakMeans {
  still_cut,  // the store was cut off or lost already: nothing new
  cut,        // a cut begins: try to reach the store again within rejoin_window
  lost,       // the store is gone: the job ends here
};
// What a store call that failed means. `own_store`: this launcher serves the store (node 0), so a
// call to it that timed out means this launcher stalled past the call's deadline (stopped and
// continued, a paused VM): a cut too, as are calls on the connection that timeout closed. Any
// other failure of its own store is a loss.
BreakMeans on_break(const StoreLink& l, bool own_store, bool timed_out);
// The link after on_break said `means` at `now`: a cut begins (its first try at once), or the
// store is broken.
void take_break(StoreLink& l, BreakMeans means, LaunchClock::time_point now);
// Whether to try to reach the store at `now`: while cut, at most every kReconnectEvery.
bool try_again_now(const StoreLink& l, LaunchClock::time_point now);
// A try at `now` failed: the next one kReconnectEvery later. Once the cut has lasted `window`
// (rejoin_window) the store is given up: true then.
bool try_failed(StoreLink& l, LaunchClock::time_point now, std::chrono::seconds window);
// A try reached the store: up again.
void reached_again(StoreLink& l);
// Another launcher holds this node rank (`who` says which): the store is lost to this one.
void replaced_by(StoreLink& l, std::string who);

// Each node's beat count, and since when it has not changed. A node not heard from yet is not
// judged; one whose count changes is heard afresh.
class Silence {
 public:
  explicit Silence(std::chrono::seconds after) : after_(after) {}
  // Notes node `n`'s count as read at `now` (nullopt: it never beat); true once it stood still for
  // the silence time.
  bool judge(int n, const std::optional<std::string>& count, LaunchClock::time_point now);
  bool heard(int n) const { return beats_.count(n) != 0; }
  // This launcher itself stood still until `now` (stopped, starved of CPU): it did not watch the
  // others meanwhile, and on node 0 they could not reach its store, so every silence counts from now.
  void stood_still(LaunchClock::time_point now);
  void forget(int n) { beats_.erase(n); }
  void forget_all() { beats_.clear(); }
  std::chrono::seconds after() const noexcept { return after_; }

 private:
  struct Beat {
    std::string count;
    LaunchClock::time_point since;
  };
  std::chrono::seconds after_;
  std::map<int, Beat> beats_;
};

// What the nodes said when their ranks ended, as node 0 reads it.
struct NodesEnded {
  std::vector<int> missing;       // did not say in time
  std::vector<int> interrupted;   // their launcher was told to stop: no restart then
  bool stopped_on_request = false;  // a node's ranks stopped after a checkpoint (exit code 75)
  bool stop_requested = false;      // a node's launcher got SIGUSR2 for its ranks: no restart then either
  std::vector<int> silent;        // fell silent and did not come back within --rejoin-timeout
  std::vector<int> rejoined;      // not in the attempt: their launcher was started again, and they rejoin
  std::vector<int> never_joined;  // after a failure: no launcher ever claimed their node rank
  bool succeeded = true;          // every node's ranks ended with 0
  int interrupted_code = 0;       // the first interrupted node's exit code (128 + the signal)
};

// Node `n` said `said` (its attempt/A/done/N); what cannot be read counts as a failure.
void note_end(NodesEnded& ended, int n, const std::optional<DoneReport>& said);

// What node 0 read in one poll of a node that has not said yet that its ranks ended.
struct NodeSeen {
  std::optional<std::string> said;  // its done report, once written
  bool claimed = false;  // a launcher holds its node rank (read after a failure only)
  bool silent = false;   // Silence::judge of its beat count
  bool heard = false;    // it beat at least once
};

struct EndPoll {
  LaunchClock::time_point now;
  std::map<int, NodeSeen> seen;  // each node of EndWait::ended.missing
  int stop = 0;  // SIGINT or SIGTERM waiting for node 0's launcher, or 0
};

enum class EndAction { wait, decide, report_silent, report_stop, read_failure };

struct EndStep {
  EndAction action = EndAction::wait;
  int node = -1;  // report_silent: the node that fell silent
  bool operator==(const EndStep&) const = default;
};

// Node 0's wait for the nodes of `attempt` to say that their ranks ended: until every one has
// (after a failure, for --grace and a minute more), until one falls silent (while restarts
// remain, for --rejoin-timeout more: it may be cut off rather than gone), until --join-timeout
// passed with the missing nodes never heard from, or until node 0's launcher is told to stop.
struct EndWait {
  EndWait(int attempt, const std::vector<int>& nodes, LaunchClock::time_point now, const JobRules& rules);
  int attempt;
  NodesEnded ended;       // ended.missing: the nodes not heard from yet
  std::vector<int> done;  // the nodes but 0 that said: they read the verdict before the store stops
  std::optional<Failure> failed;                  // the attempt's failure that stands
  std::optional<LaunchClock::time_point> deadline;  // set by a failure; before one, liveness bounds the wait
  std::vector<int> rejoining;                       // fell silent, given --rejoin-timeout to come back
  std::optional<LaunchClock::time_point> rejoin_by;  // the last of them to fall silent has until then
  LaunchClock::time_point join_deadline;            // for nodes never heard from
  int stop = 0;  // the SIGINT or SIGTERM that ended the wait
};

// Tallies the poll's done reports (after a failure, a node that no launcher ever claimed has no
// ranks to stop: never_joined), then says what to do.
EndStep end_step(EndWait& w, const EndPoll& p);
// After report_silent: `standing` is the attempt's failure that stands (the silence, or one
// reported before). True when nothing is left to wait for: no restart could follow.
bool fell_silent(EndWait& w, int node, const Failure& standing, LaunchClock::time_point now, const JobRules& rules);
// After read_failure found `f`: the nodes get until ending_by to stop their ranks.
void took_failure(EndWait& w, const Failure& f, LaunchClock::time_point now, const JobRules& rules);
// Until when the nodes may take to stop their ranks once `f` ended the attempt: --grace and a
// minute more, and --take-in-timeout more while they stop after a checkpoint for a node taken in.
LaunchClock::time_point ending_by(const Failure& f, LaunchClock::time_point now, const JobRules& rules);
// The wait is over: `stop`, node 0's own SIGINT/SIGTERM (0: none); `stop_pending`, a SIGUSR2 that
// came while no rank ran here; `rejoined`, the nodes outside the attempt that said they ended
// (their launcher runs again and asks in). Returns what the verdict weighs.
NodesEnded close_wait(EndWait& w, int stop, bool stop_pending, const std::vector<int>& rejoined);

// Node 0's verdict on `attempt`, run on `nodes`, given its failure and how its nodes ended.
// `never_joined`: what to say of ended.never_joined (the shell knows the store and the refusals).
Verdict verdict(const JobRules& rules, int attempt, const std::vector<int>& nodes,
                const std::optional<Failure>& reported, const NodesEnded& ended, const std::string& never_joined);

}  // namespace coshard::run
