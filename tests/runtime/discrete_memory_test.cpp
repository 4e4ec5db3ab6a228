// The cpu-discrete device (discrete_memory.hpp): its memory is reachable from stream work and
// from nothing else, and copies between it and host memory go through streams.
#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <vector>

#include "coshard/runtime/copy.hpp"
#include "coshard/runtime/cuda.hpp"
#include "coshard/runtime/discrete_memory.hpp"
#include "coshard/runtime/runtime.hpp"

using namespace coshard;

namespace {

Runtime::Options discrete() { return {.discrete_memory = true}; }

// What a death test's child prints when the host touches device memory.
constexpr const char* kHostAccess = "host access to cpu-discrete device memory at 0x[0-9a-f]+";

TEST(DiscreteMemory, StreamWorkReadsAndWritesAndCopiesRoundTrip) {
  Runtime rt(discrete());
  EXPECT_FALSE(rt.host_accessible());
  Stream& s = rt.stream("compute");
  // Big enough for a shared segment and small enough for an anonymous mapping.
  for (std::int64_t n : {std::int64_t{7}, std::int64_t{1} << 19}) {
    Tensor t = Tensor::empty(rt.allocator(), DType::f32, {n});
    std::vector<float> in(static_cast<std::size_t>(n));
    std::iota(in.begin(), in.end(), 1.0f);
    upload(s, t, in, "upload");
    s.enqueue([t] {
      float* p = t.data_as<float>();
      for (std::int64_t i = 0; i < t.numel(); ++i) p[i] *= 2;
    });
    auto out = rt.scheduler().sync_wait(download<float>(s, t));
    ASSERT_EQ(out.size(), in.size());
    for (std::size_t i = 0; i < in.size(); ++i) ASSERT_EQ(out[i], 2 * in[i]) << i;
  }
}

// A tensor says whether the host may dereference it, and its views say the same: what the engine
// checks so that no piece of its work mixes device and host memory (device_work.hpp).
TEST(DiscreteMemory, TensorsSayWhetherTheHostCanReachThem) {
  Runtime rt(discrete());
  Allocator host(cpu_memory());
  const Tensor device = Tensor::empty(rt.allocator(), DType::f32, {8});
  const Tensor plain = Tensor::empty(host, DType::f32, {8});
  EXPECT_FALSE(device.host_accessible());
  EXPECT_FALSE(device.view(2, {3}).host_accessible());
  EXPECT_TRUE(plain.host_accessible());
  EXPECT_TRUE(plain.view(2, {3}).host_accessible());
  Runtime cpu(Runtime::Options{});
  EXPECT_TRUE(Tensor::empty(cpu.allocator(), DType::f32, {1}).host_accessible());
  EXPECT_TRUE(Tensor().host_accessible());  // no storage: nothing to fault on
}

TEST(DiscreteMemory, TheGateIsClosedOnceTheStreamsAreIdle) {
  DiscreteCpuMemory memory(Device::cpu(), 0);
  auto s = Stream::cpu(Device::cpu(), "compute", {.gate = &memory});
  bool open_inside = false;
  s.enqueue([&] { open_inside = memory.is_open(); });
  s.synchronize();
  EXPECT_TRUE(open_inside);
  EXPECT_FALSE(memory.is_open());
}

TEST(DiscreteMemoryDeathTest, AHostWriteAbortsNamingTheAccess) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        Runtime rt(discrete());
        Tensor t = Tensor::empty(rt.allocator(), DType::f32, {16});
        t.data_as<float>()[3] = 1.0f;  // the engine's old zero fill of a fresh shard
      },
      kHostAccess);
}

TEST(DiscreteMemoryDeathTest, AHostReadAfterAwaitingTheStreamAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        Runtime rt(discrete());
        Tensor t = Tensor::empty(rt.allocator(), DType::i64, {1});
        Stream& s = rt.stream("compute");
        upload(s, t, std::vector<std::int64_t>{42});
        Event done(s.device());
        done.record(s);
        rt.scheduler().sync_wait([](Event e, Tensor v) -> Task<void> {
          co_await e;
          volatile std::int64_t read = v.data_as<std::int64_t>()[0];  // what download() is for
          (void)read;
        }(done, t));
      },
      kHostAccess);
}

TEST(DiscreteMemory, CopiesCheckSizesAndDevices) {
  Runtime rt(discrete());
  Stream& s = rt.stream("compute");
  Tensor t = Tensor::empty(rt.allocator(), DType::f32, {4});
  EXPECT_THROW(upload(s, t, std::vector<float>(3)), Error);
  EXPECT_THROW(upload(s, t, std::vector<std::int32_t>(4)), Error);
  auto other = Stream::cpu(Device::cpu(1), "other");
  try {
    upload(other, t, std::vector<float>(4));
    FAIL() << "a copy on another device's stream was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cpu:1"), std::string::npos) << e.what();
  }
}

TEST(DiscreteMemory, IsACpuModeOnly) {
  try {
    Runtime rt({.device = Device::cuda(0), .discrete_memory = true});
    FAIL() << "discrete memory was accepted on CUDA";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("cpu-discrete"), std::string::npos) << e.what();
  }
}

}  // namespace
