#include "common/step_profile.h"

#include <algorithm>
#include <array>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace tandem {
absl::StatusOr<StepProfile> ProfileStep(const Schedule& lowered,
                                        const std::vector<const v1::StepReport*>& reports,
                                        const std::vector<double>& stage_transfer_seconds) {
  const int p = lowered.placement.num_ranks;
  const int s = lowered.placement.num_stages();
  if (static_cast<int>(reports.size()) != p || static_cast<int>(lowered.program.size()) != p) {
    return absl::InvalidArgumentError(
        absl::StrCat("profile: ", reports.size(), " reports for ", p, " ranks"));
  }
  if (!stage_transfer_seconds.empty() && static_cast<int>(stage_transfer_seconds.size()) != s) {
    return absl::InvalidArgumentError(absl::StrCat("profile: ", stage_transfer_seconds.size(),
                                                   " transfer costs for ", s, " stages"));
  }
  StepProfile out;
  out.busy_seconds.assign(p, 0.0);
  out.exec_seconds.assign(p, 0.0);
  // Sums and counts per stage and kind: F, B, I, W, R. An R just before its backward is
  // nearly free as timed (it arms the backward, which recomputes layer by layer), and that
  // backward then costs more: each keeps what it measured, so the replay sums the same time.
  std::vector<std::array<double, 5>> sum(s, {0, 0, 0, 0, 0});
  std::vector<std::array<int, 5>> count(s, {0, 0, 0, 0, 0});
  auto slot = [](v1::ActionKind k) {
    return k == v1::ACTION_F   ? 0
           : k == v1::ACTION_B ? 1
           : k == v1::ACTION_I ? 2
           : k == v1::ACTION_W ? 3
                               : 4;
  };
  // Per stage: the gradient reductions' time past the compute they were posted after.
  std::vector<double> reduce_sum(s, 0.0);
  std::vector<int> reduce_count(s, 0);
  for (int r = 0; r < p; ++r) {
    const v1::StepReport& rep = *reports[r];
    const std::vector<Action>& actions = lowered.program[r];
    out.exec_seconds[r] = static_cast<double>(rep.exec_us()) * 1e-6;
    int64_t compute_end_us = 0;  // the latest end of the rank's compute so far
    for (const v1::ActionTiming& t : rep.timings()) {
      if (t.index() < 0 || t.index() >= static_cast<int>(actions.size())) {
        return absl::InvalidArgumentError(absl::StrCat("profile: rank ", r, " timing index ",
                                                       t.index(), " is outside its ",
                                                       actions.size(), " actions"));
      }
      const Action& a = actions[t.index()];
      if (IsReductionAction(a.kind)) {
        // The worker reports a reduction from its first bucket, handed over inside the last
        // backward, to its last bucket summed; the program posts it after that backward, so the
        // replay charges it what it ran past it (the part the step waited for, or the later
        // compute it ran beside).
        reduce_sum[a.stage] +=
            static_cast<double>(std::max<int64_t>(0, t.end_us() - compute_end_us)) * 1e-6;
        ++reduce_count[a.stage];
        continue;
      }
      if (!IsComputeAction(a.kind)) continue;
      compute_end_us = std::max(compute_end_us, t.end_us());
      const double seconds =
          static_cast<double>(ComputeBusyMicros(t.start_us(), t.end_us(), t.device_us())) * 1e-6;
      out.busy_seconds[r] += seconds;
      sum[a.stage][slot(a.kind)] += seconds;
      ++count[a.stage][slot(a.kind)];
    }
  }
  const double max_exec = *std::max_element(out.exec_seconds.begin(), out.exec_seconds.end());
  double busy = 0.0;
  for (double b : out.busy_seconds) busy += b;
  out.measured_bubble = max_exec > 0 ? std::max(0.0, 1.0 - busy / (p * max_exec)) : 0.0;
  out.stage_costs.resize(s);
  for (int st = 0; st < s; ++st) {
    auto mean = [&](int k) { return count[st][k] > 0 ? sum[st][k] / count[st][k] : 0.0; };
    ActionCosts& c = out.stage_costs[st];
    c.forward = mean(0);
    c.backward = mean(1);
    c.backward_input = mean(2);
    c.backward_weight = mean(3);
    c.recompute = count[st][4] > 0 ? mean(4) : -1.0;
    c.transfer = stage_transfer_seconds.empty() ? 0.0 : std::max(0.0, stage_transfer_seconds[st]);
    c.reduce = reduce_count[st] > 0 ? reduce_sum[st] / reduce_count[st] : 0.0;
  }
  ASSIGN_OR_RETURN(SimulationResult sim, SimulateSchedule(lowered, ActionCosts{}, out.stage_costs));
  out.predicted_step_seconds = sim.step_time;
  out.predicted_bubble = sim.bubble_fraction;
  return out;
}

}  // namespace tandem
