// Checks and predictions for lowered pipeline programs (one action list per rank, stages placed
// by a Placement): a validator that proves a program complete and deadlock-free by simulating
// the blocking semantics of common/schedule.h, and a timed simulator that predicts step time,
// bubble and peak live activations from per-action costs. Pure code, no I/O.
#ifndef TANDEM_COMMON_SCHEDULE_CHECK_H_
#define TANDEM_COMMON_SCHEDULE_CHECK_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/schedule.h"

namespace tandem {

// INVALID_ARGUMENT unless:
//  - completeness: every stage runs F for micro-batches 0..M-1 exactly once, on its rank, and
//    for each micro-batch either B exactly once or I and W exactly once each (I before W,
//    never both B and I/W), after its F; and at most one R (recompute), after its F and
//    before its B or I;
//  - dependencies: F of stage s for a micro-batch after F of s-1 (received, or done earlier
//    on the same rank); the backward (B or I) of s after the backward of s+1;
//  - transfers: every send follows the compute that produced its data and is received exactly
//    once by the rank holding the neighbouring stage; no transfer between two stages of one
//    rank;
//  - no deadlock: running the blocking semantics (sends never block, a receive waits for its
//    send) finishes every rank's list;
//  - reductions (data parallelism): REDUCE_GRAD of a stage at most once, after the stage's
//    weight gradient (B or W) of every micro-batch; and either every stage has one or none;
//  - overlapped pairs: an action with overlap_with_next is an F directly followed by the B or I
//    of another stage (StartsOverlappedPair). The pair is then checked, and simulated (its cost
//    the sum of the two), as its two actions in order.
// The message names the failing action and prints the per-rank grid with it in [brackets].
absl::Status ValidateProgram(const Program& lowered, const Placement& placement,
                             int num_micro_batches);
absl::Status ValidateSchedule(const Schedule& lowered);

struct ActionCosts {
  double forward = 1.0;
  double backward = 2.0;         // full backward B (inputs and weights)
  double backward_input = 1.0;   // I
  double backward_weight = 1.0;  // W
  double transfer = 0.0;         // from a send being posted to the data being receivable
  // DualPipe's F&B: an overlapped pair (Action::overlap_with_next, costed by its F's stage)
  // from its start to its end, both results ready at its end. 0: the sum of its two actions,
  // as Tandem's workers run it (one after the other).
  double overlapped_pair = 0.0;
  // The stage's gradient reduction across its data-parallel group (REDUCE_GRAD), from its
  // start; 0 without data parallelism.
  double reduce = 0.0;
  // An R (recompute): its context again without the output, somewhat less than a forward;
  // below 0 (the default): `forward`.
  double recompute = -1.0;
  // Memory, for peak_activation_bytes (in any unit; the defaults count micro-batches): what one
  // micro-batch's forward of the stage keeps for its backward (activation_bytes); what a recomputed
  // micro-batch keeps between its F and its R (input_bytes: its layers' inputs, the per-layer
  // checkpoints); and the largest working set of one layer of the stage (layer_bytes), which a
  // backward that recomputes layer by layer (an R right before it: RecomputeAtBackward) holds
  // beside the checkpoints. An R placed earlier brings the activations back from the R to the
  // backward.
  double activation_bytes = 1.0;
  double input_bytes = 0.0;
  double layer_bytes = 0.0;
};

struct SimulationResult {
  double step_time = 0.0;
  std::vector<double> busy;      // per rank: compute time
  std::vector<double> idle;      // per rank: step_time - busy
  double bubble_fraction = 0.0;  // total idle / (ranks x step_time)
  // Per rank: the most (stage, micro-batch) pairs between their F and their last backward
  // action (B, or W when split): the activations the rank must hold at its peak.
  std::vector<int> peak_live_micro_batches;
  // Per rank: the most activation memory held at once under the memory model of ActionCosts
  // (activation_bytes per micro-batch between F and its last backward; for a micro-batch the
  // program recomputes, input_bytes from F to R, then activation_bytes to its last backward,
  // or, with the R right before a B, input_bytes until that B and layer_bytes more during it).
  // With the default costs and no R it equals peak_live_micro_batches.
  std::vector<double> peak_activation_bytes;
  // Per rank: the time its gradient reductions run past its last compute (the exposed part,
  // which the step waits for); 0 without REDUCE_GRAD actions.
  std::vector<double> reduce_exposed;
  // Per rank and action index: simulated start and end (for the timestep grid).
  std::vector<std::vector<double>> start;
  std::vector<std::vector<double>> end;
};

// Runs the validated program: each rank executes its actions in order, a compute action
// starts when the rank is free and its inputs are there; a send takes no rank time and its
// message is receivable `transfer` later, a receive ends when its message is there. A
// REDUCE_GRAD starts when posted (or when the rank's previous reduction ends) and takes the
// stage's `reduce` beside the rank's compute; the rank's step ends when its compute and its
// reductions have. (It is modelled as starting at its action; the buckets a worker starts
// within the last backward make the real exposure smaller, so this is an upper bound.)
// `per_stage` (optional, one entry per stage) overrides `costs` for measured, unequal stages
// (a message takes its sending stage's `transfer`). INVALID_ARGUMENT when ValidateProgram
// fails or `per_stage` has neither 0 nor S entries.
absl::StatusOr<SimulationResult> SimulateProgram(const Program& lowered, const Placement& placement,
                                                 int num_micro_batches,
                                                 const ActionCosts& costs = {},
                                                 const std::vector<ActionCosts>& per_stage = {});
absl::StatusOr<SimulationResult> SimulateSchedule(const Schedule& lowered,
                                                  const ActionCosts& costs = {},
                                                  const std::vector<ActionCosts>& per_stage = {});

// The timestep grid of a simulated program: one line per rank ("rank 0: 0F0 0F1 .   0B1"),
// one column per time unit `unit` (a non-positive unit is taken as 1) showing the compute
// action running at the column's midpoint, "." when idle, cells padded to one width; at most
// 10000 columns. As `tandem plan` prints it.
std::string TimestepGrid(const Program& lowered, const SimulationResult& sim, double unit);

}  // namespace tandem

#endif  // TANDEM_COMMON_SCHEDULE_CHECK_H_
