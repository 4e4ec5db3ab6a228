#include "stage_pipeline.hpp"

#include <algorithm>
#include <exception>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

namespace coshard::transport::detail {

SideThread::~SideThread() {
  {
    std::lock_guard lock(m_);
    stop_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

bool SideThread::ready(const LogSink& log) noexcept {
  if (thread_.joinable()) return true;
  if (unavailable_) return false;
  try {
    thread_ = std::thread([this] { loop(); });
    return true;
  } catch (const std::system_error& e) {
    coshard::log(log, LogLevel::warning, std::string("no thread for the overlapped two-level schedule (") + e.what() +
                                             "); its phases run one after another");
    unavailable_ = true;
    return false;
  }
}

void SideThread::run(std::function<void()> job) {
  {
    std::lock_guard lock(m_);
    job_ = std::move(job);
    idle_.store(false, std::memory_order_relaxed);
  }
  cv_.notify_one();
}

void SideThread::wait_idle() const noexcept {
  while (!idle_.load(std::memory_order_acquire)) idle_.wait(false, std::memory_order_acquire);
}

void SideThread::loop() {
  for (;;) {
    std::function<void()> job;
    {
      std::unique_lock lock(m_);
      cv_.wait(lock, [this] { return stop_ || job_; });
      if (!job_) return;
      job = std::exchange(job_, nullptr);
    }
    job();
    idle_.store(true, std::memory_order_release);
    idle_.notify_all();
  }
}

namespace {

Error as_error(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const Error& x) {
    return x;
  } catch (const std::exception& x) {
    return Error(Errc::internal, x.what());
  } catch (...) {
    return Error(Errc::internal, "unknown exception in a two-level schedule");
  }
}

bool is_timeout(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const Error& x) {
    return x.code() == Errc::timeout;
  } catch (...) {
    return false;
  }
}

// For the life of the overlap: `near`'s waits stop progressing `far`'s worker, and `far`'s waits
// progress nothing but their own. Nothing waits on the communicator's own wire meanwhile.
class Apart {
 public:
  Apart(Wire& near, Wire& far) : near_(near), far_(far), near_with_(near.siblings()), far_with_(far.siblings()) {
    auto without_far = near_with_;
    std::erase(without_far, &far);
    near.progress_with(std::move(without_far));
    far.progress_with({});
  }
  ~Apart() {
    near_.progress_with(near_with_);
    far_.progress_with(far_with_);
  }
  Apart(const Apart&) = delete;
  Apart& operator=(const Apart&) = delete;

 private:
  Wire &near_, &far_;
  std::vector<Wire*> near_with_, far_with_;
};

// The first failure of either thread. A timeout met while a thread waited for the other one, not
// for a message, names nobody, so it is thrown only when nothing else failed. When both wires
// time out, the cross-host one's names the cause: the ranks of this host that the per-host wire
// waited for were themselves waiting across (a cut link between hosts).
class FirstFailure {
 public:
  void note(std::exception_ptr e, bool waiting_for_other, bool near) {
    std::lock_guard lock(m_);
    const bool timeout = is_timeout(e);
    auto& slot = waiting_for_other && timeout ? weak_ : near && timeout ? near_timeout_ : first_;
    if (!slot) slot = std::move(e);
  }
  void rethrow() const {
    std::lock_guard lock(m_);
    for (const auto& e : {first_, near_timeout_, weak_}) {
      if (e) std::rethrow_exception(e);
    }
  }

 private:
  mutable std::mutex m_;
  std::exception_ptr first_, near_timeout_, weak_;
};

// After a failure on one thread: notes it, and unless it is a timeout (the other thread meets the
// same deadline) aborts the other thread's wire so that it stops at once. Nothing escapes: a
// thread's job must end, and the caller must still wait for the side thread.
void failed(FirstFailure& failure, std::exception_ptr e, bool waiting_for_other, bool near, Wire& other) noexcept {
  try {
    failure.note(e, waiting_for_other, near);
    if (!is_timeout(e)) other.abort(as_error(e));
  } catch (...) {
    other.abort(Error(Errc::internal, "a two-level schedule failed on its other thread"));
  }
}

}  // namespace

void StagePipeline::run(Wire& near, Wire& far, int chunks, const Stages& stages) {
  if (chunks > 1 && side_.ready(near.log_sink())) {
    overlapped(near, far, chunks, stages);
    return;
  }
  run_in_order(chunks, stages);
}

void StagePipeline::run_in_order(int chunks, const Stages& stages) {
  for (int k = 0; stages.before && k < chunks; ++k) stages.before(k);
  for (int k = 0; k < chunks; ++k) stages.across(k);
  for (int k = 0; stages.after && k < chunks; ++k) stages.after(k);
}

void StagePipeline::overlapped(Wire& near, Wire& far, int chunks, const Stages& stages) {
  std::atomic<int> near_done{stages.before ? 0 : chunks}, far_done{0};
  FirstFailure failure;
  Apart apart(near, far);
  side_.run([&]() noexcept {
    bool waiting = false;
    try {
      for (int k = 0; k < chunks; ++k) {
        waiting = true;
        far.wait_until([&] { return near_done.load(std::memory_order_acquire) > k; });
        waiting = false;
        stages.across(k);
        far_done.store(k + 1, std::memory_order_release);
      }
    } catch (...) {
      failed(failure, std::current_exception(), waiting, false, near);
    }
  });
  bool waiting = false;
  try {
    for (int k = 0; stages.before && k < chunks; ++k) {
      stages.before(k);
      near_done.store(k + 1, std::memory_order_release);
    }
    for (int k = 0; stages.after && k < chunks; ++k) {
      waiting = true;
      near.wait_until([&] { return far_done.load(std::memory_order_acquire) > k; });
      waiting = false;
      stages.after(k);
    }
    waiting = true;
    near.wait_until([&] { return side_.idle(); });
  } catch (...) {
    failed(failure, std::current_exception(), waiting, true, far);
  }
  side_.wait_idle();
  failure.rethrow();
}

}  // namespace coshard::transport::detail
