#pragma once
// Collectives over a group of ranks. Every call is asynchronous: it is ordered after the work
// already enqueued on `after` (the stream that produced the input), runs on the communicator's
// own stream, and returns an Event that completes when the result is ready. Callers make a stream
// wait on it (`compute.wait(ev)`) or `co_await` it. A failed operation (timeout, dead peer,
// mismatched sizes, abort) completes its event with the error, and every later operation of the
// communicator fails with it too: no hang, and no silent recovery from a half-done collective.
//
// Every rank of the group must issue the same collectives, with the same sizes and dtypes, in the
// same order; a mismatch is detected and named instead of hanging.
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "coshard/runtime/dtype.hpp"
#include "coshard/runtime/error.hpp"
#include "coshard/runtime/stream.hpp"
#include "coshard/runtime/task.hpp"
#include "coshard/runtime/tensor.hpp"

namespace coshard::transport {

/// How reduce_scatter and all_reduce combine the ranks' values (see Reduction).
enum class ReduceOp : std::uint8_t { sum, avg, max, premul_sum };

/// The reduction of a reduce_scatter or all_reduce: the op and, for premul_sum, its factor.
struct Reduction {
  ReduceOp op = ReduceOp::sum;  ///< how the ranks' values are combined
  double factor = 1.0;  ///< premul_sum: every input is multiplied by it before summing
  /// Element-wise sum over the ranks (the default).
  static Reduction sum() { return {}; }
  /// The sum divided by the number of ranks (gradient averaging).
  static Reduction avg() { return {ReduceOp::avg, 1.0}; }
  /// Element-wise maximum over the ranks.
  static Reduction max() { return {ReduceOp::max, 1.0}; }
  /// Every input multiplied by `f`, then summed: averaging by a divisor other than the rank count.
  static Reduction premul_sum(double f) { return {ReduceOp::premul_sum, f}; }
};

/// The kinds of operation a communicator runs; named in errors, timeline spans and flight records.
enum class CollectiveOp : std::uint8_t { all_gather, reduce_scatter, all_reduce, broadcast, barrier, send, recv };
/// The operation's name as errors and flight records write it, e.g. "all_gather".
std::string_view to_string(CollectiveOp op) noexcept;
/// The reduction's name as errors write it, e.g. "premul_sum".
std::string_view to_string(ReduceOp op) noexcept;

/// What one operation is; handed to hooks and kept by the flight recorder.
struct OpInfo {
  CollectiveOp op = CollectiveOp::barrier;  ///< which operation
  std::uint64_t seq = 0;  ///< per communicator (collectives) or per peer (send/recv)
  DType dtype = DType::f32;  ///< element type of the buffers
  std::int64_t count = 0;  ///< elements per rank: the shard for all_gather/reduce_scatter, the buffer otherwise
  ReduceOp reduce = ReduceOp::sum;  ///< reduction of reduce_scatter and all_reduce; sum for the others
  int peer = -1;  ///< root of a broadcast, peer of send/recv
  std::string label;  ///< what the caller gathers or reduces (an FSDP unit's name): spans, flight records
  /// Bytes per rank: `count` elements of `dtype`.
  std::size_t bytes() const noexcept { return static_cast<std::size_t>(count) * size_of(dtype); }
  /// An OpInfo with these fields set and the rest at their defaults (no peer, no label).
  static OpInfo of(CollectiveOp op, std::uint64_t seq, DType dtype, std::int64_t count) {
    OpInfo i;
    i.op = op;
    i.seq = seq;
    i.dtype = dtype;
    i.count = count;
    return i;
  }
};

/// Settings of one communicator, given when it is created or split.
struct CommOptions {
  std::string name = "world";                   ///< names keys in the store, streams and errors
  std::chrono::milliseconds timeout{300000};    ///< per operation, from the moment it starts running
  Telemetry* telemetry = nullptr;               ///< collective durations, bytes, errors; not owned
  /// Runs on the communicator's stream right before each operation. For tests and tracing:
  /// recording which ops ran with which dtype, or injecting a delay.
  std::function<void(const OpInfo&)> before_op;
};

/// Collectives over a group of ranks, the interface of both backends (UCX, NCCL). Every call is
/// ordered after the work on `after`, runs on the communicator's own stream and returns an Event;
/// a failed operation fails every later one too.
///
/// The operations are not virtual: each checks what it is given against what every backend needs
/// (tensors allocated, dtypes that match, the sizes the group's size asks for, a reducible dtype, a
/// root or peer in the group) and throws Errc::invalid_argument naming the operation, the
/// communicator and what is wrong before anything is issued, so that a refused call takes no
/// sequence number and the ranks stay in step. A backend then checks only what is its own (the
/// device its tensors must be on) in the protected issue_* functions it implements.
class Communicator {
 public:
  virtual ~Communicator() = default;

