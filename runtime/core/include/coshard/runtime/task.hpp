#pragma once
// Task<T>: a lazy, move-only coroutine. Awaiting it starts it and transfers control to it
// symmetrically (no stack growth over deep chains); its result or exception is delivered to the
// awaiter. The awaiting task's context (scheduler and stop token) is inherited by the awaited one,
// so cancellation and "resume on the owner's scheduler" flow down a chain without being passed.
#include <coroutine>
#include <exception>
#include <optional>
#include <stop_token>
#include <type_traits>
#include <utility>

namespace coshard {

class Scheduler;

/// What a running task carries: the scheduler it must resume on and the token that asks it to stop.
struct TaskContext {
  Scheduler* scheduler = nullptr;  ///< where the task resumes after an await; null outside a scheduler
  std::stop_token stop;            ///< asks the task to end early; its awaits then throw Errc::cancelled
};

namespace detail {

class PromiseBase {
 public:
  std::suspend_always initial_suspend() noexcept { return {}; }

  struct FinalAwaiter {
    bool await_ready() noexcept { return false; }
    template <class P>
    std::coroutine_handle<> await_suspend(std::coroutine_handle<P> h) noexcept {
      auto next = h.promise().continuation_;
      return next ? next : std::noop_coroutine();
    }
    void await_resume() noexcept {}
  };
  FinalAwaiter final_suspend() noexcept { return {}; }
  void unhandled_exception() noexcept { exception_ = std::current_exception(); }

  void set_continuation(std::coroutine_handle<> c) noexcept { continuation_ = c; }
  const TaskContext& context() const noexcept { return context_; }
  void set_context(TaskContext ctx) noexcept { context_ = std::move(ctx); }

 protected:
  void rethrow_if_failed() const {
    if (exception_) std::rethrow_exception(exception_);
  }

 private:
  std::coroutine_handle<> continuation_;
  TaskContext context_;
  std::exception_ptr exception_;
};

template <class P>
inline constexpr bool is_coshard_promise = std::is_base_of_v<PromiseBase, P>;

/// Copies the awaiting coroutine's context into the awaited promise when the awaiter is ours.
template <class Awaiting>
void inherit_context(std::coroutine_handle<Awaiting> awaiting, PromiseBase& child) noexcept {
  if constexpr (is_coshard_promise<Awaiting>) child.set_context(awaiting.promise().context());
}

}  // namespace detail

/// A lazy, move-only coroutine producing a T (or nothing). It starts when awaited and inherits the
/// awaiter's context; its result or exception comes out of the co_await.
template <class T = void>
class [[nodiscard]] Task {
 public:
  /// @cond INTERNAL
  struct promise_type : detail::PromiseBase {
    Task get_return_object() noexcept { return Task(std::coroutine_handle<promise_type>::from_promise(*this)); }
    template <class U>
      requires std::is_convertible_v<U&&, T>
    void return_value(U&& v) noexcept(std::is_nothrow_constructible_v<T, U&&>) {
      value_.emplace(std::forward<U>(v));
    }
    T take() {
      rethrow_if_failed();
      return std::move(*value_);
    }

   private:
    std::optional<T> value_;
  };
  /// @endcond
  using value_type = T;  ///< what `co_await task` yields

  /// An empty task: owns no coroutine, not valid().
  Task() noexcept = default;
  /// Moves the handle; the source no longer owns a coroutine.
  Task(Task&& o) noexcept : h_(std::exchange(o.h_, {})) {}
  /// Destroys the coroutine this task owns (if any), then takes over `o`'s.
  Task& operator=(Task&& o) noexcept {
    if (this != &o) {
      reset();
      h_ = std::exchange(o.h_, {});
    }
    return *this;
  }
  Task(const Task&) = delete;
  Task& operator=(const Task&) = delete;
  /// Destroys the coroutine frame, whether it ran or not.
  ~Task() { reset(); }

  /// True while the task owns a coroutine (not moved from or default-constructed).
  bool valid() const noexcept { return static_cast<bool>(h_); }
  /// True once the coroutine has finished, or when there is none.
  bool done() const noexcept { return !h_ || h_.done(); }

  /// @cond INTERNAL
  struct Awaiter {
    std::coroutine_handle<promise_type> h;
    bool await_ready() const noexcept { return !h || h.done(); }
    template <class P>
    std::coroutine_handle<> await_suspend(std::coroutine_handle<P> awaiting) noexcept {
      detail::inherit_context(awaiting, h.promise());
      h.promise().set_continuation(awaiting);
      return h;
    }
    T await_resume() { return h.promise().take(); }
  };
  /// @endcond
  /// `co_await std::move(task)` starts the task with the awaiter's context and resumes the awaiter
  /// when it ends, yielding its value or rethrowing its exception.
  Awaiter operator co_await() && noexcept { return Awaiter{h_}; }

  /// For combinators: the handle stays owned by this Task.
  std::coroutine_handle<promise_type> handle() const noexcept { return h_; }

 private:
  explicit Task(std::coroutine_handle<promise_type> h) noexcept : h_(h) {}
  void reset() noexcept {
    if (h_) std::exchange(h_, {}).destroy();
  }
  std::coroutine_handle<promise_type> h_;
};

/// @cond INTERNAL
template <>
struct Task<void>::promise_type : detail::PromiseBase {
  Task get_return_object() noexcept { return Task(std::coroutine_handle<promise_type>::from_promise(*this)); }
  void return_void() noexcept {}
  void take() { rethrow_if_failed(); }
};
/// @endcond

/// `co_await current_context()` yields the running task's context without suspending.
struct current_context {
  /// @cond INTERNAL
  TaskContext ctx;
  bool await_ready() const noexcept { return false; }
  template <class P>
    requires detail::is_coshard_promise<P>
  bool await_suspend(std::coroutine_handle<P> h) noexcept {
    ctx = h.promise().context();
    return false;
  }
  TaskContext await_resume() noexcept { return std::move(ctx); }
  /// @endcond
};

}  // namespace coshard
