#include "coshard/transport/ucx_communicator.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <optional>
#include <string_view>
#include <tuple>

#include "coshard/runtime/parse_whole.hpp"
#include "coshard/transport/flight_recorder.hpp"
#include "algorithm.hpp"
#include "connect.hpp"
#include "direct.hpp"
#include "hierarchy.hpp"
#include "mesh.hpp"
#include "op_metrics.hpp"
#include "reduce_kernels.hpp"
#include "ring.hpp"
#include "wire.hpp"

namespace coshard::transport {
namespace {

using detail::Algorithm;
using detail::Blocks;
using detail::DirectSetup;
using detail::Wire;
using Clock = std::chrono::steady_clock;

std::string describe(const OpInfo& i) {
  std::string s = detail::op_name(i);
  if (i.op == CollectiveOp::barrier) return s;
  s += " (" + std::string(to_string(i.dtype)) + " x " + std::to_string(i.count);
  if (i.op == CollectiveOp::all_gather || i.op == CollectiveOp::reduce_scatter) s += " per rank";
  if (i.op == CollectiveOp::send) s += " to rank " + std::to_string(i.peer);
  if (i.op == CollectiveOp::recv) s += " from rank " + std::to_string(i.peer);
  if (i.op == CollectiveOp::broadcast) s += ", root " + std::to_string(i.peer);
  return s + ")";
}

class UcxCommunicator final : public Communicator {
 public:
  UcxCommunicator(Runtime& rt, launch::StoreClient* store, std::shared_ptr<detail::UcxContext> ctx, std::unique_ptr<Wire> wire,
                  std::string key_prefix, CommOptions options, UcxOptions ucx, DirectSetup direct,
                  detail::Levels levels)
      : rt_(rt),
        store_(store),
        ctx_(std::move(ctx)),
        wire_(std::move(wire)),
        key_prefix_(std::move(key_prefix)),
        options_(std::move(options)),
        ucx_(ucx),
        send_seq_(static_cast<std::size_t>(wire_->size()), 0),
        recv_seq_(static_cast<std::size_t>(wire_->size()), 0) {
    levels_ = std::move(levels);
    if (levels_.mesh_max_bytes > 0 && wire_->size() > 1) {
      mesh_ = std::make_unique<detail::Mesh>(*wire_, levels_.mesh_max_bytes, levels_.hierarchy.get());
      if (mesh_->room() > 0) header_room_.resize(sizeof(detail::Header) + mesh_->room());
    }
    if (levels_.hierarchy) {
      Wire& local = levels_.hierarchy->local();
      Wire& cross = levels_.hierarchy->cross();
      wire_->progress_with({&local, &cross});
      local.progress_with({wire_.get(), &cross});
      cross.progress_with({wire_.get(), &local});
    }
    Telemetry& t = options_.telemetry ? *options_.telemetry : rt_.telemetry();
    if (direct.on && wire_->size() > 1) {
      // Segments of every peer that recent operations used: a few buffers per peer in practice.
      Gauge& mapped = t.gauge("coshard_peer_segments_mapped_bytes",
                              "Bytes of peers' shared-memory segments this communicator keeps mapped (direct path)",
                              {{"comm", options_.name}, {"transport", "ucx"}});
      mapped.set(0);
      direct_ = std::make_unique<detail::Direct>(*wire_, std::max<std::size_t>(64, 32 * static_cast<std::size_t>(size())),
                                                 &mapped, direct.stream_min_bytes);
      direct_min_bytes_ = std::max<std::size_t>(1, direct.min_bytes);
    }
    Stream::Options stream_options = rt_.stream_options();  // jitter and discrete memory reach it too
    stream_options.telemetry = &t;
    stream_ = std::make_unique<Stream>(Stream::cpu(Device::cpu(), options_.name, stream_options));
    metrics_ = std::make_unique<detail::OpMetrics>(t);
    diagnostic_ = rt_.add_diagnostic([this] { recorder_.dump(record_owner()); });
  }

  ~UcxCommunicator() override {
    rt_.remove_diagnostic(diagnostic_);
    stream_.reset();  // drains the queued operations first: they use the wire
    direct_.reset();  // unmaps the peers' segments
    wire_->progress_with({});  // the hierarchy's wires go first
    levels_.hierarchy.reset();
    wire_.reset();
  }

