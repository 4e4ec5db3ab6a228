// CPU backend: a stream is an in-order worker thread with a queue; a recorded point is a flag with
// waiters that the worker sets when it reaches it.
#include <atomic>
#include <cstdint>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <variant>
#include <vector>

#include "coshard/runtime/discrete_memory.hpp"
#include "coshard/runtime/error.hpp"
#include "coshard/runtime/stream.hpp"

namespace coshard {
namespace {

class CpuCompletion final : public detail::Completion {
 public:
  explicit CpuCompletion(std::shared_ptr<const std::string> stream) : source(std::move(stream)) {}
  const std::shared_ptr<const std::string> source;  // the recording stream's name, for stalls()
  bool ready() const override {
    std::lock_guard lock(m_);
    return done_;
  }
  std::exception_ptr error() const override {
    std::lock_guard lock(m_);
    return error_;
  }
  void notify(std::shared_ptr<detail::Waiter> w) override {
    std::unique_lock lock(m_);
    if (!done_) {
      waiters_.push_back(std::move(w));
      return;
    }
    auto e = error_;
    lock.unlock();
    w->complete(e);
  }
  bool block_until_ready(std::chrono::nanoseconds limit) override {
    std::unique_lock lock(m_);
    return cv_.wait_for(lock, limit, [&] { return done_; });
  }
  // No deadline needed: every recorded point is reached, because a stream always drains its
  // queue (failed work is skipped, not stuck) before its thread exits.
  void block() {
    std::unique_lock lock(m_);
    cv_.wait(lock, [&] { return done_; });
  }
  void finish(std::exception_ptr e) {
    std::vector<std::shared_ptr<detail::Waiter>> waiters;
    {
      std::lock_guard lock(m_);
      done_ = true;
      error_ = e;
      waiters.swap(waiters_);
    }
    cv_.notify_all();
    for (auto& w : waiters) w->complete(e);
  }

 private:
  mutable std::mutex m_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
  std::vector<std::shared_ptr<detail::Waiter>> waiters_;
};

class CpuStream final : public detail::StreamImpl {
  struct Work {
    std::function<void()> fn;
    std::string span;
  };
  struct Mark {
    std::shared_ptr<CpuCompletion> point;
  };
  struct Wait {
    std::shared_ptr<CpuCompletion> point;
  };
  struct Reset {};
  using Item = std::variant<Work, Mark, Wait, Reset>;

