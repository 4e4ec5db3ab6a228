// How coshard-run writes lists of nodes: for people, runs as ranges (a message about 65535 nodes
// stays a line); for the store, every node, read back as written.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "coordinator_internal.hpp"

namespace {

using namespace coshard::run::coord;

TEST(NodeList, RunsOfThreeOrMoreAreRangesAndShorterOnesAreListed) {
  EXPECT_EQ(node_list({}), "");
  EXPECT_EQ(node_list({5}), "5");
  EXPECT_EQ(node_list({1, 2}), "1, 2");
  EXPECT_EQ(node_list({1, 2, 3}), "1-3");
  EXPECT_EQ(node_list({0, 1, 3, 4, 5, 6, 7, 9}), "0, 1, 3-7, 9");
  EXPECT_EQ(node_list({0, 2, 3, 4, 6, 7}), "0, 2-4, 6, 7");
  std::vector<int> many = every_node(65536);
  many.erase(many.begin());
  EXPECT_EQ(node_list(many), "1-65535");
}

TEST(NodeList, TheStoresFormListsEveryNodeAndReadsBack) {
  const std::vector<int> nodes = {0, 1, 2, 3, 7};
  EXPECT_EQ(node_words(nodes), "0 1 2 3 7");
  EXPECT_EQ(parse_nodes(node_words(nodes)), nodes);
  EXPECT_EQ(every_node(3), (std::vector<int>{0, 1, 2}));
}

}  // namespace
