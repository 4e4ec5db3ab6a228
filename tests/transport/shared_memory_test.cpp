// The shared host memory behind the UCX communicator's direct path: segments, the registry of
// pointers, and mapping a segment from another process (a forked child, which maps it through
// /proc/<parent>/fd/<fd> like a peer rank would).
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>

#include "coshard/runtime/runtime.hpp"
#include "coshard/runtime/shared_memory.hpp"
#include "coshard/runtime/tensor.hpp"

using namespace coshard;

namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

TEST(SharedMemory, LargeAllocationsAreSegmentsAndPointersInsideThemAreFound) {
  auto memory = shared_cpu_memory(Device::cpu(), kMiB);
  const std::size_t before = shared_segment_count();
  void* p = memory->allocate(3 * kMiB);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(shared_segment_count(), before + 1);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % 4096, 0u);
  std::memset(p, 7, 3 * kMiB);

  SegmentRef ref;
  ASSERT_TRUE(shared_segment_of(p, &ref));
  EXPECT_EQ(ref.pid, ::getpid());
  EXPECT_GE(ref.fd, 0);
  EXPECT_EQ(ref.offset, 0u);
  EXPECT_EQ(ref.size, 3 * kMiB);
  EXPECT_NE(ref.inode, 0u);

  SegmentRef inner;
  auto* mid = static_cast<std::byte*>(p) + kMiB + 12;
  ASSERT_TRUE(shared_segment_of(mid, kMiB, &inner));
  EXPECT_EQ(inner.id, ref.id);
  EXPECT_EQ(inner.fd, ref.fd);
  EXPECT_EQ(inner.offset, kMiB + 12);
  // A range that runs past the segment's end is not inside it.
  EXPECT_FALSE(shared_segment_of(mid, 2 * kMiB, &inner));
  EXPECT_FALSE(shared_segment_of(static_cast<std::byte*>(p) + 3 * kMiB, &inner));

  void* q = memory->allocate(kMiB);
  SegmentRef other;
  ASSERT_TRUE(shared_segment_of(q, &other));
  EXPECT_NE(other.id, ref.id);
  EXPECT_NE(other.fd, ref.fd);

  memory->deallocate(p, 3 * kMiB);
  memory->deallocate(q, kMiB);
  EXPECT_EQ(shared_segment_count(), before);
  EXPECT_FALSE(shared_segment_of(mid, &inner));
}

TEST(SharedMemory, SmallAllocationsComeFromTheHeap) {
  auto memory = shared_cpu_memory(Device::cpu(), kMiB);
  const std::size_t before = shared_segment_count();
  void* p = memory->allocate(kMiB - 512);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % 64, 0u);
  EXPECT_FALSE(shared_segment_of(p, nullptr));
  EXPECT_EQ(shared_segment_count(), before);
  memory->deallocate(p, kMiB - 512);
}

TEST(SharedMemory, TheDescriptorLimitIsRaisedToTheHardOne) {
  auto memory = shared_cpu_memory();
  rlimit rl{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &rl), 0);
  EXPECT_EQ(rl.rlim_cur, rl.rlim_max);
}

TEST(SharedMemory, TheRuntimeAllocatesSharedHostMemoryUnlessTurnedOff) {
  {
    Runtime rt({.name = "shared"});
    Tensor big = Tensor::empty(rt.allocator(), DType::f32, {1 << 20});  // 4 MiB
    SegmentRef ref;
    EXPECT_TRUE(shared_segment_of(big.data(), big.nbytes(), &ref));
    Tensor view = big.view(1000, {10});
    EXPECT_TRUE(shared_segment_of(view.data(), view.nbytes(), &ref));
    EXPECT_EQ(ref.offset, 4000u);
    Tensor small = Tensor::empty(rt.allocator(), DType::f32, {1000});
    EXPECT_FALSE(shared_segment_of(small.data(), nullptr));
  }
  Runtime::Options o;
  o.name = "private";
  o.shared_host_memory = false;
  Runtime rt(o);
  Tensor big = Tensor::empty(rt.allocator(), DType::f32, {1 << 20});
  EXPECT_FALSE(shared_segment_of(big.data(), nullptr));
}

// The child maps the parent's segment as a peer rank would, checks what the parent wrote before
// and after the mapping, and reports through its exit status.
TEST(SharedMemory, AnotherProcessMapsTheSegmentAndSeesLaterWrites) {
  auto memory = shared_cpu_memory(Device::cpu(), kMiB);
  const std::size_t bytes = 2 * kMiB;
  auto* p = static_cast<std::uint32_t*>(memory->allocate(bytes));
  const std::size_t n = bytes / sizeof(std::uint32_t);
  for (std::size_t i = 0; i < n; ++i) p[i] = static_cast<std::uint32_t>(i * 2654435761u);
  SegmentRef ref;
  ASSERT_TRUE(shared_segment_of(p, &ref));

  int to_child[2], to_parent[2];
  ASSERT_EQ(::pipe(to_child), 0);
  ASSERT_EQ(::pipe(to_parent), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    int rc = 0;
    try {
      PeerMapping m = PeerMapping::map(ref);
      const auto* seen = reinterpret_cast<const std::uint32_t*>(m.data());
      if (m.size() != bytes) rc = 10;
      for (std::size_t i = 0; i < n && rc == 0; ++i) {
        if (seen[i] != static_cast<std::uint32_t>(i * 2654435761u)) rc = 11;
      }
      char c = 'm';
      if (::write(to_parent[1], &c, 1) != 1) rc = 12;
      if (::read(to_child[0], &c, 1) != 1) rc = 13;
      if (rc == 0 && (seen[0] != 0xABCDEF01u || seen[n - 1] != 0x12345678u)) rc = 14;
    } catch (...) {
      rc = 15;
    }
    ::_exit(rc);
  }
  char c = 0;
  ASSERT_EQ(::read(to_parent[0], &c, 1), 1);
  p[0] = 0xABCDEF01u;
  p[n - 1] = 0x12345678u;
  ASSERT_EQ(::write(to_child[1], &c, 1), 1);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "10: wrong size, 11: wrong data, 14: later writes not seen, 15: map threw";
  for (int fd : {to_child[0], to_child[1], to_parent[0], to_parent[1]}) ::close(fd);
  memory->deallocate(p, bytes);
}

TEST(SharedMemory, MappingAFreedOrWrongSegmentFailsWithTheReason) {
  auto memory = shared_cpu_memory(Device::cpu(), kMiB);
  void* p = memory->allocate(kMiB);
  SegmentRef ref;
  ASSERT_TRUE(shared_segment_of(p, &ref));
  SegmentRef wrong = ref;
  wrong.inode += 1;
  try {
    (void)PeerMapping::map(wrong);
    FAIL() << "mapped a segment with the wrong inode";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::io);
    EXPECT_NE(e.message().find("another file"), std::string::npos) << e.message();
  }
  memory->deallocate(p, kMiB);
  try {
    (void)PeerMapping::map(ref);
    FAIL() << "mapped a freed segment";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::io);
    EXPECT_NE(e.message().find("/proc/"), std::string::npos) << e.message();
  }
}

}  // namespace
