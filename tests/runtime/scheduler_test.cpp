#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <thread>
#include <vector>

#include "coshard/runtime/scheduler.hpp"
#include "coshard/runtime/timeout.hpp"
#include "coshard/runtime/when_all.hpp"

using namespace coshard;
using namespace std::chrono_literals;

namespace {

TEST(Scheduler, PostFromManyThreadsRunsEverythingOnTheSchedulerThread) {
  Scheduler sched;
  sched.start();
  std::atomic<int> count{0};
  std::atomic<int> wrong_thread{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) {
        sched.post([&] {
          if (!sched.running_in_this_thread()) ++wrong_thread;
          ++count;
        });
      }
    });
  }
  for (auto& t : threads) t.join();
  sched.sync_wait([]() -> Task<void> { co_await yield_now{}; }());
  auto deadline = std::chrono::steady_clock::now() + 10s;
  while (count < 4000 && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(count, 4000);
  EXPECT_EQ(wrong_thread, 0);
  EXPECT_TRUE(sched.stop());
  EXPECT_EQ(sched.health(), Health::stopped);
}

TEST(Scheduler, SpawnedTasksAreCancelledAndDrainedOnStop) {
  Scheduler sched;
  sched.start();
  std::atomic<int> cancelled{0};
  for (int i = 0; i < 10; ++i) {
    sched.spawn([](std::atomic<int>* c) -> Task<void> {
      try {
        co_await sleep_for(1h);
      } catch (const Error& e) {
        if (e.code() == Errc::cancelled) ++*c;
        throw;
      }
    }(&cancelled));
  }
  auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(sched.stop());
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
  EXPECT_EQ(cancelled, 10);
  EXPECT_EQ(sched.first_error(), nullptr);  // cancellation on stop is not a failure
}

TEST(Scheduler, SpawnRecordsTheFirstFailure) {
  Scheduler sched;
  sched.start();
  sched.spawn([]() -> Task<void> {
    throw Error(Errc::internal, "first");
    co_return;
  }());
  sched.sync_wait([]() -> Task<void> { co_await sleep_for(20ms); }());
  ASSERT_NE(sched.first_error(), nullptr);
  EXPECT_THROW(std::rethrow_exception(sched.first_error()), Error);
  sched.stop();
}

// What the scheduler cannot throw to anyone goes to Options::log, not to stderr.
TEST(Scheduler, ASpawnedTasksFailureGoesToTheLogSinkGiven) {
  std::mutex m;
  std::vector<std::pair<LogLevel, std::string>> said;
  Scheduler sched(Scheduler::Options{.name = "logged", .log = [&](LogLevel level, std::string_view line) {
                                       std::lock_guard lock(m);
                                       said.emplace_back(level, std::string(line));
                                     }});
  sched.start();
  sched.spawn([]() -> Task<void> {
    throw Error(Errc::internal, "the task's own error");
    co_return;
  }());
  sched.sync_wait([]() -> Task<void> { co_await sleep_for(20ms); }());
  sched.stop();
  std::lock_guard lock(m);
  ASSERT_EQ(said.size(), 1u);
  EXPECT_EQ(said[0].first, LogLevel::error);
  EXPECT_NE(said[0].second.find("spawned task failed: "), std::string::npos) << said[0].second;
  EXPECT_NE(said[0].second.find("the task's own error"), std::string::npos) << said[0].second;
}

TEST(Scheduler, SyncWaitOnTheSchedulerThreadIsAnError) {
  Scheduler sched;
  sched.start();
  auto inner = [](Scheduler* s) -> Task<bool> {
    try {
      s->sync_wait([]() -> Task<void> { co_return; }());
    } catch (const Error& e) {
      co_return e.code() == Errc::invalid_argument;
    }
    co_return false;
  };
  EXPECT_TRUE(sched.sync_wait(inner(&sched)));
}

