#pragma once
// The per-rank scheduler: one thread running an Asio io_context. All control logic runs there, so
// it needs no locks; other threads hand it work with post().
#include <chrono>
#include <condition_variable>
#include <coroutine>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stop_token>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "coshard/runtime/error.hpp"
#include "coshard/runtime/log.hpp"
#include "coshard/runtime/task.hpp"
#include "coshard/runtime/waiter.hpp"

namespace asio {
class io_context;
}

namespace coshard {

/// Lifecycle of a Scheduler: created until start(), stopping during stop(), failed when control
/// code threw out of a handler on the scheduler thread.
enum class Health { created, running, stopping, stopped, failed };

/// One thread running an Asio io_context, where a rank's control tasks run without locks.
class Scheduler {
 public:
  /// Settings fixed at construction.
  struct Options {
    std::string name = "coshard";  ///< names the scheduler in errors and logs
    /// How long stop() lets spawned tasks finish after asking them to stop.
    std::chrono::milliseconds drain_timeout{5000};
    /// After running work, keep polling (yielding the CPU) this long before sleeping. A sleeping
    /// thread costs a futex wake-up per completion (tens of microseconds on small VMs); a bounded,
    /// yielding poll keeps resumes fast during a step without starving other ranks when idle.
    std::chrono::microseconds poll_before_sleep{50};
    /// Where the scheduler says what it cannot throw to anyone (a spawned task that failed, tasks
    /// that did not drain at stop()); empty: stderr (log.hpp).
    LogSink log = {};
  };

  /// A scheduler with default Options; not started.
  Scheduler();
  /// A scheduler with `options`; its thread runs only after start().
  explicit Scheduler(Options options);
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;
  ~Scheduler();  ///< stop()s if still running

  /// Starts the thread. Throws Errc::invalid_argument when called twice: a stopped scheduler does
  /// not restart, create a new one.
  void start();
  /// Asks every spawned task to stop, waits up to drain_timeout for them, then joins the thread.
  /// Returns false when some task did not finish in time (its frame is leaked, not resumed).
  bool stop();
  /// Where the scheduler is in its lifecycle; thread-safe.
  Health health() const noexcept;
  /// Options::name.
  const std::string& name() const noexcept;

  /// Thread-safe. Runs `fn` on the scheduler thread.
  void post(std::function<void()> fn);
  /// Thread-safe. Resumes `h` on the scheduler thread.
  void post(std::coroutine_handle<> h);
  /// True on the scheduler's own thread: where control code, channels and semaphores must run.
  bool running_in_this_thread() const noexcept;
  /// For services that drive Asio I/O on this thread (sockets, timers); see asio_await.hpp.
  asio::io_context& io_context() noexcept;

  /// Starts `task` on the scheduler, detached. A failure is recorded (first_error) and logged.
  void spawn(Task<void> task);
  /// The first failure of a spawned task (cancellation is not one) or of the scheduler thread
  /// itself; null when none. Thread-safe.
  std::exception_ptr first_error() const;

  /// A task suspended on this scheduler: what it awaits, and for how long so far.
  struct SuspendedWait {
    std::string what;                  ///< e.g. "stream 'compute' after 'backward h.3'"
    std::chrono::nanoseconds waited{};  ///< since it suspended
  };
  /// The pending waits of this scheduler's tasks (an event, a timer, a socket, a channel, a
  /// semaphore), longest first, for hang dumps. Thread-safe; a task awaiting another task is
  /// listed by the wait at the bottom of its chain.
  std::vector<SuspendedWait> suspended() const;
  /// @cond INTERNAL
  const std::shared_ptr<detail::WaitRegistry>& wait_registry() const noexcept;
  /// @endcond

  /// Runs `task` on the scheduler and blocks the calling (non-scheduler) thread until it ends.
  template <class T>
  T sync_wait(Task<T> task);

  /// The token every spawned and sync_waited task inherits; requested by stop().
  std::stop_token stop_token() const noexcept { return root_stop_.get_token(); }

  /// Awaitable that resumes after `d` on the scheduler; cancellable.
  struct SleepAwaiter;

 private:
  friend struct SleepAwaiter;
  struct Impl;
  void launch(Task<void> task, std::function<void(std::exception_ptr)> done);
  std::unique_ptr<Impl> impl_;
  std::stop_source root_stop_;
};

/// Suspends the current task for `d` (resumes on its scheduler). Throws Errc::cancelled if asked
/// to stop meanwhile.
struct Scheduler::SleepAwaiter {
  std::chrono::nanoseconds duration;       ///< how long to sleep
  std::shared_ptr<detail::Waiter> waiter;  ///< set when suspended: the timer's wait

  /// @cond INTERNAL
  bool await_ready() const noexcept { return false; }
  template <class P>
  void await_suspend(std::coroutine_handle<P> h) {
    start(detail::scheduler_of(h, "sleep_for"), h, detail::stop_token_of(h));
  }
  void await_resume() const { waiter->rethrow_if_failed(); }
  /// @endcond

 private:
  void start(Scheduler& s, std::coroutine_handle<> h, const std::stop_token& token);
};

/// `co_await sleep_for(d)` suspends the current task for `d`; see Scheduler::SleepAwaiter.
inline Scheduler::SleepAwaiter sleep_for(std::chrono::nanoseconds d) { return {d, nullptr}; }

/// Resumes the current task from the scheduler's queue, letting other ready work run first.
struct yield_now {
  /// @cond INTERNAL
  bool await_ready() const noexcept { return false; }
  template <class P>
  void await_suspend(std::coroutine_handle<P> h) {
    detail::scheduler_of(h, "yield_now").post(std::coroutine_handle<>(h));
  }
  void await_resume() const noexcept {}
  /// @endcond
};

/// Throws Errc::cancelled when the current task was asked to stop.
struct check_cancelled {
  /// @cond INTERNAL
  bool stop = false;
  bool await_ready() const noexcept { return false; }
  template <class P>
  bool await_suspend(std::coroutine_handle<P> h) noexcept {
    stop = detail::stop_token_of(h).stop_requested();
    return false;
  }
  void await_resume() const {
    if (stop) detail::throw_cancelled("check_cancelled");
  }
  /// @endcond
};

template <class T>
T Scheduler::sync_wait(Task<T> task) {
  if (running_in_this_thread()) {
    throw Error(Errc::invalid_argument, "sync_wait called on the scheduler thread of '" + name() +
                                            "': it would deadlock; co_await the task instead");
  }
  std::mutex m;
  std::condition_variable cv;
  bool finished = false;
  std::exception_ptr error;
  std::optional<std::conditional_t<std::is_void_v<T>, char, T>> result;
  auto body = [](Task<T> t, auto* out) -> Task<void> {
    if constexpr (std::is_void_v<T>) {
      co_await std::move(t);
    } else {
      out->emplace(co_await std::move(t));
    }
  };
  launch(body(std::move(task), &result), [&](std::exception_ptr e) {
    std::lock_guard lock(m);
    error = std::move(e);  // no reference stays behind on the scheduler thread
    finished = true;
    cv.notify_all();
  });
  std::unique_lock lock(m);
  cv.wait(lock, [&] { return finished; });
  if (error) std::rethrow_exception(error);
  if constexpr (!std::is_void_v<T>) return std::move(*result);
}

}  // namespace coshard
