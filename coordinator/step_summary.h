// The arithmetic of one training step's summary: how the coordinator combines its workers'
// reports into a v1::StepSummary (loss, bytes, memory per stage, busy and bubble, the global
// gradient norm and the clipping it decides) and how it derives the step's throughput figures
// (tokens/s, MFU, coordinator overhead). Pure functions: no RPC, no clock, no store, so that
// they are tested on hand-made reports (tests/coordinator/step_summary_test.cc).
#ifndef TANDEM_COORDINATOR_STEP_SUMMARY_H_
#define TANDEM_COORDINATOR_STEP_SUMMARY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common/grad_clip.h"
#include "common/schedule.h"
#include "tandem/v1/coordinator.pb.h"
#include "tandem/v1/worker.pb.h"

namespace tandem::coordinator {

using ::tandem::ClipScale;  // common/grad_clip.h

// What the RunStep reports of a training step say, before its update.
struct StepReports {
  // step, loss, bytes_sent, peak activation bytes (overall and per rank), the slowest
  // worker's update phase (its update_us + grad_norm_us), stage_memory and
  // stage_peak_bytes, and, where they could be computed, the bubble, busy and per-stage
  // seconds (ProfileStep) and the per-stage busy, comm and idle seconds (TimelineOf).
  v1::StepSummary summary;
  bool has_loss = false;    // some report carried the loss (the last stage's must)
  double grad_norm = 0.0;   // sqrt of the sum of every rank's squared gradient norm
  bool finite = true;       // every rank's gradients, the global norm and the loss are finite
  float grad_scale = 1.0f;  // ClipScale(grad_norm, clip) for a finite step; 1 otherwise
  int64_t max_exec_us = 0;  // the slowest worker's RunStep execution
  // The slowest worker's time in the call: its update before the step plus its execution.
  int64_t max_call_us = 0;
  std::vector<std::string> warnings;  // parts left out, and why (for the caller's log)
};

// Combines the reports of one training step (`reports` by gang rank; `timings` the step's
// timings on the coordinator's clock, StepTimingsOf, of every gang rank) under `schedule`
// (lowered, `num_stages` stages, P ranks) with gradient clipping at `clip`
// (optimizer.grad_clip; <= 0: off). With `replicas` R > 1 the gang is R pipelines (gang rank
// r P + p): the loss is the sum of the R last stages' shares, the gradient norm replica 0's
// (after the reduction every replica holds the same gradients) or, with `sharded_state`
// (optimizer.shard_state: each replica reports the norm of its segments), every rank's;
// finiteness every rank's; the per-stage figures are replica 0's. `stage_transfer_seconds`:
// per stage, what the plan priced a message at (empty without a profiled link), for the
// step's replay (exec_replayed_seconds, ProfileStep).
StepReports SummarizeReports(int64_t step, const Schedule& schedule, int num_stages,
                             const std::vector<const v1::StepReport*>& reports,
                             const v1::StepTimings& timings, float clip, int replicas = 1,
                             bool sharded_state = false,
                             const std::vector<double>& stage_transfer_seconds = {});

// The step's time and throughput inputs.
struct StepThroughput {
  double run_seconds = 0.0;   // the RunStep phase's wall time
  double step_seconds = 0.0;  // the whole step's wall time (RunStep and ApplyStep)
  int64_t max_exec_us = 0;    // the slowest worker's RunStep execution
  int64_t max_call_us = 0;    // the slowest worker's update + execution (StepReports)
  int64_t tokens_per_step = 0;
  double model_flops_per_token = 0.0;
  std::vector<double> peak_flops;  // each worker's measured peak; <= 0: unknown
};

// Sets step_seconds, max_worker_exec_seconds, coordinator_overhead_seconds (the RunStep
// phase's wall time minus the slowest worker's time in the call, its update and execution:
// what the calls and the coordinator add to the step, at least 0), tokens_per_second (0 for a step
// of no time) and mfu (against the sum of the workers' peaks; left 0 when one peak is unknown).
void SetThroughput(const StepThroughput& t, v1::StepSummary* summary);

}  // namespace tandem::coordinator

#endif  // TANDEM_COORDINATOR_STEP_SUMMARY_H_
