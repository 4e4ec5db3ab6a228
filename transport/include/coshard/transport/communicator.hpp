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

enum class ReduceOp : std::uint8_t { sum, avg, max, premul_sum };

struct Reduction {
  ReduceOp op = ReduceOp::sum;
  double factor = 1.0;  ///< premul_sum: every input is multiplied by it before summing
  static Reduction sum() { return {}; }
  static Reduction avg() { return {ReduceOp::avg, 1.0}; }
  static Reduction max() { return {ReduceOp::max, 1.0}; }
  static Reduction premul_sum(double f) { return {ReduceOp::premul_sum, f}; }
};

enum class CollectiveOp : std::uint8_t { all_gather, reduce_scatter, all_reduce, broadcast, barrier, send, recv };
std::string_view to_string(CollectiveOp op) noexcept;
std::string_view to_string(ReduceOp op) noexcept;

/// What one operation is; handed to hooks and kept by the flight recorder.
struct OpInfo {
  CollectiveOp op = CollectiveOp::barrier;
  std::uint64_t seq = 0;  ///< per communicator (collectives) or per peer (send/recv)
  DType dtype = DType::f32;
  std::int64_t count = 0;  ///< elements per rank: the shard for all_gather/reduce_scatter, the buffer otherwise
  ReduceOp reduce = ReduceOp::sum;
  int peer = -1;  ///< root of a broadcast, peer of send/recv
  std::string label;  ///< what the caller gathers or reduces (an FSDP unit's name): spans, flight records
  std::size_t bytes() const noexcept { return static_cast<std::size_t>(count) * size_of(dtype); }
  static OpInfo of(CollectiveOp op, std::uint64_t seq, DType dtype, std::int64_t count) {
    OpInfo i;
    i.op = op;
    i.seq = seq;
    i.dtype = dtype;
    i.count = count;
    return i;
  }
};

struct CommOptions {
  std::string name = "world";                   ///< names keys in the store, streams and errors
  std::chrono::milliseconds timeout{300000};    ///< per operation, from the moment it starts running
  Telemetry* telemetry = nullptr;               ///< collective durations, bytes, errors; not owned
  /// Runs on the communicator's stream right before each operation. For tests and tracing:
  /// recording which ops ran with which dtype, or injecting a delay.
  std::function<void(const OpInfo&)> before_op;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const noexcept = 0;
  virtual int size() const noexcept = 0;
  virtual const std::string& name() const noexcept = 0;
  virtual std::string_view backend() const noexcept = 0;  ///< "ucx", "nccl"
  /// The stream the operations run on (for timelines and for waiting on all of them).
  virtual Stream& stream() noexcept = 0;

  /// Gathers every rank's `input` into `output` (size() * input.numel() elements, rank order).
  /// In place when `input` is the view of `output` at offset rank() * input.numel().
  /// `label` names what moves (e.g. the FSDP unit) on the timeline and in the flight record.
  virtual Event all_gather(Tensor input, Tensor output, Stream& after, std::string label = {}) = 0;
  /// Reduces `input` (size() * output.numel() elements) over ranks; rank r receives chunk r.
  /// f32, bf16 and f16; low-precision sums accumulate in f32 and are rounded once.
  virtual Event reduce_scatter(Tensor input, Tensor output, Reduction reduction, Stream& after,
                               std::string label = {}) = 0;
  virtual Event all_reduce(Tensor inout, Reduction reduction, Stream& after, std::string label = {}) = 0;
  virtual Event broadcast(Tensor inout, int root, Stream& after, std::string label = {}) = 0;
  virtual Event barrier(Stream& after) = 0;
  virtual Event send(Tensor input, int peer, Stream& after) = 0;
  virtual Event recv(Tensor output, int peer, Stream& after) = 0;

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
  /// No default arguments on coroutines: GCC 12 destroys such temporaries twice inside co_await.
  Task<std::unique_ptr<Communicator>> split(int color, int key) { return split(color, key, std::string()); }
  virtual const CommOptions& options() const noexcept = 0;

  /// Fails the operation in flight and every later one with `reason`. Thread-safe, idempotent.
  virtual void abort(const Error& reason) = 0;
  /// The last operations (sequence, op, bytes, times, state) as JSON, for comparing ranks.
  virtual std::string flight_record_json() const = 0;
};

}  // namespace coshard::transport