  int rank() const noexcept override { return wire_->rank(); }
  int size() const noexcept override { return wire_->size(); }
  const std::string& name() const noexcept override { return options_.name; }
  std::string_view backend() const noexcept override { return "ucx"; }
  Stream& stream() noexcept override { return *stream_; }

  const CommOptions& options() const noexcept override { return options_; }
  Task<std::unique_ptr<Communicator>> split(int color, int key, CommOptions options) override;
  void abort(const Error& reason) override { abort_wires(reason); }

  FlightRecorder::Owner record_owner() const { return {options_.name, rank(), size(), backend(), rt_.rank()}; }

  std::string flight_record_json() const override {
    return recorder_.json(record_owner());
  }

 protected:
  // The arguments passed Communicator's checks; what is left is UCX's own: host memory.
  Event issue_all_gather(Tensor input, Tensor output, Stream& after, std::string label) override {
    OpInfo info = collective(CollectiveOp::all_gather, input, input.numel());
    info.label = std::move(label);
    host_only(info, {&input, &output});
    return enqueue(info, after, [this, input, output] {
      auto* base = static_cast<std::byte*>(output.data());
      if (algorithm_ == Algorithm::mesh) {
        mesh_->all_gather(current_, static_cast<const std::byte*>(input.data()), input.nbytes(), base);
        return;
      }
      if (ran_direct([&] {
            return direct_->all_gather(current_, static_cast<const std::byte*>(input.data()), input.nbytes(), base);
          })) {
        return;
      }
      std::byte* own = base + static_cast<std::size_t>(rank()) * input.nbytes();
      if (input.data() != own && input.nbytes() > 0) std::memcpy(own, input.data(), input.nbytes());
      if (algorithm_ == Algorithm::hierarchical) {
        levels_.hierarchy->all_gather(current_.seq, base, input.nbytes(), ucx_.pipeline_bytes);
        return;
      }
      detail::ring_all_gather(*wire_, current_.seq, 0, base, Blocks::uniform(input.nbytes(), size()),
                              ucx_.pipeline_bytes);
    });
  }

  Event issue_reduce_scatter(Tensor input, Tensor output, Reduction reduction, Stream& after,
                             std::string label) override {
    OpInfo info = collective(CollectiveOp::reduce_scatter, output, output.numel());
    info.label = std::move(label);
    info.reduce = reduction.op;
    host_only(info, {&input, &output});
    return enqueue(info, after, [this, input, output, reduction] {
      if (algorithm_ == Algorithm::mesh) {
        mesh_->reduce_scatter(current_, static_cast<const std::byte*>(input.data()),
                              static_cast<std::size_t>(output.numel()), output.data(), spec(output.dtype(), reduction));
        return;
      }
      if (ran_direct([&] {
            return direct_->reduce_scatter(current_, static_cast<const std::byte*>(input.data()),
                                           static_cast<std::size_t>(output.numel()), output.data(),
                                           spec(output.dtype(), reduction));
          })) {
        return;
      }
      if (algorithm_ == Algorithm::hierarchical) {
        levels_.hierarchy->reduce_scatter(current_.seq, static_cast<const std::byte*>(input.data()),
                                          static_cast<std::size_t>(output.numel()), output.data(),
                                          spec(output.dtype(), reduction), ucx_.pipeline_bytes, scratch_);
        return;
      }
      detail::ring_reduce_scatter(*wire_, current_.seq, 0, static_cast<const std::byte*>(input.data()),
                                  Blocks::uniform(static_cast<std::size_t>(output.numel()), size()), output.data(),
                                  spec(output.dtype(), reduction), ucx_.pipeline_bytes, scratch_);
    });
  }

  Event issue_all_reduce(Tensor inout, Reduction reduction, Stream& after, std::string label) override {
    OpInfo info = collective(CollectiveOp::all_reduce, inout, inout.numel());
    info.label = std::move(label);
    info.reduce = reduction.op;
    host_only(info, {&inout});
    return enqueue(info, after, [this, inout, reduction] {
      auto* base = static_cast<std::byte*>(inout.data());
      const std::size_t esize = size_of(inout.dtype());
      if (algorithm_ == Algorithm::mesh) {
        mesh_->all_reduce(current_, base, static_cast<std::size_t>(inout.numel()), spec(inout.dtype(), reduction));
        return;
      }
      auto blocks = Blocks::balanced(static_cast<std::size_t>(inout.numel()), size());
      if (ran_direct([&] { return direct_->all_reduce(current_, base, blocks, spec(inout.dtype(), reduction)); })) {
        return;
      }
      if (algorithm_ == Algorithm::hierarchical) {
        levels_.hierarchy->all_reduce(current_.seq, base, static_cast<std::size_t>(inout.numel()),
                                      spec(inout.dtype(), reduction), ucx_.pipeline_bytes, scratch_);
        return;
      }
      const auto own = static_cast<std::size_t>(rank());
      detail::ring_reduce_scatter(*wire_, current_.seq, 0, base, blocks, base + blocks.offset[own] * esize,
                                  spec(inout.dtype(), reduction), ucx_.pipeline_bytes, scratch_);
      detail::ring_all_gather(*wire_, current_.seq, size(), base, blocks.scaled(esize), ucx_.pipeline_bytes);
    });
  }

