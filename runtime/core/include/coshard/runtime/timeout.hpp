#pragma once
// Deadlines: with_timeout runs a task against a timer. When the timer wins, the task is cancelled
// (and awaited, so nothing outlives the call) and a timeout error names the operation.
#include <chrono>
#include <string>

#include "coshard/runtime/error.hpp"
#include "coshard/runtime/scheduler.hpp"
#include "coshard/runtime/when_all.hpp"

namespace coshard {

namespace detail {
inline Task<void> sleep_task(std::chrono::nanoseconds d) { co_await sleep_for(d); }
[[noreturn]] void throw_timeout(const std::string& op, std::chrono::nanoseconds limit);
}  // namespace detail

/// Runs `task` with a deadline of `limit`: its result if it ends first, otherwise it is cancelled,
/// awaited, and Errc::timeout is thrown naming `op`.
template <class T>
Task<T> with_timeout(Task<T> task, std::chrono::nanoseconds limit, std::string op) {
  auto r = co_await when_any(std::move(task), detail::sleep_task(limit));
  if (r.index() == 1) detail::throw_timeout(op, limit);
  if constexpr (!std::is_void_v<T>) co_return std::get<0>(std::move(r));
}

}  // namespace coshard
