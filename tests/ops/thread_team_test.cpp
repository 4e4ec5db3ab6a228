// The team of helper threads that a thread's split ops run on (ops/src/thread_team.hpp): every
// part runs exactly once whatever the count, helpers take parts, a split inside a part runs unsplit
// on its own thread, each thread has its own team, and a forked child gets a working team.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <latch>
#include <thread>
#include <vector>

#include "thread_team.hpp"

#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define COSHARD_TSAN 1
#endif
#endif
#if defined(__SANITIZE_THREAD__)
#define COSHARD_TSAN 1
#endif

using coshard::ops::detail::ThreadTeam;

namespace {

// Counts the runs of each of `parts` parts.
struct Tally {
  explicit Tally(std::size_t parts) : runs(parts) {}
  std::vector<std::atomic<int>> runs;
  bool each_once() const {
    for (const auto& r : runs)
      if (r.load() != 1) return false;
    return true;
  }
};

void busy_for(std::chrono::microseconds d) {
  const auto end = std::chrono::steady_clock::now() + d;
  while (std::chrono::steady_clock::now() < end) {
  }
}

TEST(OpsThreadTeam, EveryPartRunsExactlyOnceOnAnyCount) {
  ThreadTeam team;
  for (int round = 0; round < 20; ++round) {
    for (std::size_t parts : {0, 1, 2, 3, 5, 8, 17}) {
      Tally tally(parts);
      team.run(parts, [&](std::size_t t) { tally.runs[t]++; });
      ASSERT_TRUE(tally.each_once()) << parts << " parts, round " << round;
    }
  }
  EXPECT_EQ(team.helpers(), 16u);  // started once, for the largest split, and kept
  Tally many(70000);  // more parts than a claim word counts: all on the caller
  team.run(many.runs.size(), [&](std::size_t t) { many.runs[t]++; });
  EXPECT_TRUE(many.each_once());
}

TEST(OpsThreadTeam, HelpersTakeParts) {
  ThreadTeam team;
  const auto owner = std::this_thread::get_id();
  std::atomic<int> on_helpers{0};
  for (int round = 0; round < 100 && on_helpers.load() == 0; ++round) {
    team.run(4, [&](std::size_t) {
      busy_for(std::chrono::microseconds(300));
      if (std::this_thread::get_id() != owner) on_helpers++;
    });
  }
  EXPECT_GT(on_helpers.load(), 0);
}

// A part that splits again, on the owner's thread (which is inside run()) or on a helper's, runs
// the inner parts on its own thread.
TEST(OpsThreadTeam, ASplitInsideAPartRunsOnThatPartsThread) {
  Tally inner(4 * 3);
  std::atomic<int> elsewhere{0};
  const auto inner_parts = [&](std::size_t t) {
    const auto here = std::this_thread::get_id();
    const auto count = [&](std::size_t u) {
      inner.runs[t * 3 + u]++;
      if (std::this_thread::get_id() != here) elsewhere++;
    };
    ThreadTeam::split(3, count);
  };
  ThreadTeam::split(4, inner_parts);
  EXPECT_TRUE(inner.each_once());
  EXPECT_EQ(elsewhere.load(), 0);
}

TEST(OpsThreadTeam, EachThreadHasItsOwnTeam) {
  std::atomic<bool> all_once{true};
  std::vector<const ThreadTeam*> teams(2);
  std::latch recorded(2);  // both teams alive when compared, so that neither address is reused
  std::vector<std::jthread> ranks;
  for (std::size_t r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      ThreadTeam& team = ThreadTeam::of_this_thread();
      for (int round = 0; round < 200; ++round) {
        Tally tally(3);
        team.run(3, [&](std::size_t t) { tally.runs[t]++; });
        if (!tally.each_once()) all_once = false;
      }
      teams[r] = &team;
      recorded.arrive_and_wait();
    });
  }
  ranks.clear();  // joins; each thread's team joins its helpers as the thread exits
  EXPECT_TRUE(all_once.load());
  EXPECT_NE(teams[0], teams[1]);
}

// Waits for child `pid` for up to 20 s, killing it past that; its exit status, or -1.
[[maybe_unused]] int exit_status(pid_t pid) {  // unused where the fork tests skip (TSan)
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

#ifdef COSHARD_TSAN
TEST(OpsThreadTeam, AForkedChildGetsAWorkingTeam) {
  GTEST_SKIP() << "ThreadSanitizer ends a child that starts threads after a multi-threaded fork";
}
#else
TEST(OpsThreadTeam, AForkedChildGetsAWorkingTeam) {
  ThreadTeam& team = ThreadTeam::of_this_thread();
  Tally before(3);
  team.run(3, [&](std::size_t t) { before.runs[t]++; });
  ASSERT_GT(team.helpers(), 0u);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ThreadTeam& mine = ThreadTeam::of_this_thread();
    Tally tally(3);
    mine.run(3, [&](std::size_t t) { tally.runs[t]++; });
    // The parent's copy, whose helpers were not forked, is not the team used here.
    ::_exit(&mine != &team && tally.each_once() ? 0 : 1);
  }
  EXPECT_EQ(exit_status(pid), 0);
}
#endif

// A child that exits without splitting again destroys the copy of its parent's team as the thread
// exits: it must not wait on, or join, helpers that were never forked. The child's own threads take
// the stacks glibc kept from those helpers, and with them their thread handles, so a join of the
// parent's helpers would join these (detached, never ending) threads: an error or a hang.
#ifdef COSHARD_TSAN
TEST(OpsThreadTeam, AForkedChildExitsWithoutJoiningItsParentsHelpers) {
  GTEST_SKIP() << "ThreadSanitizer ends a child that starts threads after a multi-threaded fork";
}
#else
TEST(OpsThreadTeam, AForkedChildExitsWithoutJoiningItsParentsHelpers) {
  Tally before(3);
  ThreadTeam::of_this_thread().run(3, [&](std::size_t t) { before.runs[t]++; });
  const std::size_t helpers = ThreadTeam::of_this_thread().helpers();
  ASSERT_GT(helpers, 0u);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    for (std::size_t i = 0; i < helpers; ++i) {
      std::thread([] {
        for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
      }).detach();
    }
    // exit() runs this thread's thread_local destructors, the team's among them, and then the
    // atexit handlers, the last registered first: this one ends the child before a leak checker's
    // would report what the parent's threads own, unreachable in any forked child.
    std::atexit([] { ::_exit(0); });
    std::exit(0);
  }
  EXPECT_EQ(exit_status(pid), 0);
}
#endif

}  // namespace
