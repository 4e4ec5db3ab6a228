// The NCCL backend. Collectives are enqueued from the caller's thread on the communicator's CUDA
// stream (after an event wait on the caller's stream); NCCL runs them on the device. Communicators
// are non-blocking (config.blocking = 0), so every NCCL call is followed by a bounded wait for
// ncclInProgress to clear. A watchdog thread per communicator polls ncclCommGetAsyncError and the
// deadline of the oldest unfinished operation and aborts the communicator from that one place.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>

#include "coshard/kernels/cast.hpp"
#include "coshard/transport/flight_recorder.hpp"
#include "coshard/transport/nccl_communicator.hpp"

namespace coshard::transport {
namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void nccl_fail(ncclResult_t r, const std::string& what) {
  throw Error(r == ncclInvalidArgument || r == ncclInvalidUsage ? Errc::invalid_argument : Errc::device,
              what + " failed: " + ncclGetErrorString(r) + " (" + ncclGetLastError(nullptr) +
                  "); NCCL_DEBUG=WARN tells more");
}

void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(Errc::device, std::string(what) + " failed: " + cudaGetErrorString(e));
}

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32: return ncclFloat32;
    case DType::bf16: return ncclBfloat16;
    case DType::f16: return ncclFloat16;
    case DType::i32: return ncclInt32;
    case DType::i64: return ncclInt64;
  }
  return ncclFloat32;
}

