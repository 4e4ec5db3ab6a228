#pragma once
// An async counting semaphore for tasks on one scheduler: acquire() suspends the task, never the
// thread. Waiters are served in FIFO order; a cancelled waiter leaves the queue.
#include <cstddef>
#include <deque>
#include <memory>

#include "coshard/runtime/waiter.hpp"

namespace coshard {

/// A counting semaphore whose acquire() suspends the task; use it on one scheduler thread only.
class Semaphore {
 public:
  /// A semaphore holding `permits` permits.
  explicit Semaphore(std::size_t permits) : permits_(permits) {}
  Semaphore(const Semaphore&) = delete;
  Semaphore& operator=(const Semaphore&) = delete;

  /// @cond INTERNAL
  struct AcquireAwaiter {
    Semaphore& sem;
    std::shared_ptr<detail::Waiter> waiter;
    bool await_ready() noexcept { return sem.try_acquire(); }
    template <class P>
    void await_suspend(std::coroutine_handle<P> h) {
      auto& s = detail::scheduler_of(h, "Semaphore::acquire");
      sem.enqueue(*this, s, h, detail::stop_token_of(h));
    }
    void await_resume() const {
      if (waiter) waiter->rethrow_if_failed();
    }
  };
  /// @endcond

  /// `co_await sem.acquire()` takes a permit, suspending in FIFO order until one is released.
  /// Throws Errc::cancelled if the task is asked to stop meanwhile (it then takes no permit).
  AcquireAwaiter acquire() noexcept { return AcquireAwaiter{*this, nullptr}; }
  /// Takes a permit if one is free and nobody is queued ahead; never suspends.
  bool try_acquire() noexcept;
  /// Hands the permit to the oldest waiter, or returns it to the pool.
  void release(std::size_t n = 1);
  /// Permits free right now.
  std::size_t available() const noexcept { return permits_; }
  /// Tasks suspended in acquire().
  std::size_t waiting() const noexcept { return waiters_.size(); }

 private:
  void enqueue(AcquireAwaiter& a, Scheduler& s, std::coroutine_handle<> h, const std::stop_token& token);
  std::size_t permits_;
  std::deque<std::shared_ptr<detail::Waiter>> waiters_;
};

}  // namespace coshard
