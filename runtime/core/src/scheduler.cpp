#include "coshard/runtime/scheduler.hpp"

#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>
#include <atomic>
#include <algorithm>

namespace coshard {
namespace {

// A detached coroutine that owns the task it drives and frees itself when done.
struct Detached {
  struct promise_type : detail::PromiseBase {
    Detached get_return_object() noexcept {
      return Detached{std::coroutine_handle<promise_type>::from_promise(*this)};
    }
    std::suspend_never final_suspend() noexcept { return {}; }
    void return_void() noexcept {}
  };
  std::coroutine_handle<promise_type> handle;
};

}  // namespace

struct Scheduler::Impl {
  Options options;
  asio::io_context io{1};
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> guard;
  std::thread thread;
  std::atomic<std::thread::id> thread_id{};
  std::atomic<Health> health{Health::created};

  std::mutex m;  // guards live and first_error; taken off the hot path only
  std::condition_variable cv;
  std::size_t live = 0;
  std::exception_ptr first_error;
  std::shared_ptr<detail::WaitRegistry> waits = std::make_shared<detail::WaitRegistry>();

  void run_loop() {
    using clock = std::chrono::steady_clock;
    auto last_work = clock::now();
    while (!io.stopped()) {
      if (io.poll() > 0) {
        last_work = clock::now();
      } else if (clock::now() - last_work < options.poll_before_sleep) {
        std::this_thread::yield();
      } else if (io.run_one() > 0) {
        last_work = clock::now();
      }
    }
  }