  Event issue_broadcast(Tensor inout, int root, Stream& after, std::string label) override {
    OpInfo info = collective(CollectiveOp::broadcast, inout, inout.numel());
    info.label = std::move(label);
    info.peer = root;
    host_only(info, {&inout});
    return enqueue(info, after, [this, inout, root] {
      detail::ring_broadcast(*wire_, current_.seq, static_cast<std::byte*>(inout.data()), inout.nbytes(), root,
                             ucx_.pipeline_bytes);
    });
  }

  Event issue_barrier(Stream& after) override {
    OpInfo info;
    info.op = CollectiveOp::barrier;
    info.seq = seq_++;
    // After a ring all-gather every rank has heard, through its neighbours, from every rank.
    return enqueue(info, after, [this] {
      std::vector<std::byte> token(static_cast<std::size_t>(size()));
      detail::ring_all_gather(*wire_, current_.seq, 0, token.data(), Blocks::uniform(1, size()), 1);
    });
  }

  Event issue_send(Tensor input, int peer, Stream& after) override {
    OpInfo info = point_to_point(CollectiveOp::send, input, peer);
    return enqueue(info, after, [this, input, peer] {
      wire_->send(peer, input.data(), input.nbytes(), detail::make_tag(true, current_.seq, rank(), 0, 0));
      wire_->wait_all();
    });
  }

  Event issue_recv(Tensor output, int peer, Stream& after) override {
    OpInfo info = point_to_point(CollectiveOp::recv, output, peer);
    return enqueue(info, after, [this, output, peer] {
      wire_->recv(peer, output.data(), output.nbytes(), detail::make_tag(true, current_.seq, peer, 0, 0));
      wire_->wait_all();
    });
  }

 private:
  OpInfo collective(CollectiveOp op, const Tensor& t, std::int64_t count) {
    return OpInfo::of(op, seq_++, t.dtype(), count);
  }

  OpInfo point_to_point(CollectiveOp op, const Tensor& t, int peer) {
    OpInfo info;
    info.op = op;
    info.dtype = t.dtype();
    info.count = t.numel();
    info.peer = peer;
    host_only(info, {&t});
    auto& counter = (op == CollectiveOp::send ? send_seq_ : recv_seq_)[static_cast<std::size_t>(peer)];
    info.seq = counter++;
    return info;
  }

  [[noreturn]] void bad(const OpInfo& info, const std::string& why) const {
    throw Error(Errc::invalid_argument, describe(info) + " on communicator '" + options_.name + "': " + why,
                ErrorContext{.rank = rt_.rank(), .op = describe(info), .unit = {}});
  }

  void host_only(const OpInfo& info, std::initializer_list<const Tensor*> tensors) const {
    for (const Tensor* t : tensors) {
      if (t->device().kind != DeviceKind::cpu) {
        bad(info, "the UCX backend moves host memory; this tensor is on " + t->device().to_string() +
                      " (use the NCCL backend for device tensors)");
      }
    }
  }

  detail::ReduceSpec spec(DType dtype, Reduction r) const {
    detail::ReduceSpec s;
    s.dtype = dtype;
    s.op = r.op == ReduceOp::max ? ReduceOp::max : ReduceOp::sum;
    if (r.op == ReduceOp::premul_sum) s.scale = static_cast<float>(r.factor);
    if (r.op == ReduceOp::avg) s.post = 1.0f / static_cast<float>(size());
    return s;
  }

