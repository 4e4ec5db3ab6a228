#include <gtest/gtest.h>

#include <cstring>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "coshard/runtime/cuda.hpp"
#include "coshard/runtime/runtime.hpp"
#include "coshard/runtime/timeout.hpp"

using namespace coshard;

namespace {

// Records spans so the test can check what the streams reported.
class RecordingTelemetry final : public Telemetry {
 public:
  Counter& counter(std::string_view, std::string_view, const Labels&) override { return noop_.counter({}, {}, {}); }
  Gauge& gauge(std::string_view, std::string_view, const Labels&) override { return noop_.gauge({}, {}, {}); }
  Histogram& histogram(std::string_view, std::string_view, const Labels&, std::span<const double>) override {
    return noop_.histogram({}, {}, {}, {});
  }
  void span(Span s) override {
    std::lock_guard lock(m);
    spans.push_back(std::move(s));
  }
  bool tracing() const noexcept override { return true; }
  std::mutex m;
  std::vector<Span> spans;

 private:
  NoopTelemetry noop_;
};

TEST(Runtime, OwnsSchedulerStreamsAndAllocator) {
  RecordingTelemetry telemetry;
  Runtime rt({.rank = 2, .telemetry = &telemetry});
  auto& compute = rt.stream("compute");
  EXPECT_EQ(&compute, &rt.stream("compute"));
  auto buf = rt.allocator().allocate(100);
  compute.enqueue([p = static_cast<char*>(buf.data())] { p[0] = 1; }, "fwd unit0");
  compute.enqueue([] {});  // unlabelled: no span
  Event e;
  e.record(compute);
  rt.scheduler().sync_wait([](Event ev) -> Task<void> { co_await ev; }(e));
  std::lock_guard lock(telemetry.m);
  ASSERT_EQ(telemetry.spans.size(), 1u);
  EXPECT_EQ(telemetry.spans[0].name, "fwd unit0");
  EXPECT_EQ(telemetry.spans[0].stream, "compute");
  EXPECT_EQ(telemetry.spans[0].rank, 2);
  EXPECT_LE(telemetry.spans[0].begin, telemetry.spans[0].end);
}

// Runtime::Options::log reaches the runtime's scheduler and Runtime::log, which the communicators
// and the engine write through.
TEST(Runtime, ItsLogSinkTakesTheSchedulersMessagesAndItsOwn) {
  std::mutex m;
  std::vector<std::string> said;
  Runtime rt({.log = [&](LogLevel level, std::string_view line) {
    std::lock_guard lock(m);
    said.push_back(std::string(level == LogLevel::warning ? "warning " : "") + std::string(line));
  }});
  rt.log(LogLevel::warning, "a note");
  rt.scheduler().spawn([]() -> Task<void> {
    throw Error(Errc::internal, "lost");
    co_return;
  }());
  rt.scheduler().sync_wait([]() -> Task<void> { co_await sleep_for(std::chrono::milliseconds(20)); }());
  rt.stop();
  std::lock_guard lock(m);
  ASSERT_EQ(said.size(), 2u);
  EXPECT_EQ(said[0], "warning a note");
  EXPECT_NE(said[1].find("spawned task failed: "), std::string::npos) << said[1];
}

TEST(Runtime, ACudaDeviceWithoutAGpuIsAClearError) {
  if (cuda::probe().devices > 0) GTEST_SKIP() << "a GPU is present";
  try {
    Runtime rt({.device = Device::cuda(0)});
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::device);
    EXPECT_NE(std::string(e.what()).find("cuda:0"), std::string::npos);
  }
}

TEST(Runtime, StreamJitterIsRefusedOnCuda) {
  try {
    Runtime rt({.device = Device::cuda(0), .stream_jitter = std::chrono::microseconds(100)});
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("stream jitter"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("CPU backend"), std::string::npos) << e.what();
  }
}

}  // namespace

namespace {

// Offload's host memory on CUDA: pinned where it can be, plain (with one warning) where not.
TEST(PinnedHostMemory, FallsBackToPlainMemoryWithOneWarningWhenPinningFails) {
#ifndef COSHARD_HAVE_CUDA
  GTEST_SKIP() << "built without CUDA: there is nothing to pin for";
#else
  std::vector<std::string> warnings;
  auto memory = cuda::pinned_host_memory([&](const std::string& why) { warnings.push_back(why); });
  auto* a = static_cast<unsigned char*>(memory->allocate(1000));
  auto* b = static_cast<unsigned char*>(memory->allocate(5000));
  std::memset(a, 1, 1000);  // host memory either way
  std::memset(b, 2, 5000);
  EXPECT_EQ(a[999] + b[4999], 3);
  if (cuda::probe().devices > 0) {
    EXPECT_TRUE(warnings.empty()) << warnings.front();
  } else {
    ASSERT_EQ(warnings.size(), 1u);  // once, not per allocation
    EXPECT_NE(warnings[0].find("ulimit -l"), std::string::npos) << warnings[0];
  }
  memory->deallocate(a, 1000);
  memory->deallocate(b, 5000);
#endif
}

}  // namespace

namespace {

// The CUDA-safe unit contract (docs/fsdp.md): host work on a CUDA stream runs as a host callback,
// where coshard's CUDA calls abort naming the work instead of hanging the device.
TEST(CudaHostCallbacksDeathTest, ACudaCallFromHostWorkAbortsNamingIt) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_FALSE(cuda::in_host_callback());
  cuda::check_callable("cudaMemcpyAsync");  // outside host work: nothing happens
  EXPECT_DEATH(
      {
        const std::string stream = "compute";
        const std::string span = "forward h.3";
        cuda::HostCallbackScope scope(stream, span);
        if (cuda::in_host_callback()) cuda::check_callable("cudaMemcpyAsync");
      },
      "CUDA call cudaMemcpyAsync from host work 'forward h.3' on stream 'compute'");
  EXPECT_FALSE(cuda::in_host_callback());
}

}  // namespace
