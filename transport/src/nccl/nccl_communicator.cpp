// The NCCL backend's logic, over the NcclApi seam (nccl_api.hpp): the real library in CUDA builds,
// a fake on CPU streams in the tests. Collectives are enqueued from the caller's thread on the
// communicator's stream (after an event wait on the caller's stream), each inside
// ncclGroupStart/End. Communicators are non-blocking, so a call is followed by a bounded wait for
// ncclInProgress to clear: creation and split poll from the task (co_await, the scheduler keeps
// running); an enqueue waits on the issuing thread, with back-off, and gives up early once the
// communicator is aborted. Every call on the communicator holds comm_m_, and an abort frees the
// communicator under it exactly once, so the watchdog, the caller and the destructor never race
// on a freed communicator. A watchdog thread polls async errors and the deadline of the oldest
// operation and aborts from that one place. An operation keeps its tensors (and its premul_sum
// operator) until its event completes.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "coshard/transport/flight_recorder.hpp"
#include "coshard/transport/nccl_communicator.hpp"
#include "nccl_api.hpp"

namespace coshard::transport {
namespace detail {
namespace {

using Clock = std::chrono::steady_clock;
using Status = NcclApi::Status;

[[noreturn]] void nccl_fail(NcclApi& api, Status s, const std::string& what) {
  throw Error(s == Status::invalid_argument || s == Status::invalid_usage ? Errc::invalid_argument : Errc::device,
              what + " failed: " + api.describe(s) + "; NCCL_DEBUG=WARN tells more");
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(std::shared_ptr<NcclApi> api, Runtime& rt, launch::StoreClient* store, NcclApi::Comm comm, int rank,
                   int size, CommOptions options)
      : api_(std::move(api)), rt_(rt), store_(store), comm_(comm), rank_(rank), size_(size),
        options_(std::move(options)), stream_(rt.stream("nccl:" + options_.name)) {
    watchdog_ = std::thread([this] { watch(); });
    diagnostic_ = rt_.add_diagnostic([this] { recorder_.dump(record_owner()); });
  }

  ~NcclCommunicator() override {
    rt_.remove_diagnostic(diagnostic_);
    {
      std::lock_guard lock(m_);
      stopping_ = true;
    }
    cv_.notify_all();
    watchdog_.join();
    try {
      stream_.synchronize(options_.timeout);
    } catch (const Error&) {
      abort_now("the communicator was destroyed while operations were still running");
    }
    std::lock_guard lock(comm_m_);
    if (!comm_) return;  // aborted: the abort freed it
    for (auto& p : pending_) {
      if (p.op) retired_ops_.push_back(*p.op);
    }
    destroy_retired_ops();
    const Status finalizing = api_->finalize(comm_);
    Status state = finalizing;
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    while (state == Status::in_progress && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      api_->async_error(comm_, &state);
    }
    if (state == Status::success) {
      api_->destroy(comm_);
    } else {
      api_->abort(comm_);
    }
    comm_ = nullptr;
  }

  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return size_; }
  const std::string& name() const noexcept override { return options_.name; }
  std::string_view backend() const noexcept override { return "nccl"; }
  Stream& stream() noexcept override { return stream_; }

  const CommOptions& options() const noexcept override { return options_; }

