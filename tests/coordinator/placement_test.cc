// Placement of a stages x replicas gang by node: packed onto the fewest nodes, each stage's
// data-parallel group within one node where a node holds it, one node keeping registration
// order.
#include "coordinator/placement.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

namespace tandem::coordinator {
namespace {

// The node of each gang rank.
std::vector<std::string> GangNodes(const std::vector<std::string>& nodes,
                                   const std::vector<int>& gang) {
  std::vector<std::string> out;
  for (int i : gang) out.push_back(nodes[static_cast<size_t>(i)]);
  return out;
}

TEST(PlaceGangTest, OneNodeKeepsRegistrationOrder) {
  const std::vector<std::string> nodes(6, "host");
  EXPECT_EQ(PlaceGang(nodes, 2, 2), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(PlaceGang(nodes, 3, 1), (std::vector<int>{0, 1, 2}));
  EXPECT_TRUE(PlaceGang(nodes, 7, 1).empty()) << "not enough candidates";
}

// Workers of two nodes registered alternately: each stage's replicas still share a node.
TEST(PlaceGangTest, DataParallelGroupsStayWithinANode) {
  const std::vector<std::string> nodes = {"a", "b", "a", "b", "a", "b", "a", "b"};
  for (auto [p, r] : {std::pair{4, 2}, {2, 4}, {2, 2}, {1, 4}}) {
    SCOPED_TRACE(testing::Message() << p << " stages x " << r << " replicas");
    const std::vector<int> gang = PlaceGang(nodes, p, r);
    ASSERT_EQ(gang.size(), static_cast<size_t>(p * r));
    EXPECT_EQ(std::set<int>(gang.begin(), gang.end()).size(), gang.size()) << "distinct";
    const std::vector<std::string> at = GangNodes(nodes, gang);
    for (int s = 0; s < p; ++s) {
      std::set<std::string> group;
      for (int k = 0; k < r; ++k) group.insert(at[static_cast<size_t>(k * p + s)]);
      EXPECT_EQ(group.size(), 1u) << "stage " << s << "'s replicas are split across nodes";
    }
  }
  // 4 x 2 on two nodes of four: stages 0-1 on one node, 2-3 on the other; one hop crosses.
  EXPECT_EQ(DescribePlacement(GangNodes(nodes, PlaceGang(nodes, 4, 2)), 4, 2),
            "8 workers on 2 nodes; 4 of 4 stages' 2 replicas share a node; 2 of 6 pipeline hops "
            "cross nodes");
}

// More idle workers than the gang needs: the fullest nodes first, so the gang spans as few as
// it can.
TEST(PlaceGangTest, PacksOntoTheFewestNodes) {
  const std::vector<std::string> nodes = {"small", "big", "mid", "big", "mid", "big", "big"};
  const std::vector<int> gang = PlaceGang(nodes, 2, 3);
  ASSERT_EQ(gang.size(), 6u);
  std::vector<std::string> at = GangNodes(nodes, gang);
  EXPECT_EQ(std::count(at.begin(), at.end(), "big"), 4);
  EXPECT_EQ(std::count(at.begin(), at.end(), "mid"), 2);
  EXPECT_EQ(std::count(at.begin(), at.end(), "small"), 0);
  EXPECT_EQ(DescribePlacement({"x"}, 1, 1), "1 worker on 1 node");
}

}  // namespace
}  // namespace tandem::coordinator
