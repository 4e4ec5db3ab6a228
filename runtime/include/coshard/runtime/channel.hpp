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
  explicit Channel(std::size_t capacity) : capacity_(capacity) {}
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

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
      waiter = std::make_shared<RecvWaiter>(s, h);
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
      waiter = std::make_shared<SendWaiter>(s, h);
      waiter->value = std::move(value);
      ch.senders_.push_back(waiter);
      waiter->arm(token, [c = &ch, w = waiter.get()] { erase(c->senders_, w); });
    }
    void await_resume() const {
      if (waiter) waiter->rethrow_if_failed();
    }
  };

  RecvAwaiter recv() { return RecvAwaiter{*this}; }
  SendAwaiter send(T value) { return SendAwaiter{*this, std::move(value)}; }

  /// Non-suspending variants; try_send leaves `value` untouched when it returns false.
  bool try_send(T& value) {
    throw_if_closed();
    while (!receivers_.empty()) {
      auto w = std::move(receivers_.front());
      receivers_.pop_front();
      w->slot = std::move(value);
      if (w->complete()) return true;
      value = std::move(*w->slot);  ///< that receiver was cancelled: take the value back
    }
    if (buffer_.size() < capacity_) {
      buffer_.push_back(std::move(value));
      return true;
    }
    return false;
  }
  std::optional<T> try_recv() {
    std::optional<T> out;
    if (!buffer_.empty()) {
      out.emplace(std::move(buffer_.front()));
      buffer_.pop_front();
    }
    /// Refill from a suspended sender: into the buffer, or straight out when unbuffered.
    while (!senders_.empty() && (buffer_.size() < capacity_ || !out)) {
      auto w = std::move(senders_.front());
      senders_.pop_front();
      if (!w->complete()) continue;  ///< cancelled: its value was never sent
      if (out) {
        buffer_.push_back(std::move(*w->value));
      } else {
        out.emplace(std::move(*w->value));
      }
    }
    return out;
  }

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
  bool closed() const noexcept { return closed_; }
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