  Task<std::unique_ptr<Communicator>> split(int color, int key, CommOptions o) override {
    NcclApi::Comm sub = nullptr;
    const std::string what = "ncclCommSplit of '" + options_.name + "'";
    {
      std::lock_guard lock(comm_m_);
      if (!comm_) throw failure_or("the communicator was aborted");
      if (splitting_) throw Error(Errc::invalid_argument, what + " while another split of it runs: await the first");
      api_->use_device(rt_.device());
      const Status s = api_->split(comm_, color, key, &sub);
      if (s != Status::success && s != Status::in_progress) nccl_fail(*api_, s, what);
      splitting_ = true;  // until the parent settles, nothing else may be issued on it
    }
    struct Settled {  // clears the flag on every way out of the wait below
      NcclCommunicator& c;
      ~Settled() {
        std::lock_guard lock(c.comm_m_);
        c.splitting_ = false;
      }
    } settled{*this};
    // Non-blocking: the new communicator is usable once its own state (and the parent's) leaves
    // in_progress. Polled from the task, so the scheduler runs on meanwhile.
    const auto deadline = Clock::now() + options_.timeout;
    for (;;) {
      Status parent = Status::success, child = Status::success;
      {
        std::lock_guard lock(comm_m_);
        if (!comm_) {
          if (sub) api_->abort(sub);
          throw failure_or("the communicator was aborted during " + what);
        }
        api_->async_error(comm_, &parent);
        if (sub) api_->async_error(sub, &child);
      }
      if (parent != Status::success && parent != Status::in_progress) {
        if (sub) api_->abort(sub);
        nccl_fail(*api_, parent, what);
      }
      if (child != Status::success && child != Status::in_progress) {
        api_->abort(sub);
        nccl_fail(*api_, child, what);
      }
      if (parent == Status::success && child == Status::success) break;
      if (Clock::now() > deadline) {
        if (sub) api_->abort(sub);
        throw Error(Errc::timeout, what + " was not done within " + std::to_string(options_.timeout.count()) +
                                       " ms: not every rank split");
      }
      co_await sleep_for(std::chrono::milliseconds(1));
    }
    if (color < 0 || sub == nullptr) co_return nullptr;
    int sub_rank = 0, sub_size = 0;
    api_->user_rank(sub, &sub_rank);
    api_->count(sub, &sub_size);
    if (o.name.empty()) o.name = options_.name + "/" + std::to_string(color);
    co_return std::make_unique<NcclCommunicator>(api_, rt_, store_, sub, sub_rank, sub_size, std::move(o));
  }

  void abort(const Error& reason) override {
    {
      std::lock_guard lock(m_);
      if (!failure_) failure_ = reason;
    }
    abort_now(reason.message());
  }

  FlightRecorder::Owner record_owner() const { return {options_.name, rank_, size_, backend(), rt_.rank()}; }
  std::string flight_record_json() const override { return recorder_.json(record_owner()); }

 protected:
  // The arguments passed Communicator's checks; what is left is NCCL's own (issue: device memory,
  // no split in progress).
  Event issue_all_gather(Tensor input, Tensor output, Stream& after, std::string label) override {
    OpInfo info = make(CollectiveOp::all_gather, input, input.numel());
    info.label = std::move(label);
    return issue(info, after, {input, output}, std::nullopt, [&](NcclApi::Comm c, NcclApi::RedOp) {
      return api_->all_gather(input.data(), output.data(), static_cast<std::size_t>(input.numel()), input.dtype(), c,
                              stream_);
    });
  }

  Event issue_reduce_scatter(Tensor input, Tensor output, Reduction reduction, Stream& after,
                             std::string label) override {
    OpInfo info = make(CollectiveOp::reduce_scatter, output, output.numel());
    info.label = std::move(label);
    info.reduce = reduction.op;
    return issue(info, after, {input, output}, reduction, [&](NcclApi::Comm c, NcclApi::RedOp op) {
      return api_->reduce_scatter(input.data(), output.data(), static_cast<std::size_t>(output.numel()),
                                  output.dtype(), op, c, stream_);
    });
  }

  Event issue_all_reduce(Tensor inout, Reduction reduction, Stream& after, std::string label) override {
    OpInfo info = make(CollectiveOp::all_reduce, inout, inout.numel());
    info.label = std::move(label);
    info.reduce = reduction.op;
    return issue(info, after, {inout}, reduction, [&](NcclApi::Comm c, NcclApi::RedOp op) {
      return api_->all_reduce(inout.data(), inout.data(), static_cast<std::size_t>(inout.numel()), inout.dtype(), op,
                              c, stream_);
    });
  }

  Event issue_broadcast(Tensor inout, int root, Stream& after, std::string label) override {
    OpInfo info = make(CollectiveOp::broadcast, inout, inout.numel());
    info.label = std::move(label);
    info.peer = root;
    return issue(info, after, {inout}, std::nullopt, [&](NcclApi::Comm c, NcclApi::RedOp) {
      return api_->broadcast(inout.data(), inout.data(), static_cast<std::size_t>(inout.numel()), inout.dtype(), root,
                             c, stream_);
    });
  }

