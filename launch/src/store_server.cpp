#include <sys/resource.h>

#include <asio/ip/tcp.hpp>
#include <atomic>
#include <condition_variable>
#include <list>
#include <map>
#include <mutex>
#include <set>

#include "coshard/runtime/error.hpp"
#include "coshard/runtime/parse_whole.hpp"
#include "coshard/runtime/semaphore.hpp"
#include "coshard/runtime/timeout.hpp"
#include "coshard/launch/store.hpp"
#include "frame_io.hpp"
#include "store_protocol.hpp"

namespace coshard::launch {

using asio::ip::tcp;
using namespace std::chrono_literals;

namespace {

// A connection awaiting its hello for longer than this is taken for an idle or hostile one when
// room is needed: a client's hello follows its connect by a round trip.
constexpr auto kStaleHandshake = 1s;

// The lowest descriptor number at which the store stops taking connections: the kernel hands out
// the lowest free number, so a new socket numbered this high means only the reserve is left.
std::size_t descriptor_ceiling(std::size_t reserved) {
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur == RLIM_INFINITY) return SIZE_MAX;
  const auto soft = static_cast<std::size_t>(lim.rlim_cur);
  if (reserved == 0) reserved = std::min<std::size_t>(64, soft / 4);
  return soft > reserved ? soft - reserved : 0;
}

bool out_of_descriptors(const std::error_code& ec) {
  return ec == asio::error::no_descriptors || ec == std::errc::too_many_files_open_in_system ||
         ec == asio::error::no_buffer_space || ec == asio::error::no_memory;
}

}  // namespace

struct StoreServer::State : std::enable_shared_from_this<StoreServer::State> {
  State(Scheduler& s, Options o)
      : sched(s), options(std::move(o)), acceptor(s.io_context()) {}

  Scheduler& sched;
  Options options;
  tcp::acceptor acceptor;
  std::uint16_t port = 0;

  // Scheduler thread only:
  std::map<std::string, std::string> kv;
  std::set<Semaphore*> watchers;  // sessions waiting for a change
  std::set<std::shared_ptr<tcp::socket>> sockets;
  struct Waiting {
    std::shared_ptr<tcp::socket> sock;
    std::chrono::steady_clock::time_point since;
  };
  std::list<Waiting> handshakes;  // connections awaiting their hello, oldest first
  std::optional<std::chrono::steady_clock::time_point> said_refusing;
  bool closed = false;

  std::atomic<std::size_t> connections{0};
  std::atomic<std::size_t> rejected{0};
  std::atomic<std::size_t> evicted{0};
  std::atomic<std::size_t> refused{0};
  std::mutex m;
  std::condition_variable cv;
  std::size_t tasks = 0;  // accept loop + sessions still running

  void task_started() {
    std::lock_guard lock(m);
    ++tasks;
  }
  void task_ended() {
    std::lock_guard lock(m);
    --tasks;
    cv.notify_all();
  }

  void changed() {
    for (auto* w : watchers) w->release();
  }

  void close_all() {
    closed = true;
    std::error_code ignored;
    acceptor.close(ignored);
    for (auto& s : sockets) s->close(ignored);
    changed();  // sessions waiting for keys wake up, see `closed` and end
  }

  // Drops the connection that has awaited its hello longest, if it has waited past kStaleHandshake.
  bool evict_stale() {
    if (handshakes.empty() || std::chrono::steady_clock::now() - handshakes.front().since < kStaleHandshake) return false;
    ++evicted;  // before the close, which its client may see at once
    std::error_code ignored;
    handshakes.front().sock->close(ignored);  // its session sees the read fail and ends
    handshakes.pop_front();
    return true;
  }

  // Whether to serve `sock`, just accepted; an admitted one awaits its hello from now (session()
  // forgets it after the handshake). Past max_handshakes a stale one makes room. At the reserve
  // the new connection is closed, and a stale one dropped for the next: admitted, the new one would
  // keep its high number while the next took the number freed, and the reserve would drain. The
  // limit is read each time: a rank that serves the store may raise it after it started.
  bool admit(const std::shared_ptr<tcp::socket>& sock) {
    if (handshakes.size() >= options.max_handshakes) evict_stale();
    if (static_cast<std::size_t>(sock->native_handle()) < descriptor_ceiling(options.reserved_descriptors)) {
      handshakes.push_back({sock, std::chrono::steady_clock::now()});
      return true;
    }
    evict_stale();  // room for the next connection
    ++refused;
    const auto now = std::chrono::steady_clock::now();
    if (!said_refusing || now - *said_refusing >= 1min) {
      said_refusing = now;
      log(options.log, LogLevel::warning,
          "the rendezvous store on port " + std::to_string(port) + " refuses connections: descriptor " +
              std::to_string(sock->native_handle()) + " leaves only the reserve of its process (" +
              std::to_string(sockets.size()) + " connections open, " + std::to_string(handshakes.size()) +
              " of them not past their hello): raise the limit (ulimit -n) for a job this large, or find who "
              "holds connections open");
    }
    return false;
  }
  void forget_handshake(const std::shared_ptr<tcp::socket>& sock) {
    std::erase_if(handshakes, [&](const Waiting& w) { return w.sock == sock; });
  }

