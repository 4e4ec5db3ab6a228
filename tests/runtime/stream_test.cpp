#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <chrono>
#include <random>
#include <thread>
#include <vector>

#include "coshard/runtime/scheduler.hpp"
#include "coshard/runtime/stream.hpp"
#include "coshard/runtime/timeout.hpp"

using namespace coshard;
using namespace std::chrono_literals;

namespace {

class StreamTest : public ::testing::Test {
 protected:
  void SetUp() override { sched.start(); }
  Scheduler sched;
};

TEST_F(StreamTest, WorkRunsInEnqueueOrder) {
  auto s = Stream::cpu(Device::cpu(), "compute");
  std::vector<int> seen;
  for (int i = 0; i < 1000; ++i) s.enqueue([&seen, i] { seen.push_back(i); });
  s.synchronize();
  ASSERT_EQ(seen.size(), 1000u);
  for (int i = 0; i < 1000; ++i) EXPECT_EQ(seen[i], i);
}

TEST_F(StreamTest, AwaitingAnEventResumesOnTheSchedulerThread) {
  auto s = Stream::cpu(Device::cpu(), "compute");
  std::atomic<bool> work_done{false};
  s.enqueue([&] {
    std::this_thread::sleep_for(20ms);
    work_done = true;
  });
  Event e;
  e.record(s);
  auto body = [](Event ev, Scheduler* sc, std::atomic<bool>* done) -> Task<bool> {
    co_await ev;
    co_return sc->running_in_this_thread() && done->load();
  };
  EXPECT_TRUE(sched.sync_wait(body(e, &sched, &work_done)));
  EXPECT_TRUE(e.query());
}

// What a hang dump lists: each suspended task's wait, named by the stream and the work before the
// event, for as long as it is pending, longest first.
TEST_F(StreamTest, TheSchedulerListsSuspendedWaitsAndWhatTheyAwait) {
  auto s = Stream::cpu(Device::cpu(), "compute");
  Event before_anything;
  before_anything.record(s);
  std::atomic<bool> release{false};
  s.enqueue([&] {
    while (!release) std::this_thread::sleep_for(1ms);
  }, "backward h.3");
  s.enqueue([] {});
  Event e;
  e.record(s);
  EXPECT_EQ(before_anything.point()->what, "stream 'compute' (nothing enqueued yet)");
  auto wait_on = [](Event ev) -> Task<void> { co_await ev; };
  auto nap = []() -> Task<void> { co_await sleep_for(30s); };
  sched.spawn(wait_on(e));
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (sched.suspended().empty() && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(1ms);
  std::this_thread::sleep_for(5ms);
  sched.spawn(nap());
  while (sched.suspended().size() < 2 && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(1ms);
  auto waits = sched.suspended();
  ASSERT_EQ(waits.size(), 2u);
  EXPECT_EQ(waits[0].what, "stream 'compute' after work item 2 (last labelled 'backward h.3')");
  EXPECT_EQ(waits[1].what, "sleep_for(30 s)");
  EXPECT_GE(waits[0].waited, waits[1].waited);
  release = true;
  s.synchronize();
  while (sched.suspended().size() > 1 && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(1ms);
  waits = sched.suspended();
  ASSERT_EQ(waits.size(), 1u);  // the event's wait ended; the sleep is still pending
  EXPECT_EQ(waits[0].what, "sleep_for(30 s)");
  sched.stop();  // cancels the sleep
  EXPECT_TRUE(sched.suspended().empty());
}

TEST_F(StreamTest, StreamWaitOrdersAcrossStreamsWithoutBlockingTheHost) {
  auto a = Stream::cpu(Device::cpu(), "a");
  auto b = Stream::cpu(Device::cpu(), "b");
  std::atomic<int> value{0};
  std::atomic<bool> gate{false};
  a.enqueue([&] {
    while (!gate) std::this_thread::sleep_for(1ms);
    value = 1;
  });
  Event e;
  e.record(a);
  b.wait(e);  // returns at once: the host does not block
  int seen_by_b = -1;
  b.enqueue([&] { seen_by_b = value.load(); });
  Event done;
  done.record(b);
  EXPECT_FALSE(done.query());
  gate = true;
  b.synchronize();
  EXPECT_EQ(seen_by_b, 1);
}

// Random enqueue/record/wait operations on 4 streams, checked against a sequential model of the
// happens-before relation (vector clocks). Returns the number of items that ran too early.
int ordering_violations(int operations, Stream::Options options) {
  constexpr int kStreams = 4;
  std::vector<Stream> streams;
  for (int s = 0; s < kStreams; ++s) streams.push_back(Stream::cpu(Device::cpu(), "s" + std::to_string(s), options));
  using Clock = std::array<int, kStreams>;  // per stream: the last item that must come before
  std::vector<Clock> frontier(kStreams, Clock{-1, -1, -1, -1});
  std::vector<std::vector<int>> exec(kStreams);      // exec[s][i]: global order of item i on s
  std::vector<std::vector<Clock>> required(kStreams);  // what item i on s must follow
  for (auto& e : exec) e.reserve(operations);
  std::atomic<int> ticket{0};
  std::vector<std::pair<Event, Clock>> events;
  std::mt19937 rng(1234);
  int counts[kStreams] = {};
  for (int op = 0; op < operations; ++op) {
    int s = static_cast<int>(rng() % kStreams);
    int kind = static_cast<int>(rng() % 10);
    if (kind < 6) {
      int idx = counts[s]++;
      required[s].push_back(frontier[s]);
      exec[s].push_back(-1);
      streams[s].enqueue([&exec, &ticket, s, idx] {
        if (idx % 97 == 0) std::this_thread::sleep_for(50us);  // shake the interleaving
        exec[s][idx] = ticket.fetch_add(1);
      });
      frontier[s][s] = idx;
    } else if (kind < 8) {
      Event e;
      e.record(streams[s]);
      events.emplace_back(std::move(e), frontier[s]);
    } else if (!events.empty()) {
      auto& [e, clock] = events[rng() % events.size()];
      streams[s].wait(e);
      for (int t = 0; t < kStreams; ++t) frontier[s][t] = std::max(frontier[s][t], clock[t]);
    }
  }
  for (auto& s : streams) s.synchronize();
  int violations = 0;
  for (int s = 0; s < kStreams; ++s) {
    for (std::size_t i = 0; i < exec[s].size(); ++i) {
      EXPECT_GE(exec[s][i], 0) << "item " << i << " of stream " << s << " never ran";
      for (int t = 0; t < kStreams; ++t) {
        int dep = required[s][i][t];
        if (dep >= 0 && exec[t][dep] > exec[s][i]) ++violations;
      }
    }
  }
  return violations;
}

TEST_F(StreamTest, RandomCrossStreamOrderingMatchesTheSequentialModel) { EXPECT_EQ(ordering_violations(6000, {}), 0); }

// Fault injection: a random delay before every item reshuffles how the streams interleave, never
// the order that events and waits impose.
TEST_F(StreamTest, JitterDelaysEveryItemButKeepsTheOrder) {
  EXPECT_EQ(ordering_violations(400, {.jitter = 300us, .jitter_seed = 7}), 0);
  auto s = Stream::cpu(Device::cpu(), "jittered", {.jitter = 2ms, .jitter_seed = 7});
  const auto begin = std::chrono::steady_clock::now();
  for (int i = 0; i < 40; ++i) s.enqueue([] {});
  s.synchronize();
  // 40 delays drawn uniformly from [0, 2 ms] add up to 40 ms on average; below 10 ms the
  // delays are not applied (load only makes it slower).
  EXPECT_GE(std::chrono::steady_clock::now() - begin, 10ms);
}

// stalls() credits each wait to the stream that recorded the awaited event, and adds up to stalled().
TEST_F(StreamTest, StallsAreCountedByTheStreamWaitedFor) {
  auto slow = Stream::cpu(Device::cpu(), "slow");
  auto fast = Stream::cpu(Device::cpu(), "fast");
  auto waiting = Stream::cpu(Device::cpu(), "waiting");
  slow.enqueue([] { std::this_thread::sleep_for(30ms); });
  Event late, early;
  late.record(slow);
  early.record(fast);
  waiting.wait(late);
  waiting.wait(early);  // already reached: no stall
  waiting.synchronize();
  const auto stalls = waiting.stalls();
  ASSERT_EQ(stalls.count("slow"), 1u);
  EXPECT_GE(stalls.at("slow"), 20ms);
  EXPECT_EQ(stalls.count("fast"), 0u);
  EXPECT_EQ(stalls.at("slow"), waiting.stalled());
  EXPECT_TRUE(slow.stalls().empty());
}

TEST_F(StreamTest, ThrowingWorkPoisonsLaterEventsInsteadOfHanging) {
  auto s = Stream::cpu(Device::cpu(), "compute");
  s.enqueue([] { throw std::runtime_error("kernel exploded"); });
  bool skipped_ran = false;
  s.enqueue([&] { skipped_ran = true; });
  Event e;
  e.record(s);
  auto body = [](Event ev) -> Task<void> { co_await ev; };
  try {
    sched.sync_wait(body(e));
    FAIL() << "expected the stream's error";
  } catch (const Error& err) {
    EXPECT_EQ(err.code(), Errc::device);
    EXPECT_NE(std::string(err.what()).find("kernel exploded"), std::string::npos);
    EXPECT_NE(std::string(err.what()).find("compute"), std::string::npos);
  }
  EXPECT_FALSE(skipped_ran);
  EXPECT_THROW(s.synchronize(), Error);
}

// The error names the work that failed (its span) and the stream; once handled, reset() lets
// later work run while what was recorded before keeps the error.
TEST_F(StreamTest, TheErrorNamesTheOperationAndResetLetsLaterWorkRun) {
  auto s = Stream::cpu(Device::cpu(), "compute");
  s.enqueue([] { throw Error(Errc::invalid_argument, "bad shape"); }, "forward h.3");
  bool skipped_ran = false;
  s.enqueue([&] { skipped_ran = true; });
  Event failed;
  failed.record(s);
  auto body = [](Event ev) -> Task<void> { co_await ev; };
  try {
    sched.sync_wait(body(failed));
    FAIL() << "expected the stream's error";
  } catch (const Error& err) {
    EXPECT_EQ(err.code(), Errc::invalid_argument);
    EXPECT_NE(std::string(err.what()).find("bad shape"), std::string::npos) << err.what();
    EXPECT_NE(std::string(err.what()).find("stream compute: forward h.3"), std::string::npos) << err.what();
  }
  s.enqueue([] { throw std::runtime_error("nan in the loss"); }, "loss");  // skipped too: still poisoned
  s.reset();
  bool ran = false;
  s.enqueue([&] { ran = true; });
  Event after;
  after.record(s);
  EXPECT_NO_THROW(sched.sync_wait(body(after)));
  EXPECT_TRUE(ran);
  EXPECT_FALSE(skipped_ran);
  EXPECT_THROW(sched.sync_wait(body(failed)), Error);  // the old point keeps its error
  EXPECT_NO_THROW(s.synchronize());
  s.enqueue([] { throw std::runtime_error("again"); }, "step 2");
  try {
    s.synchronize();
    FAIL() << "expected the second error";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("work item 5 ('step 2') on stream 'compute' failed: again"),
              std::string::npos)
        << err.what();
  }
}

TEST_F(StreamTest, ErrorsFlowThroughStreamWaits) {
  auto a = Stream::cpu(Device::cpu(), "a");
  auto b = Stream::cpu(Device::cpu(), "b");
  a.enqueue([] { throw std::runtime_error("upstream"); });
  Event e;
  e.record(a);
  b.wait(e);
  Event f;
  f.record(b);
  auto body = [](Event ev) -> Task<void> { co_await ev; };
  EXPECT_THROW(sched.sync_wait(body(f)), Error);
}

TEST_F(StreamTest, UnrecordedEventIsAnErrorNotAHang) {
  Event e;
  auto body = [](Event ev) -> Task<void> { co_await ev; };
  try {
    sched.sync_wait(body(e));
    FAIL();
  } catch (const Error& err) {
    EXPECT_EQ(err.code(), Errc::invalid_argument);
    EXPECT_NE(std::string(err.what()).find("never recorded"), std::string::npos);
  }
  auto s = Stream::cpu(Device::cpu(), "compute");
  EXPECT_THROW(s.wait(e), Error);
  EXPECT_THROW((void)e.query(), Error);
}

TEST_F(StreamTest, WaitingOnAnotherDevicesStreamIsAnError) {
  auto s0 = Stream::cpu(Device::cpu(0), "dev0");
  auto s1 = Stream::cpu(Device::cpu(1), "dev1");
  Event e(Device::cpu(1));
  e.record(s1);
  try {
    s0.wait(e);
    FAIL();
  } catch (const Error& err) {
    EXPECT_EQ(err.code(), Errc::invalid_argument);
    EXPECT_NE(std::string(err.what()).find("cpu:1"), std::string::npos);
  }
  Event wrong(Device::cpu(0));
  EXPECT_THROW(wrong.record(s1), Error);
}

TEST_F(StreamTest, AwaitingASlowEventHonoursADeadline) {
  auto s = Stream::cpu(Device::cpu(), "slow");
  s.enqueue([] { std::this_thread::sleep_for(300ms); });
  Event e;
  e.record(s);
  auto body = [](Event ev) -> Task<void> { co_await ev; };
  auto start = std::chrono::steady_clock::now();
  try {
    sched.sync_wait(with_timeout(body(e), 20ms, "wait slow"));
    FAIL();
  } catch (const Error& err) {
    EXPECT_EQ(err.code(), Errc::timeout);
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 250ms);
}

TEST_F(StreamTest, SynchronizeHasADeadline) {
  auto s = Stream::cpu(Device::cpu(), "slow");
  s.enqueue([] { std::this_thread::sleep_for(200ms); });
  EXPECT_THROW(s.synchronize(10ms), Error);
}

TEST_F(StreamTest, ReRecordingMovesTheEventButOldAwaitersKeepTheirPoint) {
  auto s = Stream::cpu(Device::cpu(), "compute");
  Event e;
  e.record(s);
  s.synchronize();
  EXPECT_TRUE(e.query());
  std::atomic<bool> gate{false};
  s.enqueue([&] {
    while (!gate) std::this_thread::sleep_for(1ms);
  });
  e.record(s);
  EXPECT_FALSE(e.query());
  gate = true;
  s.synchronize();
  EXPECT_TRUE(e.query());
}

}  // namespace
