#include "wire.hpp"

#include "coshard/launch/hosts.hpp"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <thread>

namespace coshard::transport::detail {

using Clock = std::chrono::steady_clock;

void throw_ucx(ucs_status_t status, const std::string& what) {
  throw Error(Errc::io, what + " failed: " + ucs_status_string(status) +
                            " (UCX_TLS and UCX_NET_DEVICES select the transports; ucx_info -d lists them)");
}

UcxContext::UcxContext(Protocols protocols, std::string net_devices) : net_devices_(std::move(net_devices)) {
  ucp_config_t* config = nullptr;
  if (auto st = ucp_config_read(nullptr, nullptr, &config); st != UCS_OK) throw_ucx(st, "ucp_config_read");
  if (!net_devices_.empty() && !std::getenv("UCX_NET_DEVICES")) {
    if (auto st = ucp_config_modify(config, "NET_DEVICES", net_devices_.c_str()); st != UCS_OK) {
      ucp_config_release(config);
      throw_ucx(st, "ucp_config_modify NET_DEVICES=" + net_devices_);
    }
  }
  if (protocols == Protocols::eager && !std::getenv("UCX_RNDV_THRESH")) {
    if (auto st = ucp_config_modify(config, "RNDV_THRESH", "inf"); st != UCS_OK) {
      ucp_config_release(config);
      throw_ucx(st, "ucp_config_modify RNDV_THRESH");
    }
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  params.features = UCP_FEATURE_TAG;
  params.mt_workers_shared = 1;  // each communicator's worker runs on its own stream thread
  auto st = ucp_init(&params, config, &ctx_);
  ucp_config_release(config);
  if (st != UCS_OK) throw_ucx(st, "ucp_init");
}

UcxContext::~UcxContext() {
  eager_.reset();
  if (ctx_) ucp_cleanup(ctx_);
}

std::shared_ptr<UcxContext> UcxContext::eager() {
  if (!eager_) eager_ = std::make_shared<UcxContext>(Protocols::eager, net_devices_);
  return eager_;
}

namespace {

// Idle progress calls before a wait yields the core (Wire::wait_until), on a wire whose peers are
// all on this host (shared memory: a progress call is a few loads). On one with a peer on another
// host a progress call is a system call, as dear as a yield, and spinning only keeps the core from
// the ranks that share it, so such a wire yields at once (docs/benchmarks.md, "Across hosts":
// "Yielding at once on a wire that crosses hosts").
constexpr unsigned kSpins = 8;
// A wait progresses its sibling wires' workers on every this-many turns, not every turn: their
// protocol messages (a rendezvous acknowledgement) only need to move, not at once, and over TCP
// each progress call is a system call (docs/benchmarks.md, "Across hosts": every eighth turn
// against every turn).
constexpr unsigned kSiblingTurns = 8;

// Steady-clock nanoseconds, for the atomics of when a peer was last heard from.
std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

// A process on this host is gone once /proc has no entry for it or it is a zombie.
bool process_alive(int pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!f || !std::getline(f, line)) return false;
  auto paren = line.rfind(')');
  if (paren == std::string::npos || paren + 2 >= line.size()) return true;
  char state = line[paren + 2];
  return state != 'Z' && state != 'X';
}

}  // namespace

Wire::Wire(std::shared_ptr<UcxContext> ctx, int rank, int size, Options options)
    : ctx_(std::move(ctx)), rank_(rank), size_(size), options_(options), host_(launch::this_host()) {
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  // Created on the scheduler, then driven by the stream thread: one thread at a time.
  wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  if (auto st = ucp_worker_create(ctx_->get(), &wp, &worker_); st != UCS_OK) throw_ucx(st, "ucp_worker_create");
  peer_status_.assign(static_cast<std::size_t>(size_), UCS_OK);
}

Wire::~Wire() {
  std::vector<void*> closing;
  for (auto ep : eps_) {
    if (!ep) continue;
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    // FORCE needs PEER mode on both sides; otherwise flush, which a dead peer may never answer.
    p.flags = peer_error_mode_ ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    void* r = ucp_ep_close_nbx(ep, &p);
    if (r && !UCS_PTR_IS_ERR(r)) closing.push_back(r);
  }
  auto limit = Clock::now() + std::chrono::seconds(1);
  while (!closing.empty() && Clock::now() < limit) {
    ucp_worker_progress(worker_);
    std::erase_if(closing, [](void* r) {
      if (ucp_request_check_status(r) == UCS_INPROGRESS) return false;
      ucp_request_free(r);
      return true;
    });
  }
  for (void* r : closing) ucp_request_free(r);  // UCX finishes them when the worker goes
  if (worker_) ucp_worker_destroy(worker_);
}

PeerIdentity Wire::self() const {
  ucp_address_t* addr = nullptr;
  std::size_t len = 0;
  if (auto st = ucp_worker_get_address(worker_, &addr, &len); st != UCS_OK) throw_ucx(st, "ucp_worker_get_address");
  PeerIdentity me{host_, static_cast<int>(::getpid()), -1, std::string(reinterpret_cast<const char*>(addr), len)};
  ucp_worker_release_address(worker_, addr);
  return me;
}

void Wire::on_peer_error(void* arg, ucp_ep_h, ucs_status_t status) {
  auto* a = static_cast<ErrArg*>(arg);
  a->wire->peer_status_[static_cast<std::size_t>(a->peer)] = status;
}

void Wire::connect(std::vector<PeerIdentity> peers, bool peer_error_mode) {
  peers_ = std::move(peers);
  spins_ = std::any_of(peers_.begin(), peers_.end(), [&](const PeerIdentity& p) { return p.host != host_; }) ? 0 : kSpins;
  last_heard_ = std::make_unique<std::atomic<std::int64_t>[]>(static_cast<std::size_t>(size_));
  for (int p = 0; p < size_; ++p) last_heard_[static_cast<std::size_t>(p)].store(0, std::memory_order_relaxed);
  peer_error_mode_ = peer_error_mode;
  eps_.assign(static_cast<std::size_t>(size_), nullptr);
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    auto& id = peers_[static_cast<std::size_t>(p)];
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    ep.address = reinterpret_cast<const ucp_address_t*>(id.address.data());
    ep.err_mode = peer_error_mode_ ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
    if (peer_error_mode_) {
      err_args_.push_back(std::make_unique<ErrArg>(ErrArg{this, p}));
      ep.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLER;
      ep.err_handler.cb = &Wire::on_peer_error;
      ep.err_handler.arg = err_args_.back().get();
    }
    if (auto st = ucp_ep_create(worker_, &ep, &eps_[static_cast<std::size_t>(p)]); st != UCS_OK) {
      throw_ucx(st, "connecting to " + peer_name(p) + " (ucp_ep_create, " + std::to_string(size_) + " ranks)");
    }
  }
}

