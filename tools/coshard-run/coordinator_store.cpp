// The Coordinator's connection to node 0's store: joining the job, beginning an attempt, beating
// (coordinator.hpp; reaching the store again after a cut: coordinator_cut.cpp).
#include "coordinator.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <optional>
#include <vector>

#include "coordinator_internal.hpp"
#include "coshard/runtime/error.hpp"
#include "coshard/runtime/parse_whole.hpp"
#include "coshard/runtime/scheduler.hpp"
#include "coshard/launch/store.hpp"

namespace coshard::run {
namespace {

using namespace coord;

// How long node 0, giving up before it started the job, waits for the nodes that joined to read
// why: they poll every kPoll.
constexpr auto kToldWithin = std::chrono::milliseconds(2000);

// A number the job's launchers wrote: anything else (stoi threw a bare "stoi"; a value beyond an
// int was out of range) means that another program writes to this store, which is bad_config.
int stored_int(const std::string& v, const std::string& key) {
  const std::optional<int> out = parse_whole<int>(v);
  if (!out) {
    throw Error(Errc::bad_config, "store key '" + key + "' holds '" + v.substr(0, 40) +
                                      "', not a number: another program uses this store; give this job a --master "
                                      "port of its own");
  }
  return *out;
}

}  // namespace

Coordinator::Coordinator(const Options& o, std::uint16_t port, const std::string& token, Console& console,
                         int cut_off_in)
    : o_(o),
      rules_{.nnodes = o.nnodes, .min_nodes = o.min_nodes, .max_restarts = o.max_restarts,
             .grace_seconds = o.grace_seconds, .join_timeout = o.join_timeout, .rejoin_timeout = o.rejoin_timeout,
             .take_in_timeout = o.take_in_timeout, .silent_for = o.silence_timeout},
      console_(console),
      where_(o.master_addr + ":" + std::to_string(port)),
      silence_(o.silence_timeout) {
  sched_ = std::make_unique<Scheduler>(Scheduler::Options{.name = "coshard-run-coordinator"});
  sched_->start();
  launch::StoreClient::Options so;
  so.host = o.master_addr;
  so.port = port;
  so.token = token;
  so.served_by = o.node_rank == 0 ? "" : "the coshard-run of node 0";  // node 0's own: no one else to blame
  so.op_timeout = store_call_limit(rules_);  // a poll that hangs stalls the relay of output
  so.key_prefix = "coshard/launch/";
  options_ = so;
  try {
    connect(std::move(so));
    join(cut_off_in);
  } catch (...) {
    close();  // no destructor runs for a constructor that throws
    throw;
  }
}

// Connects in slices of at most 2 s until --join-timeout, so that SIGINT/SIGTERM end the wait.
void Coordinator::connect(launch::StoreClient::Options so) {
  const std::string who = "node " + std::to_string(o_.node_rank) + " cannot join the job: ";
  const auto deadline = Clock::now() + o_.join_timeout;
  std::optional<Clock::time_point> unresolved_since;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    so.connect_timeout = std::clamp(left, std::chrono::milliseconds(100), std::chrono::milliseconds(2000));
    try {
      store_ = sched_->sync_wait(launch::StoreClient::connect(so));
      return;
    } catch (const Error& e) {
      // Each 2 s slice is a connect of its own: resolve_timeout counts across them here.
      if (e.context().op == launch::StoreClient::kResolveOp) {
        if (!unresolved_since) unresolved_since = Clock::now();
        if (Clock::now() >= std::min(deadline, *unresolved_since + so.resolve_timeout)) throw Error(e.code(), who + e.message());
      } else if (e.code() != Errc::timeout) {
        throw Error(e.code(), who + e.message());
      } else if (Clock::now() >= deadline) {
        throw Error(Errc::timeout, who + "cannot reach the rendezvous store at " + where_ + " within " +
                                       std::to_string(o_.join_timeout.count()) + " s (" + e.message() +
                                       "). Node 0's coshard-run serves the store while its job runs: if it is "
                                       "not started yet, start it with --master " + where_ +
                                       " (or give this node a longer --join-timeout); if it ran already, it gave up "
                                       "waiting for this node (its output names the nodes that never joined), so "
                                       "start every node again together");
      }
    }
    if (const int sig = pending_stop()) throw Error(Errc::cancelled, who + "got " + strsignal(sig) + " while joining");
  }
}

