// `tandem plan`: what a job's pipeline will do, computed locally from the job file without
// running anything (common/pipeline_plan.h and the simulator in common/schedule_check.h).
#ifndef TANDEM_COORDINATOR_CLI_PLAN_H_
#define TANDEM_COORDINATOR_CLI_PLAN_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/planner.h"
#include "coordinator/cli/args.h"
#include "tandem/v1/common.pb.h"
#include "tandem/v1/spec.pb.h"

namespace tandem::cli {

// Applies --schedule, --schedule-csv (reading the file into pipeline.schedule_csv) and
// --chunks to a parsed spec, before defaults and validation. NOT_FOUND/INVALID_ARGUMENT for
// a CSV file that cannot be read.
absl::Status ApplyScheduleOverrides(const CliOptions& opts, v1::JobSpec& spec);

// The plan of a valid spec: stages and their layers, the predicted figures with unit costs,
// the timestep grid, and with `print_actions` every rank's lowered action list.
// INVALID_ARGUMENT when the pipeline cannot be planned.
// With `profile` (the coordinator's, for the spec's shape) also the measured per-stage times
// and memory, the predicted step against the uniform cut, communication per step and the
// planner's warnings (M < 4P, stages imbalanced by more than 10%).
absl::StatusOr<std::string> FormatPlan(const v1::JobSpec& spec, bool print_actions,
                                       const v1::ModelProfile* profile = nullptr);

// One row per known schedule: chunks, stages, predicted step time and bubble, peak live
// activations, or why it does not fit this job.
// With `profile`, the step and bubble are predicted from the measured layer costs (seconds).
std::string FormatScheduleComparison(const v1::JobSpec& spec,
                                     const v1::ModelProfile* profile = nullptr);

// The planner's search (SearchPlans): the fastest `max_rows` feasible candidates as a table,
// how many do not fit and why, and the choice (ChoosePlan) against the spec as written
// (`as_written_step_seconds`, 0 when unknown), with how to run it.
std::string FormatPlannerSearch(const v1::JobSpec& spec,
                                const std::vector<PlanCandidate>& candidates,
                                double as_written_step_seconds, int max_rows = 10);

}  // namespace tandem::cli

#endif  // TANDEM_COORDINATOR_CLI_PLAN_H_
