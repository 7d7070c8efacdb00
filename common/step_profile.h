// What a step actually did, from the workers' reports: per-rank busy time, the measured
// bubble, the measured cost of every stage's actions, and what the simulator predicts from
// those costs. The coordinator records it with every step (StepSummary), so that a user sees
// the bubble the schedule really has next to the one it should have; profile-driven planning
// starts from the same measured costs. Pure code, no I/O.
#ifndef TANDEM_COMMON_STEP_PROFILE_H_
#define TANDEM_COMMON_STEP_PROFILE_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "common/schedule.h"
#include "common/schedule_check.h"
#include "tandem/v1/common.pb.h"

namespace tandem {

// How long a reported compute action kept its device busy, in microseconds: the device's own
// time where the worker measured one (ActionTiming.device_us; never taken above the host
// interval [start_us, end_us] that brackets it), else the interval (a CPU worker's compute). On
// a GPU the interval also holds launches and synchronisation, during which the device idles.
inline int64_t ComputeBusyMicros(int64_t start_us, int64_t end_us, int64_t device_us) {
  const int64_t interval = std::max<int64_t>(0, end_us - start_us);
  return device_us > 0 ? std::min(device_us, interval) : interval;
}

struct StepProfile {
  std::vector<double> busy_seconds;  // per rank: time in compute actions (F, B, I, W)
  std::vector<double> exec_seconds;  // per rank: the worker's whole RunStep execution
  // 1 - sum(busy) / (ranks x max(exec)): the idle share of the workers' time.
  double measured_bubble = 0.0;
  // Per stage: the mean measured duration of each kind of compute action (0 where the stage
  // ran none of that kind), and of its gradient reduction past the compute before it (reduce:
  // the reduction overlaps the last backward layer by layer, and the program posts it after).
  std::vector<ActionCosts> stage_costs;
  // The simulator run on the program with stage_costs: the measured compute, each message at
  // the cost the plan priced it (stage_transfer_seconds; free without), a data-parallel step's
  // reductions as measured. Set against the step's measured pipeline, it leaves out the
  // compute's own error: what remains is the schedule's waits, the transfers' error and the
  // per-action overheads.
  double predicted_step_seconds = 0.0;
  double predicted_bubble = 0.0;
};

// `reports[r]` is rank r's report of one training step of `lowered` (its timings index into
// rank r's action list); `stage_transfer_seconds[s]`, where given, what the plan priced a
// message from stage s at (ActionCosts.transfer, from the profile's link). INVALID_ARGUMENT
// when the reports do not match the program, or the transfer costs not its stages.
absl::StatusOr<StepProfile> ProfileStep(const Schedule& lowered,
                                        const std::vector<const v1::StepReport*>& reports,
                                        const std::vector<double>& stage_transfer_seconds = {});

}  // namespace tandem

#endif  // TANDEM_COMMON_STEP_PROFILE_H_
