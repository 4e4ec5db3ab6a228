#pragma once
// The shared state of one suspended await that ends either by completion (from any thread) or by
// cancellation, whichever comes first. Either way the coroutine resumes on its own scheduler,
// never inline on the completing thread.
#include <atomic>
#include <chrono>
#include <coroutine>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <stop_token>
#include <string>

#include "coshard/runtime/task.hpp"

namespace coshard {
class Scheduler;

namespace detail {

class Waiter;

// The pending waits of one scheduler's tasks. Shared with every waiter, so a waiter that outlives
// its scheduler (held by a stream or an Asio handler) still unregisters safely.
struct WaitRegistry {
  mutable std::mutex m;  // waiters are made on the scheduler thread but may die on any
  std::set<const Waiter*> waits;
};

class Waiter : public std::enable_shared_from_this<Waiter> {
 public:
  /// `what` says what the coroutine awaits; the scheduler lists pending waits for hang dumps
  /// (Scheduler::suspended).
  Waiter(Scheduler& sched, std::coroutine_handle<> h, std::string what);
  Waiter(const Waiter&) = delete;
  Waiter& operator=(const Waiter&) = delete;
  virtual ~Waiter();

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
  const std::string& what() const noexcept { return what_; }
  std::chrono::steady_clock::time_point since() const noexcept { return since_; }

 private:
  void cancel_from_any_thread();
  void resume_on_scheduler();

  Scheduler& sched_;
  std::shared_ptr<WaitRegistry> registry_;
  std::coroutine_handle<> handle_;
  std::string what_;
  std::chrono::steady_clock::time_point since_ = std::chrono::steady_clock::now();
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
