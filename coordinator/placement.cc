#include "coordinator/placement.h"

#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"

namespace tandem::coordinator {

std::vector<int> PlaceGang(const std::vector<std::string>& nodes, int stages, int replicas) {
  const int p = std::max(1, stages);
  const int r = std::max(1, replicas);
  const size_t count = static_cast<size_t>(p) * static_cast<size_t>(r);
  if (nodes.size() < count) return {};
  // The candidates of each node, nodes in order of first appearance.
  std::vector<std::string> order;
  std::map<std::string, std::vector<int>> by_node;
  for (size_t i = 0; i < nodes.size(); ++i) {
    auto [it, added] = by_node.try_emplace(nodes[i]);
    if (added) order.push_back(nodes[i]);
    it->second.push_back(static_cast<int>(i));
  }
  // Fullest nodes first (stable: registration order among equals).
  std::stable_sort(order.begin(), order.end(), [&](const std::string& a, const std::string& b) {
    return by_node[a].size() > by_node[b].size();
  });
  std::vector<int> chosen;
  for (const std::string& node : order) {
    for (int i : by_node[node]) {
      if (chosen.size() == count) break;
      chosen.push_back(i);
    }
  }
  std::set<std::string> used;
  for (int i : chosen) used.insert(nodes[i]);
  if (used.size() == 1) {
    std::sort(chosen.begin(), chosen.end());  // one node: registration order, gang rank = index
    return chosen;
  }
  // Stage-major: chosen[s * R + k] plays stage s of replica k, gang rank k * P + s.
  std::vector<int> gang(count);
  for (int s = 0; s < p; ++s) {
    for (int k = 0; k < r; ++k) gang[static_cast<size_t>(k * p + s)] = chosen[s * r + k];
  }
  return gang;
}

std::string DescribePlacement(const std::vector<std::string>& gang_nodes, int stages,
                              int replicas) {
  const int p = std::max(1, stages);
  const int r = std::max(1, replicas);
  if (gang_nodes.size() != static_cast<size_t>(p) * static_cast<size_t>(r)) return "";
  const std::set<std::string> all(gang_nodes.begin(), gang_nodes.end());
  std::string text = absl::StrCat(gang_nodes.size(), " worker", gang_nodes.size() == 1 ? "" : "s",
                                  " on ", all.size(), " node", all.size() == 1 ? "" : "s");
  if (all.size() == 1) return text;
  if (r > 1) {
    int within = 0;
    for (int s = 0; s < p; ++s) {
      std::set<std::string> group;
      for (int k = 0; k < r; ++k) group.insert(gang_nodes[static_cast<size_t>(k * p + s)]);
      if (group.size() == 1) ++within;
    }
    absl::StrAppend(&text, "; ", within, " of ", p, " stage", p == 1 ? "'s" : "s'", " ", r,
                    " replicas share a node");
  }
  if (p > 1) {
    int crossing = 0;
    for (int k = 0; k < r; ++k) {
      for (int s = 0; s + 1 < p; ++s) {
        crossing += gang_nodes[static_cast<size_t>(k * p + s)] !=
                    gang_nodes[static_cast<size_t>(k * p + s + 1)];
      }
    }
    absl::StrAppend(&text, "; ", crossing, " of ", r * (p - 1), " pipeline hops cross nodes");
  }
  return text;
}

}  // namespace tandem::coordinator
