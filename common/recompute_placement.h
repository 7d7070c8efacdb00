// Recomputation hidden in the bubble: a pass that moves R actions of a lowered program out of
// their backwards and into the rank's idle time, where that shortens the simulated step and
// keeps every rank's activation memory within a limit (Mario, PPoPP'25, places recomputation
// in pipeline bubbles; this is the same idea as a pass over Tandem's schedule IR).
//
// An R right before its backward runs inside it, layer by layer (RecomputeAtBackward): the
// least memory, and its forward on the rank's critical path. The same R placed earlier, before
// a receive the rank would wait at (the warm-up and cool-down of 1F1B, the gaps a zero-bubble
// schedule leaves, a rank that waits for a slower neighbour), runs while the rank would idle,
// and holds the micro-batch's whole working set from there to its backward (the simulator's
// memory model, common/schedule_check.h). Where the limit leaves room for a micro-batch's whole
// working set from its F on, the cheapest R is none: DropRecomputation removes it, so the F
// saves its activations and nothing is recomputed (Mario's checkpoint skipping: recomputation
// only where memory needs it). Pure code, no I/O.
#ifndef TANDEM_COMMON_RECOMPUTE_PLACEMENT_H_
#define TANDEM_COMMON_RECOMPUTE_PLACEMENT_H_

#include <vector>

#include "absl/status/statusor.h"
#include "common/schedule.h"
#include "common/schedule_check.h"

namespace tandem {

struct RecomputePlacement {
  Schedule schedule;  // lowered; the R's that moved are ahead of their backwards
  int moved = 0;      // PlaceRecomputation: R's placed in idle slots
  int dropped = 0;    // DropRecomputation: R's removed (their micro-batches keep their F's)
  int total = 0;      // R's in the input program
  SimulationResult before;
  SimulationResult after;
};

// Greedy, one R at a time in program order, rank by rank: each R that runs inside its
// backward is tried, latest first, before each receive between its F and its backward at
// which the simulation has the rank waiting, and moved to the first such place where the
// simulated step gets shorter (by more than 1e-9 of it), or stays as long with the work done
// earlier (the sum of every action's end falls: what lets several moves together shorten a
// step that no single one can), and every rank's peak activation memory stays within its
// entry of `memory_limit` (one per rank, in the costs' memory units;
// a non-positive entry or an empty vector: no limit). The costs are SimulateProgram's (one
// for all stages, or `per_stage`). The result validates and simulates no slower than the
// input. INVALID_ARGUMENT when the input does not validate, or `memory_limit` is neither
// empty nor one entry per rank.
absl::StatusOr<RecomputePlacement> PlaceRecomputation(const Schedule& lowered,
                                                      const ActionCosts& costs,
                                                      const std::vector<ActionCosts>& per_stage,
                                                      const std::vector<double>& memory_limit);

// Greedy, one R at a time in program order, rank by rank: each R is removed where every rank's
// peak activation memory stays within its entry of `memory_limit` (as PlaceRecomputation's;
// no limit: every R goes, recomputation exists only to save memory) and the simulated step
// gets no longer. Its micro-batch's F then keeps the stage's working set until the backward
// (activation_bytes in the simulator) instead of the layers' inputs: free where the stage's
// in-flight micro-batches leave room (the last stage of 1F1B keeps one; every other
// micro-batch of the first stage where the limit holds one more working set), and on a stage
// of one layer, whose backward would hold that layer's working set anyway, it even saves the
// checkpoint. Run before PlaceRecomputation: a removed R costs nothing, a moved one only hides
// in idle time. Same errors as PlaceRecomputation.
absl::StatusOr<RecomputePlacement> DropRecomputation(const Schedule& lowered,
                                                     const ActionCosts& costs,
                                                     const std::vector<ActionCosts>& per_stage,
                                                     const std::vector<double>& memory_limit);

}  // namespace tandem

#endif  // TANDEM_COMMON_RECOMPUTE_PLACEMENT_H_
