#include "coshard/runtime/waiter.hpp"

#include "coshard/runtime/error.hpp"
#include "coshard/runtime/scheduler.hpp"

namespace coshard::detail {

void throw_no_scheduler(const char* what) {
  throw Error(Errc::invalid_argument, std::string(what) +
                                          " awaited by a coroutine that has no scheduler: run it with "
                                          "Scheduler::spawn or sync_wait, or co_await it from such a task");
}

void throw_cancelled(const char* what) {
  throw Error(Errc::cancelled, std::string(what) + " cancelled: the awaiting task was asked to stop");
}

Waiter::Waiter(Scheduler& sched, std::coroutine_handle<> h, std::string what)
    : sched_(sched), registry_(sched.wait_registry()), handle_(h), what_(std::move(what)) {
  std::lock_guard lock(registry_->m);
  registry_->waits.insert(this);
}

Waiter::~Waiter() {
  std::lock_guard lock(registry_->m);
  registry_->waits.erase(this);
}

bool Waiter::complete(std::exception_ptr error) {
  int expected = 0;
  if (!state_.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) return false;
  error_ = std::move(error);
  resume_on_scheduler();
  return true;
}

void Waiter::arm(const std::stop_token& token, std::function<void()> on_cancel) {
  on_cancel_ = std::move(on_cancel);
  if (token.stop_possible()) stop_cb_.emplace(token, [this] { cancel_from_any_thread(); });
}

void Waiter::cancel_from_any_thread() {
  int expected = 0;
  if (!state_.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) return;
  error_ = std::make_exception_ptr(
      Error(Errc::cancelled, "wait cancelled: the awaiting task was asked to stop"));
  sched_.post([self = shared_from_this()] {
    if (self->on_cancel_) self->on_cancel_();
    self->stop_cb_.reset();
    self->handle_.resume();
  });
}

void Waiter::resume_on_scheduler() {
  sched_.post([self = shared_from_this()] {
    self->stop_cb_.reset();
    self->handle_.resume();
  });
}

}  // namespace coshard::detail
