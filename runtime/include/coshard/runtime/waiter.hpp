#pragma once
// The shared state of one suspended await that ends either by completion (from any thread) or by
// cancellation, whichever comes first. Either way the coroutine resumes on its own scheduler,
// never inline on the completing thread.
#include <atomic>
#include <coroutine>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <stop_token>

#include "coshard/runtime/task.hpp"

namespace coshard {
class Scheduler;

namespace detail {

class Waiter : public std::enable_shared_from_this<Waiter> {
 public:
  Waiter(Scheduler& sched, std::coroutine_handle<> h) : sched_(sched), handle_(h) {}
  Waiter(const Waiter&) = delete;
  Waiter& operator=(const Waiter&) = delete;
  virtual ~Waiter() = default;

  /// Finishes the wait with a value-less success or an error. Thread-safe; returns false when the
  /// wait already ended (the other side won).
  bool complete(std::exception_ptr error = nullptr);

  /// Arms cancellation through `token`. `on_cancel` runs on the scheduler thread after the wait was
  /// cancelled (to unlink the waiter from a queue, cancel a timer, ...).
  void arm(const std::stop_token& token, std::function<void()> on_cancel = {});

  bool pending() const noexcept { return state_.load(std::memory_order_acquire) == 0; }
  void rethrow_if_failed() const {
    if (error_) std::rethrow_exception(error_);
  }
  Scheduler& scheduler() const noexcept { return sched_; }

 private:
  void cancel_from_any_thread();
  void resume_on_scheduler();

  Scheduler& sched_;
  std::coroutine_handle<> handle_;
  std::atomic<int> state_{0};  ///< 0 pending, 1 ended
  std::exception_ptr error_;
  std::function<void()> on_cancel_;
  std::optional<std::stop_callback<std::function<void()>>> stop_cb_;
};

[[noreturn]] void throw_no_scheduler(const char* what);
[[noreturn]] void throw_cancelled(const char* what);

/// Reads the scheduler of the awaiting coroutine or throws: awaiting device or timer work outside
/// a scheduler would have no thread to resume on.
template <class P>
Scheduler& scheduler_of(std::coroutine_handle<P> h, const char* what) {
  if constexpr (is_coshard_promise<P>) {
    if (auto* s = h.promise().context().scheduler) return *s;
  }
  throw_no_scheduler(what);
}

template <class P>
std::stop_token stop_token_of(std::coroutine_handle<P> h) {
  if constexpr (is_coshard_promise<P>) return h.promise().context().stop;
  return {};
}

}  // namespace detail
}  // namespace coshard
