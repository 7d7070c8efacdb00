// Drives one running job: plan (JobPlanner, job_planning.h), configure every worker of its
// gang, then the step loop. Each step sends one RunStep to every worker at once and waits for
// all reports (Gang, gang.h; the coordinator is off the micro-batch path), combines them into
// the step's summary (step_summary.h), then sends every worker its ApplyStep. On cancel, a lost
// worker or a step error it aborts every worker of the job so that nothing hangs, and ends the
// job with a reason that names the stage and worker at fault.
//
// Thread-safe: Cancel() and OnWorkerLost() may be called from any thread while Run() executes
// on the runner's own thread.
#ifndef TANDEM_COORDINATOR_JOB_RUNNER_H_
#define TANDEM_COORDINATOR_JOB_RUNNER_H_

#include <atomic>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/model_desc.h"
#include "common/pipeline_plan.h"
#include "common/schedule.h"
#include "coordinator/checkpoint_store.h"
#include "coordinator/gang.h"
#include "coordinator/job_planning.h"
#include "coordinator/job_store.h"
#include "coordinator/profile_store.h"
#include "coordinator/rendezvous_store.h"
#include "coordinator/step_relay_plan.h"
#include "coordinator/worker_client.h"
#include "coordinator/worker_registry.h"

namespace tandem::coordinator {

struct RunnerOptions {
  absl::Duration configure_timeout = absl::Seconds(120);
  absl::Duration step_timeout = absl::Seconds(600);
  absl::Duration abort_timeout = absl::Seconds(5);
  absl::Duration profile_timeout = absl::Seconds(300);
  // A cached layer profile at least this old is speed-checked before it prices a job
  // (PlanningEnv::speed_check_after); infinite: never.
  absl::Duration profile_speed_check_after = kDefaultSpeedCheckAfter;
  // Once a run has measured steps, a step's deadline is kStepDeadlineFactor x its slowest
  // step so far, at least this floor (and at most step_timeout): a worker that hangs while its
  // heartbeats still arrive is caught within it.
  absl::Duration step_deadline_floor = absl::Seconds(10);
  // A job requeued after a fault waits before it is allocated again: restart_backoff after
  // its first restart, doubling with each further one, at most restart_backoff_max. A fault
  // that lasts a while (a link down, a node rebooting) then does not spend every restart in a
  // second. Zero: no wait.
  absl::Duration restart_backoff = absl::Seconds(1);
  absl::Duration restart_backoff_max = absl::Seconds(60);
  // The step relay (step_relay_plan.h): a gang of at least this many workers gets each
  // training step's RunStep through about sqrt(N) of its workers, which forward it to the rest,
  // instead of one call per worker from the coordinator. Zero: never.
  int step_relay_min_workers = 64;
  // Peer recovery: a data-parallel job (replicas > 1, optimizer state not sharded) whose run
  // fails resumes from the state its surviving workers kept after the last completed step,
  // when every stage has a survivor, instead of from its checkpoint. False: checkpoints only.
  bool peer_recovery = true;
  // The job's final checkpoint, when the coordinator cannot store it (a full disk), is tried
  // kFinalCheckpointTries times this far apart before the job fails: its trained state is lost
  // with the run. (An earlier checkpoint is skipped with a warning; the job trains on.)
  absl::Duration checkpoint_retry_delay = absl::Seconds(5);
};

inline constexpr int kFinalCheckpointTries = 3;

// How long a job waits before its run after `restarts` restarts in a row (since a run last
// trained a step) starts (zero for none).
absl::Duration RestartBackoff(const RunnerOptions& options, int restarts);

// The phases of a run of a job, in order.
enum class RunPhase {
  kPlan,       // JobPlanner: the plan, the profile, the checkpoint or HF file to start from
  kConfigure,  // Configure on every worker: its stage, data, transport, restored checkpoint
  kTrain,      // the steps, validations and checkpoints
};

// What a failed run says about running the job again.
enum class FailureKind {
  kFault,      // the gang, not the job: a worker lost, hung or aborted, a link down; restart it
  kPermanent,  // the job's configuration: every run would fail the same way; fail it now
};

// Classifies the failure that ended a run in `phase`. `worker_code` is the code a call to a
// worker failed with when the run ended on one (WorkerErrorCode, gang.h), nullopt otherwise (a
// worker unreachable or lost, an interruption, the coordinator's own error).
//  - kPlan: permanent, whatever the error (the plan is computed from the spec and the stored
//    checkpoints and profiles; a Hugging Face file that does not match the model fails here).
//  - kConfigure: permanent when a worker refused its configuration with INVALID_ARGUMENT (the
//    spec or a checkpoint does not fit the stage: a tensor of another shape), NOT_FOUND (a data
//    file, a checkpoint tensor), PERMISSION_DENIED (a data path that leads out of the data
//    root), FAILED_PRECONDITION (the worker cannot take such a stage: another device kind, no
//    checkpoint source) or RESOURCE_EXHAUSTED (the stage does not fit its memory); a fault
//    otherwise: no worker code (a worker that died mid-Configure is unreachable), UNAVAILABLE
//    or DEADLINE_EXCEEDED (a peer or the checkpoint store out of reach), ABORTED, CANCELLED,
//    DATA_LOSS (a checkpoint stream cut short; the next run picks a readable checkpoint),
//    INTERNAL, UNKNOWN.
//  - kTrain: a fault, whatever the code (a worker that restarted refuses the steps of a run it
//    no longer holds with FAILED_PRECONDITION).
// A cancel is neither: the caller tells it apart first.
FailureKind ClassifyRunFailure(RunPhase phase, std::optional<absl::StatusCode> worker_code);

inline constexpr double kStepDeadlineFactor = 5.0;

// What a runner needs from the coordinator, passed explicitly.
struct RunnerEnv {
  JobStore* store = nullptr;
  WorkerRegistry* registry = nullptr;
  StageWorkerClientFactory* clients = nullptr;
  RendezvousStore* rendezvous = nullptr;   // optional: the job's keys are dropped at its end
  CheckpointStore* checkpoints = nullptr;  // optional: no checkpoints without it
  std::string models_root;                 // where init.hf_file paths resolve; empty: none
  ProfileStore* profiles = nullptr;        // optional: layer profiles cached per shape
  RunnerOptions options;
};

// The learning rate for `step` (0-based) of a `total_steps` job: linear warm-up to lr over
// warmup_steps, then constant or cosine decay to lr * min_lr_ratio at the last step.
float LearningRateAt(const v1::OptimizerSpec& opt, int64_t step, int64_t total_steps);

// Whether a validation pass follows training step `step`.
bool EvalDue(const v1::JobSpec& spec, int64_t step);
// Whether a checkpoint is taken after training step `step`.
bool CheckpointDue(const v1::JobSpec& spec, int64_t step);

class JobRunner {
 public:
  // `workers` are the gang allocated to the job, in stage order.
  JobRunner(RunnerEnv env, v1::Job job, std::vector<WorkerRecord> workers);
  ~JobRunner();  // joins the thread

