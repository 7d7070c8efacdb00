#include "coordinator/peer_recovery.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/spec.h"
#include "common/step_number.h"

namespace tandem::coordinator {

bool PeerRecoveryApplies(const v1::JobSpec& spec) {
  return spec.pipeline().replicas() > 1 && !ShardsOptimizerState(spec);
}

std::optional<v1::PeerState> SurvivorsState(int64_t step, const std::vector<WorkerRecord>& workers,
                                            const std::vector<bool>& lost, const PipelinePlan& plan,
                                            int replicas, std::string* why_not) {
  if (step < 0) {
    *why_not = "the run had no state yet (no step trained or restored)";
    return std::nullopt;
  }
  const int p = plan.num_ranks();
  if (replicas < 1 || p < 1 || static_cast<int>(workers.size()) != p * replicas ||
      lost.size() != workers.size()) {
    *why_not = "the gang does not match the plan";
    return std::nullopt;
  }
  std::vector<int> uncovered;
  for (int rank = 0; rank < p; ++rank) {
    bool covered = false;
    for (int r = 0; r < replicas && !covered; ++r) covered = !lost[r * p + rank];
    if (!covered) uncovered.push_back(rank);
  }
  if (!uncovered.empty()) {
    *why_not = absl::StrCat("no replica of pipeline rank(s) ", absl::StrJoin(uncovered, ", "),
                            " survived");
    return std::nullopt;
  }
  v1::PeerState state;
  state.set_step(step);
  for (size_t g = 0; g < workers.size(); ++g) {
    if (lost[g]) continue;
    v1::StateHolder* h = state.add_holders();
    h->set_worker_id(workers[g].id);
    h->set_address(workers[g].address);
    for (int stage : plan.schedule.placement.StagesOf(static_cast<int>(g) % p)) {
      h->add_layer_begin(plan.ranges[stage].begin);
      h->add_layer_end(plan.ranges[stage].end);
    }
  }
  return state;
}

std::vector<std::string> PeerOrderFor(const v1::PeerState& state,
                                      const std::vector<LayerRange>& layers) {
  auto overlaps = [&](const v1::StateHolder& h) {
    for (int i = 0; i < h.layer_begin_size() && i < h.layer_end_size(); ++i) {
      for (const LayerRange& l : layers) {
        if (std::max(l.begin, h.layer_begin(i)) < std::min(l.end, h.layer_end(i))) return true;
      }
    }
    return false;
  };
  std::vector<std::string> first, rest;
  for (const v1::StateHolder& h : state.holders()) {
    (overlaps(h) ? first : rest).push_back(h.address());
  }
  first.insert(first.end(), rest.begin(), rest.end());
  return first;
}

std::vector<v1::StateHolder> HoldersOutside(const v1::PeerState& state,
                                            const std::vector<WorkerRecord>& gang) {
  std::vector<v1::StateHolder> out;
  for (const v1::StateHolder& h : state.holders()) {
    const bool in_gang = std::any_of(gang.begin(), gang.end(), [&](const WorkerRecord& w) {
      return w.id == h.worker_id() && w.address == h.address();
    });
    if (!in_gang) out.push_back(h);
  }
  return out;
}

}  // namespace tandem::coordinator
