// The "plan" phase of a job's run: the transport (pipeline.transport resolved on the job's
// workers, coordinator/transport_choice.h), the pipeline plan (pipeline.plan: auto searches the
// splits of the global batch on measured layer profiles), the partition (profiled on the job's
// first worker when partition: profile and no profile is cached), the checkpoint the run starts
// from (init.hf_file imported, init.from_job, or the job's own after a restart), and the stage
// assignment recorded in the job store.
//
// Not thread-safe: used by the job's runner, on its thread, before the workers are configured.
#ifndef TANDEM_COORDINATOR_JOB_PLANNING_H_
#define TANDEM_COORDINATOR_JOB_PLANNING_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/pipeline_plan.h"
#include "coordinator/checkpoint_store.h"
#include "coordinator/gang.h"
#include "coordinator/job_store.h"
#include "coordinator/model_profiler.h"
#include "coordinator/profile_speed_check.h"
#include "coordinator/profile_store.h"
#include "coordinator/rendezvous_store.h"
#include "tandem/v1/coordinator.pb.h"

namespace tandem::coordinator {

// What planning decided for one run of a job.
struct RunPlan {
  // The spec the run uses: the job's as submitted, or with the auto planner's pipeline.
  v1::JobSpec spec;
  PipelinePlan pipeline;      // schedule (lowered, validated), eval program, layer ranges
  v1::CheckpointRef restore;  // set when the run resumes from a checkpoint (or from peers)
  int64_t first_step = 0;     // the run's first training step
  // Peer recovery: the surviving workers of the job's failed run that kept its state after
  // restore.step (no holders: the run restores from a checkpoint, if any).
  v1::PeerState peers;
};

// What planning needs from the coordinator.
struct PlanningEnv {
  JobStore* store = nullptr;
  RendezvousStore* rendezvous = nullptr;   // optional: the link probe's keys (profiling)
  CheckpointStore* checkpoints = nullptr;  // optional: no checkpoint to start from without it
  std::string models_root;                 // where init.hf_file paths resolve; empty: none
  ProfileStore* profiles = nullptr;        // optional: layer profiles cached per shape
  absl::Duration profile_timeout = absl::Seconds(300);
  // A cached profile at least this old is speed-checked before it prices the job
  // (coordinator/profile_speed_check.h); infinite: never.
  absl::Duration speed_check_after = kDefaultSpeedCheckAfter;
  // Re-deals the gang's ranks (Gang::Reorder, under the runner's lock) when pipeline.plan:
  // auto chose another stages x replicas than the gang was placed for; null: never.
  std::function<absl::Status(const std::vector<int>& order)> reorder_gang;
};

class JobPlanner {
 public:
  // `gang` is the job's workers (profiles are measured on its first, idle, worker).
  JobPlanner(PlanningEnv env, const v1::Job& job, Gang& gang)
      : env_(std::move(env)), job_(job), gang_(gang) {}

  // Plans the run into `*plan`, whose spec starts as the job's; records the choices in the
  // store (SetPlan, SetPredictedStep, SetFirstStep, SetStages). On failure `*plan` keeps what
  // was decided before it; the error is the planner's, the profiler's or the checkpoint's.
  absl::Status Plan(RunPlan* plan);

 private:
  // pipeline.plan: auto: profiles every split of the global batch, picks the candidate with the
  // shortest predicted step (SearchPlans / ChoosePlan), makes it *spec and records it.
  absl::Status ChooseAutoPlan(v1::JobSpec* spec);
  // After ChooseAutoPlan: the gang was placed for placed_stages x placed_replicas; when `spec`
  // has another factorization, re-deals its ranks for it (PlaceGang over the gang's nodes).
  absl::Status PlaceForPlan(int placed_stages, int placed_replicas, const v1::JobSpec& spec);
  // The layer profile of `spec`'s shape on the job's workers' kind: cached, or measured on
  // the first worker (which is allocated to the job and idle) by ProfileForJob, with the link
  // to the second when the job has one.
  absl::StatusOr<v1::ModelProfile> ProfileAt(const v1::JobSpec& spec);
  absl::StatusOr<v1::ModelProfile> ProfileForJob(const v1::JobSpec& spec);
  // A cached profile of `spec`'s shape as the job is priced on it: as it is when younger than
  // env_.speed_check_after; else after the plan's speed check (one per plan, on the first
  // cached profile it prices, recorded in the job; every cached profile of the plan then takes
  // its verdict): scaled, measured again (ProfileForJob) or as it is. A check that fails is
  // logged and the profile used as it is.
  absl::StatusOr<v1::ModelProfile> SpeedChecked(const v1::JobSpec& spec, v1::ModelProfile cached);
  // The job's workers, as MeasureProfile and CheckProfileSpeed take them.
  std::vector<ProfiledWorker> ProfiledWorkers();

  const PlanningEnv env_;
  const v1::Job& job_;
  Gang& gang_;
  std::optional<SpeedCheck> speed_check_;  // this plan's, once made
};

}  // namespace tandem::coordinator

#endif  // TANDEM_COORDINATOR_JOB_PLANNING_H_