  Event issue_barrier(Stream& after) override {
    if (!token_.defined()) token_ = Tensor::empty(rt_.allocator(), DType::f32, {1});
    OpInfo info = make(CollectiveOp::barrier, token_, 1);
    return issue(info, after, {token_}, Reduction::sum(), [&](NcclApi::Comm c, NcclApi::RedOp op) {
      return api_->all_reduce(token_.data(), token_.data(), 1, DType::f32, op, c, stream_);
    });
  }

  Event issue_send(Tensor input, int peer, Stream& after) override {
    OpInfo info = make(CollectiveOp::send, input, input.numel());
    info.peer = peer;
    return issue(info, after, {input}, std::nullopt, [&](NcclApi::Comm c, NcclApi::RedOp) {
      return api_->send(input.data(), static_cast<std::size_t>(input.numel()), input.dtype(), peer, c, stream_);
    });
  }

  Event issue_recv(Tensor output, int peer, Stream& after) override {
    OpInfo info = make(CollectiveOp::recv, output, output.numel());
    info.peer = peer;
    return issue(info, after, {output}, std::nullopt, [&](NcclApi::Comm c, NcclApi::RedOp) {
      return api_->recv(output.data(), static_cast<std::size_t>(output.numel()), output.dtype(), peer, c, stream_);
    });
  }

 private:
  struct Pending {
    OpInfo info;
    std::uint64_t record;
    Event done;
    Clock::time_point started;
    std::vector<Tensor> tensors;        // alive until `done`: the device reads and writes them until then
    std::optional<NcclApi::RedOp> op;  // a premul_sum operator, destroyed once `done` completes
  };

  OpInfo make(CollectiveOp op, const Tensor& t, std::int64_t count) { return OpInfo::of(op, seq_++, t.dtype(), count); }

  [[noreturn]] void bad(const OpInfo& info, const std::string& why) const {
    throw Error(Errc::invalid_argument,
                std::string(to_string(info.op)) + "#" + std::to_string(info.seq) + " on '" + options_.name + "': " + why,
                ErrorContext{.rank = rank_, .op = std::string(to_string(info.op)), .unit = {}});
  }

  Error failure_or(const std::string& why) {
    std::lock_guard lock(m_);
    return failure_ ? *failure_ : Error(Errc::cancelled, "communicator '" + options_.name + "': " + why);
  }

  // Under comm_m_: the operator of `r` (a builtin, or a premul_sum made for this operation).
  NcclApi::RedOp make_op(const Reduction& r, DType dtype, std::optional<NcclApi::RedOp>& made) {
    if (r.op != ReduceOp::premul_sum) {
      return api_->builtin(r.op == ReduceOp::avg ? NcclApi::Red::avg : r.op == ReduceOp::max ? NcclApi::Red::max
                                                                                             : NcclApi::Red::sum);
    }
    NcclApi::RedOp op{};
    if (const Status s = api_->premul_sum(&op, r.factor, dtype, comm_); s != Status::success) {
      nccl_fail(*api_, s, "ncclRedOpCreatePreMulSum on '" + options_.name + "'");
    }
    made = op;
    return op;
  }

  // Under comm_m_, with comm_ alive and no call in progress: the premul_sum operators of completed
  // operations (the watchdog retires them; destroying one while a call is in progress is not allowed).
  void destroy_retired_ops() {
    std::vector<NcclApi::RedOp> ops;
    {
      std::lock_guard lock(m_);
      ops.swap(retired_ops_);
    }
    for (NcclApi::RedOp op : ops) api_->op_destroy(op, comm_);
  }

  // Waits, with back-off, until the communicator has taken the last call; `lock` holds comm_m_ and
  // is let go while sleeping, so that the watchdog can poll and an abort (the watchdog's, another
  // thread's) ends the wait at once. Bounded by the operation timeout.
  void settle(std::unique_lock<std::mutex>& lock, Status issued, const std::string& what) {
    if (issued != Status::success && issued != Status::in_progress) nccl_fail(*api_, issued, what);
    const auto deadline = Clock::now() + options_.timeout;
    auto pause = std::chrono::microseconds(1);
    Status state = issued;
    while (state == Status::in_progress) {
      if (Clock::now() > deadline) {
        throw Error(Errc::timeout, what + " still in progress after " + std::to_string(options_.timeout.count()) + " ms");
      }
      lock.unlock();
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(1000));
      lock.lock();
      if (!comm_) throw failure_or("the communicator was aborted while " + what + " was being enqueued");
      if (const Status r = api_->async_error(comm_, &state); r != Status::success) nccl_fail(*api_, r, what);
    }
    if (state != Status::success) nccl_fail(*api_, state, what);
  }

