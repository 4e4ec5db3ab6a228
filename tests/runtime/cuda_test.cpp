#include <gtest/gtest.h>

#include "coshard/runtime/cuda.hpp"
#include "coshard/runtime/scheduler.hpp"

using namespace coshard;

namespace {

// GPU tests skip, naming the reason, where no device is usable.
#define REQUIRE_GPU()                                                        \
  if (auto probe_ = cuda::probe(); probe_.devices == 0) {                    \
    GTEST_SKIP() << "no CUDA device: " << probe_.reason;                     \
  }

TEST(Cuda, ProbeNeverThrows) {
  auto p = cuda::probe();
  if (p.devices == 0) {
    EXPECT_FALSE(p.reason.empty());
  }
}

TEST(Cuda, EventCompletionResumesOnTheScheduler) {
  REQUIRE_GPU();
  Scheduler sched;
  sched.start();
  cuda::EventPoller poller(Device::cuda(0));
  poller.start();
  auto s = cuda::make_stream(Device::cuda(0), "compute", poller);
  bool ran = false;
  s.enqueue([&] { ran = true; });
  Event e(Device::cuda(0));
  e.record(s);
  auto body = [](Event ev, Scheduler* sc) -> Task<bool> {
    co_await ev;
    co_return sc->running_in_this_thread();
  };
  EXPECT_TRUE(sched.sync_wait(body(e, &sched)));
  EXPECT_TRUE(ran);
}

TEST(Cuda, CachingAllocatorOnTheDevice) {
  REQUIRE_GPU();
  Allocator alloc(cuda::device_memory(Device::cuda(0)));
  void* p;
  { auto b = alloc.allocate(1 << 20); p = b.data(); }
  auto b = alloc.allocate(1 << 20);
  EXPECT_EQ(b.data(), p);
}

}  // namespace
