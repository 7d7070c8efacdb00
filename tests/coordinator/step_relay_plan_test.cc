// The step relay's tree: off below its threshold; otherwise groups of ceil(sqrt(N)) workers in
// (node, rank) order, each rank in exactly one group, the first of each group called by the
// coordinator.
#include "coordinator/step_relay_plan.h"

#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace tandem::coordinator {
namespace {

std::vector<RelayMember> Members(int n, int per_node = 0) {
  std::vector<RelayMember> m;
  for (int i = 0; i < n; ++i) {
    m.push_back({absl::StrCat("127.0.0.1:", 2000 + i),
                 per_node > 0 ? absl::StrCat("node-", i % (n / per_node)) : "node"});
  }
  return m;
}

// Every rank once, roots included; returns the group sizes.
std::vector<int> CheckCovers(const std::vector<RelayGroup>& groups, int n,
                             const std::vector<RelayMember>& members) {
  std::set<int> seen;
  std::vector<int> sizes;
  for (const RelayGroup& g : groups) {
    EXPECT_TRUE(seen.insert(g.root).second) << g.root;
    for (const v1::StepRelay& c : g.children) {
      EXPECT_TRUE(seen.insert(c.rank()).second) << c.rank();
      EXPECT_EQ(c.address(), members[c.rank()].address);
      EXPECT_EQ(c.children_size(), 0);
    }
    sizes.push_back(1 + static_cast<int>(g.children.size()));
  }
  EXPECT_EQ(static_cast<int>(seen.size()), n);
  return sizes;
}

TEST(StepRelayPlanTest, OffBelowTheThresholdOrWhenDisabled) {
  EXPECT_TRUE(PlanStepRelay(Members(63), 64).empty());
  EXPECT_TRUE(PlanStepRelay(Members(1024), 0).empty());
  EXPECT_TRUE(PlanStepRelay(Members(1), 1).empty());
  EXPECT_FALSE(PlanStepRelay(Members(64), 64).empty());
}

TEST(StepRelayPlanTest, GroupsOfCeilSqrtNCoverEveryRankOnce) {
  for (int n : {2, 3, 4, 5, 64, 65, 100, 255, 256, 1000, 1024, 4096}) {
    const auto members = Members(n);
    const auto groups = PlanStepRelay(members, 2);
    int g = 1;
    while (g * g < n) ++g;
    const std::vector<int> sizes = CheckCovers(groups, n, members);
    ASSERT_FALSE(sizes.empty());
    for (size_t i = 0; i + 1 < sizes.size(); ++i) EXPECT_EQ(sizes[i], g) << n;
    EXPECT_LE(sizes.back(), g);
    EXPECT_EQ(static_cast<int>(groups.size()), (n + g - 1) / g) << n;
  }
  // 1,024 workers: the coordinator calls 32, each forwards to 31.
  const auto groups = PlanStepRelay(Members(1024), 64);
  ASSERT_EQ(groups.size(), 32u);
  EXPECT_EQ(groups[0].root, 0);
  EXPECT_EQ(groups[0].children.size(), 31u);
}

// Ranks interleaved over 4 nodes (rank i on node i % 4): each group of 4 is one node's.
TEST(StepRelayPlanTest, GroupsKeepToANodeWhereTheyCan) {
  const auto members = Members(16, 4);
  const auto groups = PlanStepRelay(members, 2);
  CheckCovers(groups, 16, members);
  ASSERT_EQ(groups.size(), 4u);
  for (const RelayGroup& g : groups) {
    for (const v1::StepRelay& c : g.children) {
      EXPECT_EQ(members[c.rank()].node, members[g.root].node);
    }
  }
  EXPECT_EQ(groups[0].root, 0);  // node-0: ranks 0, 4, 8, 12
  EXPECT_EQ(groups[0].children[0].rank(), 4);
}

}  // namespace
}  // namespace tandem::coordinator
