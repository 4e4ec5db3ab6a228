#include <asio/ip/tcp.hpp>
#include <atomic>
#include <condition_variable>
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

struct StoreServer::State : std::enable_shared_from_this<StoreServer::State> {
  State(Scheduler& s, Options o) : sched(s), options(std::move(o)), acceptor(s.io_context()) {}

  Scheduler& sched;
  Options options;
  tcp::acceptor acceptor;
  std::uint16_t port = 0;

  // Scheduler thread only:
  std::map<std::string, std::string> kv;
  std::set<Semaphore*> watchers;  // sessions waiting for a change
  std::set<std::shared_ptr<tcp::socket>> sockets;
  bool closed = false;

  std::atomic<std::size_t> connections{0};
  std::atomic<std::size_t> rejected{0};
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

  static Task<void> accept_loop(std::shared_ptr<State> self) {
    struct Done {
      State* s;
      ~Done() { s->task_ended(); }
    } done{self.get()};
    while (!self->closed) {
      auto sock = std::make_shared<tcp::socket>(self->sched.io_context());
      auto r = co_await asio_op([&](auto h) { self->acceptor.async_accept(*sock, std::move(h)); },
                                [&] { self->acceptor.cancel(); });
      if (r.ec) {
        if (self->closed || r.ec == asio::error::operation_aborted) break;
        continue;  // e.g. too many open files: keep serving the others
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
        s->sockets.erase(sock);
        --s->connections;
        s->task_ended();
      }
    } done{self.get(), sock};
    try {
      if (!co_await handshake(*self, *sock)) {
        ++self->rejected;
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
    auto read = detail::read_frame(sock, self.options.limits.max_message_bytes);
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

StoreServer::Stats StoreServer::stats() const { return {state_->connections.load(), state_->rejected.load()}; }

}  // namespace coshard::launch
