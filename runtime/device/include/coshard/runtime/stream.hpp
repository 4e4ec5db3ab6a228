#pragma once
// Streams and events. A Stream runs device work in order; an Event marks a point in a stream.
// Host code never blocks on them: `co_await event` resumes the task on its scheduler once the
// point is reached, and `stream.wait(event)` makes a stream (not the host) wait for another.
// A failing work item poisons its stream: later work is skipped and later events complete with
// that error (naming the stream and the work's span), so no waiter hangs. Once the error is
// handled, reset() lets the work enqueued after it run again.
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "coshard/runtime/device.hpp"
#include "coshard/runtime/telemetry.hpp"
#include "coshard/runtime/waiter.hpp"

namespace coshard {

class MemoryGate;

namespace detail {

/// One recorded point in a stream. Completes once, possibly with an error.
class Completion {
 public:
  virtual ~Completion() = default;
  virtual bool ready() const = 0;
  virtual std::exception_ptr error() const = 0;
  /// Calls w->complete(error()) once ready, from whatever thread observes it (maybe inline).
  virtual void notify(std::shared_ptr<Waiter> w) = 0;
  /// Blocks the calling thread until ready or `limit` passes; returns ready().
  virtual bool block_until_ready(std::chrono::nanoseconds limit) = 0;
  /// Where the point is, for hang dumps: "stream 'compute' after 'backward h.3'". Set once by
  /// Event::record before the event is shared.
  std::string what = "an event";
};

class StreamImpl {
 public:
  virtual ~StreamImpl() = default;
  virtual Device device() const noexcept = 0;
  virtual const std::string& name() const noexcept = 0;
  virtual std::shared_ptr<Completion> record() = 0;
  virtual void wait(std::shared_ptr<Completion> c) = 0;
  virtual void enqueue(std::function<void()> work, std::string span) = 0;
  virtual void* native() noexcept { return nullptr; }  // cudaStream_t on CUDA
  /// Work enqueued after this runs again after a failure (see Stream::reset).
  virtual void reset() {}
  /// Time spent running work, and time stalled in stream-side waits for other streams (CPU
  /// backend; 0 where the device does not say).
  virtual std::chrono::nanoseconds busy() const noexcept { return {}; }
  virtual std::chrono::nanoseconds stalled() const noexcept { return {}; }
  /// stalled(), by the name of the stream that recorded the awaited event (CPU backend).
  virtual std::map<std::string, std::chrono::nanoseconds> stalls() const { return {}; }

  // What the host enqueued last, so that an event says which work it waits behind.
  void note_enqueued(const std::string& span);
  std::string describe_point();

 private:
  std::mutex note_m_;  // streams may be fed from more than one thread
  std::uint64_t enqueued_ = 0;
  std::string last_span_;
};

}  // namespace detail

class Event;

/// An in-order queue of device work on one device; move-only. Runtime::stream() hands out named ones.
class Stream {
 public:
  /// Settings of a CPU stream.
  struct Options {
    Telemetry* telemetry = nullptr;  ///< timeline spans for labelled work, when it is tracing
    int rank = 0;                    ///< rank shown on those spans
    /// Fault injection for soak and stress runs: the worker sleeps a random time in [0, jitter]
    /// before each work item, so that a missing stream-side wait shows as a wrong result instead
    /// of hiding behind lucky timing. Results must not change. Zero: off.
    std::chrono::microseconds jitter{0};
    std::uint64_t jitter_seed = 0;  ///< with the stream's name, picks the delays (reproducible)
    /// Discrete device memory (discrete_memory.hpp): the worker holds this gate open while it has
    /// work to run, so that only stream work can touch device memory. Not owned; null: none.
    MemoryGate* gate = nullptr;
  };
  /// A CPU stream: an in-order worker thread with a queue.
  static Stream cpu(Device device, std::string name);
  /// A CPU stream whose labelled work is traced per `options`.
  static Stream cpu(Device device, std::string name, Options options);
  /// Wraps a backend implementation (how cuda::make_stream builds its streams).
  explicit Stream(std::unique_ptr<detail::StreamImpl> impl) : impl_(std::move(impl)) {}
  Stream(Stream&&) noexcept = default;             ///< moves the handle; the source no longer owns the stream
  Stream& operator=(Stream&&) noexcept = default;  ///< moves the handle; the stream held before is destroyed
  ~Stream();  ///< finishes queued work, then joins

