// The per-step plan on its own: recording, prefetch targets, reshard decisions.
#include "plan.hpp"

#include <gtest/gtest.h>

namespace coshard::fsdp::detail {
namespace {

using Units = std::vector<std::size_t>;

// A root of two phases (tied embedding and head) around two blocks, as GPT-2.
Plan gpt_like(Options o = {}) { return Plan({"root", "h0", "h1"}, {2, 1, 1}, std::move(o)); }

// Runs one forward in the default order, recording it as the engine does.
void record_first_iteration(Plan& p) {
  for (std::size_t u : p.forward_order()) {
    const std::size_t pos = p.next_forward_position();
    p.record(u);
    p.forward_done(pos);
  }
  p.end_iteration();
}

TEST(Plan, DefaultOrderRunsLaterPhasesInnermostFirst) {
  Plan p = gpt_like();
  EXPECT_FALSE(p.ready());
  EXPECT_EQ(p.forward_order(), (Units{0, 1, 2, 0}));
  EXPECT_EQ(p.steps_per_iteration(), 4u);
}

TEST(Plan, TheFirstIterationBecomesThePlanAfterItsLastPhase) {
  Plan p({"a", "b", "c"}, {1, 1, 1}, {});
  for (std::size_t u : {2u, 0u}) {
    const std::size_t pos = p.next_forward_position();
    p.record(u);
    p.forward_done(pos);
    EXPECT_FALSE(p.ready());
  }
  const std::size_t pos = p.next_forward_position();
  p.record(1);
  p.forward_done(pos);
  EXPECT_TRUE(p.ready());
  EXPECT_EQ(p.forward_order(), (Units{2, 0, 1}));
  p.end_iteration();
  EXPECT_EQ(p.next_forward_position(), 0u);
}

TEST(Plan, NoPrefetchBeforeThePlanIsKnown) {
  Plan p = gpt_like();
  EXPECT_TRUE(p.forward_prefetch(0, 0).empty());
}

TEST(Plan, ForwardPrefetchTakesTheNextUnitsOfThePlan) {
  Options o;
  o.prefetch.forward = 2;
  Plan p = gpt_like(o);
  record_first_iteration(p);
  EXPECT_EQ(p.forward_prefetch(0, 0), (Units{1, 2}));
  EXPECT_EQ(p.forward_prefetch(2, 2), (Units{0}));  // only one position left
  EXPECT_TRUE(p.forward_prefetch(0, 3).empty());
}

TEST(Plan, BackwardPrefetchTakesTheNextUnitInReverse) {
  Plan p = gpt_like();
  record_first_iteration(p);  // plan 0 1 2 0: backward runs 0 2 1 0
  EXPECT_EQ(p.backward_prefetch(0, 0), (Units{2}));
  EXPECT_EQ(p.backward_prefetch(2, 1), (Units{1}));
  EXPECT_EQ(p.backward_prefetch(1, 2), (Units{0}));
  EXPECT_TRUE(p.backward_prefetch(0, 3).empty());
}

TEST(Plan, ExplicitListsOverrideByName) {
  Options o;
  o.prefetch.forward_explicit = {{"root", {"h1", "h0"}}};
  o.prefetch.backward_explicit = {{"h1", {"root"}}};
  o.prefetch.backward = BackwardPrefetch::none;
  Plan p = gpt_like(o);
  EXPECT_EQ(p.forward_prefetch(0, 0), (Units{2, 1}));  // also before the plan is known
  record_first_iteration(p);
  EXPECT_EQ(p.backward_prefetch(2, 1), (Units{0}));
  EXPECT_TRUE(p.prefetch_before_backward(2));   // explicit lists run before the gradient compute
  EXPECT_FALSE(p.prefetch_before_backward(1));  // none
  EXPECT_FALSE(p.prefetch_after_backward(1));
}

TEST(Plan, BackwardPrefetchPositionFollowsTheOption) {
  Options pre, post;
  post.prefetch.backward = BackwardPrefetch::post;
  EXPECT_TRUE(gpt_like(pre).prefetch_before_backward(1));
  EXPECT_FALSE(gpt_like(pre).prefetch_after_backward(1));
  EXPECT_FALSE(gpt_like(post).prefetch_before_backward(1));
  EXPECT_TRUE(gpt_like(post).prefetch_after_backward(1));
}

TEST(Plan, FullShardKeepsOnlyTheLastUnitOfThePlanAfterForward) {
  Plan p({"a", "b", "c"}, {1, 1, 1}, {});
  EXPECT_TRUE(p.reshard_after_forward(2));  // nothing known yet: every unit reshards
  record_first_iteration(p);
  EXPECT_TRUE(p.reshard_after_forward(0));
  EXPECT_TRUE(p.reshard_after_forward(1));
  EXPECT_FALSE(p.reshard_after_forward(2));  // runs first in backward, as FSDP's root
}

TEST(Plan, ReshardAfterForwardPerStrategyAndOverride) {
  auto with = [](Strategy s, std::optional<std::variant<bool, int>> raf) {
    Options o;
    o.strategy = s;
    o.reshard_after_forward = raf;
    return Plan({"a", "b"}, {1, 1}, o).reshard_after_forward(0);
  };
  EXPECT_FALSE(with(Strategy::shard_grad_op, std::nullopt));
  EXPECT_FALSE(with(Strategy::hybrid_shard_zero2, std::nullopt));
  EXPECT_FALSE(with(Strategy::no_shard, true));  // NO_SHARD has nothing to reshard
  EXPECT_TRUE(with(Strategy::hybrid_shard, std::nullopt));
  EXPECT_TRUE(with(Strategy::shard_grad_op, true));
  EXPECT_FALSE(with(Strategy::full_shard, false));
  EXPECT_TRUE(with(Strategy::full_shard, 2));  // to a group size
}

TEST(Plan, DeviationIsSeenOnlyOnceThePlanIsReady) {
  Plan p({"a", "b"}, {1, 1}, {});
  EXPECT_FALSE(p.deviates(0, 1));
  record_first_iteration(p);
  EXPECT_FALSE(p.deviates(0, 0));
  EXPECT_TRUE(p.deviates(0, 1));
  EXPECT_TRUE(p.deviates(2, 0));  // past the plan's end
}

}  // namespace
}  // namespace coshard::fsdp::detail
