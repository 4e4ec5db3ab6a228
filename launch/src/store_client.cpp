#include <asio/connect.hpp>
#include <asio/ip/tcp.hpp>
#include <memory>
#include <optional>

#include "coshard/runtime/error.hpp"
#include "coshard/runtime/semaphore.hpp"
#include "coshard/runtime/timeout.hpp"
#include "coshard/launch/store.hpp"
#include "frame_io.hpp"
#include "store_protocol.hpp"

namespace coshard::launch {

using asio::ip::tcp;

struct StoreClient::Impl {
  Impl(Scheduler& s, Options o) : sched(s), options(std::move(o)), socket(s.io_context()) {}
  Scheduler& sched;
  Options options;
  tcp::socket socket;
  Semaphore turn{1};  // one request on the wire at a time
  std::string broken;  // why the connection can no longer be used

  std::string where() const { return options.host + ":" + std::to_string(options.port); }
  // Why a connection breaks, most often.
  std::string gone() const {
    return options.served_by.empty() ? ""
                                     : ". The store's host (" + options.served_by +
                                           ") may have exited: its own output says why";
  }

  // Sends one request and returns the reply body (status first), within `limit` (nothing:
  // op_timeout). A failure mid-request leaves the stream in an unknown state, so the connection is
  // closed and later calls fail at once.
  Task<std::string> exchange(wire::Writer request, std::string what, std::optional<std::chrono::milliseconds> limit) {
    if (!broken.empty()) {
      throw Error(Errc::peer_lost, "store " + what + ": the connection to " + where() + " was lost earlier (" +
                                       broken + ")");
    }
    auto& frame = request.frame();
    if (frame.size() - 4 > options.limits.max_message_bytes) {
      throw Error(Errc::invalid_argument, "store " + what + ": request of " + std::to_string(frame.size()) +
                                              " bytes exceeds the store's bound of " +
                                              std::to_string(options.limits.max_message_bytes) + " bytes");
    }
    co_await turn.acquire();
    struct Release {
      Semaphore& s;
      ~Release() { s.release(); }
    } release{turn};
    try {
      co_return co_await with_timeout(round_trip(std::move(frame), what), limit.value_or(options.op_timeout),
                                      "store " + what + " at " + where());
    } catch (const Error& e) {
      broken = e.what();
      std::error_code ignored;
      socket.close(ignored);
      throw;
    }
  }

  // No default argument on the coroutine (GCC 12 destroys such temporaries twice).
  Task<std::string> exchange(wire::Writer request, std::string what) {
    return exchange(std::move(request), std::move(what), std::nullopt);
  }

  Task<std::string> round_trip(std::vector<char> frame, std::string what) {
    if (auto ec = co_await detail::write_frame(socket, std::move(frame))) {
      throw Error(Errc::peer_lost, "store " + what + ": sending to " + where() + " failed: " + ec.message() + gone());
    }
    auto f = co_await detail::read_frame(socket, options.limits.max_message_bytes);
    switch (f.error) {
      case detail::FrameError::none:
        co_return std::move(f.body);
      case detail::FrameError::closed:
        throw Error(Errc::peer_lost, "store " + what + ": " + where() +
                                         " closed the connection (the store stopped, or dropped this client)" + gone());
      case detail::FrameError::bad_length:
        throw Error(Errc::io, "store " + what + ": reply of " + std::to_string(f.length) + " bytes from " + where() +
                                  " is outside the bound; is that a coshard store?");
      case detail::FrameError::io:
        break;
    }
    throw Error(Errc::peer_lost, "store " + what + ": receiving from " + where() + " failed: " + f.ec.message() + gone());
  }

