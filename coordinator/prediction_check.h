// How a job's steps ran against the step its plan predicted, and whose miss a miss is: the
// schedule's (replayed on the steps' own action costs, it does not give the time the workers
// measured: waits, transfers, per-action overheads) or the costs' (the stages ran off the
// times the profile predicted for them: a busier or slower host, or a stale profile). The job
// store fills Job.prediction_check with it on every read, so that `tandem status`, the
// dashboard, the Python client and a JSON reader all get one verdict made by one rule. Pure
// functions of the Job message and its steps.
#ifndef TANDEM_COORDINATOR_PREDICTION_CHECK_H_
#define TANDEM_COORDINATOR_PREDICTION_CHECK_H_

#include <optional>
#include <string>
#include <vector>

#include "tandem/v1/coordinator.pb.h"

namespace tandem::coordinator {

// How far a measurement may sit from its prediction and still count as met.
inline constexpr double kPredictionTolerance = 0.03;
// A Job read without history is checked over this many of its latest retained steps.
inline constexpr int kPredictionCheckSteps = 10;

// `steps` (in step order; `job.history` is not read) against job.predicted_step_seconds: the
// medians over the steady ones (PredictionCheck), the miss and its one-line summary. nullopt
// without a prediction or with fewer than two steady steps.
std::optional<v1::PredictionCheck> CheckPrediction(
    const v1::Job& job, const std::vector<const v1::StepSummary*>& steps);
// Over job.history.
std::optional<v1::PredictionCheck> CheckPrediction(const v1::Job& job);

// Whose miss, from the medians of `check` (its miss field is not read).
v1::PredictionMiss MissOf(const v1::PredictionCheck& check);

// The miss as the dashboard's JSON and the Python client name it: "" (within the tolerance),
// "schedule", "costs", "schedule and costs", "transfers", "transfers and costs", "update or
// calls", "unknown".
std::string MissName(v1::PredictionMiss miss);

// The summary line, e.g. "19.398 s per step, median of steps 2-7: x1.146 the prediction; the
// schedule replayed on those steps' own costs 19.02 s against 19.26 s measured (within 3%), the
// stages ran x1.210-1.220 of their predicted times: the costs moved, not the schedule (...)".
// Steps are numbered as `tandem status` numbers them (steps done: StepSummary.step + 1).
std::string FormatPredictionCheck(const v1::PredictionCheck& check);

}  // namespace tandem::coordinator

#endif  // TANDEM_COORDINATOR_PREDICTION_CHECK_H_
