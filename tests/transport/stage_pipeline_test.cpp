// The overlapped two-level schedule's pipeline (transport/src/ucx/stage_pipeline.hpp) on two
// one-rank wires of a real UCX context: which stage waits for which, that the cross-host stage
// really runs beside the others, and how a failure on either thread ends both. The collectives
// built on it are checked against a float64 reference across fake hosts (mp/collectives_test.cpp).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "ucx/stage_pipeline.hpp"

using namespace coshard;
using namespace coshard::transport::detail;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

class StagePipelineTest : public ::testing::Test {
 protected:
  void SetUp() override { begin(60s); }
  void begin(std::chrono::milliseconds timeout) {
    const WaitContext wait{"all_reduce#1 (test)", Clock::now() + timeout, timeout};
    near.begin(wait);
    far.begin(wait);
  }
  // Waits (bounded) until `done` holds, for stages that wait on each other.
  static bool eventually(const std::function<bool()>& done) {
    const auto limit = Clock::now() + 10s;
    while (!done()) {
      if (Clock::now() > limit) return false;
      std::this_thread::sleep_for(100us);
    }
    return true;
  }

  // The error run() threw; nothing when it returned.
  std::optional<Error> error_of(int chunks, const StagePipeline::Stages& stages) {
    try {
      pipeline.run(near, far, chunks, stages);
    } catch (const Error& e) {
      return e;
    }
    return std::nullopt;
  }

  std::shared_ptr<UcxContext> ctx = std::make_shared<UcxContext>();
  Wire near{ctx, 0, 1, {}};
  Wire far{ctx, 0, 1, {}};
  StagePipeline pipeline;
};

