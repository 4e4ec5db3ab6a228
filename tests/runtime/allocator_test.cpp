#include <gtest/gtest.h>

#include <limits>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>

#include "coshard/runtime/allocator.hpp"
#include "coshard/runtime/tensor.hpp"

using namespace coshard;
using namespace std::chrono_literals;

namespace {

TEST(Allocator, FreedBlocksAreReusedAndCounted) {
  Allocator alloc(cpu_memory());
  void* first;
  {
    auto b = alloc.allocate(1000);
    first = b.data();
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(first) % 64, 0u);
    auto s = alloc.stats();
    EXPECT_EQ(s.allocated_bytes, 1024u);
    EXPECT_EQ(s.reserved_bytes, 1024u);
    EXPECT_EQ(s.device_allocations, 1u);
  }
  EXPECT_EQ(alloc.stats().allocated_bytes, 0u);
  EXPECT_EQ(alloc.stats().reserved_bytes, 1024u);
  auto again = alloc.allocate(900);  // same 1024-byte class
  EXPECT_EQ(again.data(), first);
  EXPECT_EQ(alloc.stats().cache_hits, 1u);
  EXPECT_EQ(alloc.stats().device_allocations, 1u);
}

TEST(Allocator, PeakTracksTheHighWaterMark) {
  Allocator alloc(cpu_memory());
  {
    auto a = alloc.allocate(4 << 20);
    auto b = alloc.allocate(2 << 20);
  }
  auto s = alloc.stats();
  EXPECT_EQ(s.peak_allocated_bytes, std::size_t{6} << 20);
  EXPECT_EQ(s.allocated_bytes, 0u);
  alloc.reset_peak();
  EXPECT_EQ(alloc.stats().peak_allocated_bytes, 0u);
}

TEST(Allocator, ABlockInUseByAStreamIsReusedOnlyAfterItsEvent) {
  Allocator alloc(cpu_memory());
  auto stream = Stream::cpu(Device::cpu(), "compute");
  std::atomic<bool> gate{false};
  void* p;
  {
    auto b = alloc.allocate(4096);
    p = b.data();
    stream.enqueue([&gate, p] {
      while (!gate) std::this_thread::sleep_for(1ms);
      static_cast<char*>(p)[0] = 1;  // still writing after the host freed the buffer
    });
    Event used;
    used.record(stream);
    b.record_use(used);
  }  // freed on the host while the stream still uses it
  auto c = alloc.allocate(4096);
  EXPECT_NE(c.data(), p) << "reused a block a stream was still using";
  gate = true;
  stream.synchronize();
  c.reset();
  auto d = alloc.allocate(4096);  // both cached blocks are free now; one of them is reused
  EXPECT_EQ(alloc.stats().device_allocations, 2u);
}

// A buffer that lives for the run is used by every step's work: the uses that completed are dropped
// as new ones come, so their events do not pile up, while the ones still running are all kept.
TEST(Allocator, ALongLivedBufferKeepsOnlyTheUsesNotYetComplete) {
  Allocator alloc(cpu_memory());
  auto stream = Stream::cpu(Device::cpu(), "compute");
  auto b = alloc.allocate(4096);
  for (int step = 0; step < 1000; ++step) {
    Event used;
    used.record(stream);
    stream.synchronize();
    b.record_use(used);
  }
  EXPECT_EQ(b.recorded_uses(), 1u);
  std::atomic<bool> gate{false};
  stream.enqueue([&gate] {
    while (!gate) std::this_thread::sleep_for(1ms);
  });
  for (int step = 0; step < 3; ++step) {
    Event used;
    used.record(stream);
    b.record_use(used);
  }
  EXPECT_EQ(b.recorded_uses(), 3u) << "dropped a use whose work had not run";
  gate = true;
  stream.synchronize();
}

TEST(Allocator, CapGivesAClearOutOfMemoryError) {
  Allocator alloc(cpu_memory(), {.cap_bytes = 8 << 20});
  auto a = alloc.allocate(6 << 20);
  try {
    auto b = alloc.allocate(4 << 20);
    FAIL() << "expected out of memory";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::out_of_memory);
    std::string w = e.what();
    for (const char* word : {"requested 4194304", "cap of 8388608", "allocated 6291456", "reserved 6291456"}) {
      EXPECT_NE(w.find(word), std::string::npos) << word << " missing in: " << w;
    }
  }
}

TEST(Allocator, CapReleasesCachedBlocksBeforeFailing) {
  Allocator alloc(cpu_memory(), {.cap_bytes = 8 << 20});
  { auto a = alloc.allocate(6 << 20); }  // cached, reserved
  auto b = alloc.allocate(8 << 20);      // needs the cache released first
  EXPECT_EQ(alloc.stats().reserved_bytes, std::size_t{8} << 20);
}

TEST(Tensor, ViewsShareStorageAndCheckBounds) {
  Allocator alloc(cpu_memory());
  auto t = Tensor::empty(alloc, DType::f32, {4, 8});
  EXPECT_EQ(t.numel(), 32);
  EXPECT_EQ(t.nbytes(), 128u);
  auto row = t.view(8, {8});
  row.data_as<float>()[0] = 3.5f;
  EXPECT_EQ(t.data_as<float>()[8], 3.5f);
  EXPECT_THROW(t.view(30, {8}), Error);
  EXPECT_THROW(t.data_as<std::int32_t>(), Error);
  EXPECT_THROW(t.reshape({5, 8}), Error);
  EXPECT_EQ(t.reshape({32}).numel(), 32);
}

TEST(Tensor, SizesThatOverflowAreErrorsNotWrappedAllocations) {
  Allocator alloc(cpu_memory());
  const std::int64_t big = std::int64_t{1} << 40;
  EXPECT_THROW((void)numel({big, big}), Error);  // 2^80 elements
  try {
    (void)Tensor::empty(alloc, DType::f32, {std::int64_t{1} << 62});  // 2^64 bytes: wraps to 0
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("do not fit in a 64-bit byte count"), std::string::npos) << e.what();
  }
  auto t = Tensor::empty(alloc, DType::f32, {16});
  EXPECT_THROW((void)t.view(std::numeric_limits<std::int64_t>::max(), {2}), Error);  // offset + n wraps
  EXPECT_EQ(bytes_of(3, DType::bf16), 6u);
}

TEST(Tensor, StorageReturnsToThePoolWhenTheLastViewGoes) {
  Allocator alloc(cpu_memory());
  Tensor v;
  {
    auto t = Tensor::empty(alloc, DType::bf16, {1000});
    v = t.view(10, {10});
  }
  EXPECT_GT(alloc.stats().allocated_bytes, 0u);
  v = Tensor();
  EXPECT_EQ(alloc.stats().allocated_bytes, 0u);
}

}  // namespace