  Device device() const noexcept { return impl_->device(); }          ///< where its work runs
  const std::string& name() const noexcept { return impl_->name(); }  ///< for messages and the timeline

  /// Host work in stream order (CPU backend; on CUDA it is a host callback in stream order).
  /// A non-empty `span` names the work on the timeline.
  void enqueue(std::function<void()> work, std::string span = {});
  /// Stream-side wait: work enqueued after this runs only once `event` has completed. Throws when
  /// the event was never recorded or belongs to another device.
  void wait(const Event& event);
  /// After a failure was handled: the work enqueued from now on runs again (the work enqueued
  /// before is still skipped, and events recorded before keep the error). CPU streams; on CUDA the
  /// errors that poison a context (an illegal address) cannot be undone: recreate the Runtime.
  void reset() { impl_->reset(); }
  /// Blocks the host until all work enqueued so far is done; throws Errc::timeout after `limit`,
  /// or the stream's error. For shutdown and tests; tasks co_await an event instead.
  void synchronize(std::chrono::nanoseconds limit = std::chrono::seconds(60));

  /// Totals since the stream was made: time running work, and time its worker was blocked in
  /// stream-side waits (how long this stream waited on others: exposed communication, when this
  /// is the compute stream). CPU backend; zero on CUDA.
  std::chrono::nanoseconds busy() const noexcept { return impl_->busy(); }
  std::chrono::nanoseconds stalled() const noexcept { return impl_->stalled(); }  ///< time blocked in waits; see busy()
  /// stalled() split by the stream each awaited event was recorded on, so that a caller can tell
  /// waiting for a collective from waiting for a copy or the optimizer. CPU backend; empty on CUDA.
  std::map<std::string, std::chrono::nanoseconds> stalls() const { return impl_->stalls(); }

  /// The backend behind the handle, for backends and transports (e.g. the native CUDA stream).
  detail::StreamImpl& impl() noexcept { return *impl_; }

 private:
  std::unique_ptr<detail::StreamImpl> impl_;
};

/// A point in a stream that tasks can co_await and other streams can wait on; copyable, cheap.
class Event {
 public:
  /// An unrecorded event for streams of `device`.
  explicit Event(Device device = Device::cpu()) : device_(device) {}

  /// Captures all work enqueued on `stream` so far. Re-recording moves the event to a new point;
  /// tasks already awaiting the old point are unaffected.
  void record(Stream& stream);
  bool recorded() const noexcept { return static_cast<bool>(point_); }  ///< whether record() was called
  /// True once the recorded point is reached (with or without error). Throws if never recorded.
  bool query() const;
  /// The error of the work before this point, if any.
  std::exception_ptr error() const;
  Device device() const noexcept { return device_; }  ///< streams it may be recorded on and waited by
  /// The recorded point (null before record()), for the allocator's and backends' bookkeeping.
  const std::shared_ptr<detail::Completion>& point() const noexcept { return point_; }

  /// @cond INTERNAL
  struct Awaiter {
    std::shared_ptr<detail::Completion> point;
    std::shared_ptr<detail::Waiter> waiter{};
    bool await_ready() const;
    template <class P>
    void await_suspend(std::coroutine_handle<P> h) {
      start(detail::scheduler_of(h, "Event"), h, detail::stop_token_of(h));
    }
    void await_resume() const;

   private:
    void start(Scheduler& s, std::coroutine_handle<> h, const std::stop_token& token);
  };
  /// @endcond
  /// Suspends until the recorded point is reached; rethrows the stream's error. Cancellable.
  Awaiter operator co_await() const;

 private:
  Device device_;
  std::shared_ptr<detail::Completion> point_;
};

}  // namespace coshard
