#include "coordinator/step_relay_plan.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace tandem::coordinator {

std::vector<RelayGroup> PlanStepRelay(const std::vector<RelayMember>& members, int min_workers) {
  const int n = static_cast<int>(members.size());
  if (min_workers <= 0 || n < min_workers || n < 2) return {};
  std::vector<int> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return members[a].node < members[b].node; });
  int group = static_cast<int>(std::ceil(std::sqrt(static_cast<double>(n))));
  while (group * group < n) ++group;  // exact for any n, whatever sqrt rounds to
  std::vector<RelayGroup> groups;
  for (int begin = 0; begin < n; begin += group) {
    const int end = std::min(n, begin + group);
    RelayGroup g;
    g.root = order[begin];
    for (int i = begin + 1; i < end; ++i) {
      v1::StepRelay child;
      child.set_rank(order[i]);
      child.set_address(members[order[i]].address);
      g.children.push_back(std::move(child));
    }
    groups.push_back(std::move(g));
  }
  return groups;
}

}  // namespace tandem::coordinator
