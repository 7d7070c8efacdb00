// Checks and predictions for lowered pipeline programs (one action list per rank, rank ==
// stage): a validator that proves a program complete and deadlock-free by simulating the
// blocking semantics, and a timed simulator that predicts step time, bubble and peak live
// activations from per-action costs. Pure code, no I/O.
#ifndef TANDEM_COMMON_SCHEDULE_CHECK_H_
#define TANDEM_COMMON_SCHEDULE_CHECK_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/schedule.h"

namespace tandem {

// INVALID_ARGUMENT unless every stage runs F for micro-batches 0..M-1 exactly once and B
// exactly once after it, F of stage s for a micro-batch follows F of s-1 and B of s follows
// B of s+1, every send is matched by one receive, and the program cannot deadlock (sends
// never block; a receive blocks until its send is posted). The message names the failing
// action and prints the per-rank grid with it marked by [brackets].
absl::Status ValidateProgram(const Program& lowered, int num_stages, int num_micro_batches);

struct ActionCosts {
  double forward = 1.0;
  double backward = 2.0;  // full backward (inputs and weights)
  double transfer = 0.0;  // from a send being posted to the data being receivable
};

struct SimulationResult {
  double step_time = 0.0;
  std::vector<double> busy;                  // per stage: compute time
  std::vector<double> idle;                  // per stage: step_time - busy
  double bubble_fraction = 0.0;              // total idle / (stages x step_time)
  std::vector<int> peak_live_micro_batches;  // per stage: most micro-batches between F and B
};

// Runs the (validated) program with the given costs: each rank executes its actions in order,
// a compute action starts when the rank is free and its inputs have arrived.
absl::StatusOr<SimulationResult> SimulateProgram(const Program& lowered, int num_stages,
                                                 int num_micro_batches,
                                                 const ActionCosts& costs = {});

}  // namespace tandem

#endif  // TANDEM_COMMON_SCHEDULE_CHECK_H_
