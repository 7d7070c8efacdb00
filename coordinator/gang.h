// The workers allocated to one job, driven as a unit: one asynchronous call to every worker at
// once (CallAll), awaited together; a failed call diagnosed by probing every worker, so that an
// unreachable worker is named as the cause rather than the neighbour that noticed it; and an
// abort of every worker (AbortAll), which makes blocked transfers return.
//
// A gang can be interrupted (Interrupt) from any thread: a batch still waiting for its calls
// stops waiting, every worker is aborted and the batch returns the interrupting status (so does
// Diagnose); InterruptStatus tells the job's loop to stop. Ranks found lost (their heartbeats
// missed, or a probe unanswered) are neither waited for nor aborted: a dead or hung worker cannot
// answer.
//
// Thread-safe: Interrupt, InterruptStatus and RankLost may be called from any thread while the
// job's own thread makes the calls.
#ifndef TANDEM_COORDINATOR_GANG_H_
#define TANDEM_COORDINATOR_GANG_H_

#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/worker_client.h"
#include "coordinator/worker_registry.h"

namespace tandem::coordinator {

// The code of the worker's own error that `status` reports, when it is a gang's diagnosis of
// one (INTERNAL "<what>: <worker>: <its error>", every worker reachable); nullopt for any other
// status (an unreachable worker, an interruption, OK). The caller tells from it a worker's
// refusal of its configuration from a fault (ClassifyRunFailure, job_runner.h).
std::optional<absl::StatusCode> WorkerErrorCode(const absl::Status& status);

class Gang {
 public:
  // Connects to every worker of `workers` (in rank order) through `clients`. `registry` learns
  // of the workers found unreachable (MarkLost). `name` says who a rank is in messages ("stage
  // 2 (worker w-3 at host:port)"). `abort_timeout` bounds each Abort call, and the wait for a
  // batch's calls to return after an abort.
  Gang(std::string job_id, std::vector<WorkerRecord> workers, StageWorkerClientFactory& clients,
       WorkerRegistry* registry, absl::Duration abort_timeout,
       std::function<std::string(int rank)> name);

  // Re-deals the gang's ranks: the worker at rank order[r] becomes rank r (its client with
  // it). For planning that chose another stages x replicas than the gang was placed for
  // (pipeline.plan: auto), before any call. FAILED_PRECONDITION after a rank was lost or
  // interrupted; INVALID_ARGUMENT unless `order` is a permutation of the ranks.
  absl::Status Reorder(const std::vector<int>& order);

  int size() const { return static_cast<int>(workers_.size()); }
  const std::vector<WorkerRecord>& workers() const { return workers_; }
  StageWorkerClient& client(int rank) { return *clients_[rank]; }

  // Issues one call per worker (issue(rank, done)) and waits for all. If one fails, the gang is
  // interrupted or `timeout` (+5 s) passes first, aborts every worker and waits for the rest
  // (at most abort_timeout, then their calls are cancelled). Returns the interruption, else
  // OK when every call succeeded, else the diagnosis of the failure (Diagnose). `what` names
  // the batch in errors ("step 7"). With `count` >= 0 only the first `count` ranks are called
  // (a data-parallel job's replica 0: its evaluations and checkpoints).
  absl::Status CallAll(const std::string& what, absl::Duration timeout,
                       const std::function<void(int, StageWorkerClient::Done)>& issue,
                       int count = -1);
  // The same for the calls of `ranks` only (the step relay's roots, which forward the call to
  // the others). A failure that names a relayed rank (common/relayed_rank.h) is that rank's, not
  // the caller's: the abort reason and the diagnosis name it.
  absl::Status CallRanks(const std::string& what, absl::Duration timeout,
                         const std::vector<int>& ranks,
                         const std::function<void(int, StageWorkerClient::Done)>& issue);

  // Explains failed calls made outside CallAll: `results` by rank, each call made with
  // `deadline`; the lowest failed rank is taken for the first failure. Returns the
  // interruption if the gang was interrupted; else probes every worker: UNAVAILABLE naming the
  // first unreachable one (every unreachable one is marked lost, here and in the registry, so
  // that a restart picks none of them), else INTERNAL
  // naming the first failure, with that worker's own code attached (WorkerErrorCode).
  absl::Status Diagnose(const std::string& what, const std::vector<absl::Status>& results,
                        absl::Duration deadline);

  // Aborts every worker not known lost, at once; failures are logged. Each keeps its state
  // after the retain step for peer recovery when one is set (set_retain_step).
  void AbortAll(const std::string& reason);
  // Peer recovery: every abort from now on (the one a failed batch of calls sends too) asks
  // the workers to keep their state after `step` (AbortRequest.retain_state); -1: not to,
  // and to drop any state they kept of the job.
  // `apply` is that step's update where it has not been sent yet (AbortRequest.retain_apply).
  void set_retain_step(int64_t step, const v1::ApplyStepRequest* apply = nullptr);
  int64_t retain_step() const;

  // The first interrupt wins: returns false (and changes nothing) if the gang was already
  // interrupted. `status` must not be OK; `lost_ranks` are marked lost with it.
  bool Interrupt(absl::Status status, const std::vector<int>& lost_ranks = {});
  // OK until interrupted, then the interrupting status.
  absl::Status InterruptStatus() const;
  bool RankLost(int rank) const;

 private:
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
  // Waits for every call of the batch. If one fails, the gang is interrupted or `timeout`
  // passes first, aborts every worker (so that blocked transfers return) and then waits for
  // the rest. Returns the interruption, or OK (the batch's results say the rest).
  absl::Status AwaitBatch(Batch* batch, absl::Duration timeout, const std::string& what);
  absl::Status Diagnose(const std::string& what, const std::vector<absl::Status>& results,
                        int first_failure, absl::Duration deadline);

  const std::string job_id_;
  std::vector<WorkerRecord> workers_;  // by rank (Reorder before any call)
  std::vector<std::unique_ptr<StageWorkerClient>> clients_;
  WorkerRegistry* const registry_;
  const absl::Duration abort_timeout_;
  const std::function<std::string(int)> name_;
  mutable absl::Mutex retain_mu_;
  int64_t retain_step_ ABSL_GUARDED_BY(retain_mu_) = -1;
  std::optional<v1::ApplyStepRequest> retain_apply_ ABSL_GUARDED_BY(retain_mu_);

  mutable absl::Mutex mu_;
  absl::Status interrupt_ ABSL_GUARDED_BY(mu_);
  // Ranks whose worker was lost (no heartbeat) or found unreachable: not waited for, not
  // aborted (a dead or hung worker cannot answer; when it comes back, the next Configure
  // replaces its stage and its calls of this attempt are refused).
  std::set<int> lost_ranks_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::coordinator

#endif  // TANDEM_COORDINATOR_GANG_H_