  [[noreturn]] void bad_reply(const std::string& what) {
    broken = "malformed reply";
    throw Error(Errc::io, "store " + what + ": malformed reply from " + where() + "; is that a coshard store?");
  }
};

namespace {

wire::Writer request(wire::Op op) { return wire::Writer(static_cast<std::uint8_t>(op)); }

wire::Status status_of(wire::Reader& r) {
  auto h = r.head();
  return h ? static_cast<wire::Status>(*h) : wire::Status::bad_request;
}

// One attempt on a socket of its own, kept alive by the operation's handler: when the attempt's
// deadline cancels it, Asio still runs the handler later, and it must not find a socket that the
// failed connect has destroyed with the client.
Task<std::error_code> connect_once(StoreClient::Impl& impl, tcp::resolver::results_type endpoints) {
  auto sock = std::make_shared<tcp::socket>(impl.sched.io_context());
  auto r = co_await asio_op(
      [&](auto h) {
        asio::async_connect(*sock, endpoints,
                            [h = std::move(h), sock](std::error_code e, const tcp::endpoint&) mutable { h(e, 0); });
      },
      [sock] {
        std::error_code ignored;
        sock->close(ignored);
      });
  if (!r.ec) impl.socket = std::move(*sock);
  co_return r.ec;
}

Error unresolved_error(const StoreClient::Impl& impl, std::error_code ec) {
  return Error(Errc::bad_config, "cannot resolve the rendezvous store's host '" + impl.options.host + "' (" +
                                     ec.message() + "). Check MASTER_ADDR (coshard-run's --master) for a typo, or "
                                     "give the address of rank 0's host",
               op_context(std::string(StoreClient::kResolveOp)));
}

// Every attempt has a deadline of its own: a SYN that is dropped (a full accept queue, a host
// that is not there) is otherwise retried by the kernel for about two minutes, past any deadline.
Task<void> connect_with_retry(StoreClient::Impl& impl) {
  using clock = std::chrono::steady_clock;
  constexpr auto kAttemptLimit = std::chrono::seconds(2);
  auto deadline = clock::now() + impl.options.connect_timeout;
  auto pause = std::chrono::milliseconds(10);
  std::string last_error;
  std::optional<clock::time_point> unresolved_since;
  for (;;) {
    std::error_code ec;
    tcp::resolver resolver(impl.sched.io_context());
    // A synchronous lookup, once per rank at start-up; numeric addresses never touch DNS.
    auto endpoints = resolver.resolve(impl.options.host, std::to_string(impl.options.port), ec);
    // An authoritative "no such name" is a typo, or a name not published yet (a pod whose DNS
    // record comes with it): retried for resolve_timeout at most, then named. A failed lookup
    // (try_again, a DNS server down) is retried as a refused connect.
    const bool unresolved = ec == asio::error::host_not_found;
    if (unresolved && !unresolved_since) unresolved_since = clock::now();
    if (unresolved && clock::now() >= *unresolved_since + impl.options.resolve_timeout) throw unresolved_error(impl, ec);
    if (!ec) {
      const auto left = std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - clock::now());
      try {
        ec = co_await with_timeout(connect_once(impl, std::move(endpoints)), std::min<std::chrono::nanoseconds>(left, kAttemptLimit),
                                   "store connect attempt");
        if (!ec) co_return;
      } catch (const Error& e) {
        if (e.code() != Errc::timeout) throw;
        ec = asio::error::timed_out;
      }
    }
    last_error = ec.message();
    if (clock::now() + pause >= deadline) {
      if (ec == asio::error::host_not_found) throw unresolved_error(impl, ec);
      break;
    }
    co_await sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(500));
  }
  const auto ms = impl.options.connect_timeout.count();
  const std::string limit = ms % 1000 == 0 ? std::to_string(ms / 1000) + " s" : std::to_string(ms) + " ms";
  throw Error(Errc::timeout, "cannot reach the rendezvous store at " + impl.where() + " within " + limit + " (" +
                                 last_error +
                                 "). Check that rank 0 or coshard-run is up and MASTER_ADDR/MASTER_PORT point at it",
              op_context("store connect"));
}

}  // namespace

StoreClient::StoreClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
StoreClient::~StoreClient() = default;

Task<std::unique_ptr<StoreClient>> StoreClient::connect(Options options) {
  auto ctx = co_await current_context();
  if (!ctx.scheduler) coshard::detail::throw_no_scheduler("StoreClient::connect");
  if (options.token.size() > StoreServer::kMaxTokenBytes) {
    throw Error(Errc::bad_config, "the rendezvous store token (COSHARD_TOKEN, coshard-run --token) has " +
                                      std::to_string(options.token.size()) + " bytes, more than the store's " +
                                      std::to_string(StoreServer::kMaxTokenBytes));
  }
  auto impl = std::make_unique<Impl>(*ctx.scheduler, std::move(options));
  co_await connect_with_retry(*impl);
  auto hello = request(wire::Op::hello);
  hello.str(impl->options.token);
  // Bounded like the connect: a store whose accept queue took the connection but that never
  // serves it must not hold a rank for the 5 minutes of an ordinary call.
  const std::chrono::milliseconds hello_limit = impl->options.connect_timeout;
  auto body = co_await impl->exchange(std::move(hello), "hello", hello_limit);
  wire::Reader r(body);
  auto s = status_of(r);
  if (s == wire::Status::unauthorized) {
    throw Error(Errc::bad_config, "the rendezvous store at " + impl->where() +
                                      " rejected this client's token: a rank needs the store's COSHARD_TOKEN (coshard-run "
                                      "sets it for its ranks), and every node's coshard-run the same --token");
  }
  if (s != wire::Status::ok) impl->bad_reply("hello");
  co_return std::unique_ptr<StoreClient>(new StoreClient(std::move(impl)));
}

Task<void> StoreClient::set(std::string key, std::string value) {
  auto q = request(wire::Op::set);
  q.str(impl_->options.key_prefix + key).str(value);
  auto body = co_await impl_->exchange(std::move(q), "set '" + key + "'");
  wire::Reader r(body);
  if (status_of(r) != wire::Status::ok) impl_->bad_reply("set");
}

