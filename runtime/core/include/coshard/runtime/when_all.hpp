#pragma once
// Structured concurrency over tasks on one scheduler: when_all runs children concurrently and
// returns all results (the first failure cancels the siblings, waits for them, then is rethrown);
// when_any returns the first to finish and cancels and waits for the rest. A stop request on the
// parent reaches every child.
#include <atomic>
#include <cstddef>
#include <exception>
#include <optional>
#include <stop_token>
#include <tuple>
#include <variant>
#include <vector>

#include "coshard/runtime/task.hpp"

namespace coshard {

/// The result type of a Task<T> in a combinator: T, or std::monostate for void.
template <class T>
using value_or_monostate = std::conditional_t<std::is_void_v<T>, std::monostate, T>;

namespace detail {

/// Shared by the children of one combinator: counts them down and resumes the parent.
struct Join {
  std::atomic<std::size_t> remaining;
  std::coroutine_handle<> parent;
  std::stop_source stop;
  std::exception_ptr first_error;
  std::optional<std::size_t> first_done;  ///< when_any: index of the winner
  bool cancel_on_first_done = false;

  explicit Join(std::size_t n) : remaining(n + 1) {}  // +1: the parent's own arrival after starting all

  void child_done(std::size_t index, std::exception_ptr error) {
    if (!first_done) {
      first_done = index;
      if (cancel_on_first_done) stop.request_stop();
    }
    if (error && !first_error) {
      first_error = error;
      stop.request_stop();
    }
  }
  bool arrive() noexcept { return remaining.fetch_sub(1, std::memory_order_acq_rel) == 1; }
};

class JoinChild {
 public:
  struct promise_type : PromiseBase {
    Join* join = nullptr;
    JoinChild get_return_object() noexcept {
      return JoinChild(std::coroutine_handle<promise_type>::from_promise(*this));
    }
    struct Final {
      bool await_ready() noexcept { return false; }
      std::coroutine_handle<> await_suspend(std::coroutine_handle<promise_type> h) noexcept {
        Join* j = h.promise().join;
        return j->arrive() ? j->parent : std::noop_coroutine();
      }
      void await_resume() noexcept {}
    };
    Final final_suspend() noexcept { return {}; }
    void return_void() noexcept {}
  };
  JoinChild(JoinChild&& o) noexcept : h_(std::exchange(o.h_, {})) {}
  JoinChild(const JoinChild&) = delete;
  JoinChild& operator=(const JoinChild&) = delete;
  JoinChild& operator=(JoinChild&&) = delete;
  ~JoinChild() {
    if (h_) h_.destroy();
  }
  void start(Join& j, Scheduler* s) {
    h_.promise().join = &j;
    h_.promise().set_context(TaskContext{s, j.stop.get_token()});
    h_.resume();
  }

 private:
  explicit JoinChild(std::coroutine_handle<promise_type> h) : h_(h) {}
  std::coroutine_handle<promise_type> h_;
};

template <class T>
JoinChild run_child(Task<T> task, std::optional<value_or_monostate<T>>& slot, Join& join, std::size_t index) {
  std::exception_ptr error;
  try {
    if constexpr (std::is_void_v<T>) {
      co_await std::move(task);
      slot.emplace();
    } else {
      slot.emplace(co_await std::move(task));
    }
  } catch (...) {
    error = std::current_exception();
  }
  join.child_done(index, error);
}

/// Starts all children and suspends the parent until every one has finished.
struct JoinAwaiter {
  Join& join;
  std::vector<JoinChild>& children;
  bool await_ready() const noexcept { return children.empty(); }
  template <class P>
  bool await_suspend(std::coroutine_handle<P> parent) {
    join.parent = parent;
    Scheduler* s = nullptr;
    std::stop_token parent_stop;
    if constexpr (is_coshard_promise<P>) {
      s = parent.promise().context().scheduler;
      parent_stop = parent.promise().context().stop;
    }
    if (parent_stop.stop_requested()) join.stop.request_stop();
    link.emplace(parent_stop, StopLink{&join.stop});
    for (auto& c : children) c.start(join, s);
    return !join.arrive();
  }
  void await_resume() noexcept { link.reset(); }

  struct StopLink {
    std::stop_source* target;
    void operator()() const noexcept { target->request_stop(); }
  };
  std::optional<std::stop_callback<StopLink>> link;
};

}  // namespace detail

/// Runs every task concurrently; returns their results in order (void becomes std::monostate).
template <class... Ts>
Task<std::tuple<value_or_monostate<Ts>...>> when_all(Task<Ts>... tasks) {
  detail::Join join(sizeof...(Ts));
  std::tuple<std::optional<value_or_monostate<Ts>>...> slots;
  std::vector<detail::JoinChild> children;
  children.reserve(sizeof...(Ts));
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    (children.push_back(detail::run_child(std::move(tasks), std::get<I>(slots), join, I)), ...);
  }(std::index_sequence_for<Ts...>{});
  co_await detail::JoinAwaiter{join, children, {}};
  if (join.first_error) std::rethrow_exception(join.first_error);
  co_return std::apply([](auto&... s) { return std::tuple<value_or_monostate<Ts>...>(std::move(*s)...); }, slots);
}

/// Runs every task of `tasks` concurrently; returns their results in order, like the variadic form.
template <class T>
Task<std::vector<value_or_monostate<T>>> when_all(std::vector<Task<T>> tasks) {
  detail::Join join(tasks.size());
  std::vector<std::optional<value_or_monostate<T>>> slots(tasks.size());
  std::vector<detail::JoinChild> children;
  children.reserve(tasks.size());
  for (std::size_t i = 0; i < tasks.size(); ++i) {
    children.push_back(detail::run_child(std::move(tasks[i]), slots[i], join, i));
  }
  co_await detail::JoinAwaiter{join, children, {}};
  if (join.first_error) std::rethrow_exception(join.first_error);
  std::vector<value_or_monostate<T>> out;
  out.reserve(slots.size());
  for (auto& s : slots) out.push_back(std::move(*s));
  co_return out;
}

/// Returns the result of whichever task finishes first, as a variant indexed like the arguments;
/// the others are cancelled and awaited (their cancellation errors are dropped). If the first to
/// finish failed, its error is rethrown.
template <class... Ts>
Task<std::variant<value_or_monostate<Ts>...>> when_any(Task<Ts>... tasks) {
  static_assert(sizeof...(Ts) > 0);
  detail::Join join(sizeof...(Ts));
  join.cancel_on_first_done = true;
  std::tuple<std::optional<value_or_monostate<Ts>>...> slots;
  std::vector<std::exception_ptr> errors(sizeof...(Ts));
  std::vector<detail::JoinChild> children;
  children.reserve(sizeof...(Ts));
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    (children.push_back(detail::run_child(std::move(tasks), std::get<I>(slots), join, I)), ...);
  }(std::index_sequence_for<Ts...>{});
  co_await detail::JoinAwaiter{join, children, {}};
  using Out = std::variant<value_or_monostate<Ts>...>;
  std::optional<Out> out;
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    ((I == *join.first_done && std::get<I>(slots) ? (out.emplace(std::in_place_index<I>, std::move(*std::get<I>(slots))), 0) : 0), ...);
  }(std::index_sequence_for<Ts...>{});
  if (!out) std::rethrow_exception(join.first_error);
  co_return std::move(*out);
}

}  // namespace coshard
