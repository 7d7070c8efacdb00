// Pipeline schedules as data: pure functions that emit one action list per rank, with no I/O.
//
// A job has S pipeline stages (contiguous layer ranges, stage 0 holds the embedding, stage S-1
// the head) placed on P ranks by a Placement; a rank may hold several stages ("virtual
// stages", v = S/P chunks per rank). A Program is one action list per rank; every action names
// its global stage. Generators emit compute-only programs (F, B, I, W); LowerWithTransfers()
// brackets each compute action with the receive it needs and the send it produces, only where
// the neighbouring stage lives on another rank (a hand-off between two stages of one rank is a
// local move).
//
// Blocking semantics (what the validator simulates and the workers implement): a send is
// posted and never blocks its rank (the transport completes it in the background and the
// worker waits for all sends at the end of the step), a receive blocks until the matching send
// is posted. So where a rank must both send and receive at one point, the send is always
// issued first and the two never wait on each other; both ends of a link derive the order of
// their messages from the same program, and messages are matched by (payload, stage, micro-
// batch), never by arrival order.
#ifndef TANDEM_COMMON_SCHEDULE_H_
#define TANDEM_COMMON_SCHEDULE_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "tandem/v1/common.pb.h"

namespace tandem {

using ActionKind = tandem::v1::ActionKind;

struct Action {
  int stage = 0;
  ActionKind kind = tandem::v1::ACTION_F;
  int micro_batch = 0;

  bool operator==(const Action&) const = default;
};

// One action list per rank.
using Program = std::vector<std::vector<Action>>;

// Which rank runs each stage.
struct Placement {
  int num_ranks = 1;
  std::vector<int> rank_of_stage;  // one entry per stage