  static Task<void> accept_loop(std::shared_ptr<State> self) {
    struct Done {
      State* s;
      ~Done() { s->task_ended(); }
    } done{self.get()};
    auto pause = 10ms;
    while (!self->closed) {
      auto sock = std::make_shared<tcp::socket>(self->sched.io_context());
      auto r = co_await asio_op([&](auto h) { self->acceptor.async_accept(*sock, std::move(h)); },
                                [&] {
                                  std::error_code ignored;  // closed by close_all meanwhile
                                  self->acceptor.cancel(ignored);
                                });
      if (r.ec) {
        if (self->closed || r.ec == asio::error::operation_aborted) break;
        // Out of descriptors (or kernel memory): the queued connection stays queued, and accepting
        // again at once would spin. The sessions that end meanwhile give some back.
        if (out_of_descriptors(r.ec)) {
          co_await sleep_for(pause);
          pause = std::min<std::chrono::milliseconds>(pause * 2, 1s);
        }
        continue;  // keep serving the others
      }
      pause = 10ms;
      if (!self->admit(sock)) {
        std::error_code ignored;
        sock->close(ignored);
        continue;
      }
      self->task_started();
      self->sched.spawn(session(self, std::move(sock)));
    }
  }

  static Task<void> session(std::shared_ptr<State> self, std::shared_ptr<tcp::socket> sock) {
    self->sockets.insert(sock);
    ++self->connections;
    struct Done {
      State* s;
      std::shared_ptr<tcp::socket> sock;
      ~Done() {
        std::error_code ignored;
        sock->close(ignored);
        s->forget_handshake(sock);  // one that ended before its hello was read
        s->sockets.erase(sock);
        --s->connections;
        s->task_ended();
      }
    } done{self.get(), sock};
    try {
      const bool ok = co_await handshake(*self, *sock);
      self->forget_handshake(sock);
      if (!ok) {
        if (sock->is_open()) ++self->rejected;  // an evicted one is counted as such
        co_return;
      }
      for (;;) {
        auto f = co_await detail::read_frame(*sock, self->options.limits.max_message_bytes);
        if (f.error == detail::FrameError::closed || f.error == detail::FrameError::io) co_return;
        if (f.error != detail::FrameError::none) {
          ++self->rejected;  // a frame past the bound: drop the client
          co_return;
        }
        auto reply = co_await self->handle(std::move(f.body));
        if (!reply) {
          ++self->rejected;  // garbage
          co_return;
        }
        if (co_await detail::write_frame(*sock, std::move(reply->frame()))) co_return;
      }
    } catch (const Error&) {
      // cancelled (server stopping) or the handshake deadline: the client is dropped
    }
  }

  static Task<bool> handshake(State& self, tcp::socket& sock) {
    // The hello is an op and the token: a connection that has not authenticated holds no more.
    auto read = detail::read_frame(sock, std::min(self.options.limits.max_message_bytes, 1 + 4 + kMaxTokenBytes));
    detail::FrameRead f;
    try {
      f = co_await with_timeout(std::move(read), self.options.handshake_timeout, "store handshake");
    } catch (const Error&) {
      co_return false;
    }
    if (f.error != detail::FrameError::none) co_return false;
    wire::Reader r(f.body);
    auto op = r.head();
    auto token = r.str();
    if (!op || *op != static_cast<std::uint8_t>(wire::Op::hello) || !token || !r.done()) co_return false;
    if (*token != self.options.token) {
      wire::Writer w(static_cast<std::uint8_t>(wire::Status::unauthorized));
      w.str("token rejected");
      co_await detail::write_frame(sock, std::move(w.frame()));
      co_return false;
    }
    wire::Writer w(static_cast<std::uint8_t>(wire::Status::ok));
    co_return !co_await detail::write_frame(sock, std::move(w.frame()));
  }

  static wire::Writer status(wire::Status s) { return wire::Writer(static_cast<std::uint8_t>(s)); }

