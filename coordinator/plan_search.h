// The PlanJob RPC's answer without gRPC: the planner's search (common/planner.h) for a spec,
// as `pipeline.plan: auto` runs it, turned into a v1::PlanJobResponse that a client can show
// (the Python client's Client.plan, for one). Pure: profiles come from the caller.
#ifndef TANDEM_COORDINATOR_PLAN_SEARCH_H_
#define TANDEM_COORDINATOR_PLAN_SEARCH_H_

#include <vector>

#include "absl/status/statusor.h"
#include "common/planner.h"
#include "tandem/v1/coordinator.pb.h"
#include "tandem/v1/spec.pb.h"

namespace tandem::coordinator {

// The planner's search for a spec, as `pipeline.plan: auto` runs it: SearchPlans with one
// profile per micro-batch size (asked of `profiles` once each, the spec's own size included),
// ChoosePlan's verdict and, when it chose, the spec as written predicted from its size's
// profile (0 when it cannot be costed or nothing was chosen). `spec` has its defaults filled
// in and is valid.
struct PlanSearch {
  std::vector<PlanCandidate> candidates;
  absl::StatusOr<PlanCandidate> best;
  double as_written_step_seconds = 0.0;
};
PlanSearch RunPlanSearch(const v1::JobSpec& spec, const ProfileSource& profiles);

// RunPlanSearch as the PlanJob RPC answers it: every candidate, feasible first and fastest
// first, the one ChoosePlan picks (chosen = its index, choice = DescribeChoice's line,
// chosen_spec) or, when none fits, chosen = -1 and choice = why (the smallest budget that
// would fit); and the spec as written, predicted.
v1::PlanJobResponse SearchPlanJob(const v1::JobSpec& spec, const ProfileSource& profiles);

}  // namespace tandem::coordinator

#endif  // TANDEM_COORDINATOR_PLAN_SEARCH_H_
