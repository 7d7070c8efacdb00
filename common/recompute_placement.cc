#include "common/recompute_placement.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace tandem {
namespace {

bool WithinLimit(const SimulationResult& sim, const std::vector<double>& limit) {
  for (size_t r = 0; r < limit.size(); ++r) {
    if (limit[r] > 0 && sim.peak_activation_bytes[r] > limit[r]) return false;
  }
  return true;
}

// The ends of every action of every rank, summed: smaller when work happens earlier.
double SumOfEnds(const SimulationResult& sim) {
  double sum = 0;
  for (const auto& rank : sim.end) {
    for (double e : rank) sum += e;
  }
  return sum;
}

bool IsReceive(ActionKind kind) { return kind == v1::ACTION_RECV_F || kind == v1::ACTION_RECV_B; }

absl::Status CheckLimits(const Schedule& lowered, const std::vector<double>& memory_limit) {
  const int ranks = lowered.placement.num_ranks;
  if (!memory_limit.empty() && static_cast<int>(memory_limit.size()) != ranks) {
    return absl::InvalidArgumentError(absl::StrCat("recompute placement: ", memory_limit.size(),
                                                   " memory limits for ", ranks, " ranks"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<RecomputePlacement> DropRecomputation(const Schedule& lowered,
                                                     const ActionCosts& costs,
                                                     const std::vector<ActionCosts>& per_stage,
                                                     const std::vector<double>& memory_limit) {
  RETURN_IF_ERROR(CheckLimits(lowered, memory_limit));
  RecomputePlacement out;
  out.schedule = lowered;
  ASSIGN_OR_RETURN(out.before, SimulateSchedule(lowered, costs, per_stage));
  SimulationResult current = out.before;
  for (size_t r = 0; r < out.schedule.program.size(); ++r) {
    for (size_t i = 0; i < out.schedule.program[r].size();) {
      if (out.schedule.program[r][i].kind != v1::ACTION_R) {
        ++i;
        continue;
      }
      ++out.total;
      Schedule trial = out.schedule;
      trial.program[r].erase(trial.program[r].begin() + static_cast<std::ptrdiff_t>(i));
      absl::StatusOr<SimulationResult> sim = SimulateSchedule(trial, costs, per_stage);
      if (sim.ok() && sim->step_time <= current.step_time * (1 + 1e-12) &&
          WithinLimit(*sim, memory_limit)) {
        out.schedule = std::move(trial);
        current = *std::move(sim);
        ++out.dropped;
        continue;  // the next action is at i now
      }
      ++i;
    }
  }
  out.after = std::move(current);
  return out;
}

absl::StatusOr<RecomputePlacement> PlaceRecomputation(const Schedule& lowered,
                                                      const ActionCosts& costs,
                                                      const std::vector<ActionCosts>& per_stage,
                                                      const std::vector<double>& memory_limit) {
  RETURN_IF_ERROR(CheckLimits(lowered, memory_limit));
  const int ranks = lowered.placement.num_ranks;
  RecomputePlacement out;
  out.schedule = lowered;
  ASSIGN_OR_RETURN(out.before, SimulateSchedule(lowered, costs, per_stage));
  SimulationResult current = out.before;
  for (int r = 0; r < ranks; ++r) {
    for (size_t i = 0; i < out.schedule.program[r].size(); ++i) {
      const std::vector<Action>& list = out.schedule.program[r];
      if (list[i].kind != v1::ACTION_R) continue;
      ++out.total;
      if (!RecomputeAtBackward(list)[i]) continue;
      const Action r_action = list[i];
      // Its F on this rank (the R may go anywhere after it and the sends that follow it).
      size_t first = 0;
      for (size_t j = 0; j < i; ++j) {
        if (list[j].kind == v1::ACTION_F && list[j].stage == r_action.stage &&
            list[j].micro_batch == r_action.micro_batch) {
          first = j + 1;
        }
      }
      // Receives between, latest first, at which the rank waits.
      for (size_t j = i; j-- > first;) {
        if (!IsReceive(list[j].kind)) continue;
        if (current.end[r][j] <= current.start[r][j]) continue;  // no wait there
        Schedule trial = out.schedule;
        std::vector<Action>& t = trial.program[r];
        t.erase(t.begin() + static_cast<std::ptrdiff_t>(i));
        t.insert(t.begin() + static_cast<std::ptrdiff_t>(j), r_action);
        absl::StatusOr<SimulationResult> sim = SimulateSchedule(trial, costs, per_stage);
        if (!sim.ok()) continue;  // not a valid placement (cannot happen: R only needs its F)
        // Shorter, or as long with the work done earlier (a step that one move cannot
        // shorten often needs several: each R hidden moves its rank's later work forward).
        const bool shorter = sim->step_time < current.step_time * (1 - 1e-9);
        const bool earlier = sim->step_time <= current.step_time * (1 + 1e-12) &&
                             SumOfEnds(*sim) < SumOfEnds(current) * (1 - 1e-9);
        if ((shorter || earlier) && WithinLimit(*sim, memory_limit)) {
          out.schedule = std::move(trial);
          current = *std::move(sim);
          ++out.moved;
          break;
        }
      }
    }
  }
  out.after = std::move(current);
  return out;
}

}  // namespace tandem