  // Returns the reply, or nothing when the request is malformed (the client is then dropped).
  Task<std::optional<wire::Writer>> handle(std::string body) {
    wire::Reader r(body);
    auto op = r.head();
    if (!op) co_return std::nullopt;
    switch (static_cast<wire::Op>(*op)) {
      case wire::Op::set: co_return set_key(r);
      case wire::Op::get: co_return get_key(r);
      case wire::Op::get_many: co_return get_keys(r);
      case wire::Op::wait: {
        auto request = read_wait(r);
        if (!request) co_return std::nullopt;
        co_return co_await wait_keys(std::move(request->keys), std::min(request->timeout, options.limits.max_wait));
      }
      case wire::Op::add: co_return add_to_key(r);
      case wire::Op::compare_set: co_return compare_set_key(r);
      case wire::Op::del: co_return erase_key(r);
      case wire::Op::hello: break;
    }
    co_return std::nullopt;
  }

  // The request handlers below read the rest of a request after its op; nothing means malformed.

  std::optional<wire::Writer> set_key(wire::Reader& r) {
    auto key = r.str();
    auto value = r.str();
    if (!key || !value || !r.done()) return std::nullopt;
    kv[*key] = std::move(*value);
    changed();
    return status(wire::Status::ok);
  }

  std::optional<wire::Writer> get_key(wire::Reader& r) {
    auto key = r.str();
    if (!key || !r.done()) return std::nullopt;
    auto it = kv.find(*key);
    if (it == kv.end()) return status(wire::Status::not_found);
    auto w = status(wire::Status::ok);
    w.str(it->second);
    return w;
  }

  // Each key's value, present or not, in one reply: one round trip where a caller would make one per
  // key (coshard-run's node 0 reads every node's claim and beat count each poll). A reply that
  // would pass the frame bound is refused, naming it, rather than cut.
  std::optional<wire::Writer> get_keys(wire::Reader& r) {
    auto count = r.i64();
    if (!count || *count < 0) return std::nullopt;
    std::vector<const std::string*> values;
    std::size_t bytes = 1;
    for (std::int64_t i = 0; i < *count; ++i) {
      auto key = r.str();
      if (!key) return std::nullopt;
      auto it = kv.find(*key);
      values.push_back(it == kv.end() ? nullptr : &it->second);
      bytes += 8 + (it == kv.end() ? 0 : 4 + it->second.size());
      if (bytes > options.limits.max_message_bytes) {  // checked as it grows, so that it cannot wrap
        auto w = status(wire::Status::bad_request);
        w.str("the values of " + std::to_string(*count) + " keys take more than a frame's " +
              std::to_string(options.limits.max_message_bytes) + " bytes: ask for fewer keys");
        return w;
      }
    }
    if (!r.done()) return std::nullopt;
    auto w = status(wire::Status::ok);
    for (const std::string* v : values) {
      w.i64(v ? 1 : 0);
      if (v) w.str(*v);
    }
    return w;
  }

  struct WaitRequest {
    std::vector<std::string> keys;
    std::chrono::milliseconds timeout;
  };

  static std::optional<WaitRequest> read_wait(wire::Reader& r) {
    auto timeout_ms = r.i64();
    auto count = r.i64();
    if (!timeout_ms || !count || *count < 0 || *timeout_ms < 0) return std::nullopt;
    WaitRequest request{{}, std::chrono::milliseconds(*timeout_ms)};
    for (std::int64_t i = 0; i < *count; ++i) {
      auto k = r.str();
      if (!k) return std::nullopt;
      request.keys.push_back(std::move(*k));
    }
    if (!r.done()) return std::nullopt;
    return request;
  }

  std::optional<wire::Writer> add_to_key(wire::Reader& r) {
    auto key = r.str();
    auto delta = r.i64();
    if (!key || !delta || !r.done()) return std::nullopt;
    std::int64_t value = 0;
    if (auto it = kv.find(*key); it != kv.end()) {
      const std::optional<std::int64_t> stored = parse_whole<std::int64_t>(it->second);
      if (!stored) {
        auto w = status(wire::Status::bad_request);
        w.str("the value of '" + *key + "' is not an integer");
        return w;
      }
      value = *stored;
    }
    if (__builtin_add_overflow(value, *delta, &value)) {  // found by tests/fuzz/store_protocol
      auto w = status(wire::Status::bad_request);
      w.str("adding " + std::to_string(*delta) + " to '" + *key + "' overflows a 64-bit integer");
      return w;
    }
    kv[*key] = std::to_string(value);
    changed();
    auto w = status(wire::Status::ok);
    w.i64(value);
    return w;
  }