// Checks this node's flags against node 0's, then claims the node rank and beats once, so that
// node 0 judges it from now on.
void Coordinator::join(int cut_off_in) {
  const Claim mine{.nproc = o_.nproc_per_node,
                   .max_restarts = o_.max_restarts,
                   .min_nodes = o_.min_nodes,
                   .host = this_host(),
                   .pid = std::to_string(::getpid()),
                   .protocol = kProtocol,
                   .take_in_timeout = static_cast<int>(o_.take_in_timeout.count()),
                   .nodes = o_.nnodes,
                   .silence_timeout = static_cast<int>(o_.silence_timeout.count())};
  const std::string me = encode(mine);
  if (o_.node_rank != 0) {
    if (auto why = unlike_node_zero(o_.node_rank, mine, decode_claim(await_node_zero())); !why.empty()) throw refuse(why);
  }
  auto node_zeros_attempt = [&] { return stored_int(sched_->sync_wait(store().get("attempt")).value_or("0"), "attempt"); };
  const std::string key = "node/" + std::to_string(o_.node_rank);
  std::string holder = sched_->sync_wait(store().compare_set(key, "", me));
  // Only while a restart may follow: on the last attempt taking over would only end the job.
  // Asked again after the wait, in which node 0 may have begun its last attempt.
  const std::string gone = holder;
  bool took_over = false;
  if (holder != me && o_.node_rank != 0 && node_zeros_attempt() < o_.max_restarts && holder_gone(holder) &&
      node_zeros_attempt() < o_.max_restarts) {
    took_over = (holder = sched_->sync_wait(store().compare_set(key, holder, me))) == me;
  }
  if (holder != me) {
    throw refuse("node rank " + std::to_string(o_.node_rank) + " was started twice: " + decode_claim(holder).describe() +
                 " already holds it (this is " + decode_claim(me).describe() + "). Give every node its own --node-rank");
  }
  claim_ = me;
  heartbeat();
  // After the claim, so that node 0 waits for this node in any attempt it begins from now on.
  if (o_.node_rank == 0) {
    if (o_.min_nodes < o_.nnodes) {
      try {
        gather();
      } catch (const Error& e) {
        say_not_started(e.message());
        throw;
      }
    } else {
      for (int n = 0; n < o_.nnodes; ++n) nodes_.push_back(n);
    }
  } else {
    try {
      await_attempt();
    } catch (const Error&) {
      try {  // a claim left behind would count as a node that joined (gather)
        if (link_.state == Link::up) sched_->sync_wait(store().erase(key));
      } catch (const Error&) {
        // the store is gone: nothing is left to count it
      }
      throw;
    }
  }
  attempt_ = first_attempt_;
  const bool again = first_attempt_ <= cut_off_in;  // its ranks of that attempt were stopped
  if (!took_over && !again && member()) return;
  const std::string range = "(--nnodes " + std::to_string(o_.min_nodes) + ":" + std::to_string(o_.nnodes) + ")";
  const std::string why =
      took_over ? "its coshard-run fell silent and " + decode_claim(me).describe() + " took its place"
      : cut_off_in >= 0 ? "its coshard-run, cut off from the store in attempt " + std::to_string(cut_off_in) +
                              " for longer than --rejoin-timeout, reached it again " + range
                        : "its coshard-run joined after the job started on node(s) " + node_list(nodes_) + " " + range;
  if (first_attempt_ >= o_.max_restarts) {  // node 0 began its last attempt meanwhile
    // The place stays the silent one's, or free for a later job.
    if (took_over) {
      sched_->sync_wait(store().compare_set(key, me, gone));
    } else {
      sched_->sync_wait(store().erase(key));
    }
    throw refuse("node " + std::to_string(o_.node_rank) + ": " + why + ", but node 0 runs the job's last attempt "
                 "(--max-restarts " + std::to_string(o_.max_restarts) + "): no restart is left to take node " +
                 std::to_string(o_.node_rank) + " in");
  }
  ask_in(first_attempt_, why, !took_over && !again);  // else some of the attempt's ranks are gone
}

