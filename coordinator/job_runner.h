// Drives one running job: plan (uniform partition + schedule), configure every worker of its
// gang, then the step loop. Each step sends one RunStep to every worker at once and waits for
// all reports (the coordinator is off the micro-batch path). On cancel, a lost worker or a
// step error it aborts every worker of the job so that nothing hangs, and ends the job with a
// reason that names the stage and worker at fault.
//
// Thread-safe: Cancel() and OnWorkerLost() may be called from any thread while Run() executes
// on the runner's own thread.
#ifndef TANDEM_COORDINATOR_JOB_RUNNER_H_
#define TANDEM_COORDINATOR_JOB_RUNNER_H_

#include <atomic>
#include <functional>
#include <memory>
#include <set>
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
#include "coordinator/job_store.h"
#include "coordinator/profile_store.h"
#include "coordinator/rendezvous_store.h"
#include "coordinator/worker_client.h"
#include "coordinator/worker_registry.h"

namespace tandem::coordinator {

struct RunnerOptions {
  absl::Duration configure_timeout = absl::Seconds(120);
  absl::Duration step_timeout = absl::Seconds(600);
  absl::Duration abort_timeout = absl::Seconds(5);
  absl::Duration profile_timeout = absl::Seconds(300);
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
};

// How long a job waits before its run after `restarts` restarts starts (zero for none).
absl::Duration RestartBackoff(const RunnerOptions& options, int restarts);

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
  absl::Status Plan();
  // pipeline.plan: auto: profiles every split of the global batch, picks the candidate with the
  // shortest predicted step (SearchPlans / ChoosePlan), makes it spec_ and records it.
  absl::Status ChooseAutoPlan();
  absl::Status ConfigureAll();
  absl::Status RunOneStep(int64_t step);
  // The validation pass after `step`: RunStep(EVAL) on every worker; returns the loss.
  absl::StatusOr<double> RunEval(int64_t step);
  // Streams every stage's state into the checkpoint store and commits it.
  absl::Status SaveCheckpoint(int64_t step);
  void AbortAll(const std::string& reason);
  // One asynchronous call to every worker; guarded by mu_.
  struct Batch {
    explicit Batch(int n) : results(n), pending(n) {}
    std::vector<absl::Status> results;
    int pending;
    int failed = 0;
    int first_failure = -1;   // the rank whose call failed first (later ones may be our aborts)
    absl::Duration deadline;  // of each call (for the message when one passes it)
  };
  StageWorkerClient::Done Completion(Batch* batch, int rank);
  // Issues one call per worker (issue(rank, done)) and waits for all (AwaitBatch); a failed
  // call is explained by Diagnose. `what` names the batch in errors ("step 7").
  absl::Status CallAll(const std::string& what, absl::Duration timeout,
                       const std::function<void(int, StageWorkerClient::Done)>& issue);
  // Waits for every call of the batch. If one fails, the job is interrupted or `timeout`
  // passes first, aborts every worker (so that blocked transfers return) and then waits for
  // the rest. Returns the interruption, or OK (the batch's results say the rest).
  absl::Status AwaitBatch(Batch* batch, absl::Duration timeout, const std::string& what);
  // Explains a failed call batch: probes every worker so that an unreachable worker is named
  // as the cause rather than the neighbour that noticed it.
  absl::Status Diagnose(const std::string& what, const Batch& batch);

  // "stage 2 (worker w-3 at host:port)", or "rank 1 (stages 1, 6; worker ...)".
  std::string WorkerName(int rank) const;
  // The layer profile of `spec`'s shape on the job's workers' kind: cached, or measured on
  // the first worker (which is allocated to the job and idle) by ProfileForJob, with the link
  // to the second when the job has one.
  absl::StatusOr<v1::ModelProfile> ProfileAt(const v1::JobSpec& spec);
  absl::StatusOr<v1::ModelProfile> ProfileForJob(const v1::JobSpec& spec);
  int LastStageRank() const;
  absl::Status InterruptStatus();

  RunnerEnv env_;
  const v1::Job job_;
  // The spec the job runs: job_.spec() as submitted, or with the planner's pipeline.
  v1::JobSpec spec_;
  const std::vector<WorkerRecord> workers_;
  std::vector<std::unique_ptr<StageWorkerClient>> clients_;
  PipelinePlan plan_;          // schedule (lowered, validated), eval program, layer ranges
  v1::CheckpointRef restore_;  // set when the job resumes from a checkpoint
  int64_t first_step_ = 0;
  const int32_t attempt_;              // job_.restarts(): this run's StageProgram.attempt
  double slowest_step_seconds_ = 0.0;  // over this run's steps

  absl::Mutex mu_;
  Interrupt interrupt_ ABSL_GUARDED_BY(mu_) = Interrupt::kNone;
  std::string interrupt_reason_ ABSL_GUARDED_BY(mu_);
  // Ranks whose worker was lost (no heartbeat) or found unreachable: not waited for, not
  // aborted (a dead or hung worker cannot answer; when it comes back, the next Configure
  // replaces its stage and its calls of this attempt are refused).
  std::set<int> lost_ranks_ ABSL_GUARDED_BY(mu_);
  bool RankLost(int rank);

  std::atomic<bool> finished_{false};
  std::thread thread_;
};

}  // namespace tandem::coordinator

#endif  // TANDEM_COORDINATOR_JOB_RUNNER_H_
