// Cutting a model's layer sequence into pipeline stages: the exact minimisation of the
// slowest stage's time over contiguous cuts at layer boundaries, under a per-worker memory
// budget (exact with one stage per worker; with several, a search that never exceeds it). Pure
// code, no I/O; the costs come from profiling (or from a model's parameter counts, or are all
// equal).
#ifndef TANDEM_COMMON_PARTITIONER_H_
#define TANDEM_COMMON_PARTITIONER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/model_desc.h"

namespace tandem {

// What one layer costs, per micro-batch.
struct LayerCost {
  double seconds = 0.0;          // forward + backward of one micro-batch
  int64_t static_bytes = 0;      // parameters + gradients + optimizer state
  int64_t activation_bytes = 0;  // what one micro-batch keeps between F and its backward
  // The activation it hands the next layer (0 for the loss layer). A stage with a neighbour
  // holds two micro-batch messages at its peak beside its saved activations (a received
  // input or gradient and an output waiting to be sent), each the size of the message at its
  // cut.
  int64_t output_bytes = 0;
  // Held once beside the live micro-batches' activations by a stage that recomputes: where
  // the layer's activation_bytes is only its input (the checkpoint), the working set its
  // backward holds while it recomputes it (the layer's whole activations). A stage holds its
  // largest layer's (PartitionProblem::whole_stage_recompute: their sum); 0 without
  // recomputation.
  int64_t working_set_bytes = 0;
  // A device backend's scratch, which the stage's layers share: a stage holds
  // StageWorkspaceBytes of its layers'.
  int64_t workspace_bytes = 0;
};

// The workspace of a stage from its layers' (LayerCost::workspace_bytes): each kind of layer's
// once, i.e. the sum of the distinct values (its blocks share one; the embedding's, the
// blocks' and the head's add up). An upper bound: the scratch every kind has is counted once
// per kind, where the largest alone would miss what the others add.
int64_t StageWorkspaceBytes(absl::Span<const int64_t> layer_workspaces);

// PartitionProblem::max_enumerated_cuts's default: all the cuts of a small model (e.g. 20
// layers into 8 stages, 50,388 cuts, in about 8 ms on one core).
inline constexpr int64_t kMaxEnumeratedCuts = int64_t{1} << 16;

struct PartitionProblem {
  std::vector<LayerCost> layers;  // the global layer sequence, embedding first, head last
  int num_stages = 1;
  // Added to a stage's time for each cut it touches (the activation sent forward and the
  // gradient sent back, per micro-batch); 0 for the first stage's left and last's right.
  double transfer_seconds = 0.0;
  // Per stage: how many micro-batches of activations the schedule keeps alive at its peak
  // (1F1B: P - s; GPipe: M). Empty = 1 for every stage.
  std::vector<int> live_micro_batches;
  // Bytes a worker may use for its stages (each: static + live x activation + working set +
  // workspace + messages); 0 = unlimited.
  int64_t memory_budget_bytes = 0;
  // The worker holding each stage (interleaved and V schedules place several stages on one
  // worker, whose bytes then add up under the budget). Empty: one stage per worker.
  std::vector<int> rank_of_stage;
  // With several stages on a worker and a budget, every cut is tried when there are at most
  // this many (C(layers - 1, stages - 1)), which makes the result and a refusal's budget
  // exact; else the search below. 0 (or less): always the search (its tests set it).
  int64_t max_enumerated_cuts = kMaxEnumeratedCuts;
  // A recomputing stage recomputes all its layers at once (the cuda backend), so it holds the
  // sum of its layers' working sets, not its largest one's.
  bool whole_stage_recompute = false;
  // Recomputation chosen per stage, wherever the cut falls (pipeline.recompute: auto): the
  // stages stage_recomputes flags cost their layers as recomputed_layers (as many as layers:
  // each layer's costs when its stage recomputes it), the others as layers. Both empty: every
  // stage costs layers (whose own working_set_bytes may already say they recompute).
  std::vector<LayerCost> recomputed_layers;
  std::vector<bool> stage_recomputes;
};

struct Partition {
  std::vector<LayerRange> ranges;     // one per stage, contiguous, covering every layer
  std::vector<double> stage_seconds;  // per stage: its layers' seconds + its transfers
  // per stage: static + live x activation (+ working set, workspace, messages)
  std::vector<int64_t> stage_bytes;
  // per worker (PartitionProblem::rank_of_stage): its stages' stage_bytes together
  std::vector<int64_t> worker_bytes;
  double bottleneck_seconds = 0.0;  // max of stage_seconds
};

// With several stages per worker, MinMaxPartition's search runs at most this many dynamic
// programmes (below).
inline constexpr int kMaxWorkerBudgetNodes = 64;

// The contiguous cut that minimises the slowest stage's time (exact, by dynamic programming
// over cut points; ties broken towards the smaller peak memory, then the earlier cuts), with
// every stage holding at least one layer and every worker within the memory budget.
// INVALID_ARGUMENT for fewer layers than stages; RESOURCE_EXHAUSTED when no cut fits the
// budget, naming the smallest budget that would (with several stages per worker, a budget
// that would: see below).
//
// Precisely, with one stage per worker: among the cuts whose every stage is within the
// budget, those with the smallest bottleneck_seconds; among them, those with the smallest max
// of stage_bytes; among them, the lexicographically smallest vector of cut points (the
// earliest first cut, then second, ...). Deterministic, and its figures are exactly
// EvaluatePartition's for its ranges. The RESOURCE_EXHAUSTED message gives the smallest budget
// that fits (the min over all cuts of the max stage bytes, exact) and, for the cut that attains
// it, each stage over the budget with its layers and bytes. INVALID_ARGUMENT also for
// num_stages < 1, negative or non-finite seconds, negative bytes or budget, a
// live_micro_batches that is neither empty nor num_stages long or has a negative entry, a
// rank_of_stage that is neither empty nor num_stages long or has an entry outside
// [0, num_stages), and bytes that would overflow int64. O(P n^2) time per programme at worst
// (the scans stop early at the bounds), O(P n) memory.
//
// With several stages on a worker (rank_of_stage; the ranks need not all be used) the budget
// bounds their sum, which couples stages that are not neighbours. The per-stage optimum is
// taken when every worker fits it; else a cut that fits is sought by capping the stages of
// each worker over the budget at their shares of it and solving again, or, when that finds
// none, by moving cut points for the fewest bytes on the fullest worker (a bounded descent);
// that cut is sped up (cut points moved for the slowest stage among cuts that fit, and the
// programme under caps that keep every worker within the budget), and then a best-first
// branch and bound over per-stage caps (each node solved by the same dynamic programme) looks
// for a faster one. Where the cuts are few (max_enumerated_cuts) and a budget is set, every
// cut is tried instead, which is exact: among the cuts whose every worker fits, those with the
// smallest bottleneck_seconds, then the smallest max of worker_bytes, then the earliest; a
// refusal names the smallest budget that fits, exact. The search is exact in its bottleneck
// when it ends within kMaxWorkerBudgetNodes programmes (ties are broken by the peak stage
// within the node or caps that find it, not over all cuts); otherwise the best cut found. A
// cut it returns always fits. The search's RESOURCE_EXHAUSTED names, and carries as the
// payload, the least worker budget among cuts it knows whatever the budget (so that a search
// within it finds that cut): a budget that fits, an upper bound of the least (compared with
// other candidates' exact figures it may overstate this one's), and says when the search
// stopped early.
absl::StatusOr<Partition> MinMaxPartition(const PartitionProblem& problem);

// MinMaxPartition's RESOURCE_EXHAUSTED carries the smallest budget that fits (with several
// stages per worker, one that fits), in bytes, as this payload (decimal); SmallestBudgetBytes reads
// it (0 for any other status).
inline constexpr char kSmallestBudgetPayload[] = "type.tandem.dev/smallest_budget_bytes";
int64_t SmallestBudgetBytes(const absl::Status& status);

// The figures of a given cut under the problem's costs (for uniform, parameters and manual
// partitions, and to compare them with the optimum). RESOURCE_EXHAUSTED when a worker exceeds
// the budget, naming it (every such worker, with its stages' layers and bytes). INVALID_ARGUMENT,
// naming the stage, when the ranges are not num_stages contiguous non-empty ranges covering [0,
// layers.size()) in order, and for a problem MinMaxPartition rejects.
absl::StatusOr<Partition> EvaluatePartition(const PartitionProblem& problem,
                                            const std::vector<LayerRange>& ranges);

// Stage ranges from explicit cut points: the first global layer of every stage but the first,
// strictly increasing within (0, num_layers). INVALID_ARGUMENT naming a cut that is out of
// range, unsorted or leaves a stage empty, or when the count is not num_stages - 1 (one
// message listing every such problem, each cut by its index and layer); also for
// num_stages < 1 or num_layers < num_stages.
absl::StatusOr<std::vector<LayerRange>> RangesFromCuts(const std::vector<int>& cuts, int num_layers,
                                                       int num_stages);

// Parameter count of every global layer of a model (gpt, llama or mlp_lm), as the workers
// build it;
// the `parameters` partition balances these. n_layer + 2 entries: the embedding, the blocks
// (all equal), the head. d_hidden 0 means 4 * d_model, as GptConfigFromSpec and
// MlpLmConfigFromSpec read it; gpt's embedding holds wte and wpe (seq_len rows), and its head
// ln_f plus a (vocab, d_model) matrix, tied or not (a tied head holds its own copy of wte).
// The model must be one the workers accept (its preset resolved, its fields validated); empty
// for another arch or a negative n_layer.
std::vector<int64_t> LayerParameterCounts(const v1::ModelSpec& model);

// The model's distinct parameters, as Hugging Face counts them: the sum of
// LayerParameterCounts less the tied head's copy of the token embedding (gpt, llama with
// tie_embeddings). 0 for a model LayerParameterCounts does not know.
int64_t ModelParameterCount(const v1::ModelSpec& model);

// Model FLOPs of one training token (forward + backward), the convention model-FLOPs
// utilisation is quoted in (PaLM, Megatron-LM): 6 per parameter a token multiplies through
// (every layer's but the embedding's lookup tables: the blocks and the head's matrix), plus,
// for gpt, attention's 12 x n_layer x d_model x seq_len (scores and the weighted sum, forward
// and backward). 0 for a model LayerParameterCounts does not know.
double ModelFlopsPerToken(const v1::ModelSpec& model);

}  // namespace tandem

#endif  // TANDEM_COMMON_PARTITIONER_H_