std::string Wire::peer_name(int peer) const {
  std::string s = "rank " + std::to_string(peer);
  if (options_.name_by_job_rank && static_cast<std::size_t>(peer) < peers_.size()) {
    s = "job rank " + std::to_string(peers_[static_cast<std::size_t>(peer)].job_rank);
  }
  if (static_cast<std::size_t>(peer) < peers_.size()) {
    const auto& id = peers_[static_cast<std::size_t>(peer)];
    s += " (pid " + std::to_string(id.pid) + " on " + id.host + ")";
  }
  return s;
}

void Wire::begin(WaitContext wait) {
  requests_.clear();
  wait_ = std::move(wait);
  begun_ = Clock::now();
  next_liveness_ = begun_ + options_.liveness_interval;
  heard_.assign(static_cast<std::size_t>(size_), false);
  waited_.assign(static_cast<std::size_t>(size_), 0.0);
}

Wire::RequestId Wire::send(int peer, const void* data, std::size_t bytes, std::uint64_t tag) {
  Request r;
  r.peer = peer;
  r.expected = bytes;
  ucp_request_param_t p{};
  void* h = ucp_tag_send_nbx(eps_[static_cast<std::size_t>(peer)], data, bytes, tag, &p);
  requests_.push_back(r);
  auto id = requests_.size() - 1;
  if (UCS_PTR_IS_ERR(h)) {
    requests_[id].complete = true;
    finish(requests_[id], UCS_PTR_STATUS(h));
  } else if (h == nullptr) {
    requests_[id].complete = true;
  } else {
    requests_[id].handle = h;
  }
  return id;
}

Wire::RequestId Wire::recv(int peer, void* data, std::size_t bytes, std::uint64_t tag, bool times_peer) {
  return post_recv(peer, data, bytes, tag, times_peer, false);
}

Wire::RequestId Wire::recv_up_to(int peer, void* data, std::size_t capacity, std::uint64_t tag, bool times_peer) {
  return post_recv(peer, data, capacity, tag, times_peer, true);
}

