#pragma once
// Bridges Asio's completion handlers to coshard tasks: `co_await asio_op(start, cancel)` starts an
// I/O operation on the scheduler's io_context and resumes the task with its (error_code, bytes).
// If the task is asked to stop, `cancel()` runs on the scheduler thread (e.g. socket.cancel()),
// so the operation ends before the task goes on and frees its buffers. Needs Asio: include it
// only from code that links it.
#include <asio/error.hpp>
#include <cstddef>
#include <memory>
#include <system_error>
#include <utility>

#include "coshard/runtime/scheduler.hpp"
#include "coshard/runtime/waiter.hpp"

namespace coshard {

/// How an Asio operation ended: what its completion handler received.
struct IoResult {
  std::error_code ec;     ///< the error Asio reported; false (no error) on success
  std::size_t bytes = 0;  ///< bytes transferred; 0 for operations that report none
};

namespace detail {
struct IoWaiter final : Waiter {
  using Waiter::Waiter;
  IoResult result;
};
}  // namespace detail

/// The awaitable that asio_op() returns; the task resumes on its scheduler with an IoResult.
template <class Start, class Cancel>
struct AsioOp {
  Start start;    ///< begins the operation, given the handler `(std::error_code, std::size_t = 0)`
  Cancel cancel;  ///< run on the scheduler thread when the task is asked to stop (e.g. socket.cancel())
  std::shared_ptr<detail::IoWaiter> waiter{};  ///< set when suspended: the operation's wait

  /// @cond INTERNAL
  bool await_ready() const noexcept { return false; }
  template <class P>
  void await_suspend(std::coroutine_handle<P> h) {
    auto& s = detail::scheduler_of(h, "Asio operation");
    auto token = detail::stop_token_of(h);
    if (token.stop_requested()) detail::throw_cancelled("Asio operation");
    waiter = std::make_shared<detail::IoWaiter>(s, h, "an Asio operation (socket or timer)");
    waiter->arm(token, [c = cancel]() mutable { c(); });
    start([w = waiter](std::error_code ec, std::size_t n = 0) {
      w->result = {ec, n};
      w->complete();
    });
  }
  IoResult await_resume() {
    waiter->rethrow_if_failed();
    return waiter->result;
  }
  /// @endcond
};

/// `co_await asio_op(start, cancel)` starts an Asio operation and yields its IoResult. If the task
/// is asked to stop, `cancel` runs on the scheduler thread first and the await throws
/// Errc::cancelled.
template <class Start, class Cancel>
AsioOp<Start, Cancel> asio_op(Start start, Cancel cancel) {
  return {std::move(start), std::move(cancel)};
}

}  // namespace coshard
