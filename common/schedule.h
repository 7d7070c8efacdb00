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
  // An overlapped pair (DualPipe's, torch's OVERLAP_F_B): this action, an F, and the next one
  // of the rank's list, the B or I of another stage of the rank, are one unit of the schedule,
  // printed "(0F7;7B3)OVERLAP_F_B". They stay adjacent through lowering (the receives of both
  // before the pair, the sends of both after it), and everything else, the validator, the
  // simulator and the workers, runs them as the two actions in order. A GPU worker could run
  // the two on two streams, so that one's communication and memory-bound kernels hide under
  // the other's GEMMs (what DualPipe gains); Tandem's workers run them one after the other,
  // which is correct but gains no overlap.
  bool overlap_with_next = false;

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
  // "zb_v", "dualpipe_v", "v_half", "v_min", "forward_only" or "csv"
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
// torch.distributed.pipelining (R, recompute, is Tandem's own). One action: the overlap flag is
// neither printed nor parsed here (see ActionCells).
std::string ActionToString(const Action& a);
absl::StatusOr<Action> ParseAction(absl::string_view text);
// A rank's list as cells: one per action, or one per overlapped pair, "(0F7;7B3)OVERLAP_F_B"
// as torch prints it. A flagged action not followed by a valid partner (an F followed by the B
// or I of another stage) is printed alone, unflagged; the validator refuses such a list.
std::vector<std::string> ActionCells(const std::vector<Action>& actions);
// One cell: a single action (ParseAction) or an overlapped pair "(a;b)OVERLAP_F_B", returned
// as its two actions with the first flagged. INVALID_ARGUMENT unless the pair is an F followed
// by the B or I of another stage.
absl::StatusOr<std::vector<Action>> ParseActionCell(absl::string_view text);
// Space-separated cells (ActionCells) of one rank.
std::string ActionsToString(const std::vector<Action>& actions);
// Whether `first`, `second` may form an overlapped pair: the forward of one stage with the
// backward (B or I) of another, as DualPipe overlaps the two chunks of a rank.
bool OverlapPartners(const Action& first, const Action& second);
// Whether a[i] is the first action of a well-formed overlapped pair: flagged, an F, followed by
// the B or I of another stage.
bool StartsOverlappedPair(const std::vector<Action>& actions, size_t i);

// OK when a generator can be asked for `num_ranks` ranks and `num_micro_batches`
// micro-batches (both at least 1), else INVALID_ARGUMENT naming the one that is not. Every
// generator's first check (schedule_v.cc and schedule_auto.cc prefix it with their name).
absl::Status CheckScheduleSizes(int num_ranks, int num_micro_batches);

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

// The controllable-memory V schedules (Qi et al., "Pipeline Parallelism with Controllable
// Memory", 2024; common/schedule_v.cc): 2 chunks per rank on VShapePlacement, backward split
// into I and W, each built as a unit-cost timeline (F = I = W = 1 per chunk) whose per-rank
// order is emitted, so it is deadlock-free whatever the real costs; a rank's peak live
// activations depend only on its order. 1F1B at equal work (one stage = two chunks) keeps P
// micro-batches of a whole stage, 2P chunk activations, and idles 6(P-1) chunk units per rank.
//
// V-Min ("v_min"): a building block in the paper's sense (one micro-batch's actions on every
// stage, repeated every 6 units) with the shortest lifespans: F straight down and up the V, I
// straight back, each W as soon after its I as the rank has a free slot (every rank's six
// actions of a micro-batch on six different times modulo 6, so the repetition has no
// steady-state bubble). Lifespans add up to 4P + 4 units per rank (plus the W's waits), so at
// most 2 floor((P+4)/3) chunk activations are live on any rank (P = 2, 4, 8, 16: 4, 4, 8, 12,
// that is 1, 1/2, 1/2, 3/8 of 1F1B's 2P, tending to a third as P grows). The price is the
// bubble: with unit costs every rank idles 4P-5 units for every M (4P-3 for the multiples of 3
// from 6 on, where a rank's forward and input gradient collide modulo 6 and the input
// gradients wait), about 2/3 of 1F1B's 6(P-1). Any P >= 1, M >= 1.
absl::StatusOr<Schedule> GenerateVMin(int num_ranks, int num_micro_batches);