// Node 0 under --nnodes MIN:MAX: the first attempt runs on every node as soon as all have joined,
// else on those that joined by --last-call after the MIN-th did. Fewer than MIN by --join-timeout
// end the job.
void Coordinator::gather() {
  const auto deadline = Clock::now() + o_.join_timeout;
  std::optional<Clock::time_point> last_call;
  const std::string range = std::to_string(o_.min_nodes) + ":" + std::to_string(o_.nnodes);
  const std::vector<int> every = every_node(o_.nnodes);
  const auto unless_stopped = [] {
    if (const int sig = pending_stop()) {
      throw Error(Errc::cancelled, std::string("node 0 got ") + strsignal(sig) + " while the nodes joined");
    }
  };
  for (;;) {
    heartbeat();
    std::vector<int> absent;
    std::vector<std::optional<std::string>> claims;
    try {
      if (usable()) {
        claims = per_node("node", every);
        read_refusals();
      }
    } catch (const Error& e) {
      broke(e);  // a stall of this launcher is a cut, which usable() mends or gives up at --rejoin-timeout
      if (link_.lost()) throw;
    }
    if (link_.lost()) throw Error(Errc::peer_lost, "node 0 " + lost_failure().what);
    if (claims.empty()) {  // its own store not reached again yet (a stall): polled again
      unless_stopped();
      console_.wait(kPoll);
      continue;
    }
    nodes_.clear();  // only now: say_not_started tells the nodes that joined by the last poll
    for (int n = 0; n < o_.nnodes; ++n) (claims[static_cast<std::size_t>(n)] ? nodes_ : absent).push_back(n);
    if (auto why = foreign_node(claims)) throw Error(Errc::bad_config, *why);
    if (absent.empty()) return;
    if (!last_call && nodes_.size() >= static_cast<std::size_t>(o_.min_nodes)) {
      last_call = Clock::now() + o_.last_call;
      console_.say("coshard-run: %zu of %d nodes joined (--nnodes %s); the job starts in %lld s (--last-call) "
                   "on those that have joined by then\n", nodes_.size(), o_.nnodes, range.c_str(),
                   static_cast<long long>(o_.last_call.count()));
    }
    if (last_call && Clock::now() >= *last_call) {
      console_.say("coshard-run: the job starts on node(s) %s of %d; node(s) %s are taken in at the restart "
                   "that their coshard-run causes when it joins\n", node_list(nodes_).c_str(), o_.nnodes,
                   node_list(absent).c_str());
      return;
    }
    if (!last_call && Clock::now() >= deadline) {
      throw Error(Errc::timeout, "only node(s) " + node_list(nodes_) + " joined within " +
                                     std::to_string(o_.join_timeout.count()) + " s (--join-timeout), fewer than the " +
                                     std::to_string(o_.min_nodes) + " that --nnodes " + range +
                                     " needs: start coshard-run on node(s) " + node_list(absent) + " with --master " +
                                     where_ + ", or lower MIN");
    }
    unless_stopped();
    console_.wait(kPoll);  // writing what waits meanwhile
  }
}

// Node 0 gave up gathering the nodes (gather): those that joined wait for an attempt, so they are
// told why rather than left to find its store gone. It waits a little for each to say it read it.
void Coordinator::say_not_started(const std::string& why) noexcept {
  if (link_.state != Link::up) return;  // its own store not reached again after a stall: none to tell
  try {
    sched_->sync_wait(store().set("not-started", why));
    std::vector<std::string> keys;
    for (int n : nodes_) {
      if (n != 0) keys.push_back("not-started/read/" + std::to_string(n));
    }
    if (!keys.empty()) sched_->sync_wait(store().wait(std::move(keys), kToldWithin));
  } catch (const Error&) {
    // a node not told finds the store gone, and says that node 0's output says why
  }
}

Error Coordinator::refuse(const std::string& why) {
  say_refused(why);
  return Error(Errc::bad_config, why);
}

void Coordinator::say_refused(const std::string& why) noexcept {
  constexpr int kKept = 8;  // a launcher started again and again in a loop must not grow the key for ever
  const std::string line = "coshard-run pid " + std::to_string(::getpid()) + " on " + this_host() + " (--node-rank " +
                           std::to_string(o_.node_rank) + ") was refused: " + why + "\n";
  try {
    std::string had;
    for (int tries = 0; tries < 4 && std::count(had.begin(), had.end(), '\n') < kKept; ++tries) {
      const std::string now = sched_->sync_wait(store().compare_set("refused", had, had + line));
      if (now == had + line) return;
      had = now;
    }
  } catch (const Error&) {
    // the store is gone: node 0's own output says why its job ended
  }
}

void Coordinator::read_refusals() {
  const std::string all = sched_->sync_wait(store().get("refused")).value_or("");
  std::size_t at = 0;
  for (std::size_t i = 0; i < refused_.size() && at < all.size(); ++i) at = all.find('\n', at) + 1;
  for (std::size_t nl; at < all.size() && (nl = all.find('\n', at)) != std::string::npos; at = nl + 1) {
    refused_.push_back(all.substr(at, nl - at));
    console_.say("coshard-run: %s\n", refused_.back().c_str());
  }
}