Task<std::optional<std::string>> StoreClient::get(std::string key) {
  auto q = request(wire::Op::get);
  q.str(impl_->options.key_prefix + key);
  auto body = co_await impl_->exchange(std::move(q), "get '" + key + "'");
  wire::Reader r(body);
  auto s = status_of(r);
  if (s == wire::Status::not_found) co_return std::nullopt;
  auto v = r.str();
  if (s != wire::Status::ok || !v) impl_->bad_reply("get");
  co_return v;
}

Task<std::vector<std::optional<std::string>>> StoreClient::get_many(std::vector<std::string> keys) {
  auto q = request(wire::Op::get_many);
  q.i64(static_cast<std::int64_t>(keys.size()));
  for (const auto& k : keys) q.str(impl_->options.key_prefix + k);
  const std::string what = "get of " + std::to_string(keys.size()) + " key(s)";
  auto body = co_await impl_->exchange(std::move(q), what);
  wire::Reader r(body);
  auto s = status_of(r);
  if (s == wire::Status::bad_request) {
    throw Error(Errc::invalid_argument, "store " + what + ": " + r.str().value_or("bad request"));
  }
  if (s != wire::Status::ok) impl_->bad_reply(what);
  std::vector<std::optional<std::string>> values;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const auto present = r.i64();
    if (!present || (*present != 0 && *present != 1)) impl_->bad_reply(what);
    if (*present == 0) {
      values.emplace_back();
      continue;
    }
    auto v = r.str();
    if (!v) impl_->bad_reply(what);
    values.emplace_back(std::move(*v));
  }
  if (!r.done()) impl_->bad_reply(what);
  co_return values;
}

Task<std::vector<std::string>> StoreClient::wait(std::vector<std::string> keys,
                                                 std::optional<std::chrono::milliseconds> timeout) {
  auto limit = timeout.value_or(impl_->options.op_timeout);
  auto q = request(wire::Op::wait);
  q.i64(limit.count()).i64(static_cast<std::int64_t>(keys.size()));
  for (const auto& k : keys) q.str(impl_->options.key_prefix + k);
  std::string what = "wait for " + std::to_string(keys.size()) + " key(s)";
  // The server answers at its deadline; give the reply a little longer to arrive.
  auto body = co_await impl_->exchange(std::move(q), what, limit + std::chrono::seconds(5));
  wire::Reader r(body);
  auto s = status_of(r);
  if (s == wire::Status::timeout) {
    auto n = r.i64();
    std::string missing;
    for (std::int64_t i = 0; n && i < *n; ++i) {
      auto k = r.str();
      if (!k) break;
      missing += (i ? ", '" : "'") + *k + "'";
    }
    throw Error(Errc::timeout, "store " + what + " timed out after " + std::to_string(limit.count()) +
                                   " ms; still missing: " + missing +
                                   ". The ranks that should set them have not started or have failed",
                op_context("store wait"));
  }
  if (s != wire::Status::ok) impl_->bad_reply("wait");
  std::vector<std::string> values;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    auto v = r.str();
    if (!v) impl_->bad_reply("wait");
    values.push_back(std::move(*v));
  }
  co_return values;
}

Task<std::int64_t> StoreClient::add(std::string key, std::int64_t delta) {
  auto q = request(wire::Op::add);
  q.str(impl_->options.key_prefix + key).i64(delta);
  auto body = co_await impl_->exchange(std::move(q), "add '" + key + "'");
  wire::Reader r(body);
  auto s = status_of(r);
  if (s == wire::Status::bad_request) {
    throw Error(Errc::invalid_argument, "store add '" + key + "': " + r.str().value_or("bad request"));
  }
  auto v = r.i64();
  if (s != wire::Status::ok || !v) impl_->bad_reply("add");
  co_return *v;
}

Task<std::string> StoreClient::compare_set(std::string key, std::string expected, std::string desired) {
  auto q = request(wire::Op::compare_set);
  q.str(impl_->options.key_prefix + key).str(expected).str(desired);
  auto body = co_await impl_->exchange(std::move(q), "compare_set '" + key + "'");
  wire::Reader r(body);
  auto s = status_of(r);
  auto v = r.str();
  if (s != wire::Status::ok || !v) impl_->bad_reply("compare_set");
  co_return std::move(*v);
}

Task<bool> StoreClient::erase(std::string key) {
  auto q = request(wire::Op::del);
  q.str(impl_->options.key_prefix + key);
  auto body = co_await impl_->exchange(std::move(q), "erase '" + key + "'");
  wire::Reader r(body);
  auto s = status_of(r);
  auto v = r.i64();
  if (s != wire::Status::ok || !v) impl_->bad_reply("erase");
  co_return *v != 0;
}

}  // namespace coshard::launch
