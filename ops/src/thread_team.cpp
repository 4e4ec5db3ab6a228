#include "thread_team.hpp"

#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <system_error>

namespace coshard::ops::detail {

namespace {

// How long a helper spins after a part before it sleeps, and the owner before it sleeps on the
// helpers' parts. A sleeping helper's wake-up takes tens of microseconds; a forward pass's ops
// follow each other closer than this, so its helpers stay awake from one split op to the next.
constexpr std::chrono::microseconds kHelperSpin{200};
constexpr std::chrono::microseconds kOwnerSpin{200};

// As many as set_blas_threads' largest count asks for; more parts than helpers are claimed by
// whoever is free.
constexpr std::size_t kMaxHelpers = 4095;

std::atomic<std::uint64_t> g_forks{0};  // fork()s this process came through, counted in the child
std::once_flag g_fork_handler;

void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

thread_local bool t_helper = false;  // this thread is some team's helper

}  // namespace

void ThreadTeam::Signal::wake() {
  if (sleeping.load(std::memory_order_seq_cst)) value.notify_one();
}

// Waits for a value that `done` accepts and returns it: spinning up to `spin`, yielding the core now
// and then to whatever else wants it, then sleeping in the kernel. sleeping is set before the value
// is read again, and wake() reads it after the change, both seq_cst: either this sees the change or
// wake() sees it asleep.
template <class Done>
std::uint32_t ThreadTeam::Signal::await(Done done, std::chrono::microseconds spin) {
  std::uint32_t v = value.load(std::memory_order_acquire);
  const auto start = std::chrono::steady_clock::now();
  for (unsigned i = 1; !done(v); ++i) {
    cpu_relax();
    if (i % 64 == 0) {
      if (std::chrono::steady_clock::now() - start > spin) {
        sleeping.store(true, std::memory_order_seq_cst);
        v = value.load(std::memory_order_seq_cst);
        if (!done(v)) value.wait(v, std::memory_order_acquire);
        sleeping.store(false, std::memory_order_relaxed);
      } else {
        std::this_thread::yield();
      }
    }
    v = value.load(std::memory_order_acquire);
  }
  return v;
}

void ThreadTeam::run_here(std::size_t parts, Part part, const void* context) {
  for (std::size_t t = 0; t < parts; ++t) part(context, t);
}

void ThreadTeam::split(std::size_t parts, Part part, const void* context) {
  if (t_helper) return run_here(parts, part, context);
  of_this_thread().run(parts, part, context);
}

ThreadTeam& ThreadTeam::of_this_thread() {
  thread_local std::unique_ptr<ThreadTeam> team;
  if (team && team->fork_count_ != g_forks.load(std::memory_order_relaxed)) {
    // A forked child's copy: its helpers were not forked with it, so it can neither use nor join
    // them. It is left as it is.
    (void)team.release();
  }
  if (!team) team = std::make_unique<ThreadTeam>();
  return *team;
}

ThreadTeam::ThreadTeam() {
  std::call_once(g_fork_handler, [] {
    ::pthread_atfork(nullptr, nullptr, [] { g_forks.fetch_add(1, std::memory_order_relaxed); });
  });
  fork_count_ = g_forks.load(std::memory_order_relaxed);
}

ThreadTeam::~ThreadTeam() {
  if (fork_count_ != g_forks.load(std::memory_order_relaxed)) {
    // A forked child's copy, ending before the child split again: the helpers it names were not
    // forked, so there is nothing to wake or join.
    for (auto& h : helpers_) (void)h.release();
    return;
  }
  stopping_.store(true, std::memory_order_relaxed);
  for (auto& h : helpers_) {
    h->calls.value.fetch_add(1, std::memory_order_seq_cst);
    h->calls.wake();
  }
  for (auto& h : helpers_) h->thread.join();
}

void ThreadTeam::grow(std::size_t helpers) {
  helpers_.reserve(helpers);  // so that push_back cannot throw with a helper started
  while (helpers_.size() < helpers) {
    auto h = std::make_unique<Helper>();
    try {
      h->thread = std::thread([this, self = h.get()] { serve(*self); });
    } catch (const std::system_error&) {
      return;  // the owner runs the parts no helper takes
    }
    helpers_.push_back(std::move(h));
  }
}

void ThreadTeam::serve(Helper& self) {
  t_helper = true;
  std::uint32_t job = 0;
  for (;;) {
    job = self.calls.await([job](std::uint32_t v) { return v != job; }, kHelperSpin);
    if (stopping_.load(std::memory_order_relaxed)) return;
    work_on(job);
  }
}

void ThreadTeam::work_on(std::uint32_t job) {
  std::uint64_t c = claim_.load(std::memory_order_acquire);
  for (;;) {
    const auto parts = static_cast<std::uint32_t>(c >> 16 & 0xffff), next = static_cast<std::uint32_t>(c & 0xffff);
    if (c >> 32 != job || next >= parts) return;
    if (!claim_.compare_exchange_weak(c, c + 1, std::memory_order_acquire)) continue;
    part_(context_, next);
    if (done_.value.fetch_add(1, std::memory_order_seq_cst) + 1 == parts) done_.wake();
    c = claim_.load(std::memory_order_acquire);
  }
}

void ThreadTeam::run(std::size_t parts, Part part, const void* context) {
  if (parts <= 1 || parts > 0xffff || running_) return run_here(parts, part, context);
  grow(std::min<std::size_t>(parts - 1, kMaxHelpers));
  running_ = true;
  part_ = part, context_ = context;
  const std::uint32_t job = ++job_;
  done_.value.store(0, std::memory_order_relaxed);
  claim_.store(std::uint64_t{job} << 32 | std::uint64_t{parts} << 16, std::memory_order_release);
  for (std::size_t i = 0; i < std::min(parts - 1, helpers_.size()); ++i) {
    helpers_[i]->calls.value.store(job, std::memory_order_seq_cst);
    helpers_[i]->calls.wake();
  }
  work_on(job);
  done_.await([parts](std::uint32_t v) { return v == parts; }, kOwnerSpin);
  running_ = false;
}

}  // namespace coshard::ops::detail