  Event enqueue(const OpInfo& info, Stream& after, std::function<void()> body) {
    const auto record = recorder_.queued(info);
    Event ready(after.device());
    ready.record(after);
    if (after.device() != stream_->device()) {
      bad(info, "the stream '" + after.name() + "' is on " + after.device().to_string() +
                    "; the UCX backend orders host work only");
    }
    stream_->wait(ready);
    // The span names the operation and what it moves: "all_gather#12 (f32 x 4096 per rank) h.3".
    std::string span = describe(info) + (info.label.empty() ? "" : " " + info.label);
    const Algorithm planned = choose(info);
    if (planned == Algorithm::hierarchical) span += " via " + levels_.hierarchy->describe(buffer_bytes(info));
    if (planned == Algorithm::mesh) span += " via " + mesh_->describe(info.op);
    stream_->enqueue([this, info, record, body = std::move(body)] { run(info, record, body); }, std::move(span));
    Event done;
    done.record(*stream_);
    return done;
  }

  // The schedule `info` takes first (algorithm.hpp): the same answer on every rank.
  Algorithm choose(const OpInfo& info, bool direct = true) const noexcept {
    return detail::choose(info, {.size = size(),
                                 .mesh_takes = mesh_ && mesh_->takes(info),
                                 .direct = direct && direct_ != nullptr,
                                 .direct_min_bytes = direct_min_bytes_,
                                 .hierarchy = levels_.hierarchy != nullptr,
                                 .hierarchy_min_bytes = levels_.min_bytes});
  }

  std::size_t buffer_bytes(const OpInfo& info) const noexcept { return detail::buffer_bytes(info, size()); }

  void abort_wires(const Error& reason) {
    wire_->abort(reason);
    if (levels_.hierarchy) levels_.hierarchy->abort(reason);
  }

  // Runs `attempt` (a Direct call) when the operation chose the direct path: true when it ran
  // there. When it gave up (a peer's buffers are not all shared) the operation takes the next
  // choice; the flight record says "direct" when it failed there (its peers waited on direct-path
  // messages).
  template <class F>
  bool ran_direct(F attempt) {
    if (algorithm_ != Algorithm::direct) return false;
    if (attempt()) return true;
    algorithm_ = choose(current_, false);
    return false;
  }

  // On the communicator's stream.
  void run(const OpInfo& info, std::uint64_t record, const std::function<void()>& body) {
    if (auto reason = wire_->aborted()) {
      recorder_.finished(record, reason->message());
      throw *reason;
    }
    if (options_.before_op) options_.before_op(info);
    recorder_.started(record);
    current_ = info;
    algorithm_ = choose(info);
    const auto start = Clock::now();
    const detail::WaitContext wait{describe(info) + " on '" + options_.name + "'", start + options_.timeout,
                                   options_.timeout};
    wire_->begin(wait);
    if (levels_.hierarchy) levels_.hierarchy->begin(wait);
    try {
      if (size() > 1 && algorithm_ != Algorithm::mesh) {
        if (info.op == CollectiveOp::send) {
          detail::exchange_headers(*wire_, true, info, info.peer, -1);
        } else if (info.op == CollectiveOp::recv) {
          detail::exchange_headers(*wire_, true, info, -1, info.peer);
        } else {
          detail::exchange_headers(*wire_, false, info, (rank() + 1) % size(), (rank() + size() - 1) % size(),
                                   &header_room_);
        }
      }
      body();
    } catch (const Error& e) {
      fail(info, record, e);
    } catch (const std::exception& e) {
      fail(info, record, Error(Errc::internal, e.what()));
    }
    recorder_.set_algorithm(record, std::string(to_string(algorithm_)));
    recorder_.finished(record);
    metrics_->count_peer_waits(*wire_);
    if (levels_.hierarchy) {
      metrics_->count_peer_waits(levels_.hierarchy->local());
      metrics_->count_peer_waits(levels_.hierarchy->cross());
    }
    metrics_->finished(info, size(), std::chrono::duration<double>(Clock::now() - start).count(),
                       std::string(to_string(algorithm_)));
  }

  [[noreturn]] void fail(const OpInfo& info, std::uint64_t record, const Error& e) {
    wire_->cancel_all();  // UCX lets go of the buffers before the tensors may be freed
    if (levels_.hierarchy) levels_.hierarchy->cancel_all();
    recorder_.set_algorithm(record, std::string(to_string(algorithm_)));
    recorder_.finished(record, e.message());
    metrics_->failed(e);
    if (auto reason = wire_->aborted(); reason && reason->message() == e.message()) throw e;
    rt_.write_diagnostics();  // every communicator of the rank: where each of them stood
    // This one's path, for the error; also its only record when it fails while being destroyed
    // (no longer registered, so write_diagnostics skipped it).
    std::string path = recorder_.dump(record_owner());
    Error failed(e.code(),
                 e.message() + (path.empty() ? "" : " [flight record of the last operations: " + path + "]"),
                 ErrorContext{.rank = rt_.rank(), .op = describe(info), .unit = {}});
    // The ring is now out of step with the peers: every later operation fails with this error.
    abort_wires(failed);
    throw failed;
  }