// V-Half ("v_half"): a greedy construction (as the paper's scheduler builds its V schedules)
// under V-Half's memory limit, (P/2 + 1) micro-batches of a whole stage: P + 2 chunk
// activations per rank (about half of 1F1B's 2P), split between the chunks by their round
// trips, (r+1)/2 + 1 for chunk 1 on rank r and the rest for chunk 0. Unit time steps; at each
// step a free rank runs the first of: the ready input gradient of its oldest micro-batch
// (chunk 1 on a tie: the I's are the critical path); a ready chunk 1 forward within its
// chunk's limit; a ready chunk 0 forward within its chunk's limit; the oldest deferred W
// (filling the gap and freeing memory). It never stalls: the oldest unfinished micro-batch
// always finds room on every rank (its forward of a chunk comes before any newer one's, and
// every older micro-batch is done), and I and W need none. At most P + 2 chunk activations
// live on any rank. With unit costs the idle time per rank does not grow with M (the repeated
// pattern has no bubble): 1, 7 and 19 units for P = 2, 4, 8 and M >= 4P (21 at most for P = 8
// and smaller M), against P-1 for ZB-V at 2P activations, 4P-5 for V-Min and 6(P-1) for 1F1B.
// The limit itself costs at least 2P-3 (1, 5, 13): rank r's first input gradient cannot start
// before 2P + r, and until then it can only run forwards, at most P + 2 of them, so the last
// rank, starting at P-1, idles P-2 more. Any P >= 1, M >= 1.
absl::StatusOr<Schedule> GenerateVHalf(int num_ranks, int num_micro_batches);

// DualPipeV (DeepSeek's DualPipe cut in half into a V, named "dualpipe_v"), as
// torch.distributed.pipelining's ScheduleDualPipeV orders it: 2 chunks per rank on
// VShapePlacement (chunk 0 = stage r going down the V, chunk 1 = stage 2P-1-r coming back up),
// the steady state made of overlapped pairs (the forward of one chunk with the full backward of
// the other: Action::overlap_with_next), the warm-up and cool-down using the split backward
// (I, W) where it fills a gap. Rank r runs:
//   1. 2(P-r-1) F0;           2. r+1 times F0 F1;       3. P-r-1 times I1 W F1;
//   4. M-2P+r+1 times (F0;B1) (F1;B0), the last rank's first (F0;B1) not overlapped;
//   5. P-r-1 times B1 (F1;B0);
//   6. r+1 times B1 B0, each backward a B up to half-way, an I after;
//   7. P-r-1 times W B0 (or W I0 past the half-way point);   8. r+1 W's.
// W runs the weight gradient of the oldest pending I (of either chunk). DualPipe's README gives
// the bubble as (PP/2-1)(F&B + B - 3W) (PP = 2P stages, F&B the time of a pair); simulated,
// the most idle rank idles exactly that when F = I (e.g. F = I = W), and (P-1)(F - I) more
// when the forward is longer (F = B = 2W: (P-1) F&B). At most 2P+1 chunk activations on a rank
// (the README's PP+1). Requires P >= 1 and M >= 2P (torch's "at least as many micro-batches as
// stages").
absl::StatusOr<Schedule> GenerateDualPipeV(int num_ranks, int num_micro_batches);

// Forward only (validation), named "forward_only": every rank runs F for each of its stages,
// ascending, over micro-batches 0..M-1 (deadlock-free once lowered: stage order is a
// topological order). ValidateProgram does not accept it (it requires backwards).
absl::StatusOr<Schedule> GenerateForwardOnly(const Placement& placement, int num_micro_batches);

// The five established schedules (gpipe, 1f1b, interleaved_1f1b, zb_h1, zb_v).
std::vector<std::string> ScheduleNames();
// Every schedule GenerateSchedule knows (what `pipeline.schedule` accepts), in the order
// `tandem plan --compare` lists them and the planner (common/planner.h) tries them:
// ScheduleNames() and the newer ones (looped_bfs, interleaved_zb, zb_h2, dualpipe_v, v_half,
// v_min).
std::vector<std::string> AllScheduleNames();
// Whether `schedule` takes a choice of chunks per rank (interleaved_1f1b, looped_bfs,
// interleaved_zb); the others run a fixed number.
bool TakesChunks(absl::string_view schedule);
// The chunks per rank a schedule uses when the spec leaves it 0: 2 for interleaved_1f1b,
// looped_bfs, interleaved_zb, zb_v, dualpipe_v, v_half and v_min, 1 otherwise.
int DefaultChunks(absl::string_view schedule);
// Generates the compute-only schedule named `schedule` (case-insensitive; "interleaved" and
// "zbh1"/"zbv" are accepted as aliases). `chunks` 0 means DefaultChunks; a schedule that takes
// a fixed number refuses any other with a clear error.
absl::StatusOr<Schedule> GenerateSchedule(absl::string_view schedule, int num_ranks,
                                          int num_micro_batches, int chunks = 0);