  template <class Call>
  Event issue(const OpInfo& info, Stream& after, std::vector<Tensor> tensors, std::optional<Reduction> reduction,
              Call&& call) {
    {
      std::lock_guard lock(m_);
      if (failure_) throw *failure_;
    }
    {
      std::lock_guard lock(comm_m_);
      if (splitting_) bad(info, "issued while a split of this communicator is in progress: await split() first");
    }
    for (const Tensor& t : tensors) {
      if (!t.defined() || t.device() != rt_.device()) {
        bad(info, "tensors must be allocated on " + rt_.device().to_string() + " (the NCCL backend moves device memory)");
      }
    }
    const auto record = recorder_.queued(info);
    Event ready(after.device());
    ready.record(after);
    stream_.wait(ready);
    // The hook runs where UCX runs it: on the communicator's stream, right before the operation.
    if (options_.before_op) stream_.enqueue([hook = options_.before_op, info] { hook(info); });
    const std::string what = std::string(to_string(info.op)) + "#" + std::to_string(info.seq) + " on '" + options_.name + "'";
    std::optional<NcclApi::RedOp> made;
    try {
      std::unique_lock lock(comm_m_);
      if (!comm_) throw failure_or("the communicator was aborted");
      api_->use_device(rt_.device());
      destroy_retired_ops();
      const NcclApi::RedOp op = reduction ? make_op(*reduction, info.dtype, made) : NcclApi::RedOp{};
      if (const Status s = api_->group_start(); s != Status::success) nccl_fail(*api_, s, "ncclGroupStart");
      const Status called = call(comm_, op);
      const Status ended = api_->group_end();
      if (called != Status::success && called != Status::in_progress) nccl_fail(*api_, called, what);
      settle(lock, ended, what);
    } catch (const Error& e) {
      recorder_.finished(record, e.message());
      abort(e);  // frees a premul_sum operator with the communicator
      throw;
    }
    recorder_.started(record);
    Event done(rt_.device());
    done.record(stream_);
    for (const Tensor& t : tensors) t.record_use(done);  // their blocks are reused only after it
    {
      std::lock_guard lock(m_);
      pending_.push_back({info, record, done, Clock::now(), std::move(tensors), made});
    }
    cv_.notify_all();
    return done;
  }

  // Frees the communicator by ncclCommAbort, once: every later call sees comm_ null.
  void abort_now(const std::string& why) {
    if (aborted_.exchange(true)) return;
    recorder_.dump(record_owner());
    rt_.write_diagnostics();  // the rank's other communicators too
    rt_.log(LogLevel::error, "aborting NCCL communicator '" + options_.name + "' (rank " + std::to_string(rank_) +
                                 "): " + why);
    std::lock_guard lock(comm_m_);
    if (comm_) api_->abort(comm_);
    comm_ = nullptr;
  }

  // The watchdog: asynchronous NCCL errors and the deadline of the oldest operation.
  void watch() {
    std::unique_lock lock(m_);
    while (!stopping_) {
      cv_.wait_for(lock, std::chrono::milliseconds(100));
      std::vector<Pending> finished;  // its tensors are let go below, outside the locks
      while (!pending_.empty() && pending_.front().done.query()) {
        recorder_.finished(pending_.front().record);
        if (pending_.front().op) retired_ops_.push_back(*pending_.front().op);
        finished.push_back(std::move(pending_.front()));
        pending_.pop_front();
      }
      if (aborted_.load()) continue;
      const bool late = !pending_.empty() && Clock::now() - pending_.front().started > options_.timeout;
      const std::optional<OpInfo> oldest = pending_.empty() ? std::nullopt : std::optional(pending_.front().info);
      lock.unlock();  // NCCL calls hold comm_m_ only: never both locks in the other order
      Status state = Status::success;
      {
        std::lock_guard comm_lock(comm_m_);
        if (comm_) api_->async_error(comm_, &state);
      }
      finished.clear();
      std::optional<Error> reason;
      if (state != Status::success && state != Status::in_progress) {
        reason = Error(Errc::peer_lost, "NCCL reported " + api_->describe(state) + " on '" + options_.name +
                                            "' (a peer failed or the network broke)");
      } else if (late) {
        reason = Error(Errc::timeout, std::string(to_string(oldest->op)) + "#" + std::to_string(oldest->seq) + " (" +
                                          std::to_string(oldest->bytes()) + " bytes) on '" + options_.name +
                                          "' did not complete within " + std::to_string(options_.timeout.count()) +
                                          " ms; some rank did not issue it (compare the flight records)");
      }
      if (reason) abort(*reason);
      lock.lock();
    }
  }

