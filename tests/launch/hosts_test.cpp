// launch::ranks_per_host: hybrid sharding's default shard group is the ranks of a host, which
// every rank must count alike from the hosts the rendezvous found.
#include "coshard/launch/hosts.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

using namespace coshard;
using namespace coshard::launch;

namespace {

TEST(RanksPerHost, EveryHostHoldingAsManyConsecutiveRanksGivesThatCount) {
  EXPECT_EQ(ranks_per_host({"node1", "node1", "node2", "node2"}).value(), 2);
  EXPECT_EQ(ranks_per_host({"a", "a", "a"}).value(), 3);
  EXPECT_EQ(ranks_per_host({"a", "b", "c"}).value(), 1);
  EXPECT_EQ(ranks_per_host({"solo"}).value(), 1);
}

TEST(RanksPerHost, UnevenOrInterleavedHostsAreNamed) {
  auto uneven = ranks_per_host({"node1", "node1", "node2"});
  ASSERT_FALSE(uneven);
  EXPECT_EQ(uneven.error().code(), Errc::bad_config);
  EXPECT_EQ(uneven.error().message(), "the hosts hold different numbers of ranks (node1: 2, node2: 1)");
  auto cyclic = ranks_per_host({"node1", "node2", "node1", "node2"});
  ASSERT_FALSE(cyclic);
  EXPECT_EQ(cyclic.error().message(), "the ranks of node1 are not consecutive (rank 0, then rank 2 after rank 1 on node2)");
  // Of many hosts, the odd ones, though they come last.
  std::vector<std::string> many;
  for (int h = 0; h < 12; ++h) many.insert(many.end(), h == 11 ? 1 : 2, "n" + std::to_string(h));
  auto long_list = ranks_per_host(many);
  ASSERT_FALSE(long_list);
  EXPECT_EQ(long_list.error().message(), "the hosts hold different numbers of ranks (n11: 1; the other 11 hosts: 2 each)");
  EXPECT_FALSE(ranks_per_host({}));
}

}  // namespace