  int num_stages() const { return static_cast<int>(rank_of_stage.size()); }
  // The stages of `rank`, ascending.
  std::vector<int> StagesOf(int rank) const;
  bool operator==(const Placement&) const = default;
};

// Stage s on rank s (S == P).
Placement OneStagePerRank(int num_ranks);
// v chunks per rank, stage s on rank s % P (S = v P), as Megatron-LM and PyTorch place
// interleaved stages: rank r holds stages r, P + r, 2P + r, ...
Placement InterleavedPlacement(int num_ranks, int chunks);
// Two chunks per rank in a V: stage s on rank s for s < P and on rank 2P - 1 - s after, so
// rank 0 holds the first and the last stage.
Placement VShapePlacement(int num_ranks);
// INVALID_ARGUMENT unless P >= 1, S >= 1, and every entry is a rank in [0, P) and every rank
// holds at least one stage.
absl::Status ValidatePlacement(const Placement& placement);

// A generated (or imported) schedule: its placement and its program.
struct Schedule {
  // "gpipe", "1f1b", "interleaved_1f1b", "looped_bfs", "interleaved_zb", "zb_h1", "zb_h2",
  // "zb_v", "forward_only" or "csv"
  std::string name;
  Placement placement;
  Program program;
  int num_micro_batches = 0;
};

// "F", "B", "I", "W", "R", "SEND_F", "RECV_F", "SEND_B", "RECV_B" ("?" for anything else).
const char* ActionKindName(ActionKind kind);
// F, B, I, W, R: the actions that compute; the others move data between ranks.
bool IsComputeAction(ActionKind kind);
bool IsTransferAction(ActionKind kind);
// REDUCE_GRAD: the stage's gradients summed across its data-parallel group (pipeline
// replicas). Neither compute nor a point-to-point transfer; its micro_batch is always 0.
bool IsReductionAction(ActionKind kind);

// "2F0", "0B3", "1R3", "3SEND_F1", "1RECV_B0", "2REDUCE_GRAD" (no micro-batch): the notation of
// torch.distributed.pipelining (R, recompute, is Tandem's own).
std::string ActionToString(const Action& a);
absl::StatusOr<Action> ParseAction(absl::string_view text);
// Space-separated actions of one rank.
std::string ActionsToString(const std::vector<Action>& actions);

// GPipe: all M forwards, then all M backwards (reverse order). Any P >= 1, M >= 1.
absl::StatusOr<Schedule> GenerateGPipe(int num_ranks, int num_micro_batches);

// 1F1B (PipeDream-Flush): rank r runs min(P-r-1, M) warm-up forwards, then alternates one
// forward and one backward, then drains the remaining backwards. Requires M >= P.
absl::StatusOr<Schedule> Generate1F1B(int num_ranks, int num_micro_batches);

// Interleaved 1F1B (Megatron-LM) with v >= 2 chunks per rank on InterleavedPlacement. The k-th
// forward of a rank runs chunk (k / P) % v on micro-batch (k / (P v)) P + k % P (micro-batches
// taken in groups of P per chunk); backwards likewise with the chunks in reverse. Rank r runs
// min(2 (P - r - 1) + (v - 1) P, v M) warm-up forwards, then alternates one forward and one
// backward, then drains. Requires M >= P and M % P == 0 (and v >= 2; v == 1 is 1F1B).
absl::StatusOr<Schedule> GenerateInterleaved1F1B(int num_ranks, int chunks, int num_micro_batches);

// Looped BFS (Lamy-Poirier, "Breadth-First Pipeline Parallelism", 2022), as
// torch.distributed.pipelining's ScheduleLoopedBFS orders it, on InterleavedPlacement with
// v >= 1 chunks: rank r runs F for each of its stages ascending, every micro-batch 0..M-1 of one
// stage before the next stage's, then B for its stages descending, micro-batches M-1..0. A
// looped GPipe: M micro-batches of every chunk live at the peak, (P-1)/(vM+P-1) bubble with
// unit costs. Any P >= 1, M >= 1 (v == 1 is GPipe).
absl::StatusOr<Schedule> GenerateLoopedBFS(int num_ranks, int chunks, int num_micro_batches);

// Interleaved zero bubble (ZB1P over v >= 2 chunks, Qi et al.), as torch.distributed.pipelining's
// ScheduleInterleavedZeroBubble orders it, on InterleavedPlacement. Micro-batches go through
// the chunks in rounds of n = M / max(1, M / P) (M must be a multiple of the number of rounds,
// max(1, M / P)). Rank r runs min((v-1) n + P-1-r, v M) warm-up forwards (the k-th on chunk
// (k / n) % v), then alternates F and I, then drains the I's; the j-th I runs chunk
// v-1-(j / n) % v, and from the r-th I on each I is followed by the W of the oldest pending
// I; the r W's left over finish the rank. Requires M >= P.
absl::StatusOr<Schedule> GenerateInterleavedZeroBubble(int num_ranks, int chunks,
                                                       int num_micro_batches);

// ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", 2023, section 3.1): 1F1B's order with
// every backward split into I (input gradient) and W (weight gradient), rank r deferring up to
// r W's so that they fill the cool-down while the I's, now on the critical path alone, travel
// back faster. Rank r runs P-r-1 warm-up forwards; then F, I alternately, each I followed by
// the oldest pending W whenever more than r are pending; then the remaining I's (each with its
// W) and finally the r deferred W's. At most P micro-batches are live (F to W) on any rank,
// 1F1B's peak (its rank 0). With unit costs F = I = W = 1 the idle time per rank is P-1, a
// third of 1F1B's 3(P-1) with B = 2. Requires M >= P.
absl::StatusOr<Schedule> GenerateZBH1(int num_ranks, int num_micro_batches);

// ZB-H2 (Qi et al., section 3.1): the zero-bubble schedule at up to twice 1F1B's activation
// memory. Rank r runs min(2(P-r)-1, M) warm-up forwards (enough to reach its first input
// gradient without waiting), then I, F and W while forwards remain, then I and W; a W runs only
// while more than 2r are pending (the oldest first), and the 2r deferred W's finish the rank.
// With unit costs F = I = W = 1 and M >= 2P-1 no rank is ever idle between its first and its
// last action: rank r runs from r to r + 3M, a parallelogram whose skew the paper leaves to the
// next step (its zero bubble); the step is 3M + P - 1. At most 2P micro-batches are live on a
// rank (F to W), twice 1F1B's peak: rank 0's by its warm-up, the last rank's by its deferred
// W's. Requires M >= P.
absl::StatusOr<Schedule> GenerateZBH2(int num_ranks, int num_micro_batches);

// ZB-V (Qi et al., section 6): 2 chunks per rank on VShapePlacement (rank r holds chunk 0 =
// stage r going down the V and chunk 1 = stage 2P-1-r coming back up), backward split into I
// and W. Rank r runs, with per-chunk micro-batch counters:
//   warm-up:   2(P-r)-1 F on chunk 0; r times F1 F0; P-r times F1 I1 W1;
//   steady:    F0 I0 W0 F1 I1 W1 until chunk 0's forwards run out (then I0 W0 F1 I1 W1);
//   cool-down: r times I0 I1; P-r times I0 W0; the pending W's of chunk 1, then of chunk 0.
// The phases need M >= 2P-1 micro-batches; with P <= M < 2P-1 the schedule for 2P-1 is built
// and the missing micro-batches are dropped from every rank (which keeps it deadlock-free).
// At most 2P chunk activations are live on any rank (1F1B's peak of P micro-batches of two
// chunks each). With unit costs F = I = W = 1 per chunk and M >= 2P-1 the idle time per rank is
// P-1 chunk units, against 6(P-1) for 1F1B at equal work (F = 2, B = 4 per stage). Requires
// M >= P.
absl::StatusOr<Schedule> GenerateZBV(int num_ranks, int num_micro_batches);

// Forward only (validation), named "forward_only": every rank runs F for each of its stages,
// ascending, over micro-batches 0..M-1 (deadlock-free once lowered: stage order is a
// topological order). ValidateProgram does not accept it (it requires backwards).
absl::StatusOr<Schedule> GenerateForwardOnly(const Placement& placement, int num_micro_batches);

// The established schedules, in the order `tandem plan --compare` lists them: the candidates
// the planner (common/planner.h) tries.
std::vector<std::string> ScheduleNames();
// Every schedule GenerateSchedule knows (what `pipeline.schedule` accepts): ScheduleNames()
// and the newer ones (looped_bfs, interleaved_zb, zb_h2), which the planner does not try yet.
std::vector<std::string> AllScheduleNames();
// Whether `schedule` takes a choice of chunks per rank (interleaved_1f1b, looped_bfs,
// interleaved_zb); the others run a fixed number.
bool TakesChunks(absl::string_view schedule);
// The chunks per rank a schedule uses when the spec leaves it 0: 2 for interleaved_1f1b,
// looped_bfs, interleaved_zb and zb_v, 1 otherwise.
int DefaultChunks(absl::string_view schedule);
// Generates the compute-only schedule named `schedule` (case-insensitive; "interleaved" and
// "zbh1"/"zbv" are accepted as aliases). `chunks` 0 means DefaultChunks; a schedule that takes
// a fixed number refuses any other with a clear error.
absl::StatusOr<Schedule> GenerateSchedule(absl::string_view schedule, int num_ranks,
                                          int num_micro_batches, int chunks = 0);

// Inserts, only where the neighbouring stage is on another rank: RECV_F before and SEND_F
// after each forward; RECV_B before and SEND_B after each B or I (the input gradient flows
// backwards; W has no transfers). A transfer already in a rank's list is kept where it is and
// not added again, so lowering a lowered program returns the same program.
Program LowerWithTransfers(const Program& compute, const Placement& placement);
Schedule LowerWithTransfers(const Schedule& compute);

// Activation recomputation (pipeline.recompute: full): an R of (stage, micro-batch) just before
// each B or I that has none yet (and before the RECV_B right in front of it, in a lowered
// program). A micro-batch with an R has its F run without saving (only the stage's input is
// kept); the R re-runs that forward with saving, so the backward finds what it needs. R costs
// one forward of the stage (the simulator counts it so) and moves no data, so lowering is
// unchanged. R placed just before its backward is the simplest placement; moving R's into the
// schedule's idle slots (1F1B's warm-up and cool-down bubbles, the gaps zero bubble leaves)
// when memory allows is a later pass.
Program AddRecomputation(const Program& program);
Schedule AddRecomputation(const Schedule& schedule);

// Data parallelism: adds one REDUCE_GRAD per stage to its rank's list, right after the
// stage's last weight gradient (its last B, or its last W when the backward is split) and the
// sends that directly follow it. A reduction is posted, never blocks, and the step waits for
// it at its end, so the rank goes on with its other stages' work while it runs. A stage that
// already has one keeps it where it is.
Program AddGradReductions(const Program& lowered, const Placement& placement);
Schedule AddGradReductions(const Schedule& lowered);

// The whole gang of a data-parallel job as one picture (its trace and timeline): the lowered
// program once per replica, replica r's stage s numbered r S + s and placed on gang rank
// r P + (its rank), each action renumbered so. Transfers still pair within their replica
// (MessageOf: stage r S + s sends to r S + s + 1 only when s is not the last). Not a pipeline
// program: ValidateProgram does not accept it for R > 1. `replicas` <= 1 returns `lowered`.
Schedule ReplicatedSchedule(const Schedule& lowered, int replicas);

// The message a lowered transfer action sends or receives, named as both ends of the link name
// it: the payload (SEND_F for an activation, SEND_B for an input gradient), the stage that
// sends it, the stage that receives it and the micro-batch. A send and a receive are the two
// ends of one message exactly when their messages are equal: SEND_F of stage s and RECV_F of
// stage s + 1, SEND_B of stage s and RECV_B of stage s - 1, for one micro-batch. Only for
// transfer actions (IsTransferAction); a compute action gives a message with payload F.
struct TransferMessage {
  ActionKind payload = v1::ACTION_SEND_F;
  int from_stage = 0;
  int to_stage = 0;
  int micro_batch = 0;