  Runtime& rt_;
  std::uint64_t diagnostic_ = 0;  // writes the flight record on request (SIGUSR1)
  launch::StoreClient* store_;
  std::shared_ptr<detail::UcxContext> ctx_;
  std::unique_ptr<Wire> wire_;
  std::string key_prefix_;
  CommOptions options_;
  UcxOptions ucx_;
  std::unique_ptr<Stream> stream_;
  FlightRecorder recorder_;
  std::atomic<std::uint64_t> seq_{0};
  std::vector<std::uint64_t> send_seq_, recv_seq_;  // per peer; on the caller's thread
  OpInfo current_;                                   // stream thread only
  Algorithm algorithm_ = Algorithm::ring;            // stream thread only: how current_ runs
  std::unique_ptr<detail::Direct> direct_;           // null: ring only; stream thread only
  std::unique_ptr<detail::Mesh> mesh_;               // null: no mesh; stream thread only
  std::vector<std::byte> header_room_;               // the ring's header receive, room for a mesh message
  detail::Levels levels_;                            // no hierarchy: one host, or the flat ring
  std::size_t direct_min_bytes_ = 0;
  detail::Scratch scratch_;                          // stream thread only
  int splits_ = 0;
  std::unique_ptr<detail::OpMetrics> metrics_;
};

Task<std::unique_ptr<Communicator>> UcxCommunicator::split(int color, int key, CommOptions o) {
  const int k = splits_++;
  const std::string base = key_prefix_ + "split" + std::to_string(k) + "/";
  std::vector<std::tuple<int, int, int>> all;  // color, key, rank
  if (size() == 1) {
    all.emplace_back(color, key, 0);
  } else {
    co_await store_->set(base + std::to_string(rank()), std::to_string(color) + " " + std::to_string(key));
    std::vector<std::string> keys;
    for (int r = 0; r < size(); ++r) keys.push_back(base + std::to_string(r));
    auto values = co_await store_->wait(keys, ucx_.connect_timeout);
    for (int r = 0; r < size(); ++r) {
      const std::string_view entry = values[static_cast<std::size_t>(r)];  // "<color> <key>"
      const auto space = entry.find(' ');
      const auto c = parse_whole<int>(entry.substr(0, space));
      const auto kk = space == std::string_view::npos ? std::nullopt : parse_whole<int>(entry.substr(space + 1));
      if (!c || !kk) {
        throw Error(Errc::io, "split of '" + options_.name + "': unreadable entry from rank " + std::to_string(r));
      }
      all.emplace_back(*c, *kk, r);
    }
  }
  if (color < 0) co_return nullptr;
  std::vector<std::pair<int, int>> members;  // key, parent rank
  for (auto [c, kk, r] : all) {
    if (c == color) members.emplace_back(kk, r);
  }
  std::sort(members.begin(), members.end());
  int new_rank = 0;
  for (std::size_t i = 0; i < members.size(); ++i) {
    if (members[i].second == rank()) new_rank = static_cast<int>(i);
  }
  if (o.name.empty()) o.name = options_.name + "/" + std::to_string(color);
  co_return co_await detail::connect(rt_, store_, ctx_, new_rank, static_cast<int>(members.size()),
                                     base + "c" + std::to_string(color) + "/", std::move(o), ucx_);
}

}  // namespace

std::unique_ptr<Communicator> detail::make_ucx_communicator(Runtime& rt, launch::StoreClient* store,
                                                            std::shared_ptr<UcxContext> ctx, std::unique_ptr<Wire> wire,
                                                            std::string key_prefix, CommOptions options, UcxOptions ucx,
                                                            DirectSetup direct, Levels levels) {
  return std::make_unique<UcxCommunicator>(rt, store, std::move(ctx), std::move(wire), std::move(key_prefix),
                                           std::move(options), ucx, direct, std::move(levels));
}

}  // namespace coshard::transport