// Inserts, only where the neighbouring stage is on another rank: RECV_F before and SEND_F
// after each forward; RECV_B before and SEND_B after each B or I (the input gradient flows
// backwards; W has no transfers). An overlapped pair is bracketed as one: the receives of both
// its actions before it, the sends of both after it. A transfer already in a rank's list is
// kept where it is and not added again, so lowering a lowered program returns the same program.
Program LowerWithTransfers(const Program& compute, const Placement& placement);
Schedule LowerWithTransfers(const Schedule& compute);

// Activation recomputation (pipeline.recompute: full): an R of (stage, micro-batch) right
// before each B or I that has none yet (after the RECV_B in front of it, in a lowered
// program). A micro-batch with an R has its F run without saving (only its layers' inputs are
// kept); the R re-runs that forward with saving, so the backward finds what it needs. R
// costs one recomputation of the stage (ActionCosts::recompute) and moves no data, so
// lowering is unchanged. An R right before its backward runs inside it, layer by layer
// (RecomputeAtBackward): the least memory. PlaceRecomputation moves R's earlier, into the
// rank's idle time, where that shortens the step within a memory limit.
// `stages` (pipeline.recompute: auto, one flag per stage) limits the R's to the stages whose
// flag is set; empty: every stage.
Program AddRecomputation(const Program& program, const std::vector<bool>& stages = {});
Schedule AddRecomputation(const Schedule& schedule, const std::vector<bool>& stages = {});
// Per action of one rank's list: true for an R directly followed by the backward (B or I) of
// the same stage and micro-batch (nothing between). Such an R is run inside that backward,
// one layer at a time just before each layer's backward (per-layer recomputation: the stage
// holds its layers' inputs and one layer's working set); any other R (one placed earlier, in
// an idle slot) recomputes the whole stage at once and its activations stay until the
// backward. The workers and the simulator decide it by this one rule.
std::vector<bool> RecomputeAtBackward(const std::vector<Action>& actions);

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

// CSV in the format torch.distributed.pipelining reads and writes (its _dump_csv and
// _load_csv, torch 2.x): one row per rank, one cell per action or overlapped pair in the
// notation above (ActionCells: "0F0,0SEND_F0,(0F3;3B1)OVERLAP_F_B"). Rows may differ in length.
std::string ProgramToCsv(const Program& program);
// Reads both of torch's formats: compute_only (empty cells, torch's idle slots, are skipped)
// and compute_comms. Of the latter's runtime bookkeeping, UNSHARD and RESHARD (FSDP),
// WAIT_SEND_F/WAIT_SEND_B (Tandem's sends complete at the end of the step) and REDUCE_GRAD /
// WAIT_REDUCE_GRAD (the plan adds Tandem's own REDUCE_GRAD, at the same place, when the job has
// pipeline.replicas > 1) are dropped. B is the full backward. INVALID_ARGUMENT naming the row
// and column of a bad cell (malformed, or a micro-batch >= M), or when there are not
// `num_ranks` rows. The placement is read from the rows (a stage's actions must all be on one
// row; stages must be 0..S-1; every row must hold one). A compute-only program (no SEND/RECV
// cells at all) is lowered with LowerWithTransfers; a program with any transfer is taken as
// written (and must then be complete: see ValidateProgram), but for its receives: torch posts a
// receive where it writes it and waits for it before its consumer, and a Tandem RECV is that
// wait, so each receive moves to just before the compute (or overlapped pair) that consumes it
// (a no-op for the programs Tandem writes).
absl::StatusOr<Schedule> ScheduleFromCsv(absl::string_view csv, int num_ranks,
                                         int num_micro_batches);

// The ideal bubble fraction (P-1)/(v M + P - 1) of a flush schedule with equal stage times
// (v = 1: GPipe and 1F1B; v chunks: interleaved 1F1B).
double IdealBubbleFraction(int num_ranks, int num_micro_batches, int chunks = 1);

v1::Action ToProto(const Action& a);
Action FromProto(const v1::Action& a);

}  // namespace tandem

#endif  // TANDEM_COMMON_SCHEDULE_H_