Wire::RequestId Wire::post_recv(int peer, void* data, std::size_t bytes, std::uint64_t tag, bool times_peer,
                                bool up_to) {
  Request r;
  r.up_to = up_to;
  r.peer = peer;
  r.is_recv = true;
  r.times_peer = times_peer;
  r.expected = bytes;
  ucp_request_param_t p{};
  // Always a request: UCX 1.13 leaves recv_info unset on some immediate completions, and the
  // received length is what tells a rank that its peer passed another size.
  p.op_attr_mask = UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  void* h = ucp_tag_recv_nbx(worker_, data, bytes, tag, ~std::uint64_t{0}, &p);
  requests_.push_back(r);
  auto id = requests_.size() - 1;
  if (UCS_PTR_IS_ERR(h)) {
    requests_[id].complete = true;
    finish(requests_[id], UCS_PTR_STATUS(h));
  } else {
    requests_[id].handle = h;
  }
  return id;
}

bool Wire::done(RequestId id) {
  auto& r = requests_[id];
  if (r.complete) return true;
  ucs_status_t st = r.is_recv ? ucp_tag_recv_request_test(r.handle, &r.info) : ucp_request_check_status(r.handle);
  if (st == UCS_INPROGRESS) return false;
  ucp_request_free(r.handle);
  r.handle = nullptr;
  r.complete = true;
  finish(r, st);
  return true;
}

void Wire::finish(Request& r, ucs_status_t status) {
  const auto peer = static_cast<std::size_t>(r.peer);
  if (status == UCS_OK && r.times_peer && peer < heard_.size() && !heard_[peer]) {
    heard_[peer] = true;  // seen when polled: while this rank waits, that is when it arrived
    waited_[peer] = std::chrono::duration<double>(Clock::now() - begun_).count();
  }
  if (status == UCS_OK) {
    if (r.is_recv && last_heard_) last_heard_[peer].store(now_ns(), std::memory_order_relaxed);
    if (r.is_recv && !r.up_to && r.info.length != r.expected) {
      throw Error(Errc::invalid_argument,
                  wait_.op + ": " + peer_name(r.peer) + " sent " + std::to_string(r.info.length) +
                      " bytes where this rank (" + std::to_string(rank_) + ") expected " +
                      std::to_string(r.expected) + ". Every rank must pass the same sizes to a collective",
                  op_context(wait_.op));
    }
    return;
  }
  if (peer_status_[peer] != UCS_OK) throw_peer_lost(r.peer, ucs_status_string(peer_status_[peer]));
  if (auto reason = aborted()) throw *reason;
  if (status == UCS_ERR_MESSAGE_TRUNCATED) {
    throw Error(Errc::invalid_argument,
                wait_.op + ": " + peer_name(r.peer) + " sent more than the " + std::to_string(r.expected) +
                    " bytes this rank (" + std::to_string(rank_) +
                    ") expected. Every rank must pass the same sizes to a collective",
                op_context(wait_.op));
  }
  if (status == UCS_ERR_CONNECTION_RESET || status == UCS_ERR_ENDPOINT_TIMEOUT || status == UCS_ERR_UNREACHABLE) {
    throw_peer_lost(r.peer, ucs_status_string(status));
  }
  throw Error(Errc::io,
              wait_.op + ": " + std::string(r.is_recv ? "receive from " : "send to ") + peer_name(r.peer) +
                  " failed: " + ucs_status_string(status),
              op_context(wait_.op));
}

void Wire::throw_peer_lost(int peer, const std::string& why) {
  throw Error(Errc::peer_lost,
              wait_.op + ": " + peer_name(peer) + " is gone (" + why +
                  "). Its own log says why; the job cannot continue without it",
              op_context(wait_.op));
}

void Wire::throw_timeout() {
  std::map<int, int> owing;  // peer -> messages still pending from or to it
  for (auto& r : requests_) {
    if (!r.complete) ++owing[r.peer];
  }
  std::string who;
  for (auto [peer, n] : owing) {
    if (!who.empty()) who += ", ";
    who += peer_name(peer) + ": " + std::to_string(n) + " message" + (n == 1 ? "" : "s");
  }
  // Half the deadline: the cut may have come in the middle of this very operation, after the
  // last message from across.
  const auto quiet_for = wait_.timeout / 2;
  std::string quiet = silent_for(quiet_for, owing);
  if (const std::string more = across_ ? across_->silent_for(quiet_for) : ""; !more.empty()) {
    quiet += (quiet.empty() ? "" : ", ") + more;
  }
  if (!quiet.empty()) {
    who += (who.empty() ? "the other hosts' " : "; and from the other hosts, ") + quiet +
           ", on whom the ranks of this host may be waiting";
  }
  throw Error(Errc::timeout,
              wait_.op + " did not complete within " + std::to_string(wait_.timeout.count()) +
                  " ms; not heard from: " + (who.empty() ? "nobody (local work was slow)" : who) +
                  ". Those ranks are stuck, slower, or issued different collectives (compare the flight records)",
              op_context(wait_.op));
}

