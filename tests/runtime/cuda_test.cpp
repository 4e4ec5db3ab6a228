#include <gtest/gtest.h>

#ifdef COSHARD_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "coshard/runtime/copy.hpp"
#include "coshard/runtime/cuda.hpp"
#include "coshard/runtime/runtime.hpp"
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

// The stream-ordered copies on a real device: upload, copy, zero, download.
TEST(Cuda, CopiesRoundTripThroughTheDevice) {
  REQUIRE_GPU();
  Runtime rt({.device = Device::cuda(0)});
  Stream& s = rt.stream("compute");
  std::vector<float> in(1 << 16);
  std::iota(in.begin(), in.end(), 0.0f);
  Tensor a = Tensor::empty(rt.allocator(), DType::f32, {1 << 16});
  Tensor b = Tensor::empty(rt.allocator(), DType::f32, {1 << 16});
  upload(s, a, in);
  copy_tensor(s, b, a);
  fill_zero(s, a.view(0, {16}));
  auto got_b = rt.scheduler().sync_wait(download<float>(s, b));
  auto got_a = rt.scheduler().sync_wait(download<float>(s, a));
  EXPECT_EQ(got_b, in);
  for (std::size_t i = 0; i < in.size(); ++i) ASSERT_EQ(got_a[i], i < 16 ? 0.0f : in[i]) << i;
}

// Copies from and to pageable memory go through the stream's pinned buffer in chunks and never
// block the caller: issued while host work holds the stream, they return at once (a blocking one
// would wait out the hold's 10 s), and the bytes arrive whole across chunk boundaries. The same
// copies from pinned memory take one DMA.
TEST(Cuda, PageableCopiesReturnAtOnceAndArriveWhole) {
  REQUIRE_GPU();
  Runtime rt({.device = Device::cuda(0)});
  Stream& s = rt.stream("copies");
  const auto n = static_cast<std::int64_t>((2 * cuda::kStagingBytes + 4096) / sizeof(float) + 3);  // 3 chunks
  std::vector<float> in(static_cast<std::size_t>(n));
  std::iota(in.begin(), in.end(), 1.0f);
  Tensor t = Tensor::empty(rt.allocator(), DType::f32, {n});
  auto release = std::make_shared<std::atomic<bool>>(false);
  s.enqueue([release] {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!release->load() && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }, "hold");
  const auto t0 = std::chrono::steady_clock::now();
  upload(s, t, in);
  auto out = std::make_shared<std::vector<std::byte>>();
  copy_to_host(s, t, out);
  const auto issued = std::chrono::steady_clock::now() - t0;
  release->store(true);
  EXPECT_LT(issued, std::chrono::seconds(5)) << "a copy from or to pageable memory blocked the caller";
  Event done(s.device());
  done.record(s);
  rt.scheduler().sync_wait([](Event e) -> Task<void> { co_await e; }(done));
  ASSERT_EQ(out->size(), in.size() * sizeof(float));
  std::vector<float> got(in.size());
  std::memcpy(got.data(), out->data(), out->size());
  EXPECT_EQ(got, in);
  // From and to pinned memory: one cudaMemcpyAsync each way.
  Allocator pinned(cuda::pinned_host_memory());
  Tensor host = Tensor::empty(pinned, DType::f32, {n});
  ASSERT_TRUE(cuda::pinned(host.data()));
  EXPECT_FALSE(cuda::pinned(in.data()));
  std::memcpy(host.data(), in.data(), in.size() * sizeof(float));
  Tensor u = Tensor::empty(rt.allocator(), DType::f32, {n});
  copy_to_device(s, u, host.data(), host.nbytes(), nullptr, "pinned up");
  Tensor back = Tensor::empty(pinned, DType::f32, {n});
  copy_tensor(s, back, u);
  Event copied(s.device());
  copied.record(s);
  rt.scheduler().sync_wait([](Event e) -> Task<void> { co_await e; }(copied));
  EXPECT_EQ(std::memcmp(back.data(), in.data(), back.nbytes()), 0);
  // Between two host buffers on a CUDA stream: host work, in stream order.
  Tensor again = Tensor::empty(pinned, DType::f32, {n});
  copy_tensor(s, again, back);
  EXPECT_EQ(rt.scheduler().sync_wait(download<float>(s, again)), in);
}

#ifdef COSHARD_HAVE_CUDA  // asks the CUDA runtime itself whether the memory is pinned
// Pinned host memory on a machine with a device: no fallback, no warning.
TEST(Cuda, PinnedHostMemoryPins) {
  REQUIRE_GPU();
  std::vector<std::string> warnings;
  auto memory = cuda::pinned_host_memory([&](const std::string& w) { warnings.push_back(w); });
  void* p = memory->allocate(1 << 20);
  unsigned int flags = 0;
  EXPECT_EQ(cudaHostGetFlags(&flags, p), cudaSuccess);
  memory->deallocate(p, 1 << 20);
  EXPECT_TRUE(warnings.empty());
}
#endif

// Host work on a CUDA stream that calls CUDA through coshard aborts, naming the work.
TEST(CudaDeathTest, HostWorkCallingCudaAbortsNamingIt) {
  REQUIRE_GPU();
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        Runtime rt({.device = Device::cuda(0)});
        Stream& s = rt.stream("compute");
        Tensor t = Tensor::empty(rt.allocator(), DType::f32, {4});
        s.enqueue([&s, t] { fill_zero(s, t); }, "zero inside a callback");
        s.synchronize();
      },
      "from host work 'zero inside a callback' on stream 'compute'");
}

}  // namespace
