// The Coordinator cut off from node 0's store (a cut link, node 0's host gone, a stall of this
// launcher): reaching it again, or giving it up (coordinator.hpp).
#include <chrono>
#include <memory>
#include <string>
#include <utility>

#include "coordinator.hpp"
#include "coordinator_internal.hpp"
#include "coshard/runtime/error.hpp"
#include "coshard/runtime/scheduler.hpp"
#include "coshard/launch/store.hpp"

namespace coshard::run {
namespace {

using namespace coord;

// Each try to reach the store again takes this long at most (decisions.hpp: kReconnectEvery).
constexpr auto kReconnectTry = std::chrono::milliseconds(500);

// Drops the old connection on the scheduler's thread, where it lives, and opens another.
Task<std::unique_ptr<launch::StoreClient>> reopen(std::unique_ptr<launch::StoreClient> old,
                                                     launch::StoreClient::Options options) {
  old.reset();
  co_return co_await launch::StoreClient::connect(std::move(options));
}

}  // namespace

launch::StoreClient& Coordinator::store() {
  if (!store_) throw Error(Errc::peer_lost, "the store at " + where_ + " is not reached again yet: " + link_.reason);
  return *store_;
}

bool Coordinator::usable() {
  if (link_.state != Link::cut) return link_.state == Link::up;
  if (!try_again_now(link_, Clock::now())) return false;
  try {
    auto options = options_;
    options.connect_timeout = kReconnectTry;
    store_ = sched_->sync_wait(reopen(std::move(store_), std::move(options)));
  } catch (const Error& e) {
    link_.reason = e.message();
    try_failed(link_, Clock::now(), rejoin_window().length);  // given up: lost_failure() says after how long
    return false;
  }
  console_.say("coshard-run: reached the store at %s again after %lld s\n", where_.c_str(),
               seconds_since(link_.since));
  reached_again(link_);
  try {
    if (replaced()) return false;
  } catch (const Error& e) {  // usable() never throws: its callers ask it outside their own try
    broke(e);
    return false;
  }
  if (unsent_) {
    const auto [attempt, f] = *std::exchange(unsent_, std::nullopt);
    try {  // an ask_in's end goes out before its report, as ask_in sends them
      if (attempt == asked_in_) say_ended(attempt);
    } catch (const Error& e) {
      unsent_.emplace(attempt, f);
      broke(e);
      return false;
    }
    report(attempt, f);
  }
  return link_.state == Link::up;
}

// Whether another launcher took this one's place (coordinator.hpp): it then has lost the store.
bool Coordinator::replaced() {
  if (o_.node_rank == 0 || o_.max_restarts == 0) return false;
  const auto holder = sched_->sync_wait(store().get("node/" + std::to_string(o_.node_rank)));
  if (!holder || *holder == claim_) return false;
  replaced_by(link_, decode_claim(*holder).describe() + " took node " + std::to_string(o_.node_rank) +
                         "'s place after this launcher fell silent");
  return true;
}

void Coordinator::broke(const Error& e) {
  link_.reason = e.message();
  // Node 0 serves the store in this process: a call to it that timed out means this launcher
  // stalled (on_break), and it tries again as a node cut off does, rather than end the job, until
  // usable() reconnects or gives up at --rejoin-timeout.
  const bool own = o_.node_rank == 0;
  const BreakMeans means = on_break(link_, own, e.code() == Errc::timeout);
  take_break(link_, means, Clock::now());
  if (means != BreakMeans::cut) return;
  const RejoinWindow window = rejoin_window();
  console_.say("coshard-run: the store at %s %s (%s); trying to reach it again for %lld s (%s)\n", where_.c_str(),
               own ? "(this launcher's own) did not answer in time: was this launcher stopped?" : "stopped answering",
               e.message().c_str(), static_cast<long long>(window.length.count()), window.why.c_str());
}

int Coordinator::await_store() {
  while (!link_.lost() && !usable()) {
    if (const int sig = pending_stop()) return sig;
    console_.wait(kPoll);  // writing what waits meanwhile
  }
  return 0;
}

Failure Coordinator::lost_failure() const {
  // Named as this node's failure, so that the supervisor stops the ranks at once: the successor's
  // may be starting on this host.
  if (link_.state == Link::replaced) {
    return Failure{.node = o_.node_rank, .code = 1, .restartable = false, .what = link_.reason};
  }
  std::string what = "lost the store at " + where_ + " (node 0's coshard-run): ";
  if (link_.cut_off()) {
    const long long cut_for = link_.state == Link::given_up ? link_.cut_for : seconds_since(link_.since);
    what += "not reached for " + std::to_string(cut_for) + " s (" + rejoin_window().why + "): ";
  }
  return Failure{.node = -1, .code = 1, .restartable = false, .what = what + link_.reason};
}

}  // namespace coshard::run
