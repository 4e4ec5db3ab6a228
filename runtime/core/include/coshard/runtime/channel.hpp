#pragma once
// A bounded async channel between tasks on one scheduler. send() suspends while the buffer is
// full, recv() while it is empty; after close(), recv() drains what is buffered and then yields
// std::nullopt, and send() throws. Capacity 0 makes every send a rendezvous with a receiver.
#include <cstddef>
#include <deque>
#include <memory>
#include <optional>

#include "coshard/runtime/error.hpp"
#include "coshard/runtime/scheduler.hpp"
#include "coshard/runtime/waiter.hpp"

namespace coshard {

/// A bounded async queue of T between tasks on one scheduler thread; not thread-safe.
template <class T>
class Channel {
  struct RecvWaiter final : detail::Waiter {
    using Waiter::Waiter;
    std::optional<T> slot;
  };
  struct SendWaiter final : detail::Waiter {
    using Waiter::Waiter;
    std::optional<T> value;
  };

 public:
  /// A channel buffering up to `capacity` values; 0 makes every send wait for a receiver.
  explicit Channel(std::size_t capacity) : capacity_(capacity) {}
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  /// @cond INTERNAL
  struct RecvAwaiter {
    Channel& ch;
    std::optional<T> ready{};
    std::shared_ptr<RecvWaiter> waiter{};
    bool await_ready() {
      ready = ch.try_recv();
      return ready.has_value() || ch.closed_;
    }
    template <class P>
    void await_suspend(std::coroutine_handle<P> h) {
      auto& s = detail::scheduler_of(h, "Channel::recv");
      auto token = detail::stop_token_of(h);
      ch.check_thread(s);
      if (token.stop_requested()) detail::throw_cancelled("Channel::recv");
      waiter = std::make_shared<RecvWaiter>(s, h, "Channel::recv");
      ch.receivers_.push_back(waiter);
      waiter->arm(token, [c = &ch, w = waiter.get()] { erase(c->receivers_, w); });
    }
    std::optional<T> await_resume() {
      if (!waiter) return std::move(ready);
      waiter->rethrow_if_failed();
      return std::move(waiter->slot);
    }
  };

  struct SendAwaiter {
    Channel& ch;
    std::optional<T> value;
    std::shared_ptr<SendWaiter> waiter{};
    bool await_ready() {
      ch.throw_if_closed();
      return ch.try_send(*value);
    }
    template <class P>
    void await_suspend(std::coroutine_handle<P> h) {
      auto& s = detail::scheduler_of(h, "Channel::send");
      auto token = detail::stop_token_of(h);
      ch.check_thread(s);
      if (token.stop_requested()) detail::throw_cancelled("Channel::send");
      waiter = std::make_shared<SendWaiter>(s, h, "Channel::send (full)");
      waiter->value = std::move(value);
      ch.senders_.push_back(waiter);
      waiter->arm(token, [c = &ch, w = waiter.get()] { erase(c->senders_, w); });
    }
    void await_resume() const {
      if (waiter) waiter->rethrow_if_failed();
    }
  };
  /// @endcond

  /// `co_await ch.recv()` yields the next value, suspending while the channel is empty; std::nullopt
  /// once it is closed and drained. Throws Errc::cancelled if the task is asked to stop meanwhile.
  RecvAwaiter recv() { return RecvAwaiter{*this}; }
  /// `co_await ch.send(v)` queues `v`, suspending while the buffer is full. Throws
  /// Errc::invalid_argument when the channel is (or becomes) closed, or Errc::cancelled if the
  /// task is asked to stop meanwhile.
  SendAwaiter send(T value) { return SendAwaiter{*this, std::move(value)}; }

  /// Non-suspending send: hands `value` to a waiting receiver or the buffer. Returns false, leaving
  /// `value` untouched, when neither has room; throws when the channel is closed.
  bool try_send(T& value) {
    throw_if_closed();
    while (!receivers_.empty()) {
      auto w = std::move(receivers_.front());
      receivers_.pop_front();
      w->slot = std::move(value);
      if (w->complete()) return true;
      value = std::move(*w->slot);  // that receiver was cancelled: take the value back
    }
    if (buffer_.size() < capacity_) {
      buffer_.push_back(std::move(value));
      return true;
    }
    return false;
  }
  /// Takes a buffered value (or one from a suspended sender) without suspending; std::nullopt when
  /// there is none.
  std::optional<T> try_recv() {
    std::optional<T> out;
    if (!buffer_.empty()) {
      out.emplace(std::move(buffer_.front()));
      buffer_.pop_front();
    }
    // Refill from a suspended sender: into the buffer, or straight out when unbuffered.
    while (!senders_.empty() && (buffer_.size() < capacity_ || !out)) {
      auto w = std::move(senders_.front());
      senders_.pop_front();
      if (!w->complete()) continue;  // cancelled: its value was never sent
      if (out) {
        buffer_.push_back(std::move(*w->value));
      } else {
        out.emplace(std::move(*w->value));
      }
    }
    return out;
  }

  /// Ends the channel: waiting receivers get std::nullopt, waiting senders an error; later recv()s
  /// drain the buffer first, later send()s throw.
  void close() {
    closed_ = true;
    while (!receivers_.empty()) {
      auto w = std::move(receivers_.front());
      receivers_.pop_front();
      w->complete();
    }
    while (!senders_.empty()) {
      auto w = std::move(senders_.front());
      senders_.pop_front();
      w->complete(std::make_exception_ptr(closed_error()));
    }
  }
  /// True once close() was called.
  bool closed() const noexcept { return closed_; }
  /// The number of buffered values (not counting suspended senders).
  std::size_t size() const noexcept { return buffer_.size(); }

 private:
  template <class Q, class W>
  static void erase(Q& q, W* w) {
    for (auto it = q.begin(); it != q.end(); ++it) {
      if (it->get() == w) {
        q.erase(it);
        return;
      }
    }
  }
  static Error closed_error() { return Error(Errc::invalid_argument, "send on a closed channel"); }
  void throw_if_closed() const {
    if (closed_) throw closed_error();
  }
  void check_thread(Scheduler& s) const {
    if (!s.running_in_this_thread()) {
      throw Error(Errc::invalid_argument, "Channel used off its scheduler thread; it is not thread-safe");
    }
  }

  std::size_t capacity_;
  bool closed_ = false;
  std::deque<T> buffer_;
  std::deque<std::shared_ptr<RecvWaiter>> receivers_;
  std::deque<std::shared_ptr<SendWaiter>> senders_;
};

}  // namespace coshard
