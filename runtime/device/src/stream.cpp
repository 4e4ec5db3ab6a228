#include "coshard/runtime/stream.hpp"

#include "coshard/runtime/error.hpp"
#include "coshard/runtime/scheduler.hpp"

namespace coshard {

Stream::~Stream() = default;

void Stream::enqueue(std::function<void()> work, std::string span) {
  impl_->note_enqueued(span);
  impl_->enqueue(std::move(work), std::move(span));
}

namespace detail {

void StreamImpl::note_enqueued(const std::string& span) {
  std::lock_guard lock(note_m_);
  ++enqueued_;
  if (!span.empty()) last_span_ = span;
}

std::string StreamImpl::describe_point() {
  std::lock_guard lock(note_m_);
  std::string s = "stream '" + name() + "'";
  if (enqueued_ == 0) return s + " (nothing enqueued yet)";
  s += " after work item " + std::to_string(enqueued_);
  return last_span_.empty() ? s : s + " (last labelled '" + last_span_ + "')";
}

}  // namespace detail

void Stream::wait(const Event& event) {
  if (!event.recorded()) {
    throw Error(Errc::invalid_argument, "stream '" + name() + "' asked to wait on an event that was never recorded",
                op_context("stream " + name()));
  }
  if (event.device() != device()) {
    throw Error(Errc::invalid_argument,
                "stream '" + name() + "' on " + device().to_string() + " cannot wait on an event of " +
                    event.device().to_string() + "; record the event on a stream of the same device",
                op_context("stream " + name()));
  }
  impl_->wait(event.point());
}

void Stream::synchronize(std::chrono::nanoseconds limit) {
  auto point = impl_->record();
  if (!point->block_until_ready(limit)) {
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(limit).count();
    throw Error(Errc::timeout, "stream '" + name() + "' did not drain within " + std::to_string(ms) + " ms",
                op_context("stream " + name()));
  }
  if (auto e = point->error()) std::rethrow_exception(e);
}

void Event::record(Stream& stream) {
  if (stream.device() != device_) {
    throw Error(Errc::invalid_argument, "event of " + device_.to_string() + " recorded on stream '" + stream.name() +
                                            "' of " + stream.device().to_string());
  }
  point_ = stream.impl().record();
  point_->what = stream.impl().describe_point();
}

static void throw_unrecorded(const char* what) {
  throw Error(Errc::invalid_argument,
              std::string(what) + " on an event that was never recorded; record() it on a stream first");
}

bool Event::query() const {
  if (!point_) throw_unrecorded("query");
  return point_->ready();
}

std::exception_ptr Event::error() const { return point_ ? point_->error() : nullptr; }

Event::Awaiter Event::operator co_await() const {
  if (!point_) throw_unrecorded("co_await");
  return Awaiter{point_};
}

bool Event::Awaiter::await_ready() const { return point->ready(); }

void Event::Awaiter::start(Scheduler& s, std::coroutine_handle<> h, const std::stop_token& token) {
  if (token.stop_requested()) detail::throw_cancelled("co_await Event");
  waiter = std::make_shared<detail::Waiter>(s, h, point->what);
  waiter->arm(token);
  point->notify(waiter);
}

void Event::Awaiter::await_resume() const {
  if (waiter) {
    waiter->rethrow_if_failed();  // cancellation, or the stream's error
  } else if (auto e = point->error()) {
    std::rethrow_exception(e);
  }
}

}  // namespace coshard