  std::shared_ptr<NcclApi> api_;
  Runtime& rt_;
  std::uint64_t diagnostic_ = 0;  // writes the flight record on request (SIGUSR1)
  launch::StoreClient* store_;
  std::mutex comm_m_;      // held around every call on comm_; an abort nulls comm_ under it
  NcclApi::Comm comm_;     // null once aborted or destroyed
  bool splitting_ = false;  // under comm_m_: a split's parent is still in progress
  int rank_, size_;
  CommOptions options_;
  Stream& stream_;
  Tensor token_;
  FlightRecorder recorder_;
  std::atomic<std::uint64_t> seq_{0};
  std::atomic<bool> aborted_{false};
  std::mutex m_;  // pending_, retired_ops_, failure_, stopping_; never taken before comm_m_
  std::condition_variable cv_;
  bool stopping_ = false;
  std::deque<Pending> pending_;
  std::vector<NcclApi::RedOp> retired_ops_;  // of completed operations, for destroy_retired_ops()
  std::optional<Error> failure_;
  std::thread watchdog_;
};

}  // namespace

Task<std::unique_ptr<Communicator>> create_nccl_communicator(std::shared_ptr<NcclApi> api, Runtime& runtime,
                                                             launch::StoreClient* store, int rank, int size,
                                                             CommOptions options) {
  if (!store && size > 1) throw Error(Errc::bad_config, "the NCCL backend needs the rendezvous store for its unique id");
  std::string name = options.name;
  const NcclApi::Id id = co_await unique_id_of(*api, store, rank, size, std::move(name), options.timeout);
  api->use_device(runtime.device());
  NcclApi::Comm comm = nullptr;
  NcclApi::Status state = api->init_rank(&comm, size, id, rank);
  if (state != NcclApi::Status::success && state != NcclApi::Status::in_progress) {
    nccl_fail(*api, state, "ncclCommInitRankConfig");
  }
  // Poll without blocking the scheduler: the other ranks may still be on their way.
  const auto deadline = Clock::now() + options.timeout;
  while (state == NcclApi::Status::in_progress) {
    if (Clock::now() > deadline) {
      api->abort(comm);
      throw Error(Errc::timeout, "NCCL communicator '" + options.name + "' was not ready within " +
                                     std::to_string(options.timeout.count()) + " ms: not every rank joined");
    }
    co_await sleep_for(std::chrono::milliseconds(1));
    api->async_error(comm, &state);
  }
  if (state != NcclApi::Status::success) {
    api->abort(comm);
    nccl_fail(*api, state, "ncclCommInitRankConfig");
  }
  co_return std::make_unique<NcclCommunicator>(std::move(api), runtime, store, comm, rank, size, std::move(options));
}

}  // namespace detail

Task<std::unique_ptr<Communicator>> create_nccl_communicator(Runtime& runtime, launch::StoreClient* store, int rank, int size,
                                                             CommOptions options) {
  if (!nccl_available()) {
    throw Error(Errc::bad_config, "communicator '" + options.name +
                                      "': this coshard was built without CUDA/NCCL (COSHARD_CUDA=OFF, or nvcc/NCCL not "
                                      "found); rebuild with COSHARD_CUDA=ON, or use the UCX backend for host memory");
  }
  if (runtime.device().kind != DeviceKind::cuda) {
    throw Error(Errc::bad_config, "communicator '" + options.name + "': the NCCL backend needs a CUDA runtime; this one is on " +
                                      runtime.device().to_string());
  }
  co_return co_await detail::create_nccl_communicator(detail::real_nccl_api(), runtime, store, rank, size,
                                                      std::move(options));
}

}  // namespace coshard::transport
