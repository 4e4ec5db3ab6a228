// The buffer pool on its own: a slot comes back with the event of its last use, and whoever
// takes it next must wait for exactly that event.
#include "buffer_pool.hpp"

#include <gtest/gtest.h>

namespace coshard::fsdp::detail {
namespace {

struct BufferPoolTest : ::testing::Test {
  Runtime rt{{.rank = 0}};
  BufferPool pool{DType::f32};
  Event recorded() {
    Event e;
    e.record(rt.stream("s"));
    return e;
  }
};

TEST_F(BufferPoolTest, AFreshSlotHasNothingToWaitFor) {
  auto lease = pool.acquire(rt.allocator(), 64);
  EXPECT_EQ(lease.slot, 0);
  EXPECT_FALSE(lease.previous_use.has_value());
  EXPECT_EQ(lease.buffer.numel(), 64);
  EXPECT_EQ(pool.held(), 1u);
}

TEST_F(BufferPoolTest, AReusedSlotCarriesTheEventOfItsLastUse) {
  auto first = pool.acquire(rt.allocator(), 64);
  const Event used = recorded();
  pool.release(first.slot, used);
  auto again = pool.acquire(rt.allocator(), 64);
  EXPECT_EQ(again.slot, first.slot);
  ASSERT_TRUE(again.previous_use.has_value());
  EXPECT_EQ(again.previous_use->point(), used.point());
  EXPECT_EQ(again.buffer.data(), first.buffer.data());  // the same memory, not a new allocation
  EXPECT_EQ(pool.slots(), 1u);
}

TEST_F(BufferPoolTest, GrowsOnlyWhenEverySlotIsHeld) {
  auto a = pool.acquire(rt.allocator(), 64);
  auto b = pool.acquire(rt.allocator(), 64);
  EXPECT_NE(a.slot, b.slot);
  EXPECT_EQ(pool.slots(), 2u);
  pool.release(a.slot, recorded());
  pool.acquire(rt.allocator(), 64);
  EXPECT_EQ(pool.slots(), 2u);
  EXPECT_EQ(pool.held(), 2u);
}

TEST_F(BufferPoolTest, TakesTheSlotReleasedLongestAgo) {
  auto a = pool.acquire(rt.allocator(), 64);
  auto b = pool.acquire(rt.allocator(), 64);
  pool.release(b.slot, recorded());
  pool.release(a.slot, recorded());
  EXPECT_EQ(pool.acquire(rt.allocator(), 64).slot, b.slot);  // its last user is the most likely done
}

// Units of different sizes: each slot is sized for its unit, a request takes the smallest free slot
// that fits, and a free slot too small for a request is replaced rather than joined by a new one
// (GPT-2 124M's embedding unit is 5.5 blocks: a pool sized for it held 13 x 157 MB under
// SHARD_GRAD_OP where 500 MB were needed).
TEST_F(BufferPoolTest, SlotsAreSizedPerUnitAndTakenBySizeClass) {
  auto big = pool.acquire(rt.allocator(), 100);
  auto small = pool.acquire(rt.allocator(), 10);
  EXPECT_EQ(big.buffer.numel(), 100);
  EXPECT_EQ(small.buffer.numel(), 10);
  EXPECT_EQ(pool.numel(), 110);
  pool.release(big.slot, recorded());
  pool.release(small.slot, recorded());
  auto mid = pool.acquire(rt.allocator(), 60);  // only the 100 slot fits
  EXPECT_EQ(mid.slot, big.slot);
  auto other = pool.acquire(rt.allocator(), 30);  // the free 10 slot is replaced by a 30 one
  EXPECT_EQ(other.slot, small.slot);
  EXPECT_EQ(other.buffer.numel(), 30);
  EXPECT_FALSE(other.previous_use.has_value());  // new memory; the allocator orders the old one's reuse
  EXPECT_EQ(pool.slots(), 2u);
  EXPECT_EQ(pool.numel(), 130);
  pool.release(mid.slot, recorded());
  pool.release(other.slot, recorded());
  EXPECT_EQ(pool.acquire(rt.allocator(), 25).slot, other.slot);  // the smallest fit, not the 100 slot
}

}  // namespace
}  // namespace coshard::fsdp::detail