std::string Wire::silent_for(std::chrono::milliseconds quiet, const std::map<int, int>& named) const {
  std::string out;
  if (!last_heard_) return out;
  const std::int64_t now = now_ns(), bound = std::chrono::duration_cast<std::chrono::nanoseconds>(quiet).count();
  for (int p = 0; p < size_; ++p) {
    const std::int64_t last = last_heard_[static_cast<std::size_t>(p)].load(std::memory_order_relaxed);
    if (p == rank_ || last == 0 || now - last < bound || named.count(p) ||
        peers_[static_cast<std::size_t>(p)].host == host_) {
      continue;
    }
    char silent[32];
    std::snprintf(silent, sizeof silent, " for %.1f s", static_cast<double>(now - last) * 1e-9);
    out += (out.empty() ? "" : ", ") + peer_name(p) + silent;
  }
  return out;
}

void Wire::check_liveness() {
  for (auto& r : requests_) {
    if (r.complete) continue;
    const auto& id = peers_[static_cast<std::size_t>(r.peer)];
    if (peer_status_[static_cast<std::size_t>(r.peer)] != UCS_OK) {
      throw_peer_lost(r.peer, ucs_status_string(peer_status_[static_cast<std::size_t>(r.peer)]));
    }
    if (id.host == host_ && !process_alive(id.pid)) throw_peer_lost(r.peer, "its process exited");
  }
}

void Wire::wait_until(const std::function<bool()>& ready) {
  unsigned idle = 0;
  unsigned turn = 0;
  while (!ready()) {
    unsigned progressed = ucp_worker_progress(worker_);
    if (++turn % kSiblingTurns == 0) {
      for (Wire* w : siblings_) progressed += ucp_worker_progress(w->worker_);
    }
    if (progressed != 0) {
      idle = 0;
      continue;
    }
    if (abort_flag_.load(std::memory_order_relaxed)) throw *aborted();
    ++idle;
    // Spin briefly (a message is often about to land), then yield the core to other ranks, then
    // sleep in short steps: tests run 8 ranks on 2 cores, where spinning starves the senders. A
    // yield costs a rank that has its own core one system call; a progress call over TCP costs
    // about as much, so a longer spin only keeps the core from the peer that is about to send.
    // Sleeping on the workers' event descriptors (UCP_FEATURE_WAKEUP, ucp_worker_arm and poll)
    // instead of yielding pays a wake-up per message and was slower (both measured in
    // docs/benchmarks.md, "Across hosts").
    if (idle < spins_) continue;
    auto now = Clock::now();
    if (now >= wait_.deadline) throw_timeout();
    if (now >= next_liveness_) {
      check_liveness();
      next_liveness_ = now + options_.liveness_interval;
    }
    if (idle < 2048) {
      ::sched_yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(idle < 8192 ? 20 : 200));
    }
  }
}

void Wire::wait_all() {
  wait_until([this] {
    // Every request is polled, not only up to the first pending one: a header is timed when it is
    // seen (peer_waits), and one behind a late peer's must not take that peer's lateness.
    bool all = true;
    for (std::size_t i = 0; i < requests_.size(); ++i) all = done(i) && all;
    return all;
  });
}

void Wire::cancel_all() noexcept {
  for (auto& r : requests_) {
    if (!r.complete && r.handle) ucp_request_cancel(worker_, r.handle);
  }
  auto limit = Clock::now() + std::chrono::seconds(2);
  for (auto& r : requests_) {
    while (!r.complete && r.handle) {
      ucs_status_t st = r.is_recv ? ucp_tag_recv_request_test(r.handle, &r.info) : ucp_request_check_status(r.handle);
      if (st != UCS_INPROGRESS) {
        ucp_request_free(r.handle);
        r.handle = nullptr;
        r.complete = true;
        break;
      }
      if (Clock::now() > limit) {
        log(options_.log, LogLevel::warning, wait_.op + ": a UCX request did not let go of its buffer within 2 s of cancel");
        ucp_request_free(r.handle);
        r.handle = nullptr;
        break;
      }
      ucp_worker_progress(worker_);
    }
  }
}

void Wire::abort(const Error& reason) {
  std::lock_guard lock(abort_m_);
  if (!abort_reason_) abort_reason_ = reason;
  abort_flag_.store(true);
}

std::optional<Error> Wire::aborted() const {
  std::lock_guard lock(abort_m_);
  return abort_reason_;
}

}  // namespace coshard::transport::detail