// Waits (blocking the caller, bounded) until a non-blocking communicator has taken the last call.
void settle(ncclComm_t comm, ncclResult_t issued, const std::string& what, std::chrono::milliseconds limit) {
  if (issued != ncclSuccess && issued != ncclInProgress) nccl_fail(issued, what);
  auto deadline = Clock::now() + limit;
  ncclResult_t state = issued;
  while (state == ncclInProgress) {
    if (Clock::now() > deadline) {
      throw Error(Errc::timeout, what + " still in progress after " + std::to_string(limit.count()) + " ms");
    }
    std::this_thread::yield();
    if (auto r = ncclCommGetAsyncError(comm, &state); r != ncclSuccess) nccl_fail(r, what);
  }
  if (state != ncclSuccess) nccl_fail(state, what);
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(Runtime& rt, StoreClient* store, ncclComm_t comm, int rank, int size, CommOptions options)
      : rt_(rt), store_(store), comm_(comm), rank_(rank), size_(size), options_(std::move(options)),
        stream_(rt.stream("nccl:" + options_.name)) {
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
    if (aborted_.load()) {
      ncclCommAbort(comm_);
    } else {
      ncclCommFinalize(comm_);
      ncclResult_t state = ncclInProgress;
      auto deadline = Clock::now() + std::chrono::seconds(10);
      while (state == ncclInProgress && Clock::now() < deadline) ncclCommGetAsyncError(comm_, &state);
      if (state == ncclSuccess) {
        ncclCommDestroy(comm_);
      } else {
        ncclCommAbort(comm_);
      }
    }
  }

  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return size_; }
  const std::string& name() const noexcept override { return options_.name; }
  std::string_view backend() const noexcept override { return "nccl"; }
  Stream& stream() noexcept override { return stream_; }

  Event all_gather(Tensor input, Tensor output, Stream& after, std::string label) override {
    OpInfo info = make(CollectiveOp::all_gather, input, input.numel());
    info.label = std::move(label);
    if (output.numel() != input.numel() * size_ || output.dtype() != input.dtype()) {
      bad(info, "output must hold size() x input elements of the input's dtype");
    }
    return issue(info, after, {&input, &output}, [&](cudaStream_t s) {
      return ncclAllGather(input.data(), output.data(), static_cast<std::size_t>(input.numel()),
                           nccl_type(input.dtype()), comm_, s);
    });
  }

  Event reduce_scatter(Tensor input, Tensor output, Reduction reduction, Stream& after, std::string label) override {
    OpInfo info = make(CollectiveOp::reduce_scatter, output, output.numel());
    info.label = std::move(label);
    info.reduce = reduction.op;
    if (input.numel() != output.numel() * size_ || output.dtype() != input.dtype()) {
      bad(info, "input must hold size() x output elements of the output's dtype");
    }
    return issue(info, after, {&input, &output}, [&](cudaStream_t s) {
      return with_op(reduction, output.dtype(), [&](ncclRedOp_t op) {
        return ncclReduceScatter(input.data(), output.data(), static_cast<std::size_t>(output.numel()),
                                 nccl_type(output.dtype()), op, comm_, s);
      });
    });
  }

  Event all_reduce(Tensor inout, Reduction reduction, Stream& after, std::string label) override {
    OpInfo info = make(CollectiveOp::all_reduce, inout, inout.numel());
    info.label = std::move(label);
    info.reduce = reduction.op;
    return issue(info, after, {&inout}, [&](cudaStream_t s) {
      return with_op(reduction, inout.dtype(), [&](ncclRedOp_t op) {
        return ncclAllReduce(inout.data(), inout.data(), static_cast<std::size_t>(inout.numel()),
                             nccl_type(inout.dtype()), op, comm_, s);
      });
    });
  }

  Event broadcast(Tensor inout, int root, Stream& after, std::string label) override {
    OpInfo info = make(CollectiveOp::broadcast, inout, inout.numel());
    info.label = std::move(label);
    info.peer = root;
    if (root < 0 || root >= size_) bad(info, "root " + std::to_string(root) + " is not a rank of this communicator");
    return issue(info, after, {&inout}, [&](cudaStream_t s) {
      return ncclBroadcast(inout.data(), inout.data(), static_cast<std::size_t>(inout.numel()),
                           nccl_type(inout.dtype()), root, comm_, s);
    });
  }

  Event barrier(Stream& after) override {
    if (!token_.defined()) token_ = Tensor::empty(rt_.allocator(), DType::f32, {1});
    OpInfo info = make(CollectiveOp::barrier, token_, 1);
    return issue(info, after, {&token_}, [&](cudaStream_t s) {
      return ncclAllReduce(token_.data(), token_.data(), 1, ncclFloat32, ncclSum, comm_, s);
    });
  }

  Event send(Tensor input, int peer, Stream& after) override {
    OpInfo info = make(CollectiveOp::send, input, input.numel());
    info.peer = peer;
    if (peer < 0 || peer >= size_ || peer == rank_) bad(info, "peer must be another rank of this communicator");
    return issue(info, after, {&input}, [&](cudaStream_t s) {
      return ncclSend(input.data(), static_cast<std::size_t>(input.numel()), nccl_type(input.dtype()), peer, comm_, s);
    });
  }

  Event recv(Tensor output, int peer, Stream& after) override {
    OpInfo info = make(CollectiveOp::recv, output, output.numel());
    info.peer = peer;
    if (peer < 0 || peer >= size_ || peer == rank_) bad(info, "peer must be another rank of this communicator");
    return issue(info, after, {&output}, [&](cudaStream_t s) {
      return ncclRecv(output.data(), static_cast<std::size_t>(output.numel()), nccl_type(output.dtype()), peer,
                      comm_, s);
    });
  }

  const CommOptions& options() const noexcept override { return options_; }

  Task<std::unique_ptr<Communicator>> split(int color, int key, CommOptions o) override {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t sub = nullptr;
    cuda_ok(cudaSetDevice(rt_.device().index), "cudaSetDevice");
    settle(comm_, ncclCommSplit(comm_, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &sub, &config),
           "ncclCommSplit of '" + options_.name + "'", options_.timeout);
    if (color < 0 || sub == nullptr) co_return nullptr;
    int sub_rank = 0, sub_size = 0;
    ncclCommUserRank(sub, &sub_rank);
    ncclCommCount(sub, &sub_size);
    if (o.name.empty()) o.name = options_.name + "/" + std::to_string(color);
    co_return std::make_unique<NcclCommunicator>(rt_, store_, sub, sub_rank, sub_size, std::move(o));
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

 private:
  struct Pending {
    OpInfo info;
    std::uint64_t record;
    Event done;
    Clock::time_point started;
  };

  OpInfo make(CollectiveOp op, const Tensor& t, std::int64_t count) { return OpInfo::of(op, seq_++, t.dtype(), count); }

  [[noreturn]] void bad(const OpInfo& info, const std::string& why) const {
    throw Error(Errc::invalid_argument,
                std::string(to_string(info.op)) + "#" + std::to_string(info.seq) + " on '" + options_.name + "': " + why,
                ErrorContext{.rank = rank_, .op = std::string(to_string(info.op)), .unit = {}});
  }

  template <class Issue>
  ncclResult_t with_op(Reduction r, DType dtype, Issue&& call) {
    if (r.op == ReduceOp::premul_sum) {
      ncclRedOp_t op;
      // A host scalar of the reduction's own type.
      float f = static_cast<float>(r.factor);
      std::uint16_t h = dtype == DType::bf16 ? kernels::f32_to_bf16(f) : kernels::f32_to_f16(f);
      void* scalar = dtype == DType::f32 ? static_cast<void*>(&f) : static_cast<void*>(&h);
      if (auto e = ncclRedOpCreatePreMulSum(&op, scalar, nccl_type(dtype), ncclScalarHostImmediate, comm_);
          e != ncclSuccess) {
        return e;
      }
      auto res = call(op);
      ncclRedOpDestroy(op, comm_);
      return res;
    }
    ncclRedOp_t op = r.op == ReduceOp::avg ? ncclAvg : r.op == ReduceOp::max ? ncclMax : ncclSum;
    return call(op);
  }

  template <class Call>
  Event issue(const OpInfo& info, Stream& after, std::initializer_list<const Tensor*> tensors, Call&& call) {
    {
      std::lock_guard lock(m_);
      if (failure_) throw *failure_;
    }
    if (info.op != CollectiveOp::barrier && detail_unreducible(info)) {
      bad(info, "reductions take f32, bf16 or f16");
    }
    for (const Tensor* t : tensors) {
      if (!t->defined() || t->device() != rt_.device()) {
        bad(info, "tensors must be allocated on " + rt_.device().to_string() + " (the NCCL backend moves device memory)");
      }
    }
    if (options_.before_op) options_.before_op(info);
    const auto record = recorder_.queued(info);
    Event ready(after.device());
    ready.record(after);
    stream_.wait(ready);
    cuda_ok(cudaSetDevice(rt_.device().index), "cudaSetDevice");
    const std::string what = std::string(to_string(info.op)) + "#" + std::to_string(info.seq) + " on '" + options_.name + "'";
    try {
      settle(comm_, call(static_cast<cudaStream_t>(stream_.impl().native())), what, options_.timeout);
    } catch (const Error& e) {
      recorder_.finished(record, e.message());
      abort(e);
      throw;
    }
    recorder_.started(record);
    Event done(rt_.device());
    done.record(stream_);
    {
      std::lock_guard lock(m_);
      pending_.push_back({info, record, done, Clock::now()});
    }
    cv_.notify_all();
    return done;
  }

  static bool detail_unreducible(const OpInfo& info) {
    bool reduces = info.op == CollectiveOp::reduce_scatter || info.op == CollectiveOp::all_reduce;
    return reduces && info.dtype != DType::f32 && info.dtype != DType::bf16 && info.dtype != DType::f16;
  }

  void abort_now(const std::string& why) {
    if (aborted_.exchange(true)) return;
    recorder_.dump(record_owner());
    rt_.write_diagnostics();  // the rank's other communicators too
    std::fprintf(stderr, "coshard: aborting NCCL communicator '%s' (rank %d): %s\n", options_.name.c_str(), rank_,
                 why.c_str());
    ncclCommAbort(comm_);
  }

  // The watchdog: asynchronous NCCL errors and the deadline of the oldest operation.
  void watch() {
    std::unique_lock lock(m_);
    while (!stopping_) {
      cv_.wait_for(lock, std::chrono::milliseconds(100));
      while (!pending_.empty() && pending_.front().done.query()) {
        recorder_.finished(pending_.front().record);
        pending_.pop_front();
      }
      if (aborted_.load()) continue;
      ncclResult_t state = ncclSuccess;
      ncclCommGetAsyncError(comm_, &state);
      std::optional<Error> reason;
      if (state != ncclSuccess && state != ncclInProgress) {
        reason = Error(Errc::peer_lost, "NCCL reported " + std::string(ncclGetErrorString(state)) + " on '" +
                                            options_.name + "' (a peer failed or the network broke)");
      } else if (!pending_.empty() && Clock::now() - pending_.front().started > options_.timeout) {
        const auto& p = pending_.front().info;
        reason = Error(Errc::timeout, std::string(to_string(p.op)) + "#" + std::to_string(p.seq) + " (" +
                                          std::to_string(p.bytes()) + " bytes) on '" + options_.name +
                                          "' did not complete within " + std::to_string(options_.timeout.count()) +
                                          " ms; some rank did not issue it (compare the flight records)");
      }
      if (reason) {
        if (!failure_) failure_ = *reason;
        lock.unlock();
        abort_now(reason->message());
        lock.lock();
      }
    }
  }

  Runtime& rt_;
  std::uint64_t diagnostic_ = 0;  // writes the flight record on request (SIGUSR1)
  StoreClient* store_;
  ncclComm_t comm_;
  int rank_, size_;
  CommOptions options_;
  Stream& stream_;
  Tensor token_;
  FlightRecorder recorder_;
  std::atomic<std::uint64_t> seq_{0};
  std::atomic<bool> aborted_{false};
  std::mutex m_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::deque<Pending> pending_;
  std::optional<Error> failure_;
  std::thread watchdog_;
};

}  // namespace

