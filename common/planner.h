// The planner: for a job's workers and global batch, which schedule, number of micro-batches M
// and virtual stages per worker v are predicted to train fastest within the memory budget.
//
// The global batch (micro_batch_size x micro_batches sequences) is held fixed: under the
// gradient-accumulation semantics every split of it into M micro-batches of B/M sequences
// computes the same averaged gradient, so a plan chosen here changes the speed of a job, not
// what it learns (up to floating-point summation order). Each split is costed with a layer
// profile measured at its own micro-batch shape (GEMM efficiency is not linear in the batch),
// which the caller provides. Pure code, no I/O.
#ifndef TANDEM_COMMON_PLANNER_H_
#define TANDEM_COMMON_PLANNER_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tandem/v1/common.pb.h"
#include "tandem/v1/spec.pb.h"

namespace tandem {

// One point of the search: a factorization of the workers into stages x replicas, a schedule,
// its chunks and a split of each replica's share of the global batch.
struct PlanCandidate {
  int stages = 1;    // pipeline ranks P
  int replicas = 1;  // data-parallel replicas R
  std::string schedule;
  int chunks = 1;  // stages per worker
  int micro_batches = 0;
  int micro_batch_size = 0;
  v1::JobSpec spec;  // the job's spec running this candidate (schedule, chunks, split)
  // Planned with pipeline.recompute: auto because it fits the budget only so (a spec with
  // recompute none): the stages that recompute (recompute_stages of the plan), and of how
  // many.
  bool recompute = false;
  int recompute_stages = 0;
  // OK when it runs within the budget, else why not (the schedule's constraint, the cut's
  // RESOURCE_EXHAUSTED, a profile that could not be measured).
  absl::Status status;
  double step_seconds = 0.0;  // predicted, from the profile at this micro-batch shape
  double bubble = 0.0;
  double slowest_stage_seconds = 0.0;  // forward + backward per micro-batch
  // The fullest worker's memory at the schedule's peak (its stages' together: WorkerBytes).
  int64_t peak_stage_bytes = 0;
  double tokens_per_second = 0.0;  // global batch x seq_len / step
  // R > 1: the gradient reduction's tail past the slowest rank's last compute (predicted).
  double reduce_exposed_seconds = 0.0;
};

// The profile of the job's model at a micro-batch size (the spec given has it set): measured or
// cached by the caller. An error makes the candidates of that split infeasible with it.
using ProfileSource = std::function<absl::StatusOr<v1::ModelProfile>(const v1::JobSpec&)>;

// The ways to arrange the job's workers (GangSize: stages x replicas as written) as P stages x
// R replicas that can run: P <= the model's layers, R dividing the global batch, R <=
// kMaxReplicas, R = 1 on cuda with sharded optimizer state. Most stages first.
std::vector<std::pair<int, int>> Factorizations(const v1::JobSpec& spec);
// The spec on `stages` x `replicas` workers with the same global batch: each replica's share in
// micro-batches of the size as written where they divide it, else in one.
v1::JobSpec WithFactorization(const v1::JobSpec& spec, int stages, int replicas);

// The splits of a replica's share of the global batch the planner tries: every M that divides it
// into whole micro-batches, from the number of workers P (from 1 when the batch is smaller than P)
// up to kMaxPlannedMicroBatches, such that the evaluation's sequences (eval.micro_batches x
// micro_batch_size) also divide into whole micro-batches.
inline constexpr int kMaxPlannedMicroBatches = 64;
std::vector<int> MicroBatchSplits(const v1::JobSpec& spec);

// The spec with its global batch split into `micro_batches` micro-batches (micro_batch_size and
// eval.micro_batches rescaled so that both batches keep their sequences). `micro_batches` must
// be one of MicroBatchSplits(spec).
v1::JobSpec WithSplit(const v1::JobSpec& spec, int micro_batches);

// Every factorization of the workers (Factorizations) x every schedule (interleaved_1f1b with
// 2, 3 and 4 chunks) x every split, with a profile from `profiles` for each micro-batch size
// (asked once per size): the feasible candidates by predicted step, fastest first (ties: less
// memory, then fewer replicas, then fewer micro-batches), then the infeasible ones. A data-
// parallel candidate's step includes its gradient reduction's exposed part, priced from the
// profile's link; without a measured link a factorization other than the spec's is
// infeasible (FAILED_PRECONDITION: the trade cannot be priced). A candidate the schedule's
// generator refuses outright (M < P, too few layers) is left out. The spec's partition method
// is kept (manual cut points do not carry over to other stage counts: use profile).
std::vector<PlanCandidate> SearchPlans(const v1::JobSpec& spec, const ProfileSource& profiles);

// The fastest feasible candidate of SearchPlans. RESOURCE_EXHAUSTED, naming the smallest
// memory budget that would fit, when none fits the budget; else the first candidate's error.
absl::StatusOr<PlanCandidate> ChoosePlan(const std::vector<PlanCandidate>& candidates);

// One line that says what a chosen candidate is and why: "zb_h1, 8 micro-batches of 4, 1 stage
// per worker: predicted 1.234 s per step (bubble 6.1%), 1.31x the spec as written".
std::string DescribeChoice(const PlanCandidate& chosen, double as_written_step_seconds);

// Why this factorization: each (stages, replicas)'s fastest feasible candidate with its
// predicted step, bubble and exposed reduction ("stages x replicas, each at its best: 4 x 1:
// 1.300 s (zb_h1, bubble 20.1%); 2 x 2: ..."); empty when fewer than two factorizations fit.
std::string DescribeFactorizations(const std::vector<PlanCandidate>& candidates);

}  // namespace tandem

#endif  // TANDEM_COMMON_PLANNER_H_
