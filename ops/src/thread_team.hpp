#pragma once
// The threads that a rank's CPU ops split over (parallel.hpp). Each thread that calls a split op
// (a rank's compute stream, a test's main thread) owns a team of helper threads, started on its
// first split and joined when it exits, so a split costs a wake-up (under a microsecond while the
// helpers still spin, about 10 us once they sleep) and not a thread's start and join (about 40 us
// here, as much as a layernorm of GPT-2's takes on one core).
//
// A team serves only its owner, so ranks that are threads of one process never share or wait on
// each other's helpers, and nothing else reaches them: the helpers run plain functions, never a
// coroutine. A helper that calls a split op runs it on its own thread, unsplit.
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

namespace coshard::ops::detail {

class ThreadTeam {
 public:
  using Part = void (*)(const void* context, std::size_t part);

  /// run() on the calling thread's team, or all parts on the calling thread where it is a helper
  /// (whose split ops run unsplit, and start no team).
  static void split(std::size_t parts, Part part, const void* context);
  /// The same for work(0) .. work(parts - 1).
  template <class Work>
  static void split(std::size_t parts, const Work& work) {
    split(parts, &call<Work>, &work);
  }

  /// The calling thread's team: none is started until the first run() that splits. After fork()
  /// the child, whose copy has lost its helpers, gets a new team.
  static ThreadTeam& of_this_thread();

  ThreadTeam();
  ~ThreadTeam();  // wakes the helpers to exit and joins them
  ThreadTeam(const ThreadTeam&) = delete;
  ThreadTeam& operator=(const ThreadTeam&) = delete;

  /// part(context, 0) .. part(context, parts - 1), returning when all are done, each on the
  /// caller's thread or a helper's, whichever takes it first. All run on the caller's where helpers
  /// cannot be started (a process or cgroup limit), where the caller is already inside run(), or
  /// where parts > 65535. part must not throw.
  void run(std::size_t parts, Part part, const void* context);
  template <class Work>
  void run(std::size_t parts, const Work& work) {
    run(parts, &call<Work>, &work);
  }

  /// Helpers started so far (for the tests).
  std::size_t helpers() const noexcept { return helpers_.size(); }

 private:
  template <class Work>
  static void call(const void* work, std::size_t part) {
    (*static_cast<const Work*>(work))(part);
  }
  // All parts in order on the calling thread.
  static void run_here(std::size_t parts, Part part, const void* context);

  // A word that one thread waits on and others change. The waiter spins, then sleeps; a change
  // makes a system call only while it sleeps (libstdc++'s notify makes one whenever any thread of
  // the process sleeps on a word that hashes to the same waiter slot).
  struct alignas(64) Signal {
    std::atomic<std::uint32_t> value{0};
    std::atomic<bool> sleeping{false};
    void wake();  // after a change of value made seq_cst
    template <class Done>
    std::uint32_t await(Done done, std::chrono::microseconds spin);
  };
  // Each helper has its own call word, the job it is called for, so that a job wakes only the
  // helpers it has parts for.
  struct Helper {
    Signal calls;
    std::thread thread;
  };
  void grow(std::size_t helpers);
  void serve(Helper& self);
  // Runs parts of job `job` until none is left unclaimed.
  void work_on(std::uint32_t job);

  std::vector<std::unique_ptr<Helper>> helpers_;
  // Parts are claimed, not assigned: the owner runs those no helper has taken yet, so a split
  // never waits on a helper that wakes late (asleep, or its core taken), and costs at worst about
  // what one thread would. The word is job << 32 | parts << 16 | next part, so that a helper woken
  // for a job that has ended claims nothing of the next.
  alignas(64) std::atomic<std::uint64_t> claim_{0};
  Signal done_;  // parts of the job finished
  // The job, written by the owner before it publishes claim_, read by those who claim a part.
  Part part_ = nullptr;
  const void* context_ = nullptr;
  std::uint32_t job_ = 0;  // owner-only, as are the next two
  bool running_ = false;   // run() is on the stack
  std::uint64_t fork_count_;  // the process's fork count when this team was made
  std::atomic<bool> stopping_{false};
};

}  // namespace coshard::ops::detail
