#include "coordinator.hpp"

#include <unistd.h>

#include <algorithm>
#include <map>
#include <cstdio>
#include <sstream>
#include <thread>
#include <vector>

#include "coshard/runtime/error.hpp"
#include "coshard/runtime/scheduler.hpp"
#include "coshard/transport/store.hpp"

namespace coshard::run {
namespace {

using Clock = std::chrono::steady_clock;

// A node whose launcher stopped beating for this long is lost (its host crashed, or it was cut off).
constexpr auto kSilentFor = std::chrono::seconds(10);

std::string attempt_key(int attempt, const std::string& what) { return "attempt/" + std::to_string(attempt) + "/" + what; }

// "<node> <rank> <code> <restartable> <what>"
std::string encode(const Failure& f) {
  return std::to_string(f.node) + " " + std::to_string(f.rank) + " " + std::to_string(f.code) + " " +
         (f.restartable ? "1" : "0") + " " + f.what;
}

Failure decode(const std::string& s) {
  Failure f;
  std::istringstream in(s);
  int restartable = 0;
  in >> f.node >> f.rank >> f.code >> restartable;
  f.restartable = restartable != 0;
  in.get();
  std::getline(in, f.what, '\0');
  return f;
}

// "restart|exit <code> <failed rank>\n<reason>"
std::string encode(const Verdict& v) {
  return std::string(v.restart ? "restart " : "exit ") + std::to_string(v.code) + " " + std::to_string(v.failed_rank) +
         "\n" + v.reason;
}

Verdict decode_verdict(const std::string& s) {
  Verdict v;
  std::istringstream in(s);
  std::string what;
  v.code = 1;
  in >> what >> v.code >> v.failed_rank;
  v.restart = what == "restart";
  if (const auto nl = s.find('\n'); nl != std::string::npos) v.reason = s.substr(nl + 1);
  return v;
}

// A claim is "<nproc> <max restarts> <host> <pid>".
struct Claim {
  int nproc = 0, max_restarts = 0;
  std::string host, pid;
  std::string describe() const { return "coshard-run pid " + pid + " on " + host; }
};

Claim parse_claim(const std::string& s) {
  Claim c;
  std::istringstream in(s);
  in >> c.nproc >> c.max_restarts >> c.host >> c.pid;
  return c;
}

std::string node_list(const std::vector<int>& nodes) {
  std::string out;
  for (int n : nodes) out += (out.empty() ? "" : ", ") + std::to_string(n);
  return out;
}

}  // namespace

std::string this_host() {
  char host[256] = "?";
  ::gethostname(host, sizeof host - 1);
  return host;
}

Coordinator::Coordinator(const Options& o, std::uint16_t port, const std::string& token)
    : o_(o), where_(o.master_addr + ":" + std::to_string(port)) {
  sched_ = std::make_unique<Scheduler>(Scheduler::Options{.name = "coshard-run-coordinator"});
  sched_->start();
  transport::StoreClient::Options so;
  so.host = o.master_addr;
  so.port = port;
  so.token = token;
  so.connect_timeout = o.join_timeout;
  so.op_timeout = std::chrono::seconds(10);  // a poll that hangs would stall the relay of output
  so.key_prefix = "coshard/launch/";
  try {
    store_ = sched_->sync_wait(transport::StoreClient::connect(so));
  } catch (const Error& e) {
    throw Error(e.code(), "node " + std::to_string(o.node_rank) + " cannot join the job: " + e.message() +
                              ". Node 0's coshard-run serves the store: start it with --master " + where_ +
                              " (or give this node a longer --join-timeout)");
  }
  const std::string me = std::to_string(o.nproc_per_node) + " " + std::to_string(o.max_restarts) + " " +
                         this_host() + " " + std::to_string(::getpid());
  const std::string key = "node/" + std::to_string(o.node_rank);
  const std::string holder = sched_->sync_wait(store_->compare_set(key, "", me));
  if (holder != me) {
    throw Error(Errc::bad_config, "node rank " + std::to_string(o.node_rank) + " was started twice: " +
                                      parse_claim(holder).describe() + " already holds it (this is " +
                                      parse_claim(me).describe() + "). Give every node its own --node-rank");
  }
  if (o.node_rank == 0) return;
  const Claim zero = parse_claim(sched_->sync_wait(store_->wait({"node/0"}, o.join_timeout)).at(0));
  for (const auto& [flag, here, there] : {std::tuple{"--nproc-per-node", o.nproc_per_node, zero.nproc},
                                          std::tuple{"--max-restarts", o.max_restarts, zero.max_restarts}}) {
    if (here != there) {
      throw Error(Errc::bad_config, std::string(flag) + " is " + std::to_string(here) + " on node " +
                                        std::to_string(o.node_rank) + " but " + std::to_string(there) +
                                        " on node 0 (" + zero.describe() + "): give every node the same " + flag);
    }
  }
  first_attempt_ = std::stoi(sched_->sync_wait(store_->get("attempt")).value_or("0"));
}

Coordinator::~Coordinator() {
  // The connection is the scheduler's: close it there, then stop the thread.
  sched_->sync_wait([](std::unique_ptr<transport::StoreClient> c) -> Task<void> {
    c.reset();
    co_return;
  }(std::move(store_)));
  sched_->stop();
}

void Coordinator::begin(int attempt) {
  if (o_.node_rank != 0) return;
  heard_.clear();  // each node's count is judged afresh: it was silent while it awaited the verdict
  sched_->sync_wait(store_->set("attempt", std::to_string(attempt)));
}

void Coordinator::heartbeat() {
  if (lost_ || Clock::now() < next_beat_) return;
  next_beat_ = Clock::now() + std::chrono::seconds(1);
  try {
    sched_->sync_wait(store_->set("alive/" + std::to_string(o_.node_rank), std::to_string(++beats_)));
  } catch (const Error&) {
    // The connection is now marked broken: failure(), called next, says why.
  }
}

std::optional<Failure> Coordinator::failure(int attempt) {
  if (lost_) return std::nullopt;
  try {
    auto v = sched_->sync_wait(store_->get(attempt_key(attempt, "failure")));
    if (v) return decode(*v);
    if (o_.node_rank != 0 || Clock::now() < next_watch_) return std::nullopt;
    next_watch_ = Clock::now() + std::chrono::seconds(1);
    std::vector<int> others;
    for (int n = 1; n < o_.nnodes; ++n) others.push_back(n);
    const auto n = silent_node(attempt, others);
    if (!n) return std::nullopt;
    return report(attempt, Failure{.node = *n, .code = 1, .restartable = false,
                                   .what = "its coshard-run fell silent " + std::to_string(kSilentFor.count()) +
                                           " s ago (its host is down, or cut off from node 0)"});
  } catch (const Error& e) {
    lost_ = true;
    return Failure{.node = -1, .code = 1, .restartable = false,
                   .what = "lost the store at " + where_ + " (node 0's coshard-run): " + e.message()};
  }
}

Failure Coordinator::report(int attempt, Failure f) {
  if (lost_) return f;
  try {
    return decode(sched_->sync_wait(store_->compare_set(attempt_key(attempt, "failure"), "", encode(f))));
  } catch (const Error& e) {
    lost_ = true;
    return f;
  }
}

Verdict Coordinator::finish(int attempt, int rc, bool interrupted) {
  if (!lost_) {
    try {
      sched_->sync_wait(store_->set(attempt_key(attempt, "done/" + std::to_string(o_.node_rank)),
                                    std::to_string(rc) + (interrupted ? " interrupted" : "")));
      if (o_.node_rank == 0) return decide(attempt);
      Verdict v = await_verdict(attempt);
      // Node 0 keeps its store up for the job's end until every node has read it.
      if (!v.restart) sched_->sync_wait(store_->set(attempt_key(attempt, "read/" + std::to_string(o_.node_rank)), ""));
      return v;
    } catch (const Error& e) {
      lost_ = true;
      return Verdict{.restart = false, .code = rc ? rc : 1, .reason = "lost the store at " + where_ + ": " + e.message()};
    }
  }
  return Verdict{.restart = false, .code = rc ? rc : 1, .reason = "lost the store at " + where_ + " (node 0's coshard-run)"};
}

// Node 0: waits until every node that joined has said its ranks ended (after a failure, for the
// grace period and a minute more; otherwise up to --join-timeout), or until one falls silent,
// then decides.
Verdict Coordinator::decide(int attempt) {
  std::vector<int> missing;
  for (int n = 0; n < o_.nnodes; ++n) missing.push_back(n);
  std::vector<int> done;
  auto deadline = Clock::now() + o_.join_timeout;
  std::optional<Failure> failed;
  std::vector<int> interrupted;  // nodes whose launcher was told to stop: no restart then
  for (;;) {
    std::erase_if(missing, [&](int n) {
      if (auto said = sched_->sync_wait(store_->get(attempt_key(attempt, "done/" + std::to_string(n))))) {
        if (said->ends_with(" interrupted")) interrupted.push_back(n);
        if (n != 0) done.push_back(n);
        return true;
      }
      // After a failure a node that never joined is not waited for: it has no ranks to stop.
      return failed && !sched_->sync_wait(store_->get("node/" + std::to_string(n)));
    });
    if (silent_node(attempt, missing)) break;
    if (missing.empty() || Clock::now() >= deadline) break;
    if (!failed && (failed = failure(attempt))) {
      deadline = std::min(deadline, Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                       std::chrono::duration<double>(o_.grace_seconds + 60)));
      continue;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  if (!failed) failed = failure(attempt);
  Verdict v;
  if (failed) {
    v.code = failed->code;
    v.failed_rank = failed->rank;
    v.reason = (failed->node >= 0 ? "node " + std::to_string(failed->node) + ": " : "") + failed->what;
    v.restart = failed->restartable && attempt < o_.max_restarts && missing.empty() && interrupted.empty();
  }
  if (!interrupted.empty() && failed && failed->restartable) {
    v.reason += "; not restarted: the launcher of node(s) " + node_list(interrupted) + " was told to stop";
  }
  if (!missing.empty()) {
    v.code = failed ? failed->code : 1;
    v.reason += (v.reason.empty() ? "" : "; ") + std::string("node(s) ") + node_list(missing) +
                " did not say in time that their ranks ended (their coshard-run is gone, stuck, or cut off from the "
                "store), so the job is not restarted";
  } else if (failed && !v.restart && failed->restartable && interrupted.empty()) {
    v.reason += "; no restarts left (--max-restarts " + std::to_string(o_.max_restarts) + ")";
  }
  sched_->sync_wait(store_->set(attempt_key(attempt, "verdict"), encode(v)));
  if (!v.restart) await_readers(attempt, done);
  return v;
}

// A node among `nodes` (not 0) whose count has not changed for kSilentFor and that has not said
// its ranks of `attempt` ended. A node not heard from yet is not judged: it may be starting.
std::optional<int> Coordinator::silent_node(int attempt, const std::vector<int>& nodes) {
  for (int n : nodes) {
    if (n == 0) continue;
    const auto count = sched_->sync_wait(store_->get("alive/" + std::to_string(n)));
    if (!count) continue;
    auto [it, first] = heard_.try_emplace(n, Beat{*count, Clock::now()});
    if (!first && it->second.count != *count) it->second = Beat{*count, Clock::now()};
    if (Clock::now() - it->second.since >= kSilentFor &&
        !sched_->sync_wait(store_->get(attempt_key(attempt, "done/" + std::to_string(n))))) {
      return n;
    }
  }
  return std::nullopt;
}

// The job ends: the store stops with node 0's launcher, once the others have read the verdict.
void Coordinator::await_readers(int attempt, const std::vector<int>& nodes) {
  std::vector<std::string> keys;
  for (int n : nodes) keys.push_back(attempt_key(attempt, "read/" + std::to_string(n)));
  if (keys.empty()) return;
  try {
    sched_->sync_wait(store_->wait(std::move(keys), std::chrono::milliseconds(30000)));
  } catch (const Error& e) {
    if (e.code() != Errc::timeout) throw;
    std::fprintf(stderr, "coshard-run: not every node read how the job ended within 30 s: %s\n", e.message().c_str());
  }
}

Verdict Coordinator::await_verdict(int attempt) {
  const auto limit = o_.join_timeout + std::chrono::seconds(static_cast<long>(o_.grace_seconds) + 120);
  try {
    return decode_verdict(sched_->sync_wait(store_->wait({attempt_key(attempt, "verdict")}, limit)).at(0));
  } catch (const Error& e) {
    if (e.code() != Errc::timeout) throw;
    return Verdict{.restart = false, .code = 1,
                   .reason = "node 0's coshard-run did not decide within " +
                             std::to_string(std::chrono::duration_cast<std::chrono::seconds>(limit).count()) +
                             " s whether to restart: " + e.message()};
  }
}

}  // namespace coshard::run
