// How a job's steps ran against the step its plan predicted, and whose miss a miss is: the
// schedule's (replayed on the steps' own action costs, it does not give the time the workers
// measured: waits, transfers, per-action overheads) or the costs' (the stages ran off the
// times the profile predicted for them: a busier or slower host, or a stale profile).
// `tandem status JOB` prints it under the prediction. Pure functions of the Job message.
#ifndef TANDEM_COORDINATOR_CLI_PREDICTION_CHECK_H_
#define TANDEM_COORDINATOR_CLI_PREDICTION_CHECK_H_

#include <cstdint>
#include <optional>
#include <string>

#include "tandem/v1/coordinator.pb.h"

namespace tandem::cli {

// Medians over the steady steps of a job's history: not the first step of the job or of a
// resumed run (it warms up), not the last step of a finished job (it also waits for its own
// update), not a step followed by a validation pass.
struct PredictionCheck {
  int steps = 0;                 // steady steps counted
  int64_t first_step = 0;        // the first and last of them, as `tandem status` numbers steps
  int64_t last_step = 0;         // (steps done)
  double predicted = 0;          // Job.predicted_step_seconds
  double measured = 0;           // StepSummary.step_seconds
  double pipeline_measured = 0;  // the slowest worker's pipeline phase (max_worker_exec_seconds)
  // The simulator on the same steps' own measured action costs (exec_replayed_seconds); 0 when
  // no step carries it.
  double pipeline_replayed = 0;
  // Each stage's forward + backward per micro-batch over the time predicted for it
  // (StageAssignment.predicted_seconds), the lowest and the highest; 0 without them.
  double stage_ratio_low = 0;
  double stage_ratio_high = 0;
  bool replicated = false;  // data parallelism: the pipeline phase also holds the reduction
};

// How far a measurement may sit from its prediction and still count as met.
inline constexpr double kPredictionTolerance = 0.03;

// nullopt without a prediction or with fewer than two steady steps in the job's history.
std::optional<PredictionCheck> CheckPrediction(const v1::Job& job);

// One line, e.g. "19.398 s per step, median of steps 2-7: x1.146 the prediction; the schedule
// replayed on those steps' own costs 19.02 s against 19.26 s measured (within 3%), the stages
// ran x1.210-1.220 of their predicted times: the costs moved, not the schedule (...)".
std::string FormatPredictionCheck(const PredictionCheck& check);

}  // namespace tandem::cli

#endif  // TANDEM_COORDINATOR_CLI_PREDICTION_CHECK_H_