TEST_F(StagePipelineTest, EachStageWaitsForTheOneBeforeItAndTheCrossHostStageRunsBesideTheOthers) {
  constexpr int kChunks = 8;
  std::vector<std::atomic<int>> before_done(kChunks), across_done(kChunks);
  std::atomic<int> before_started{0};
  std::mutex m;
  std::vector<std::string> breaches;
  auto breach = [&](std::string what) {
    std::lock_guard lock(m);
    breaches.push_back(std::move(what));
  };
  const auto caller = std::this_thread::get_id();
  StagePipeline::Stages s;
  s.before = [&](int k) {
    if (std::this_thread::get_id() != caller) breach("before(" + std::to_string(k) + ") off the calling thread");
    before_started.store(k + 1);
    before_done[static_cast<std::size_t>(k)].store(1);
  };
  s.across = [&](int k) {
    if (std::this_thread::get_id() == caller) breach("across(" + std::to_string(k) + ") on the calling thread");
    if (!before_done[static_cast<std::size_t>(k)].load()) breach("across(" + std::to_string(k) + ") before before()");
    // Overlap: the calling thread goes on with the next chunk while this one crosses.
    if (k == 0 && !eventually([&] { return before_started.load() >= 2; })) breach("before(1) never ran beside across(0)");
    across_done[static_cast<std::size_t>(k)].store(1);
  };
  std::vector<int> after_order;
  s.after = [&](int k) {
    if (!across_done[static_cast<std::size_t>(k)].load()) breach("after(" + std::to_string(k) + ") before across()");
    after_order.push_back(k);
  };
  pipeline.run(near, far, kChunks, s);
  EXPECT_TRUE(breaches.empty()) << ::testing::PrintToString(breaches);
  EXPECT_EQ(after_order, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  // Twice on the same side thread.
  pipeline.run(near, far, kChunks, s);
  EXPECT_TRUE(breaches.empty()) << ::testing::PrintToString(breaches);
}

TEST_F(StagePipelineTest, OneChunkRunsEveryStageInOrderOnTheCallingThread) {
  std::vector<std::string> order;
  const auto caller = std::this_thread::get_id();
  StagePipeline::Stages s;
  s.before = [&](int) { order.push_back("before"); };
  s.across = [&](int) { order.push_back(std::this_thread::get_id() == caller ? "across" : "across elsewhere"); };
  s.after = [&](int) { order.push_back("after"); };
  pipeline.run(near, far, 1, s);
  EXPECT_EQ(order, (std::vector<std::string>{"before", "across", "after"}));
}

TEST_F(StagePipelineTest, TheSiblingsOfBothWiresAreRestoredAfterwards) {
  Wire third{ctx, 0, 1, {}};
  near.progress_with({&far, &third});
  far.progress_with({&third, &near});
  StagePipeline::Stages s;
  std::vector<std::size_t> near_siblings, far_siblings;
  s.before = [&](int) { near_siblings.push_back(near.siblings().size()); };
  s.across = [&](int) { far_siblings.push_back(far.siblings().size()); };
  pipeline.run(near, far, 4, s);
  // While both threads run, neither wire's waits progress the other's worker.
  EXPECT_EQ(near_siblings, (std::vector<std::size_t>{1, 1, 1, 1}));
  EXPECT_EQ(far_siblings, (std::vector<std::size_t>{0, 0, 0, 0}));
  EXPECT_EQ(near.siblings(), (std::vector<Wire*>{&far, &third}));
  EXPECT_EQ(far.siblings(), (std::vector<Wire*>{&third, &near}));
}

TEST_F(StagePipelineTest, AFailureOnTheCallingThreadStopsTheCrossHostStageAtOnce) {
  std::atomic<int> across_ran{0};
  StagePipeline::Stages s;
  s.before = [&](int k) {
    if (k == 2) throw Error(Errc::peer_lost, "job rank 1 is gone");
  };
  s.across = [&](int) { across_ran.fetch_add(1); };
  s.after = [&](int) {};
  const auto start = Clock::now();
  const auto e = error_of(8, s);
  ASSERT_TRUE(e.has_value()) << "no error";
  EXPECT_EQ(e->code(), Errc::peer_lost);
  EXPECT_NE(std::string(e->what()).find("job rank 1 is gone"), std::string::npos) << e->what();
  // The side thread waited for before(2) under a 60 s deadline: the abort, not the deadline, ended it.
  EXPECT_LT(Clock::now() - start, 5s);
  // across(1) runs if the side thread saw before(1) done before the abort reached its wire (the
  // same race as below): no across(2), whose before-stage failed.
  EXPECT_LE(across_ran.load(), 2);
  EXPECT_TRUE(far.aborted().has_value());
}

TEST_F(StagePipelineTest, AFailureOnTheSideThreadStopsTheCallingThreadAtOnce) {
  std::atomic<int> after_ran{0};
  StagePipeline::Stages s;
  s.before = [&](int) {};
  s.across = [&](int k) {
    if (k == 1) throw Error(Errc::io, "send to job rank 3 failed");
  };
  s.after = [&](int) { after_ran.fetch_add(1); };
  const auto start = Clock::now();
  const auto e = error_of(8, s);
  ASSERT_TRUE(e.has_value()) << "no error";
  EXPECT_NE(std::string(e->what()).find("send to job rank 3 failed"), std::string::npos) << e->what();
  EXPECT_LT(Clock::now() - start, 5s);
  // after(0) runs if the calling thread saw across(0) done before the abort reached its wire; it
  // may not have (1 run in 900 of the full suite here): at once means no later chunk's, not none.
  EXPECT_LE(after_ran.load(), 1);
  EXPECT_TRUE(near.aborted().has_value());
}

// The calling thread, waiting for the cross-host stage, meets the deadline with nothing of its own
// to name; the side thread's error, which names the silent peers, is the one thrown.
TEST_F(StagePipelineTest, ATimeoutWhileWaitingForTheOtherThreadYieldsToThatThreadsError) {
  begin(300ms);
  StagePipeline::Stages s;
  s.across = [&](int) {
    std::this_thread::sleep_for(500ms);
    throw Error(Errc::timeout, "all_reduce#1 did not complete; not heard from: job rank 2: 1 message");
  };
  s.after = [&](int) {};
  const auto e = error_of(2, s);
  ASSERT_TRUE(e.has_value()) << "no error";
  EXPECT_EQ(e->code(), Errc::timeout);
  EXPECT_NE(std::string(e->what()).find("job rank 2"), std::string::npos) << e->what();
  EXPECT_FALSE(far.aborted().has_value());  // a timeout aborts nothing: the other side meets it too
}

// The other way round: a per-host stage on the calling thread times out naming its peer, while
// the side thread, waiting for that stage, meets the deadline with nothing to name.
TEST_F(StagePipelineTest, ATimeoutInAStageWinsOverTheOtherThreadsWaitForIt) {
  begin(300ms);
  StagePipeline::Stages s;
  s.before = [&](int k) {
    if (k == 1) {
      std::this_thread::sleep_for(500ms);
      throw Error(Errc::timeout, "all_reduce#1 did not complete; not heard from: job rank 1: 2 messages");
    }
  };
  s.across = [&](int) {};
  const auto e = error_of(4, s);
  ASSERT_TRUE(e.has_value()) << "no error";
  EXPECT_EQ(e->code(), Errc::timeout);
  EXPECT_NE(std::string(e->what()).find("job rank 1"), std::string::npos) << e->what();
}

// Without a side thread (none to be had, or one chunk) every before runs first, as the per-host
// wire sees them on ranks that overlap; then every across, then every after.
TEST_F(StagePipelineTest, TheOrderOnOneThreadIsTheOrderEachWireSeesWhenOverlapped) {
  std::vector<std::string> order;
  StagePipeline::Stages s;
  s.before = [&](int k) { order.push_back("b" + std::to_string(k)); };
  s.across = [&](int k) { order.push_back("x" + std::to_string(k)); };
  s.after = [&](int k) { order.push_back("a" + std::to_string(k)); };
  StagePipeline::run_in_order(2, s);
  EXPECT_EQ(order, (std::vector<std::string>{"b0", "b1", "x0", "x1", "a0", "a1"}));
}

}  // namespace