  void Start();
  // Asks the job to stop; it ends CANCELLED (unless it already ended).
  void Cancel(const std::string& reason);
  // Tells the runner that one of its workers missed its heartbeats.
  void OnWorkerLost(const WorkerRecord& worker);
  // The coordinator is stopping: the job's workers are aborted and the job stays RUNNING in
  // the store, for the next coordinator to resume from its checkpoint.
  void Shutdown(const std::string& reason);
  bool finished() const { return finished_.load(); }
  const std::string& job_id() const { return job_.id(); }

 private:
  // How a running job was interrupted from outside.
  enum class Interrupt { kNone, kCancel, kWorkerLost, kShutdown };
  bool InterruptIs(Interrupt kind);
  // The deadline of the next step's calls (RunnerOptions.step_deadline_floor).
  absl::Duration StepDeadline() const;

  void Run();
  // The plan phase (JobPlanner): fills run_.
  absl::Status Plan();
  absl::Status ConfigureAll();
  absl::Status RunOneStep(int64_t step);
  // The validation pass after `step`: RunStep(EVAL) on every worker; returns the loss.
  absl::StatusOr<double> RunEval(int64_t step);
  // Streams every stage's state into the checkpoint store and commits it. Returns the gang's
  // failure (a worker lost, or its stream broken or malformed: a fault); `*not_stored` is the
  // coordinator's own storage failing (a full disk: the gang is fine), OK when it stored all.
  absl::Status SaveCheckpoint(int64_t step, absl::Status* not_stored);
  // The checkpoint after `step`, with the final one tried again (RunnerOptions): the status
  // that ends the run, and `*not_stored` as SaveCheckpoint's.
  absl::Status Checkpoint(int64_t step, absl::Status* not_stored);
  // What a checkpoint the coordinator could not store means for the job: recorded and warned
  // about, the job training on, before its last step; a permanent failure after it.
  absl::Status CheckpointNotStored(int64_t step, const absl::Status& cause);