TEST(Scheduler, SpawnBeforeStartIsAnError) {
  Scheduler sched;
  EXPECT_THROW(sched.spawn([]() -> Task<void> { co_return; }()), Error);
}

TEST(Scheduler, AwaitingASleepWithoutASchedulerIsAnError) {
  // A plain coroutine awaited outside any scheduler has nowhere to resume.
  struct Driver {
    struct promise_type {
      Driver get_return_object() { return {}; }
      std::suspend_never initial_suspend() noexcept { return {}; }
      std::suspend_never final_suspend() noexcept { return {}; }
      void return_void() {}
      void unhandled_exception() {}
    };
  };
  bool threw = false;
  [](bool* t) -> Driver {
    try {
      co_await sleep_for(1ms);
    } catch (const Error& e) {
      *t = e.code() == Errc::invalid_argument;
    }
  }(&threw);
  EXPECT_TRUE(threw);
}

Task<int> after(std::chrono::milliseconds d, int v) {
  co_await sleep_for(d);
  co_return v;
}

TEST(WhenAll, VariadicRunsConcurrentlyAndKeepsOrder) {
  Scheduler sched;
  sched.start();
  auto start = std::chrono::steady_clock::now();
  auto [a, b, c] = sched.sync_wait(when_all(after(100ms, 1), after(100ms, 2), []() -> Task<void> { co_return; }()));
  EXPECT_LT(std::chrono::steady_clock::now() - start, 180ms);  // concurrent, not 200 ms
  EXPECT_EQ(a, 1);
  EXPECT_EQ(b, 2);
  (void)c;
}

TEST(WhenAll, RangeReturnsAllResults) {
  Scheduler sched;
  sched.start();
  std::vector<Task<int>> tasks;
  for (int i = 0; i < 50; ++i) tasks.push_back(after(std::chrono::milliseconds(50 - i), i));
  auto out = sched.sync_wait(when_all(std::move(tasks)));
  ASSERT_EQ(out.size(), 50u);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(out[i], i);
  EXPECT_TRUE(sched.sync_wait(when_all(std::vector<Task<int>>{})).empty());
}

TEST(WhenAll, FirstFailureCancelsSiblingsAndIsRethrown) {
  Scheduler sched;
  sched.start();
  auto fail = []() -> Task<int> {
    co_await sleep_for(10ms);
    throw Error(Errc::peer_lost, "rank 3 is gone");
  };
  auto start = std::chrono::steady_clock::now();
  try {
    sched.sync_wait(when_all(after(1h, 1), fail()));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::peer_lost);
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
}

TEST(WhenAny, FirstFinisherWinsAndTheRestAreCancelled) {
  Scheduler sched;
  sched.start();
  auto start = std::chrono::steady_clock::now();
  auto r = sched.sync_wait(when_any(after(1h, 1), after(20ms, 2)));
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
  ASSERT_EQ(r.index(), 1u);
  EXPECT_EQ(std::get<1>(r), 2);
}

TEST(WithTimeout, ReturnsTheValueWhenInTime) {
  Scheduler sched;
  sched.start();
  EXPECT_EQ(sched.sync_wait(with_timeout(after(1ms, 5), 5s, "quick")), 5);
}

TEST(WithTimeout, TimesOutNamingTheOperation) {
  Scheduler sched;
  sched.start();
  try {
    sched.sync_wait(with_timeout(after(1h, 5), 30ms, "all_gather#12"));
    FAIL() << "expected a timeout";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::timeout);
    EXPECT_EQ(e.context().op, "all_gather#12");
    EXPECT_NE(std::string(e.what()).find("all_gather#12"), std::string::npos);
  }
}

TEST(WithTimeout, NestedDeadlinesTheInnerFiresFirst) {
  Scheduler sched;
  sched.start();
  auto inner = with_timeout(after(1h, 1), 20ms, "inner");
  try {
    sched.sync_wait(with_timeout(std::move(inner), 5s, "outer"));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.context().op, "inner");
  }
}

}  // namespace
