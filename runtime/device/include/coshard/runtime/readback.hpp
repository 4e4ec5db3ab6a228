#pragma once
// A value that work on a stream produces for the host: a loss, a count, a flag. The host can only
// read it with `co_await value.get()`, which resumes once the work that computed it has run, so a
// stale or half-written value cannot be read (PyTorch's loss.item() synchronises the same way).
//
//   Readback<float> loss;                                          // a member of the model
//   loss.publish(scope.compute(), [acts] { return acts->loss(); });  // in a unit's forward
//   float l = co_await loss.get();                                  // in the training loop
//
// Each publish writes into storage of its own, so the host may read one step's value while the
// next step's work is already queued. `compute` runs on the stream's thread in stream order (on
// CUDA as a host callback: it must not call CUDA or throw; copy a device value to pinned memory
// first).
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "coshard/runtime/error.hpp"
#include "coshard/runtime/stream.hpp"
#include "coshard/runtime/task.hpp"

namespace coshard {

/// A value computed by stream work for the host, read with `co_await get()` once that work ran.
template <class T>
class Readback {
 public:
  /// Enqueues `compute` on `stream` after the work already there; its result is what get() returns
  /// from now on. Call from the thread that issues the stream's work.
  void publish(Stream& stream, std::function<T()> compute, std::string span = {}) {
    auto slot = std::make_shared<Slot>();
    slot->done = Event(stream.device());
    stream.enqueue([slot, compute = std::move(compute)] { slot->value = compute(); }, std::move(span));
    slot->done.record(stream);
    latest_ = std::move(slot);
  }

  /// True once publish() was called: get() would not throw for lack of a value.
  bool published() const noexcept { return static_cast<bool>(latest_); }

  /// The latest published value, once the work that computed it has run; rethrows that stream's
  /// error. Cancellable, like any event wait.
  Task<T> get() const {
    if (!latest_) {
      throw Error(Errc::invalid_argument,
                  "Readback::get before any publish: the unit that computes this value has not run its forward");
    }
    return read(latest_);
  }

 private:
  struct Slot {
    std::optional<T> value;
    Event done;
  };

  static Task<T> read(std::shared_ptr<Slot> slot) {
    co_await slot->done;
    if (!slot->value) throw Error(Errc::internal, "Readback: the stream ran the publish without producing a value");
    co_return *slot->value;
  }

  std::shared_ptr<Slot> latest_;
};

}  // namespace coshard
