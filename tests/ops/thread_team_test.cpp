// The team of helper threads that a thread's split ops run on (ops/src/thread_team.hpp): every
// part runs exactly once whatever the count, helpers take parts, a split inside a part runs unsplit
// on its own thread, each thread has its own team, and a forked child gets a working team.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <thread>
#include <vector>

#include "thread_team.hpp"

using coshard::ops::detail::ThreadTeam;

namespace {

// Runs `work(t)` for each part of a split on `team`.
template <class Work>
void run(ThreadTeam& team, std::size_t parts, const Work& work) {
  team.run(parts, [](const void* w, std::size_t t) { (*static_cast<const Work*>(w))(t); }, &work);
}

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
      run(team, parts, [&](std::size_t t) { tally.runs[t]++; });
      ASSERT_TRUE(tally.each_once()) << parts << " parts, round " << round;
    }
  }
  EXPECT_EQ(team.helpers(), 16u);  // started once, for the largest split, and kept
  Tally many(70000);  // more parts than a claim word counts: all on the caller
  run(team, many.runs.size(), [&](std::size_t t) { many.runs[t]++; });
  EXPECT_TRUE(many.each_once());
}

TEST(OpsThreadTeam, HelpersTakeParts) {
  ThreadTeam team;
  const auto owner = std::this_thread::get_id();
  std::atomic<int> on_helpers{0};
  for (int round = 0; round < 100 && on_helpers.load() == 0; ++round) {
    run(team, 4, [&](std::size_t) {
      busy_for(std::chrono::microseconds(300));
      if (std::this_thread::get_id() != owner) on_helpers++;
    });
  }
  EXPECT_GT(on_helpers.load(), 0);
}

// A part that splits again, on the owner's thread (which is inside run()) or on a helper's, runs
// the inner parts on its own thread and starts no team of its own.
TEST(OpsThreadTeam, ASplitInsideAPartRunsOnThatPartsThread) {
  ThreadTeam& team = ThreadTeam::of_this_thread();
  Tally inner(4 * 3);
  std::atomic<int> elsewhere{0};
  run(team, 4, [&](std::size_t t) {
    const auto here = std::this_thread::get_id();
    ThreadTeam& mine = ThreadTeam::of_this_thread();
    run(mine, 3, [&](std::size_t u) {
      inner.runs[t * 3 + u]++;
      if (std::this_thread::get_id() != here) elsewhere++;
    });
    if (&mine != &team && mine.helpers() != 0) elsewhere++;
  });
  EXPECT_TRUE(inner.each_once());
  EXPECT_EQ(elsewhere.load(), 0);
}

TEST(OpsThreadTeam, EachThreadHasItsOwnTeam) {
  std::atomic<bool> all_once{true};
  std::vector<const ThreadTeam*> teams(2);
  std::vector<std::jthread> ranks;
  for (std::size_t r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      ThreadTeam& team = ThreadTeam::of_this_thread();
      teams[r] = &team;
      for (int round = 0; round < 200; ++round) {
        Tally tally(3);
        run(team, 3, [&](std::size_t t) { tally.runs[t]++; });
        if (!tally.each_once()) all_once = false;
      }
    });
  }
  ranks.clear();  // joins; each thread's team joins its helpers as the thread exits
  EXPECT_TRUE(all_once.load());
  EXPECT_NE(teams[0], teams[1]);
}

#if defined(__SANITIZE_THREAD__)
TEST(OpsThreadTeam, AForkedChildGetsAWorkingTeam) {
  GTEST_SKIP() << "ThreadSanitizer ends a child that starts threads after a multi-threaded fork";
}
#else
TEST(OpsThreadTeam, AForkedChildGetsAWorkingTeam) {
  ThreadTeam& team = ThreadTeam::of_this_thread();
  Tally before(3);
  run(team, 3, [&](std::size_t t) { before.runs[t]++; });
  ASSERT_GT(team.helpers(), 0u);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ThreadTeam& mine = ThreadTeam::of_this_thread();
    Tally tally(3);
    run(mine, 3, [&](std::size_t t) { tally.runs[t]++; });
    // The parent's copy, whose helpers were not forked, is not the team used here.
    ::_exit(&mine != &team && tally.each_once() ? 0 : 1);
  }
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      FAIL() << "the forked child hung in its split";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_TRUE(WIFEXITED(status)) << "status " << status;
  EXPECT_EQ(WEXITSTATUS(status), 0);
}
#endif

}  // namespace