bool nccl_available() noexcept { return true; }

Task<std::unique_ptr<Communicator>> create_nccl_communicator(Runtime& runtime, StoreClient* store, int rank, int size,
                                                             CommOptions options) {
  if (runtime.device().kind != DeviceKind::cuda) {
    throw Error(Errc::bad_config, "communicator '" + options.name + "': the NCCL backend needs a CUDA runtime; this one is on " +
                                      runtime.device().to_string());
  }
  if (!store && size > 1) throw Error(Errc::bad_config, "the NCCL backend needs the rendezvous store for its unique id");
  ncclUniqueId id{};
  const std::string key = "coshard/nccl/" + options.name + "/id";
  if (rank == 0) {
    if (auto r = ncclGetUniqueId(&id); r != ncclSuccess) nccl_fail(r, "ncclGetUniqueId");
    if (store) co_await store->set(key, std::string(id.internal, sizeof id.internal));
  } else {
    std::vector<std::string> keys{key};
    auto values = co_await store->wait(std::move(keys), options.timeout);
    if (values[0].size() != sizeof id.internal) throw Error(Errc::io, "store key '" + key + "' is not an NCCL unique id");
    std::memcpy(id.internal, values[0].data(), sizeof id.internal);
  }
  cuda_ok(cudaSetDevice(runtime.device().index), "cudaSetDevice");
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  ncclResult_t state = ncclCommInitRankConfig(&comm, size, id, rank, &config);
  if (state != ncclSuccess && state != ncclInProgress) nccl_fail(state, "ncclCommInitRankConfig");
  // Poll without blocking the scheduler: the other ranks may still be on their way.
  auto deadline = Clock::now() + options.timeout;
  while (state == ncclInProgress) {
    if (Clock::now() > deadline) {
      ncclCommAbort(comm);
      throw Error(Errc::timeout, "NCCL communicator '" + options.name + "' was not ready within " +
                                     std::to_string(options.timeout.count()) + " ms: not every rank joined");
    }
    co_await sleep_for(std::chrono::milliseconds(1));
    ncclCommGetAsyncError(comm, &state);
  }
  if (state != ncclSuccess) {
    ncclCommAbort(comm);
    nccl_fail(state, "ncclCommInitRankConfig");
  }
  co_return std::make_unique<NcclCommunicator>(runtime, store, comm, rank, size, std::move(options));
}

}  // namespace coshard::transport
