// zb_auto: a zero-bubble schedule built for one job's measured costs (Qi et al., "Zero Bubble
// Pipeline Parallelism", 2023, section 4, automatic scheduling), instead of a fixed pattern
// drawn for equal stages and free links. The hand-crafted schedules (zb_h1, zb_h2) assume
// F = I = W on every stage and no transfer time; with one stage slower than the others or a
// slow link their warm-ups and deferred W's land in the wrong places and the bubble grows.
// Here the order of each rank is found by simulating time with the stages' own costs, under a
// memory limit per rank. Pure code, no I/O.
#ifndef TANDEM_COMMON_SCHEDULE_AUTO_H_
#define TANDEM_COMMON_SCHEDULE_AUTO_H_

#include <vector>

#include "absl/status/statusor.h"
#include "common/schedule.h"
#include "common/schedule_check.h"

namespace tandem {

struct ZBAutoOptions {
  // Also start from the hand-crafted orders that fit the memory limit (1F1B with its backward
  // split as I then W, ZB-H1, ZB-H2; only when M >= P), so that the result is never slower
  // than those under the same costs. false: the greedy construction alone.
  bool seed_with_handcrafted = true;
  // Candidate orders the local search may simulate (0: no local search). It stops earlier
  // when a whole pass over the moves finds nothing better.
  int local_search_evaluations = 20000;
};

// ZB-Auto ("zb_auto"): OneStagePerRank placement (P stages on P ranks), backward split into I
// and W. `per_stage` (one entry per stage) gives the measured costs the simulator uses
// (forward, backward_input, backward_weight, and transfer: the time from the end of a stage's
// F or I to its message being receivable by the neighbour); `max_live_micro_batches` (one
// entry per rank) the memory limit, in micro-batches live from their F to their W, as
// SimulationResult::peak_live_micro_batches counts them (0: no limit; 1F1B and ZB-H1 need P
// on rank 0, ZB-H2 2P).
//
// 1. Greedy construction, event-driven list scheduling: the rank that is free first decides
//    its next action at that time, knowing when every action already placed ends (and so when
//    its messages arrive), and a lower bound for those not placed yet:
//      - the I of its oldest micro-batch as soon as its gradient is there (the input
//        gradients are the critical path, the rank above waits for them);
//      - else a forward whose input is there, within the memory limit, as many as memory
//        allows in the warm-up, when it ends before that I's gradient arrives;
//      - else the oldest pending W when it ends before that gradient arrives (W fills the
//        gaps), or whenever the memory is full and a forward waits for the room;
//      - else it waits for the next arrival.
//    Five yes/no hyperparameters, as the paper grid-searches its own, are all tried (32
//    orders): whether an F may delay the I (start although the gradient arrives before it
//    ends); whether a W may; whether a W goes before an F when both fit; whether rank r runs
//    at most limit - r forwards before its first I (ZB-H1's warm-up shape, leaving room for
//    the W's it defers); and whether a ready F goes before a ready I while the next rank has
//    run as many forwards (the paper's rule that a rank stays one forward ahead of the next,
//    so the forwards reach the last stage, where the I's start, without delay).
//    Micro-batches go through every rank in order, and W's follow their I's in order.
// 2. The starts (the 32 greedy orders, and the hand-crafted ones that fit when
//    options.seed_with_handcrafted) are timed with SimulateProgram's semantics (each rank runs
//    its list in order, an action starts when the rank is free and its input has arrived);
//    the best (shortest step, then fewest live micro-batches) is kept.
// 3. Local search: moves of one action on one rank (each W up to 2P + 2 places either way,
//    and every swap of two adjacent actions) are kept when every rank stays within its limit
//    and the step gets shorter, or stays as long with the work done earlier (the ends of all
//    actions summed fall). A move that would deadlock is refused.
//
// The result lowers (LowerWithTransfers), validates and simulates, with every rank's peak live
// micro-batches within its limit, and its simulated step under `per_stage` no longer than the
// best start's. Any P >= 1, M >= 1. INVALID_ARGUMENT naming the problem when P < 1, M < 1,
// `per_stage` is not one entry per stage, a stage's forward or input-gradient cost is not
// positive, a weight-gradient or transfer cost is negative (or any cost not finite),
// `max_live_micro_batches` is not one entry per rank, or a limit is negative.
absl::StatusOr<Schedule> GenerateZBAuto(int num_ranks, int num_micro_batches,
                                        const std::vector<ActionCosts>& per_stage,
                                        const std::vector<int>& max_live_micro_batches,
                                        const ZBAutoOptions& options = {});

}  // namespace tandem

#endif  // TANDEM_COMMON_SCHEDULE_AUTO_H_
