#pragma once
// The phases of a two-level schedule (hierarchy.hpp) overlapped: the operation is cut into chunks,
// and while one chunk crosses between hosts the next is reduced (or the previous gathered) inside
// the host. Each wire keeps one thread: the caller drives the per-host wire, a side thread the
// cross-host one. UCX workers are serialized, not thread-safe, so while the side thread runs
// neither thread's waits progress the other's worker; both are progressed all along, since each
// thread waits for the other through its own wire.
#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

#include "wire.hpp"

namespace coshard::transport::detail {

// One thread that runs one job at a time for its owner: started on the first job, joined by the
// destructor. Jobs are plain functions, never a coroutine.
class SideThread {
 public:
  SideThread() = default;
  ~SideThread();
  SideThread(const SideThread&) = delete;
  SideThread& operator=(const SideThread&) = delete;

  // Starts the thread if it does not run yet; false when the system had none to give (asked once).
  // `log`: where to say so.
  bool ready(const LogSink& log) noexcept;
  // Hands `job` to the thread (ready() was true, the previous job has ended). `job` must not throw.
  void run(std::function<void()> job);
  // Whether the job has returned; what it wrote is visible once this says true.
  bool idle() const noexcept { return idle_.load(std::memory_order_acquire); }
  // Blocks until the job has returned. Bounded by the job: the pipeline's jobs wait on a wire,
  // whose waits end at the operation's deadline or on abort().
  void wait_idle() const noexcept;

 private:
  void loop();

  std::mutex m_;
  std::condition_variable cv_;
  std::function<void()> job_;
  bool stop_ = false;
  bool unavailable_ = false;
  std::atomic<bool> idle_{true};
  std::thread thread_;
};

class StagePipeline {
 public:
  // The stages of chunk k; `before` and `after` may be empty. Each runs whole rings on one wire.
  struct Stages {
    std::function<void(int)> before;  // on `near`
    std::function<void(int)> across;  // on `far`, once before(k) has returned
    std::function<void(int)> after;   // on `near`, once across(k) has returned
  };

  // Runs every stage of `chunks` chunks. Otherwise across() runs on the side thread, beside the
  // other two. One chunk, or no side thread to be had, runs them on this thread in the order each
  // wire sees when overlapped (every before, every across, every after), so that such a rank keeps
  // step with peers that overlap. The first failure is thrown once both threads have stopped; a
  // failure other than a timeout aborts the other thread's wire so that it stops at once (the
  // communicator fails after it anyway). A timeout does not: the other thread meets the same
  // deadline. Of two timeouts the cross-host thread's is thrown: the ranks of this host that
  // the other waited for were waiting across themselves. A timeout met while waiting for the
  // other thread names nobody, so it is thrown only when the other thread's error is not there.
  void run(Wire& near, Wire& far, int chunks, const Stages& stages);
  // Every stage on this thread, in that order.
  static void run_in_order(int chunks, const Stages& stages);

 private:
  void overlapped(Wire& near, Wire& far, int chunks, const Stages& stages);

  SideThread side_;
};

}  // namespace coshard::transport::detail
