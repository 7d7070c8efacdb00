// Layer profiling: times the forward and backward (full, and split into I then W) of single
// global layers at a job's micro-batch shape, on this worker's device and threads, and
// measures their bytes, so that the partitioner can balance stages by measured cost.
// No gRPC; the StageWorker service calls it while the worker is idle.
#ifndef TANDEM_WORKER_PROFILER_H_
#define TANDEM_WORKER_PROFILER_H_

#include <vector>

#include "absl/status/statusor.h"
#include "tandem/v1/common.pb.h"
#include "tandem/v1/spec.pb.h"
#include "worker/stage_compute.h"

namespace tandem::worker {

// Timed repeats of one layer stop early once they have taken this long (after at least one):
// a layer that runs for seconds has little relative noise, and a planner profiling several
// micro-batch shapes of a large head would otherwise wait minutes.
inline constexpr double kProfileBudgetSeconds = 2.0;

// Which passes a profile times: all of them, or only the forward and the full backward (a speed
// check of a cached profile: the split backward, the recomputation and the optimizer apply are
// then reported as 0, and the budget above buys more repeats of the two).
enum class ProfilePasses { kAll, kForwardBackward };

// For each global layer index in `layers` (all of the model's when empty): one warm-up run,
// then up to `repeats` timed runs (median; fewer once they pass kProfileBudgetSeconds) of
// Forward, Backward, BackwardInput and BackwardWeight on
// random inputs of the job's shape (micro_batch_size x seq_len), plus the parameter count,
// static bytes (parameters, gradients and the optimizer's state) and the bytes a micro-batch
// saves between its forward and its backward. INVALID_ARGUMENT for a bad model or an index
// outside the model.
absl::StatusOr<std::vector<v1::LayerProfile>> ProfileLayers(
    const v1::JobSpec& spec, const std::vector<int>& layers, int repeats,
    ProfilePasses passes = ProfilePasses::kAll);

// The same measurements through a compute backend (`make` builds it for a one-layer program):
// what a cuda:N worker profiles, so that GPU jobs are balanced by GPU times. Each call of the
// backend returns when its device is done, so wall times are device times. A backend whose
// split backward does all its work in I reports W as (nearly) 0. Inputs are random tokens and
// targets; the activations a stage receives are the backend's fresh buffers (their values do
// not change the cost).
absl::StatusOr<std::vector<v1::LayerProfile>> ProfileLayersOn(
    const v1::JobSpec& spec, const std::vector<int>& layers, int repeats,
    const ComputeFactory& make, ProfilePasses passes = ProfilePasses::kAll);

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_PROFILER_H_