  // "stage 2 (worker w-3 at host:port)", or "rank 1 (stages 1, 6; worker ...)".
  std::string WorkerName(int rank) const;
  int LastStageRank() const;
  // Data parallelism: the pipeline replicas R (pipeline.replicas), and the workers of one
  // pipeline P (the gang is R x P; replica 0 is gang ranks [0, P)).
  int Replicas() const;
  int PipelineRanks() const;
  // An elastic job, after `step` (its checkpoint, or with `from_peers` its workers' state): why
  // it should end this run and grow (idle workers allow a bigger layout,
  // common/elastic_layout.h), or nullopt.
  std::optional<std::string> GrowReason(int64_t step, bool from_peers) const;
  // Sends `req` to every worker of the gang, through the step relay where there is one, and
  // fills `responses` by rank.
  absl::Status RunStepOnAll(const std::string& what, const v1::RunStepRequest& req,
                            absl::Duration deadline, std::vector<v1::RunStepResponse>* responses);
  // After the gang restored from its peers: tells the holders outside the gang to drop their
  // kept copies (peer_recovery.h's HoldersOutside), in the background (releases_).
  void ReleaseKeptStateOutsideTheGang();

  RunnerEnv env_;
  const v1::Job job_;
  // The gang allocated to the job, in stage order: its clients, its batches of calls, its
  // interruption (which Cancel, OnWorkerLost and Shutdown set) and its lost ranks.
  Gang gang_;
  // The step relay's groups for this gang, set by Plan (empty: the coordinator calls every
  // worker).
  std::vector<RelayGroup> relay_;
  // What planning decided: the spec the job runs (job_.spec() as submitted, or with the
  // planner's pipeline), the pipeline plan, the checkpoint to restore, the first step.
  RunPlan run_;
  const int32_t attempt_;              // job_.restarts(): this run's StageProgram.attempt
  double slowest_step_seconds_ = 0.0;  // over this run's steps
  int64_t steps_run_ = 0;              // training steps this run completed
  // The last step's update, not yet sent: it travels with the next step's RunStep
  // (RunStepRequest.apply_first), so that a step costs one RPC per worker, not two; an explicit
  // ApplyStep sends it where it must land first (evaluation, checkpoint, the last step).
  std::optional<v1::ApplyStepRequest> pending_apply_;

  absl::Mutex mu_;
  // Which interrupt came first (the gang holds its status).
  Interrupt interrupt_ ABSL_GUARDED_BY(mu_) = Interrupt::kNone;

  // The Abort calls of ReleaseKeptStateOutsideTheGang and their clients, joined at the end of
  // Run: a holder that is gone costs its abort_timeout there, not in the job's first step.
  struct Release {
    std::unique_ptr<StageWorkerClient> client;
    std::future<void> done;
  };
  std::vector<Release> releases_;

  std::atomic<bool> finished_{false};
  std::thread thread_;
};

}  // namespace tandem::coordinator

#endif  // TANDEM_COORDINATOR_JOB_RUNNER_H_
