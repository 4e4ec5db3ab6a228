#include <gtest/gtest.h>

#include <mutex>
#include <vector>

#include "coshard/runtime/cuda.hpp"
#include "coshard/runtime/runtime.hpp"

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