  static Detached drive(Task<void> task, std::function<void(std::exception_ptr)> done, Impl* self) {
    std::exception_ptr error;
    {
      // The task's frame must be gone before `done` tells the owner: the frame may hold
      // references into the owner's stack (sync_wait), and must not outlive them.
      Task<void> owned = std::move(task);
      try {
        co_await std::move(owned);
      } catch (...) {
        error = std::current_exception();
      }
    }
    if (done) done(std::move(error));
    std::lock_guard lock(self->m);
    --self->live;
    self->cv.notify_all();
  }
};

Scheduler::Scheduler() : Scheduler(Options{}) {}
Scheduler::Scheduler(Options options) : impl_(std::make_unique<Impl>()) { impl_->options = std::move(options); }
Scheduler::~Scheduler() { stop(); }

const std::string& Scheduler::name() const noexcept { return impl_->options.name; }
Health Scheduler::health() const noexcept { return impl_->health.load(); }

void Scheduler::start() {
  if (impl_->health != Health::created) {
    throw Error(Errc::invalid_argument, "scheduler '" + name() + "' was already started; create a new one");
  }
  impl_->guard.emplace(impl_->io.get_executor());
  impl_->thread = std::thread([impl = impl_.get()] {
    impl->thread_id = std::this_thread::get_id();
    try {
      impl->run_loop();
    } catch (const std::exception& e) {
      // Control code must not throw out of a handler; if it does, the rank is broken.
      log(impl->options.log, LogLevel::error, "scheduler '" + impl->options.name + "' failed: " + e.what());
      impl->health = Health::failed;
      std::lock_guard lock(impl->m);
      if (!impl->first_error) impl->first_error = std::current_exception();
      impl->cv.notify_all();
    }
  });
  impl_->health = Health::running;
}

bool Scheduler::stop() {
  auto h = impl_->health.load();
  if (h == Health::created || h == Health::stopped) return true;
  if (running_in_this_thread()) {
    throw Error(Errc::invalid_argument, "Scheduler::stop called on its own thread; call it from the owner");
  }
  if (h == Health::running) impl_->health = Health::stopping;
  root_stop_.request_stop();
  bool drained;
  {
    std::unique_lock lock(impl_->m);
    drained = impl_->cv.wait_for(lock, impl_->options.drain_timeout, [&] { return impl_->live == 0; });
  }
  if (!drained) {
    log(impl_->options.log, LogLevel::error,
        "scheduler '" + name() + "': " + std::to_string(impl_->live) + " task(s) still running " +
            std::to_string(impl_->options.drain_timeout.count()) +
            " ms after stop was requested; abandoning them (an awaited operation ignored cancellation)");
    impl_->io.stop();
  }
  impl_->guard.reset();
  if (impl_->thread.joinable()) impl_->thread.join();
  if (impl_->health != Health::failed) impl_->health = Health::stopped;
  return drained;
}

void Scheduler::post(std::function<void()> fn) { asio::post(impl_->io, std::move(fn)); }
void Scheduler::post(std::coroutine_handle<> h) {
  asio::post(impl_->io, [h] { h.resume(); });
}

asio::io_context& Scheduler::io_context() noexcept { return impl_->io; }

bool Scheduler::running_in_this_thread() const noexcept {
  return impl_->thread_id.load(std::memory_order_relaxed) == std::this_thread::get_id();
}

void Scheduler::launch(Task<void> task, std::function<void(std::exception_ptr)> done) {
  if (impl_->health != Health::running) {
    throw Error(Errc::invalid_argument, "scheduler '" + name() + "' is not running: start() it first");
  }
  auto d = Impl::drive(std::move(task), std::move(done), impl_.get());
  d.handle.promise().set_context(TaskContext{this, root_stop_.get_token()});
  {
    std::lock_guard lock(impl_->m);
    ++impl_->live;
  }
  post(std::coroutine_handle<>(d.handle));
}

void Scheduler::spawn(Task<void> task) {
  launch(std::move(task), [impl = impl_.get()](std::exception_ptr e) {
    if (!e) return;
    try {
      std::rethrow_exception(e);
    } catch (const Error& err) {
      if (err.code() == Errc::cancelled) return;  // asked to stop: not a failure
      log(impl->options.log, LogLevel::error, std::string("spawned task failed: ") + err.what());
    } catch (const std::exception& err) {
      log(impl->options.log, LogLevel::error, std::string("spawned task failed: ") + err.what());
    } catch (...) {
      log(impl->options.log, LogLevel::error, "spawned task failed with a non-standard exception");
    }
    std::lock_guard lock(impl->m);
    if (!impl->first_error) impl->first_error = e;
  });
}

std::exception_ptr Scheduler::first_error() const {
  std::lock_guard lock(impl_->m);
  return impl_->first_error;
}

const std::shared_ptr<detail::WaitRegistry>& Scheduler::wait_registry() const noexcept { return impl_->waits; }

std::vector<Scheduler::SuspendedWait> Scheduler::suspended() const {
  const auto now = std::chrono::steady_clock::now();
  std::vector<SuspendedWait> out;
  {
    std::lock_guard lock(impl_->waits->m);
    for (const auto* w : impl_->waits->waits) {
      if (w->pending()) out.push_back({w->what(), now - w->since()});
    }
  }
  std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.waited > b.waited; });
  return out;
}

namespace {
std::string seconds_text(std::chrono::nanoseconds d) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g s", std::chrono::duration<double>(d).count());
  return buf;
}

struct TimerWaiter final : detail::Waiter {
  TimerWaiter(Scheduler& s, std::coroutine_handle<> h, asio::io_context& io, std::chrono::nanoseconds d)
      : Waiter(s, h, "sleep_for(" + seconds_text(d) + ")"), timer(io) {}
  asio::steady_timer timer;
};
}  // namespace

void Scheduler::SleepAwaiter::start(Scheduler& s, std::coroutine_handle<> h, const std::stop_token& token) {
  if (token.stop_requested()) detail::throw_cancelled("sleep_for");
  auto w = std::make_shared<TimerWaiter>(s, h, s.impl_->io, duration);
  waiter = w;
  w->timer.expires_after(duration);
  // The timer lives in the waiter; its handler runs on the scheduler thread.
  w->timer.async_wait([w](const std::error_code& ec) {
    if (!ec) w->complete();
  });
  w->arm(token, [w = w.get()] { w->timer.cancel(); });
}

}  // namespace coshard
