#pragma once
// UCX resources of one communicator and the tagged messages its algorithms post. A Wire is used
// by one thread at a time: created on the scheduler, then driven only by the communicator's
// stream. Every wait has a deadline, checks that the peers it waits on are alive, and stops when
// the communicator is aborted.
#include <ucp/api/ucp.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "coshard/runtime/error.hpp"
#include "coshard/runtime/log.hpp"

namespace coshard::transport::detail {

// One ucp_context per process group, shared by its communicators and their splits.
class UcxContext {
 public:
  // eager: no rendezvous protocol (UCX_RNDV_THRESH=inf unless the user set it). Measured over TCP
  // between hosts through a shaped link (docs/benchmarks.md, "Across hosts"): with two or more
  // flows per link, UCX 1.13's rendezvous stalled one operation in ten for about 55 ms.
  enum class Protocols { automatic, eager };
  // `net_devices`: UCX_NET_DEVICES unless the environment sets it (UcxOptions::net_devices).
  explicit UcxContext(Protocols protocols = Protocols::automatic, std::string net_devices = {});
  ~UcxContext();
  UcxContext(const UcxContext&) = delete;
  UcxContext& operator=(const UcxContext&) = delete;
  ucp_context_h get() const noexcept { return ctx_; }
  // A context of this process group with Protocols::eager, made on first use (the cross-host
  // wires of hierarchy.hpp). On the scheduler, as every connect.
  std::shared_ptr<UcxContext> eager();

 private:
  ucp_context_h ctx_ = nullptr;
  std::string net_devices_;
  std::shared_ptr<UcxContext> eager_;
};

[[noreturn]] void throw_ucx(ucs_status_t status, const std::string& what);

// Who a peer is: enough to tell whether its process is still alive when it is on this host.
struct PeerIdentity {
  std::string host;
  int pid = 0;
  int job_rank = -1;    // its rank in the job (metrics name peers by it)
  std::string address;  // packed ucp worker address
  // The smallest message this rank proposes for the two-level schedules across hosts (hierarchy.hpp);
  // -1: it wants the flat ring. The ranks agree on the largest (connect.cpp).
  std::int64_t hierarchy_min_bytes = -1;
  // The chunk it proposes for overlapping their phases; 0: no overlap. The ranks agree on the
  // largest, or 0 if any proposes it.
  std::int64_t hierarchy_chunk_bytes = 0;
  // The most it proposes a rank sends in one mesh operation (mesh.hpp); the ranks agree on the
  // smallest.
  std::int64_t mesh_max_bytes = 0;
};

// What the current operation is, for the errors a wait raises.
struct WaitContext {
  std::string op;  // "all_gather#12 (f32, 1000 elements per rank)"
  std::chrono::steady_clock::time_point deadline;
  std::chrono::milliseconds timeout{0};
};

class Wire {
 public:
  struct Options {
    std::chrono::milliseconds liveness_interval{250};
    // Errors name peers by their job rank: the wire's own ranks mean nothing to the user (the
    // per-host and cross-host wires of hierarchy.hpp).
    bool name_by_job_rank = false;
    LogSink log = {};  // the runtime's (Runtime::log_sink): what the wire says of its own accord
  };

  Wire(std::shared_ptr<UcxContext> ctx, int rank, int size, Options options);
  ~Wire();  // flushes and closes the endpoints (bounded), then destroys the worker
  Wire(const Wire&) = delete;
  Wire& operator=(const Wire&) = delete;
  const LogSink& log_sink() const noexcept { return options_.log; }  // Options::log

  // This rank's identity, to publish through the store.
  PeerIdentity self() const;
  // Creates the endpoints to every peer (identities indexed by rank). PEER mode reports dead
  // peers but, in UCX 1.13, limits local peers to TCP.
  void connect(std::vector<PeerIdentity> peers, bool peer_error_mode);
  bool peer_error_mode() const noexcept { return peer_error_mode_; }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  const PeerIdentity& peer(int r) const { return peers_[static_cast<std::size_t>(r)]; }

  using RequestId = std::size_t;
  RequestId send(int peer, const void* data, std::size_t bytes, std::uint64_t tag);
  // `times_peer`: this message is the peer's first of the operation (its header), so its arrival
  // says when the peer entered it (peer_waits()).
  RequestId recv(int peer, void* data, std::size_t bytes, std::uint64_t tag, bool times_peer = false);
  // A receive of any message up to `capacity` bytes (received() says how many): the caller checks
  // what arrived. A longer one still fails as too long.
  RequestId recv_up_to(int peer, void* data, std::size_t capacity, std::uint64_t tag, bool times_peer);
  // The length of a completed receive.
  std::size_t received(RequestId id) const noexcept { return requests_[id].info.length; }
  // True once complete; throws when the request failed (peer lost, size mismatch, aborted).
  bool done(RequestId id);