  auto operator<=>(const TransferMessage&) const = default;
};
TransferMessage MessageOf(const Action& transfer);

// CSV in the format torch.distributed.pipelining reads and writes: one row per rank, one
// action per cell in the notation above ("0F0,0SEND_F0,0F1"). Rows may differ in length.
std::string ProgramToCsv(const Program& program);
// INVALID_ARGUMENT naming the row and column of a bad cell (malformed, or a micro-batch >= M),
// or when there are not `num_ranks` rows. The placement is read from the rows (a stage's
// actions must all be on one row; stages must be 0..S-1; every row must hold one). A compute-only
// program (no SEND/RECV cells at all) is lowered with LowerWithTransfers; a program with any
// transfer is taken as written (and must then be complete: see ValidateProgram).
absl::StatusOr<Schedule> ScheduleFromCsv(absl::string_view csv, int num_ranks,
                                         int num_micro_batches);

// The ideal bubble fraction (P-1)/(v M + P - 1) of a flush schedule with equal stage times
// (v = 1: GPipe and 1F1B; v chunks: interleaved 1F1B).
double IdealBubbleFraction(int num_ranks, int num_micro_batches, int chunks = 1);

v1::Action ToProto(const Action& a);
Action FromProto(const v1::Action& a);

}  // namespace tandem

#endif  // TANDEM_COMMON_SCHEDULE_H_