// A refusal may be of another node rank than the missing ones (a node started with the rank of
// one that joined), so they are told as what happened meanwhile, not as the cause.
std::string Coordinator::never_joined(const std::vector<int>& nodes) const {
  if (nodes.empty()) return "";
  std::string out = "node(s) " + node_list(nodes) + " never joined the job (no coshard-run holds their node rank): "
                    "start coshard-run on each with its --node-rank and --master " + where_ +
                    ", while node 0's ranks wait at their rendezvous";
  for (std::size_t i = refusals_from_; i < refused_.size(); ++i) {
    out += (i == refusals_from_ ? "; node 0 refused meanwhile: " : "; ") + refused_[i];
  }
  return out;
}

// Other nodes: node 0's current attempt and its nodes (written before the attempt). Under
// --nnodes MIN:MAX node 0 may still be gathering the first attempt's nodes: waited for while it
// beats (its own --join-timeout and --last-call bound that). A store call that fails meanwhile is
// a cut, ridden out as in an attempt (rejoin_window()): a stall of either launcher or a short
// outage of the link does not end the job before it started.
void Coordinator::await_attempt() {
  const std::string who = "node " + std::to_string(o_.node_rank);
  for (;;) {
    const bool was_cut = link_.cut_off();  // heartbeat() may be the one to mend it
    heartbeat();  // so that a second launcher for this node rank is refused, not taken for a successor
    if (link_.state == Link::replaced) {
      throw Error(Errc::bad_config, who + " cannot join the job: " + lost_failure().what);
    }
    if (link_.lost()) {
      throw Error(Errc::peer_lost, who + " " + lost_failure().what + ", before node 0 started the job; node 0's "
                                   "output says why");
    }
    std::optional<std::string> not_started;
    bool zero_silent = false;
    try {
      if (usable()) {
        // Node 0's count was not read while cut off: judged afresh, as a frozen node 0 may not
        // have beaten yet since it ran on.
        if (was_cut) silence_.forget(0);
        if (const auto attempt = sched_->sync_wait(store().get("attempt"))) {
          first_attempt_ = stored_int(*attempt, "attempt");
          nodes_ = parse_nodes(sched_->sync_wait(store().get(attempt_key(first_attempt_, "nodes"))).value_or(""));
          return;
        }
        not_started = sched_->sync_wait(store().get("not-started"));
        if (not_started) {
          sched_->sync_wait(store().set("not-started/read/" + std::to_string(o_.node_rank), ""));
        } else {
          zero_silent = silent(0);
        }
      }
    } catch (const Error& e) {
      if (e.code() == Errc::bad_config) throw;  // the store answered, with what no launcher writes
      if (!not_started) broke(e);  // else only the ack failed: why node 0 gave up was read
    }
    if (not_started) throw Error(Errc::cancelled, who + " cannot join the job: " + *not_started);
    if (zero_silent) {
      throw Error(Errc::timeout, who + " joined, but node 0's coshard-run fell silent " +
                                     std::to_string(rules_.silent_for.count()) + " s ago, before it started the job");
    }
    if (const int sig = pending_stop()) throw Error(Errc::cancelled, who + " got " + strsignal(sig) + " while joining");
    console_.wait(kPoll);  // writing what waits meanwhile
  }
}

bool Coordinator::may_rejoin(int attempt) const noexcept {
  return o_.node_rank != 0 && o_.min_nodes < o_.nnodes && link_.state == Link::given_up &&
         attempt + 1 < o_.max_restarts;
}

bool Coordinator::member() const { return std::find(nodes_.begin(), nodes_.end(), o_.node_rank) != nodes_.end(); }

// The node rank is held: by a live launcher (this one was started twice), or by one whose host
// crashed and whose beat count stands still (this one is its host's launcher started again).
bool Coordinator::holder_gone(const std::string& holder) {
  const std::string key = "alive/" + std::to_string(o_.node_rank);
  const auto first = sched_->sync_wait(store().get(key));
  console_.say("coshard-run: node rank %d is held by %s; taking its place unless it beats within %lld s\n",
               o_.node_rank, decode_claim(holder).describe().c_str(), static_cast<long long>(rules_.silent_for.count()));
  for (const auto until = Clock::now() + rules_.silent_for; Clock::now() < until;) {
    if (const int sig = pending_stop()) {
      throw Error(Errc::cancelled, "node " + std::to_string(o_.node_rank) + " got " + strsignal(sig) + " while joining");
    }
    console_.wait(kPoll);  // writing what waits meanwhile
    if (sched_->sync_wait(store().get(key)) != first) return false;
  }
  return true;
}

