#include <gtest/gtest.h>

#include <chrono>
#include <vector>

#include "coshard/runtime/channel.hpp"
#include "coshard/runtime/scheduler.hpp"
#include "coshard/runtime/semaphore.hpp"
#include "coshard/runtime/timeout.hpp"
#include "coshard/runtime/when_all.hpp"

using namespace coshard;
using namespace std::chrono_literals;

namespace {

class SyncTest : public ::testing::Test {
 protected:
  void SetUp() override { sched.start(); }
  Scheduler sched;
};

TEST_F(SyncTest, SemaphoreLimitsConcurrency) {
  auto body = []() -> Task<int> {
    Semaphore sem(2);
    int inside = 0, max_inside = 0;
    auto worker = [&]() -> Task<void> {
      co_await sem.acquire();
      ++inside;
      max_inside = std::max(max_inside, inside);
      co_await sleep_for(5ms);
      --inside;
      sem.release();
    };
    std::vector<Task<void>> ws;
    for (int i = 0; i < 8; ++i) ws.push_back(worker());
    co_await when_all(std::move(ws));
    co_return max_inside;
  };
  EXPECT_EQ(sched.sync_wait(body()), 2);
}

TEST_F(SyncTest, SemaphoreServesWaitersInOrder) {
  auto body = []() -> Task<std::vector<int>> {
    Semaphore sem(0);
    std::vector<int> order;
    auto waiter = [&](int id) -> Task<void> {
      co_await sem.acquire();
      order.push_back(id);
    };
    auto releaser = [&]() -> Task<void> {
      co_await sleep_for(5ms);
      sem.release(3);
    };
    co_await when_all(waiter(0), waiter(1), waiter(2), releaser());
    co_return order;
  };
  EXPECT_EQ(sched.sync_wait(body()), (std::vector<int>{0, 1, 2}));
}

TEST_F(SyncTest, CancelledSemaphoreWaiterLeavesTheQueue) {
  auto body = []() -> Task<bool> {
    Semaphore sem(0);
    try {
      co_await with_timeout([&]() -> Task<void> { co_await sem.acquire(); }(), 10ms, "acquire");
    } catch (const Error& e) {
      if (e.code() != Errc::timeout) throw;
    }
    co_await yield_now{};  // let the cancellation unlink the waiter
    bool unlinked = sem.waiting() == 0;
    sem.release();
    co_return unlinked && sem.available() == 1;  // the permit was not given to the cancelled waiter
  };
  EXPECT_TRUE(sched.sync_wait(body()));
}

TEST_F(SyncTest, ChannelDeliversInOrderWithBackPressure) {
  auto body = []() -> Task<std::vector<int>> {
    Channel<int> ch(2);
    std::vector<int> got;
    auto producer = [&]() -> Task<void> {
      for (int i = 0; i < 100; ++i) co_await ch.send(i);
      ch.close();
    };
    auto consumer = [&]() -> Task<void> {
      while (auto v = co_await ch.recv()) {
        EXPECT_LE(ch.size(), 2u);
        got.push_back(*v);
      }
    };
    co_await when_all(producer(), consumer());
    co_return got;
  };
  auto got = sched.sync_wait(body());
  ASSERT_EQ(got.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(got[i], i);
}

TEST_F(SyncTest, UnbufferedChannelIsARendezvous) {
  auto body = []() -> Task<int> {
    Channel<std::unique_ptr<int>> ch(0);
    auto producer = [&]() -> Task<void> { co_await ch.send(std::make_unique<int>(9)); };
    auto consumer = [&]() -> Task<int> {
      auto v = co_await ch.recv();
      co_return **v;
    };
    auto [a, b] = co_await when_all(producer(), consumer());
    (void)a;
    co_return b;
  };
  EXPECT_EQ(sched.sync_wait(body()), 9);
}

TEST_F(SyncTest, ClosingWakesReceiversAndFailsSenders) {
  auto body = []() -> Task<bool> {
    Channel<int> ch(0);
    auto receiver = [&]() -> Task<bool> { co_return !(co_await ch.recv()).has_value(); };
    auto closer = [&]() -> Task<void> {
      co_await sleep_for(5ms);
      ch.close();
    };
    auto [r, c] = co_await when_all(receiver(), closer());
    (void)c;
    bool send_failed = false;
    try {
      co_await ch.send(1);
    } catch (const Error&) {
      send_failed = true;
    }
    co_return r && send_failed;
  };
  EXPECT_TRUE(sched.sync_wait(body()));
}

TEST_F(SyncTest, ChannelRecvHonoursDeadlines) {
  auto body = []() -> Task<void> {
    Channel<int> ch(1);
    co_await with_timeout([&]() -> Task<void> { co_await ch.recv(); }(), 10ms, "recv");
  };
  EXPECT_THROW(sched.sync_wait(body()), Error);
}

}  // namespace
