#include "coshard/runtime/readback.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "coshard/runtime/scheduler.hpp"

using namespace coshard;
using namespace std::chrono_literals;

namespace {

class ReadbackTest : public ::testing::Test {
 protected:
  void SetUp() override { sched.start(); }
  Scheduler sched;
  Stream stream = Stream::cpu(Device::cpu(), "compute");
};

Task<float> read(Readback<float>& r) { co_return co_await r.get(); }

// Reads the first publish while the second is held behind a gate on the stream, then the second.
Task<float> read_both(Readback<float>& r, Stream& s, std::atomic<bool>& gate, float& first, bool& second_ran_early) {
  Task<float> earlier = r.get();  // holds the first publish
  s.enqueue([&gate] {
    while (!gate) std::this_thread::sleep_for(1ms);
  });
  bool second_ran = false;
  r.publish(s, [&second_ran] {
    second_ran = true;
    return 2.0f;
  });
  first = co_await std::move(earlier);
  second_ran_early = second_ran;  // the gate is still closed: the second compute cannot have run
  gate = true;
  co_return co_await r.get();
}

TEST_F(ReadbackTest, GetBeforeAnyPublishIsAnErrorThatSaysWhy) {
  Readback<float> loss;
  EXPECT_FALSE(loss.published());
  try {
    sched.sync_wait(read(loss));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("before any publish"), std::string::npos) << e.what();
  }
}

// The kernel before the publish is slow: reading its output directly would see 0; get() waits.
TEST_F(ReadbackTest, GetWaitsForTheWorkBeforeThePublish) {
  float kernel_output = 0;  // written by the stream only
  stream.enqueue([&] {
    std::this_thread::sleep_for(50ms);
    kernel_output = 3.5f;
  });
  Readback<float> loss;
  loss.publish(stream, [&] { return kernel_output; });
  EXPECT_TRUE(loss.published());
  EXPECT_EQ(sched.sync_wait(read(loss)), 3.5f);
}

// A read started before the next publish returns its own value, while the next one is queued.
TEST_F(ReadbackTest, EachPublishHasItsOwnValue) {
  Readback<float> loss;
  loss.publish(stream, [] { return 1.0f; });
  std::atomic<bool> gate{false};
  float first = 0;
  bool second_ran_early = true;
  EXPECT_EQ(sched.sync_wait(read_both(loss, stream, gate, first, second_ran_early)), 2.0f);
  EXPECT_EQ(first, 1.0f);
  EXPECT_FALSE(second_ran_early);
}

TEST_F(ReadbackTest, AFailedComputeIsRethrownByGet) {
  Readback<float> loss;
  loss.publish(stream, []() -> float { throw Error(Errc::device, "the loss kernel failed"); });
  try {
    sched.sync_wait(read(loss));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the loss kernel failed"), std::string::npos) << e.what();
  }
}

}  // namespace