 public:
  CpuStream(Device device, std::string name, Stream::Options options)
      : device_(device),
        name_(std::move(name)),
        options_(options),
        shared_name_(std::make_shared<const std::string>(name_)),
        jitter_(options.jitter_seed ^ std::hash<std::string>{}(name_)) {
    worker_ = std::thread([this] { run(); });
  }
  ~CpuStream() override {
    {
      std::lock_guard lock(m_);
      closing_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }

  Device device() const noexcept override { return device_; }
  const std::string& name() const noexcept override { return name_; }

  std::shared_ptr<detail::Completion> record() override {
    auto p = std::make_shared<CpuCompletion>(shared_name_);
    push(Mark{p});
    return p;
  }
  void wait(std::shared_ptr<detail::Completion> c) override {
    auto p = std::dynamic_pointer_cast<CpuCompletion>(std::move(c));
    if (!p) throw Error(Errc::invalid_argument, "CPU stream '" + name_ + "' cannot wait on a non-CPU event");
    push(Wait{std::move(p)});
  }
  void enqueue(std::function<void()> work, std::string span) override {
    push(Work{std::move(work), std::move(span)});
  }
  void reset() override { push(Reset{}); }
  std::chrono::nanoseconds busy() const noexcept override {
    return std::chrono::nanoseconds(busy_ns_.load(std::memory_order_relaxed));
  }
  std::chrono::nanoseconds stalled() const noexcept override {
    return std::chrono::nanoseconds(stalled_ns_.load(std::memory_order_relaxed));
  }
  std::map<std::string, std::chrono::nanoseconds> stalls() const override {
    std::lock_guard lock(stalls_m_);
    return stalls_;
  }

 private:
  void push(Item item) {
    {
      std::lock_guard lock(m_);
      queue_.push_back(std::move(item));
      queued_.fetch_add(1, std::memory_order_release);
    }
    cv_.notify_one();
  }

  void run() {
    for (;;) {
      Item item;
      if (queued_.load(std::memory_order_acquire) == 0) close_gate();  // idle: the host must not see memory open
      poll_briefly();
      {
        std::unique_lock lock(m_);
        cv_.wait(lock, [&] { return closing_ || !queue_.empty(); });
        if (queue_.empty()) {  // closing and drained
          close_gate();
          return;
        }
        item = std::move(queue_.front());
        queue_.pop_front();
        queued_.fetch_sub(1, std::memory_order_relaxed);
      }
      std::visit([this](auto& it) { execute(it); }, item);
    }
  }

  // Same trade-off as the scheduler: a short yielding poll before sleeping saves a futex wake-up
  // per item while work is flowing, and costs nothing once the stream is idle.
  void poll_briefly() {
    auto until = std::chrono::steady_clock::now() + kPollBeforeSleep;
    while (queued_.load(std::memory_order_acquire) == 0 && std::chrono::steady_clock::now() < until) {
      std::this_thread::yield();
    }
  }

  void execute(Work& w) {
    ++items_;
    if (poison_) return;
    if (options_.jitter.count() > 0) {
      close_gate();  // a delay is a gap in which the host's accesses are caught
      std::uniform_int_distribution<std::int64_t> us(0, options_.jitter.count());
      std::this_thread::sleep_for(std::chrono::microseconds(us(jitter_)));
    }
    open_gate();
    const auto begin = std::chrono::steady_clock::now();
    struct Account {  // adds the item's time even when it throws
      std::atomic<std::int64_t>& total;
      std::chrono::steady_clock::time_point begin;
      ~Account() { total.fetch_add((std::chrono::steady_clock::now() - begin).count(), std::memory_order_relaxed); }
    } account{busy_ns_, begin};
    try {
      w.fn();
      if (!w.span.empty() && options_.telemetry && options_.telemetry->tracing()) {
        options_.telemetry->span({std::move(w.span), {}, name_, options_.rank, begin, std::chrono::steady_clock::now()});
      }
    } catch (const Error& e) {
      poison_ = std::make_exception_ptr(e.with_context(op_context(where(w))));
    } catch (const std::exception& e) {
      poison_ = std::make_exception_ptr(Error(Errc::device, what(w) + " failed: " + e.what(), op_context(where(w))));
    } catch (...) {
      poison_ = std::make_exception_ptr(Error(Errc::device, what(w) + " threw", op_context(where(w))));
    }
  }
  // "work item 12 ('forward h.3') on stream 'compute'": the operation, when the work was named.
  std::string what(const Work& w) const {
    return "work item " + std::to_string(items_) + (w.span.empty() ? "" : " ('" + w.span + "')") + " on stream '" +
           name_ + "'";
  }
  std::string where(const Work& w) const { return "stream " + name_ + (w.span.empty() ? "" : ": " + w.span); }
  void execute(Reset&) { poison_ = nullptr; }
  // Device memory is open while the worker has work in hand, and closed whenever it may block, so
  // that the gaps in which the host runs alone are as wide as the work allows.
  void open_gate() noexcept {
    if (options_.gate && !gate_held_) {
      options_.gate->open();
      gate_held_ = true;
    }
  }
  void close_gate() noexcept {
    if (gate_held_) {
      options_.gate->close();
      gate_held_ = false;
    }
  }
  void execute(Mark& m) {
    // The host may resume on this point and touch memory at once: close first when idle.
    if (queued_.load(std::memory_order_acquire) == 0) close_gate();
    m.point->finish(poison_);
  }
  void execute(Wait& w) {
    if (poison_) return;
    if (!w.point->ready()) {
      close_gate();
      const auto begin = std::chrono::steady_clock::now();
      w.point->block();
      const auto stalled = std::chrono::steady_clock::now() - begin;
      stalled_ns_.fetch_add(stalled.count(), std::memory_order_relaxed);
      std::lock_guard lock(stalls_m_);
      stalls_[*w.point->source] += stalled;
    }
    if (auto e = w.point->error()) poison_ = e;  // an upstream failure flows downstream
  }

  Device device_;
  std::string name_;
  Stream::Options options_;
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  bool closing_ = false;
  std::atomic<std::size_t> queued_{0};
  std::atomic<std::int64_t> busy_ns_{0};
  std::atomic<std::int64_t> stalled_ns_{0};
  std::shared_ptr<const std::string> shared_name_;
  mutable std::mutex stalls_m_;
  std::map<std::string, std::chrono::nanoseconds> stalls_;  // only stalls, so rarely touched
  static constexpr std::chrono::microseconds kPollBeforeSleep{50};
  // Worker-thread state only:
  std::exception_ptr poison_;
  std::size_t items_ = 0;
  bool gate_held_ = false;
  std::mt19937_64 jitter_;
  std::thread worker_;
};

}  // namespace

Stream Stream::cpu(Device device, std::string name) { return cpu(device, std::move(name), Options{}); }

Stream Stream::cpu(Device device, std::string name, Options options) {
  if (device.kind != DeviceKind::cpu) {
    throw Error(Errc::invalid_argument, "Stream::cpu needs a CPU device, got " + device.to_string());
  }
  return Stream(std::make_unique<CpuStream>(device, std::move(name), options));
}

}  // namespace coshard