  // Wires whose workers this one's waits also progress (not owned). The wires of one communicator
  // (hierarchy.hpp) must: a peer's protocol messages for a finished transfer (a rendezvous
  // acknowledgement) complete only when the worker they arrive on is progressed, and a rank that
  // waits on one wire while a peer waits for such a message on another stalls both.
  void progress_with(std::vector<Wire*> siblings) { siblings_ = std::move(siblings); }
  const std::vector<Wire*>& siblings() const noexcept { return siblings_; }
  // The cross-host wire of this per-host wire's two-level schedule (hierarchy.hpp), not owned: a
  // timeout here also names its silent peers (silent_for).
  void name_on_timeout(const Wire* across) noexcept { across_ = across; }
  // The peers on other hosts that this wire has heard from, but not for at least `quiet`, named
  // with how long ("rank 3 (pid 9 on node2) for 6.1 s"; empty if none), but for those in `named`.
  // A timeout names them beside the peers it waited for: those, on this rank's host, may be
  // waiting on them (a cut link between hosts). Safe from another thread than the one that waits
  // on this wire.
  std::string silent_for(std::chrono::milliseconds quiet, const std::map<int, int>& named = {}) const;

  // Drives progress until `ready()` returns true. Throws Errc::timeout at the deadline naming the
  // peers still owing data, Errc::peer_lost when a peer died, the abort reason when aborted.
  void wait_until(const std::function<bool()>& ready);
  void wait_all();  // every request posted since begin()

  // Starts an operation: forgets the requests of the previous one.
  void begin(WaitContext wait);
  // Per peer, how long the current (or last) operation waited from begin() until that peer's header
  // (a recv with times_peer) arrived: how much later the peer entered the operation. Only the
  // header counts: a later message may wait on a third rank (the direct path's ready messages
  // follow the ring's header exchange). 0 for peers not heard from.
  const std::vector<double>& peer_waits() const noexcept { return waited_; }
  // After a failure: cancels what is still posted and waits (bounded) until UCX lets go of the
  // buffers, so that the caller may free them.
  void cancel_all() noexcept;

  // Thread-safe: the next or current wait throws `reason`.
  void abort(const Error& reason);
  std::optional<Error> aborted() const;

 private:
  struct Request {
    void* handle = nullptr;
    bool complete = false;
    bool is_recv = false;
    bool times_peer = false;
    bool up_to = false;  // any length up to `expected`
    int peer = -1;
    std::size_t expected = 0;
    ucp_tag_recv_info_t info{};
  };
  static void on_peer_error(void* arg, ucp_ep_h ep, ucs_status_t status);
  RequestId post_recv(int peer, void* data, std::size_t bytes, std::uint64_t tag, bool times_peer, bool up_to);
  void finish(Request& r, ucs_status_t status);
  void check_liveness();
  [[noreturn]] void throw_timeout();
  [[noreturn]] void throw_peer_lost(int peer, const std::string& why);
  std::string peer_name(int peer) const;

  std::shared_ptr<UcxContext> ctx_;
  int rank_;
  int size_;
  Options options_;
  bool peer_error_mode_ = false;
  std::string host_;
  unsigned spins_ = 8;  // idle progress calls before a wait yields: see kSpins (wire.cpp)
  ucp_worker_h worker_ = nullptr;
  std::vector<PeerIdentity> peers_;
  std::vector<ucp_ep_h> eps_;
  std::vector<Wire*> siblings_;
  const Wire* across_ = nullptr;
  // Per peer: when a receive from it last completed (steady clock, ns; 0: never). Atomic: the per-host
  // wire's thread reads the cross-host wire's while that one's thread writes it (stage_pipeline.hpp).
  std::unique_ptr<std::atomic<std::int64_t>[]> last_heard_;
  struct ErrArg {
    Wire* wire;
    int peer;
  };
  std::vector<std::unique_ptr<ErrArg>> err_args_;
  std::vector<ucs_status_t> peer_status_;  // set by UCX's error callback (PEER mode)
  std::vector<Request> requests_;
  WaitContext wait_;
  std::chrono::steady_clock::time_point begun_;
  std::vector<bool> heard_;     // per peer: a message of the current operation arrived
  std::vector<double> waited_;  // see peer_waits()
  std::chrono::steady_clock::time_point next_liveness_;
  std::atomic<bool> abort_flag_{false};
  mutable std::mutex abort_m_;
  std::optional<Error> abort_reason_;
};

}  // namespace coshard::transport::detail
