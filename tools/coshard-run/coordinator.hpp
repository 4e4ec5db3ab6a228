#pragma once
// The launchers of one job, one per node, agree through the store that node 0's launcher serves
// for the whole job (keys under "coshard/launch/"):
//   node/K                which launcher holds node rank K, with its flags (a second one is refused)
//   attempt               the attempt node 0 runs now, for a launcher that joins late
//   attempt/A/nodes       the node ranks that run ranks in attempt A ("0 1 3"; every node, unless
//                         some were dropped or had not joined, --nnodes MIN:MAX)
//   alive/K               a count node K's launcher raises every second while its ranks run
//   attempt/A/failure     the first failure of attempt A: every launcher then stops its ranks
//   attempt/A/done/K      node K's ranks of attempt A have all ended: "<rc>[ interrupted][ stop]"
//   attempt/A/verdict     node 0's decision once every node is done: restart, stop (on request), or
//                         exit with a code
//   attempt/A/read/K      node K read a verdict that ends the job: node 0 may stop the store
//   refused               the launchers refused when they joined, one line each with its host and
//                         why, for node 0's output and verdict (at most 8)
//   attempt/A/stop-now    while ranks stop after a checkpoint for a node taken in: node K stopped
//                         its ranks without one, and the others stop theirs too
// A restart starts every node's ranks again with COSHARD_RESTART_COUNT=A+1, and their own keys
// (launch::rendezvous) live under coshard/attempt/A+1/, so nothing of a failed attempt is read.
//
// A node cut off from the store (its link down, node 0's host unreachable) is indistinguishable,
// seen from either side, from one that crashed. While restarts remain both sides give it
// --rejoin-timeout: its launcher keeps trying to reach the store and reports what happened
// meanwhile once it does; node 0 records it as a restartable failure and waits for its ranks to
// end. Without restarts left nothing can follow, so node 0 ends the job once a node has been silent
// for --silence-timeout, and a cut-off launcher tries to reach the store until then: a shorter cut
// is ridden out.
//
// With --nnodes MIN:MAX a node that fell silent and did not come back within --rejoin-timeout is
// dropped instead: the others restart without it, down to MIN nodes, with ranks numbered afresh
// over the nodes left. The job also starts without every node: on all MAX as soon as they joined,
// else on those that joined by --last-call after the MIN-th did. A node outside the current
// attempt asks to be taken in (Coordinator::ask_in), and the restart that this causes takes it:
// one that joins late, a dropped one's launcher that runs again (it was frozen) or that reached
// the store again after it gave up (cut off), and one started again in a dropped one's place (as
// after a crash).
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "coshard/runtime/error.hpp"
#include "console.hpp"
#include "decisions.hpp"
#include "records.hpp"
#include "coshard/launch/hosts.hpp"
#include "coshard/launch/store.hpp"
#include "options.hpp"

namespace coshard::run {

// This host's name, as the launchers' messages and claims give it.
using launch::this_host;

// How one attempt ended on this node.
struct AttemptEnd {
  int rc = 1;                   // the local exit code (Supervisor::result)
  bool interrupted = false;     // the launcher got SIGINT/SIGTERM
  bool stop_requested = false;  // the launcher got SIGUSR2 and its ranks took it: no restart
};

class Coordinator {
 public:
  // Connects to the store (retrying until --join-timeout), checks on other nodes than 0 that node 0
  // speaks the same launcher protocol and runs with the same --nproc-per-node, --max-restarts,
  // --nnodes (N, or MIN and MAX) and --take-in-timeout, and claims this node rank. Throws Error
  // naming the protocol or flag that differs, or the launcher that holds the node rank already.
  // `cut_off_in`: the attempt in which this launcher, cut off from the store for longer than
  // --rejoin-timeout, stopped its ranks (may_rejoin): it asks to be taken in rather than run ranks
  // in that attempt again. `console`: where it says what it does (never blocking on a stalled reader).
  Coordinator(const Options& o, std::uint16_t port, const std::string& token, Console& console, int cut_off_in = -1);
  ~Coordinator();
  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