  std::optional<wire::Writer> compare_set_key(wire::Reader& r) {
    auto key = r.str();
    auto expected = r.str();
    auto desired = r.str();
    if (!key || !expected || !desired || !r.done()) return std::nullopt;
    auto it = kv.find(*key);
    bool match = it == kv.end() ? expected->empty() : it->second == *expected;
    if (match) {
      kv[*key] = std::move(*desired);
      changed();
    }
    auto w = status(wire::Status::ok);
    w.str(kv.count(*key) ? kv[*key] : std::string());
    return w;
  }

  std::optional<wire::Writer> erase_key(wire::Reader& r) {
    auto key = r.str();
    if (!key || !r.done()) return std::nullopt;
    auto w = status(wire::Status::ok);
    w.i64(kv.erase(*key) ? 1 : 0);
    return w;
  }

  Task<wire::Writer> wait_keys(std::vector<std::string> keys, std::chrono::milliseconds timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    Semaphore changed_sem(0);
    watchers.insert(&changed_sem);
    struct Unwatch {
      State* s;
      Semaphore* sem;
      ~Unwatch() { s->watchers.erase(sem); }
    } unwatch{this, &changed_sem};
    for (;;) {
      if (closed) throw Error(Errc::cancelled, "the store is stopping");
      std::vector<std::string> missing;
      for (const auto& k : keys) {
        if (!kv.count(k)) missing.push_back(k);
      }
      if (missing.empty()) {
        auto w = status(wire::Status::ok);
        for (const auto& k : keys) w.str(kv[k]);
        co_return w;
      }
      auto left = deadline - std::chrono::steady_clock::now();
      bool timed_out = left <= std::chrono::nanoseconds::zero();
      if (!timed_out) {
        try {
          co_await with_timeout([](Semaphore& s) -> Task<void> { co_await s.acquire(); }(changed_sem), left,
                                "store wait");
          while (changed_sem.try_acquire()) {
          }
        } catch (const Error& e) {
          if (e.code() != Errc::timeout) throw;
          timed_out = true;
        }
      }
      if (timed_out) {
        auto w = status(wire::Status::timeout);
        w.i64(static_cast<std::int64_t>(missing.size()));
        for (const auto& k : missing) w.str(k);
        co_return w;
      }
    }
  }
};

std::string StoreServer::bind_address_for(const std::string& master_addr) {
  if (master_addr == "localhost") return "127.0.0.1";
  std::error_code ec;
  (void)asio::ip::make_address(master_addr, ec);
  return ec ? "0.0.0.0" : master_addr;
}

StoreServer::StoreServer(Scheduler& sched, Options options)
    : state_(std::make_shared<State>(sched, std::move(options))) {
  auto& o = state_->options;
  const std::string where = o.bind_address + ":" + std::to_string(o.port);
  if (o.token.size() > kMaxTokenBytes) {
    throw Error(Errc::bad_config, "the rendezvous store's token has " + std::to_string(o.token.size()) +
                                      " bytes, more than the " + std::to_string(kMaxTokenBytes) + " a client may present");
  }
  try {
    tcp::endpoint ep(asio::ip::make_address(o.bind_address), o.port);
    state_->acceptor.open(ep.protocol());
    state_->acceptor.set_option(tcp::acceptor::reuse_address(true));
    state_->acceptor.bind(ep);
    state_->acceptor.listen();
    state_->port = state_->acceptor.local_endpoint().port();
  } catch (const std::system_error& e) {
    throw Error(Errc::io, "the rendezvous store cannot listen on " + where + ": " + e.code().message() +
                              ". Pick a free port (MASTER_PORT, coshard-run --master ADDR:0 picks one) or a local "
                              "address");
  }
  state_->task_started();
  sched.spawn(State::accept_loop(state_));
}

StoreServer::~StoreServer() { stop(); }

std::uint16_t StoreServer::port() const noexcept { return state_->port; }

void StoreServer::stop() {
  auto st = state_;
  if (st->sched.running_in_this_thread()) {
    st->close_all();
    return;
  }
  if (st->sched.health() != Health::running) return;  // its tasks ended with the scheduler
  st->sched.post([st] { st->close_all(); });
  std::unique_lock lock(st->m);
  st->cv.wait_for(lock, 10s, [&] { return st->tasks == 0; });
}

StoreServer::Stats StoreServer::stats() const {
  return {state_->connections.load(), state_->rejected.load(), state_->evicted.load(), state_->refused.load()};
}

}  // namespace coshard::launch
