#pragma once
// The rendezvous store: a small TCP key-value service that ranks use to find each other. One
// process serves it (rank 0 or the launcher); every rank connects as a client. A shared token is
// required to join; a client without it, or one speaking garbage, is dropped and the server keeps
// serving. Every client call has a deadline.
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "coshard/runtime/log.hpp"
#include "coshard/runtime/scheduler.hpp"
#include "coshard/runtime/task.hpp"

namespace coshard::launch {

/// Bounds that the store's server and clients both enforce.
struct StoreLimits {
  std::size_t max_message_bytes = 16u << 20;  ///< a frame above this is refused
  /// The server answers a wait at this deadline at the latest, whatever the client asked, so that
  /// a session never outlives its usefulness by hours.
  std::chrono::milliseconds max_wait{std::chrono::hours(2)};
};

/// Serves the store on a scheduler's thread (on rank 0, or in the launcher); stops when destroyed.
class StoreServer {
 public:
  /// Where the server listens and whom it admits.
  struct Options {
    std::string bind_address = "127.0.0.1";  ///< loopback for one host; 0.0.0.0 or an interface across hosts
    std::uint16_t port = 0;                  ///< 0: pick a free port
    std::string token;                       ///< clients must present it (empty: any client)
    StoreLimits limits;                      ///< a client sending a larger frame is dropped
    std::chrono::milliseconds handshake_timeout{10000};  ///< a silent connection is dropped after this
    /// Connections awaiting their hello at once, beyond which one that has waited over a second
    /// is dropped for each new one: idle connections cannot crowd out the clients that speak.
    std::size_t max_handshakes = 256;
    /// File descriptors the store leaves free for the rest of its process (the launcher's pipes for
    /// a restart's ranks): at that point a new connection is closed at once, after the oldest one
    /// that waits for its hello is dropped if it has waited over a second. 0: a quarter of
    /// RLIMIT_NOFILE's soft limit, at most 64.
    std::size_t reserved_descriptors = 0;
    /// Where the server says that it refuses connections (at most once a minute); empty: stderr.
    LogSink log = {};
  };
  /// The longest token a client may present: the hello frame is bounded by it, so that a
  /// connection that has not authenticated cannot make the server hold more than a few KiB.
  static constexpr std::size_t kMaxTokenBytes = 1024;

  /// The address a store binds so that clients told MASTER_ADDR=`master_addr` reach it: a numeric
  /// address itself, "localhost" loopback, and any other host name (node1 from a Slurm step)
  /// every address, since a name cannot be bound.
  static std::string bind_address_for(const std::string& master_addr);

  /// Binds and listens now (a port in use is an Error naming it), then serves on `sched`.
  StoreServer(Scheduler& sched, Options options);
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;
  ~StoreServer();  ///< stop()

  /// The port it listens on: the one picked when Options::port was 0.
  std::uint16_t port() const noexcept;
  /// Closes the listener and every connection, and waits (bounded) for the sessions to end.
  /// From a thread other than the scheduler's.
  void stop();

  /// The server's counters, for tests and diagnostics.
  struct Stats {
    std::size_t connections = 0;  ///< sessions now
    std::size_t rejected = 0;     ///< dropped for a bad token, garbage or a bound
    std::size_t evicted = 0;      ///< dropped while awaiting their hello, to make room (max_handshakes)
    std::size_t refused = 0;      ///< closed on accept: the descriptors left were the reserve
  };
  /// The counters now.
  Stats stats() const;

  struct State;

 private:
  std::shared_ptr<State> state_;
};

/// One rank's connection to the store. Every call has a deadline; the errors name the store's address.
class StoreClient {
 public:
  /// Where the store is, the token to present, and how long to wait.
  struct Options {
    std::string host = "127.0.0.1";  ///< the store's address (MASTER_ADDR)
    std::uint16_t port = 0;          ///< the store's port (MASTER_PORT)
    std::string token;               ///< the server's token, if it has one (COSHARD_TOKEN)
    std::chrono::milliseconds connect_timeout{30000};  ///< retries with back-off until then
    /// A host name that does not resolve (no such name) is retried this long at most, within
    /// connect_timeout: a name not published yet, not a typo for the whole wait.
    std::chrono::milliseconds resolve_timeout{60000};
    std::chrono::milliseconds op_timeout{300000};      ///< any one call
    StoreLimits limits;                                ///< larger frames are refused, both ways
    /// Put in front of every key this client names, so that clients of one attempt of a job never
    /// see the keys of another on a store that outlives attempts (coshard-run --max-restarts).
    std::string key_prefix;
    /// Who serves the store ("rank 0", "the coshard-run of node 0"), for the errors of a
    /// connection that breaks: then that process has most likely exited, and its own output says
    /// why. Empty in the process that serves it: no such hint.
    std::string served_by = "rank 0 or coshard-run";
  };

  /// The op of connect()'s Error(bad_config) when the store's host name did not resolve (no such
  /// name) within resolve_timeout, or by connect_timeout: a caller that connects in slices of a
  /// longer wait (coshard-run) tells it from a timeout by this.
  static constexpr std::string_view kResolveOp = "store resolve";

  /// Connects (retrying while the server is not up yet) and presents the token.
  static Task<std::unique_ptr<StoreClient>> connect(Options options);
  ~StoreClient();
  StoreClient(const StoreClient&) = delete;
  StoreClient& operator=(const StoreClient&) = delete;

  /// Sets `key` to `value`, replacing any earlier value, and wakes the ranks waiting for it.
  Task<void> set(std::string key, std::string value);
  /// The value at `key`, or nothing when it is missing; does not wait for it (see wait()).
  Task<std::optional<std::string>> get(std::string key);
  /// Each key's value (nothing where it is missing), in order, in one round trip. Throws
  /// Errc::invalid_argument when the request would pass this client's limits.max_message_bytes,
  /// or the values the server's (ask for fewer keys).
  Task<std::vector<std::optional<std::string>>> get_many(std::vector<std::string> keys);
  /// Waits until every key exists and returns their values in order; Errc::timeout names the
  /// missing keys when `timeout` (nothing: op_timeout) passes first.
  Task<std::vector<std::string>> wait(std::vector<std::string> keys, std::optional<std::chrono::milliseconds> timeout);
  /// wait() with the client's op_timeout.
  /// No default arguments on coroutines: GCC 12 destroys such temporaries twice inside co_await.
  Task<std::vector<std::string>> wait(std::vector<std::string> keys) { return wait(std::move(keys), std::nullopt); }
  /// Adds `delta` to the integer at `key` (missing: 0) and returns the new value.
  Task<std::int64_t> add(std::string key, std::int64_t delta);
  /// Sets `key` to `desired` if its value is `expected` (empty `expected`: if it is missing).
  /// Returns the value after the call.
  Task<std::string> compare_set(std::string key, std::string expected, std::string desired);
  /// Returns whether the key existed.
  Task<bool> erase(std::string key);

  struct Impl;

 private:
  explicit StoreClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace coshard::launch