  /// This rank's index in the group, 0 to size() - 1.
  virtual int rank() const noexcept = 0;
  /// Number of ranks in the group.
  virtual int size() const noexcept = 0;
  /// CommOptions::name: prefixes the communicator's store keys and names its stream and errors.
  virtual const std::string& name() const noexcept = 0;
  virtual std::string_view backend() const noexcept = 0;  ///< "ucx", "nccl"
  /// The stream the operations run on (for timelines and for waiting on all of them).
  virtual Stream& stream() noexcept = 0;

  /// Gathers every rank's `input` into `output` (size() * input.numel() elements, rank order).
  /// In place when `input` is the view of `output` at offset rank() * input.numel().
  /// `label` names what moves (e.g. the FSDP unit) on the timeline and in the flight record.
  Event all_gather(Tensor input, Tensor output, Stream& after, std::string label = {});
  /// Reduces `input` (size() * output.numel() elements) over ranks; rank r receives chunk r.
  /// f32, bf16 and f16; low-precision sums accumulate in f32 and are rounded once.
  Event reduce_scatter(Tensor input, Tensor output, Reduction reduction, Stream& after, std::string label = {});
  /// Reduces `inout` over the ranks in place: every rank ends with the whole result.
  Event all_reduce(Tensor inout, Reduction reduction, Stream& after, std::string label = {});
  /// Copies rank `root`'s `inout` into `inout` on every other rank.
  Event broadcast(Tensor inout, int root, Stream& after, std::string label = {});
  /// Completes once every rank of the group has reached its barrier.
  Event barrier(Stream& after) { return issue_barrier(after); }
  /// Sends `input` to rank `peer`; the sends to a peer pair in order with that peer's recv calls.
  /// A large send completes only when the peer has received it.
  Event send(Tensor input, int peer, Stream& after);
  /// Receives the matching send of rank `peer` into `output`.
  Event recv(Tensor output, int peer, Stream& after);

  /// Collective over this communicator: ranks with the same color form a new communicator, ordered
  /// by (key, rank), with `options` (an empty name becomes "<name>/<color>"). A negative color
  /// takes no part and gets nullptr. Run on the scheduler.
  virtual Task<std::unique_ptr<Communicator>> split(int color, int key, CommOptions options) = 0;
  /// The same with this communicator's options and another name.
  Task<std::unique_ptr<Communicator>> split(int color, int key, std::string name) {
    CommOptions o = options();
    o.name = std::move(name);
    return split(color, key, std::move(o));
  }
  /// split() under the name "<name>/<color>", with this communicator's options.
  /// No default arguments on coroutines: GCC 12 destroys such temporaries twice inside co_await.
  Task<std::unique_ptr<Communicator>> split(int color, int key) { return split(color, key, std::string()); }
  /// The options this communicator was created with.
  virtual const CommOptions& options() const noexcept = 0;

  /// Fails the operation in flight and every later one with `reason`. Thread-safe, idempotent.
  virtual void abort(const Error& reason) = 0;
  /// The last operations (sequence, op, bytes, times, state) as JSON, for comparing ranks.
  virtual std::string flight_record_json() const = 0;

 protected:
  // What a backend implements: each operation once its arguments passed the checks above.
  /// all_gather, its arguments checked.
  virtual Event issue_all_gather(Tensor input, Tensor output, Stream& after, std::string label) = 0;
  /// reduce_scatter, its arguments checked.
  virtual Event issue_reduce_scatter(Tensor input, Tensor output, Reduction reduction, Stream& after,
                                     std::string label) = 0;
  /// all_reduce, its arguments checked.
  virtual Event issue_all_reduce(Tensor inout, Reduction reduction, Stream& after, std::string label) = 0;
  /// broadcast, its arguments checked.
  virtual Event issue_broadcast(Tensor inout, int root, Stream& after, std::string label) = 0;
  /// barrier.
  virtual Event issue_barrier(Stream& after) = 0;
  /// send, its arguments checked.
  virtual Event issue_send(Tensor input, int peer, Stream& after) = 0;
  /// recv, its arguments checked.
  virtual Event issue_recv(Tensor output, int peer, Stream& after) = 0;
};

/// Whether reduce_scatter and all_reduce take `dtype`: f32, bf16 and f16.
bool reducible(DType dtype) noexcept;

}  // namespace coshard::transport
