// The PlanJob RPC's answer without gRPC: the planner's search (common/planner.h) for a spec,
// as `pipeline.plan: auto` runs it, turned into a v1::PlanJobResponse that a client can show
// (the Python client's Client.plan, for one). Pure: profiles come from the caller.
#ifndef TANDEM_COORDINATOR_PLAN_SEARCH_H_
#define TANDEM_COORDINATOR_PLAN_SEARCH_H_

#include "common/planner.h"
#include "tandem/v1/coordinator.pb.h"
#include "tandem/v1/spec.pb.h"

namespace tandem::coordinator {

// Every candidate of SearchPlans(spec, profiles), feasible first and fastest first, the one
// ChoosePlan picks (chosen = its index, choice = DescribeChoice's line, chosen_spec) or, when
// none fits, chosen = -1 and choice = why (the smallest budget that would fit); and the spec
// as written, predicted from its own micro-batch size's profile. `spec` has its defaults
// filled in and is valid.
v1::PlanJobResponse SearchPlanJob(const v1::JobSpec& spec, const ProfileSource& profiles);

}  // namespace tandem::coordinator

#endif  // TANDEM_COORDINATOR_PLAN_SEARCH_H_
