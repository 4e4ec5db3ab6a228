// The buffer pool on its own: a slot comes back with the event of its last use, and whoever
// takes it next must wait for exactly that event.
#include "buffer_pool.hpp"

#include <gtest/gtest.h>

namespace coshard::fsdp::detail {
namespace {

struct BufferPoolTest : ::testing::Test {
  Runtime rt{{.rank = 0}};
  BufferPool pool{DType::f32, 64};
  Event recorded() {
    Event e;
    e.record(rt.stream("s"));
    return e;
  }
};

TEST_F(BufferPoolTest, AFreshSlotHasNothingToWaitFor) {
  auto lease = pool.acquire(rt.allocator());
  EXPECT_EQ(lease.slot, 0);
  EXPECT_FALSE(lease.previous_use.has_value());
  EXPECT_EQ(lease.buffer.numel(), 64);
  EXPECT_EQ(pool.held(), 1u);
}

TEST_F(BufferPoolTest, AReusedSlotCarriesTheEventOfItsLastUse) {
  auto first = pool.acquire(rt.allocator());
  const Event used = recorded();
  pool.release(first.slot, used);
  auto again = pool.acquire(rt.allocator());
  EXPECT_EQ(again.slot, first.slot);
  ASSERT_TRUE(again.previous_use.has_value());
  EXPECT_EQ(again.previous_use->point(), used.point());
  EXPECT_EQ(again.buffer.data(), first.buffer.data());  // the same memory, not a new allocation
  EXPECT_EQ(pool.slots(), 1u);
}

TEST_F(BufferPoolTest, GrowsOnlyWhenEverySlotIsHeld) {
  auto a = pool.acquire(rt.allocator());
  auto b = pool.acquire(rt.allocator());
  EXPECT_NE(a.slot, b.slot);
  EXPECT_EQ(pool.slots(), 2u);
  pool.release(a.slot, recorded());
  pool.acquire(rt.allocator());
  EXPECT_EQ(pool.slots(), 2u);
  EXPECT_EQ(pool.held(), 2u);
}

TEST_F(BufferPoolTest, TakesTheSlotReleasedLongestAgo) {
  auto a = pool.acquire(rt.allocator());
  auto b = pool.acquire(rt.allocator());
  pool.release(b.slot, recorded());
  pool.release(a.slot, recorded());
  EXPECT_EQ(pool.acquire(rt.allocator()).slot, b.slot);  // its last user is the most likely done
}

}  // namespace
}  // namespace coshard::fsdp::detail
