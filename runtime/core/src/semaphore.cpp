#include "coshard/runtime/semaphore.hpp"

#include <algorithm>

#include "coshard/runtime/scheduler.hpp"

namespace coshard {

bool Semaphore::try_acquire() noexcept {
  if (permits_ == 0 || !waiters_.empty()) return false;
  --permits_;
  return true;
}

void Semaphore::enqueue(AcquireAwaiter& a, Scheduler& s, std::coroutine_handle<> h, const std::stop_token& token) {
  if (!s.running_in_this_thread()) {
    throw Error(Errc::invalid_argument, "Semaphore used off its scheduler thread; it is not thread-safe");
  }
  if (token.stop_requested()) detail::throw_cancelled("Semaphore::acquire");
  a.waiter = std::make_shared<detail::Waiter>(s, h, "Semaphore::acquire");
  waiters_.push_back(a.waiter);
  a.waiter->arm(token, [this, w = a.waiter.get()] {
    auto it = std::find_if(waiters_.begin(), waiters_.end(), [w](const auto& p) { return p.get() == w; });
    if (it != waiters_.end()) waiters_.erase(it);
  });
}

void Semaphore::release(std::size_t n) {
  while (n > 0 && !waiters_.empty()) {
    auto w = std::move(waiters_.front());
    waiters_.pop_front();
    if (w->complete()) --n;  // a waiter cancelled meanwhile does not take the permit
  }
  permits_ += n;
}

}  // namespace coshard