  // The attempt to start with: 0 on node 0, node 0's current one on a node that joins later.
  int first_attempt() const noexcept { return first_attempt_; }
  // Whether this node runs ranks in `attempt`. It runs none in one it asked to be taken in at
  // (ask_in): it took the node rank of a launcher that fell silent (the host crashed and came back,
  // and this is its launcher started again), or it is not among the attempt's nodes.
  bool runs_ranks(int attempt) const noexcept { return attempt != asked_in_; }
  // Whether this launcher, having lost the store in `attempt` after --rejoin-timeout without
  // reaching it, may join again (a new Coordinator) and be taken in: under --nnodes MIN:MAX, on a
  // node other than 0, while node 0 has a restart left after the one that drops this node.
  bool may_rejoin(int attempt) const noexcept;
  // Ends `attempt`, in which this node runs no ranks, so that every node restarts and the restart
  // takes this node in (node 0 counts it among the nodes that rejoin): says that its ranks ended,
  // then reports `why` as the attempt's failure. `at_checkpoint`: the attempt's nodes are all well,
  // so their ranks stop after a checkpoint (Failure::at_checkpoint); not so after a take-over,
  // whose silent node's ranks could not save theirs.
  void ask_in(int attempt, const std::string& why, bool at_checkpoint);
  // The attempt this launcher starts now; node 0 also publishes it, with its nodes (for late joiners).
  void begin(int attempt);
  // The node ranks that run ranks in the current attempt, ascending: every node, unless some were
  // dropped or had not joined (--nnodes MIN:MAX). A restart's verdict gives the next attempt's.
  const std::vector<int>& nodes() const noexcept { return nodes_; }
  // Says that this launcher is alive (at most once a second; the supervisor calls it every tick),
  // and notes when this launcher stood still itself.
  void heartbeat();
  // The failure another node reported for `attempt`, if any. Losing the store is a failure too,
  // and on node 0 so are another node's launcher that fell silent and one of another launcher
  // protocol (they are then reported).
  std::optional<Failure> failure(int attempt);
  // Whether the store could not be reached again within rejoin_window(): failure() says so once.
  bool lost() const noexcept { return link_.lost(); }
  // While the ranks stop after a checkpoint for a node taken in (Failure::at_checkpoint): says that
  // this node stopped its ranks without one (they do not take SIGUSR2, one failed, the launcher
  // was interrupted, or --take-in-timeout passed), or `why` another reason, since the others'
  // ranks cannot finish a step without them. stopping_now says why, once a node did, or on node
  // 0 once another node fell silent.
  void stop_now(int attempt, const std::string& why = "");
  std::optional<std::string> stopping_now(int attempt);
  // Reports this node's failure and returns the one that stands (another node's may be first);
  // while the store does not answer, `f`, which goes out once it does (the first such report only).
  Failure report(int attempt, Failure f);
  // Once every local rank of `attempt` has ended with `rc`: says so, and returns node 0's verdict
  // (node 0 waits for every node of the attempt while it beats, and decides; the others wait while
  // node 0 beats). No node restarts when one launcher was interrupted (SIGINT/SIGTERM) or asked
  // to stop after a checkpoint (SIGUSR2).
  Verdict finish(int attempt, const AttemptEnd& end);