// Node 0 reads each other node's claim and checks every new one (a launcher that joins, or takes
// a silent one's place) for this launcher protocol: one of a build from before protocol versions
// checks nothing when it joins.
std::optional<std::string> Coordinator::foreign_node(const std::vector<std::optional<std::string>>& claims) {
  for (int n = 1; n < o_.nnodes; ++n) {
    const auto& claim = claims[static_cast<std::size_t>(n)];
    if (!claim || vetted_[n] == *claim) continue;
    auto why = foreign_protocol("node " + std::to_string(n), decode_claim(*claim), "node 0");
    if (!why.empty()) return why;
    vetted_[n] = *claim;
  }
  return std::nullopt;
}

// The value of "<what>/N" for each node N of `nodes`, in order: a round trip per 4096 nodes, where
// one per node made each of node 0's polls take seconds under --nnodes 2:65536.
std::vector<std::optional<std::string>> Coordinator::per_node(const std::string& what, const std::vector<int>& nodes) {
  constexpr std::size_t kBatch = 4096;  // 4096 claims of ~80 bytes: a frame far below the bound
  std::vector<std::optional<std::string>> out;
  out.reserve(nodes.size());
  for (std::size_t i = 0; i < nodes.size(); i += kBatch) {
    std::vector<std::string> keys;
    for (std::size_t j = i; j < std::min(nodes.size(), i + kBatch); ++j) {
      keys.push_back(what + "/" + std::to_string(nodes[j]));
    }
    for (auto& v : sched_->sync_wait(store().get_many(std::move(keys)))) out.push_back(std::move(v));
  }
  return out;
}

// Node 0's claim: it claims as soon as its store is up, but this node may have come first.
std::string Coordinator::await_node_zero() {
  const auto deadline = Clock::now() + o_.join_timeout;
  for (;;) {
    if (auto claim = sched_->sync_wait(store().get("node/0"))) return *claim;
    if (Clock::now() >= deadline) {
      throw Error(Errc::timeout, "node " + std::to_string(o_.node_rank) + " reached the store at " + where_ +
                                     " but node 0's coshard-run did not join within " +
                                     std::to_string(o_.join_timeout.count()) + " s");
    }
    if (const int sig = pending_stop()) {
      throw Error(Errc::cancelled, "node " + std::to_string(o_.node_rank) + " got " + strsignal(sig) + " while joining");
    }
    console_.wait(kPoll);  // writing what waits meanwhile
  }
}

Coordinator::~Coordinator() { close(); }

// The connection is the scheduler's: closed there, then the thread stops.
void Coordinator::close() noexcept {
  if (!sched_) return;
  try {
    sched_->sync_wait([](std::unique_ptr<launch::StoreClient> c) -> Task<void> {
      c.reset();
      co_return;
    }(std::move(store_)));
  } catch (const std::exception&) {
  }
  sched_->stop();
  sched_.reset();
}

void Coordinator::begin(int attempt) {
  attempt_ = attempt;
  if (o_.node_rank != 0) return;
  if (attempt > 0) refusals_from_ = refused_.size();  // the first attempt's include those while gathering
  silence_.forget_all();  // each node's count is judged afresh: it was silent while it awaited the verdict
  for (;;) {  // again after this launcher stalled (broke), until its store is lost
    try {
      sched_->sync_wait(store().set(attempt_key(attempt, "nodes"), node_words(nodes_)));
      sched_->sync_wait(store().set("attempt", std::to_string(attempt)));
      return;
    } catch (const Error& e) {
      broke(e);
    }
    if (const int sig = await_store()) {
      throw Error(Errc::cancelled, std::string("node 0 got ") + strsignal(sig) + " while it began attempt " +
                                       std::to_string(attempt));
    }
    if (link_.lost()) throw Error(Errc::peer_lost, "node 0 " + lost_failure().what);
  }
}

void Coordinator::heartbeat() {
  // Every loop that judges silence comes here at least every poll. Away for longer than a store
  // call may take, this launcher stood still itself (stopped, starved of CPU): it did not watch
  // the others meanwhile, and on node 0 they could not reach its store, so their silence is judged
  // afresh from now.
  const auto now = Clock::now();
  if (now - awake_ > store_call_limit(rules_)) silence_.stood_still(now);
  awake_ = now;
  if (link_.lost() || now < next_beat_) return;
  next_beat_ = Clock::now() + std::chrono::seconds(1);
  if (!usable()) return;
  try {
    if (replaced()) return;
    sched_->sync_wait(store().set("alive/" + std::to_string(o_.node_rank), std::to_string(++beats_)));
  } catch (const Error& e) {
    broke(e);  // failure(), called next, says so when the store is lost
  }
}

}  // namespace coshard::run