 private:
  void connect(launch::StoreClient::Options so);
  // The store's client. A failed reconnect (usable()) leaves none: a call meanwhile fails as one to
  // an unreachable store does, for its caller's catch (broke), rather than dereference nothing.
  launch::StoreClient& store();
  // Whether the store may be asked now: after a store call failed, one try to reach it again
  // (try_again_now) until rejoin_window(), then gives it up (try_failed); a report it missed meanwhile
  // goes out first.
  bool usable();
  // A store call failed: the store is cut off or lost, as on_break says.
  void broke(const Error& e);
  // How long a cut may last before the store is lost, and the flag or rule that says so.
  RejoinWindow rejoin_window() const { return run::rejoin_window(rules_, o_.node_rank, attempt_); }
  // Until the store is usable again or lost; returns SIGINT or SIGTERM if one ended the wait, else 0.
  int await_store();
  Failure lost_failure() const;
  void join(int cut_off_in);
  // Says that this node's ranks of `attempt` ended (it has none there: ask_in).
  void say_ended(int attempt);
  void gather();
  // Tells the nodes that joined why node 0 gave up before it started the job.
  void say_not_started(const std::string& why) noexcept;
  // A launcher refused when it joined (its flags differ from node 0's, its node rank is held, no
  // restart is left to take it in) leaves `why` in the store, so that node 0, which otherwise sees
  // only ranks missing at the rendezvous, says which host was refused and why.
  void say_refused(const std::string& why) noexcept;
  // say_refused, then the bad_config Error to throw.
  Error refuse(const std::string& why);
  // Node 0: prints the refusals it has not printed yet; refused_ keeps them for the verdict.
  void read_refusals();
  // Node 0: the verdict's words for the attempt's nodes that never joined, with the attempt's refusals.
  std::string never_joined(const std::vector<int>& nodes) const;
  void await_attempt();
  bool member() const;
  bool holder_gone(const std::string& holder);
  bool replaced();
  std::string await_node_zero();
  // The first node whose claim (of `claims`, each node's in order) is a launcher of another
  // protocol, said as an error; claims already checked are not checked again.
  std::optional<std::string> foreign_node(const std::vector<std::optional<std::string>>& claims);
  std::vector<std::optional<std::string>> per_node(const std::string& what, const std::vector<int>& nodes);
  void close() noexcept;
  Failure stopped(int attempt, int sig);
  Verdict decide(int attempt);
  Verdict decided(int attempt, const std::string& said);
  EndPoll poll_ends(int attempt, const EndWait& w);
  std::vector<int> rejoined(int attempt);
  Verdict await_verdict(int attempt);
  void await_readers(int attempt, const std::vector<int>& nodes);
  Failure report_silent(int attempt, int node);
  std::optional<int> silent_node(int attempt, const std::vector<int>& nodes);
  bool silent(int node);
  // The verdict read from `key` (`said`), or why it cannot be.
  static Verdict read_verdict(const std::string& key, const std::string& said);

  const Options& o_;
  const JobRules rules_;
  Console& console_;
  std::string where_;  // the store's ADDR:PORT, for errors
  std::unique_ptr<Scheduler> sched_;
  std::unique_ptr<launch::StoreClient> store_;
  launch::StoreClient::Options options_;  // to reach the store again
  int first_attempt_ = 0;
  int attempt_ = 0;
  std::vector<int> nodes_;
  std::string claim_;  // this launcher's claim of its node rank
  int asked_in_ = -1;  // the attempt this node asked to be taken in at, where it runs no ranks
  StoreLink link_;  // up, cut (since when, the next try), or lost, and how (decisions.hpp)
  std::optional<std::pair<int, Failure>> unsent_;  // a report (attempt, failure) the store did not take
  std::int64_t beats_ = 0;
  std::chrono::steady_clock::time_point next_beat_{};
  // Each node's beat count (node 0 judges the others once a second; the others judge node 0 while
  // they await its verdict).
  Silence silence_;
  std::chrono::steady_clock::time_point awake_ = std::chrono::steady_clock::now();  // heartbeat() came last then
  std::vector<std::string> refused_;  // node 0: the refusals read from the store, in order
  std::size_t refusals_from_ = 0;     // the first of refused_ read in the current attempt
  std::map<int, std::string> vetted_;  // node 0: each node's claim it last found of its launcher protocol
  std::chrono::steady_clock::time_point next_watch_{};
};

}  // namespace coshard::run
