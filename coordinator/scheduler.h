// Turns queued jobs into running ones: watches worker liveness, gang-allocates the P workers
// a job needs (first come first served, with backfill: a later job that fits may start while
// an earlier one waits), owns the running jobs' runners, and cancels. A job its runner
// requeued after a fault waits out its restart backoff first: it is not allocated before its
// Job.not_before_unix_ms, stored with it (so that a restarted coordinator waits too).
//
// Thread-safe. Its loop runs on its own thread; Notify() wakes it early.
#ifndef TANDEM_COORDINATOR_SCHEDULER_H_
#define TANDEM_COORDINATOR_SCHEDULER_H_

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/job_runner.h"

namespace tandem::coordinator {

class Scheduler {
 public:
  explicit Scheduler(RunnerEnv env, absl::Duration tick = absl::Milliseconds(100));
  ~Scheduler();  // Stop()

  void Start();
  // Cancels every running job (reason: coordinator shutting down) and joins the loop.
  void Stop();
  void Notify();

  // A queued job is cancelled at once; a running one is asked to stop (its workers are
  // aborted and released within seconds). FAILED_PRECONDITION if the job already ended.
  absl::StatusOr<v1::Job> Cancel(const std::string& job_id);

 private:
  void Loop();
  void Tick() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // An elastic job's layout for the idle workers there are (ElasticLayoutFor from the
  // pipeline as written): `job`'s pipeline becomes it and, when it changes, `resize` says how
  // (for Tick to record once the gang is allocated). False, with the job's reason set, when it
  // must wait.
  bool ChooseElasticLayout(v1::Job* job, std::optional<v1::ResizeEvent>* resize)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  RunnerEnv env_;
  const absl::Duration tick_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool notified_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, std::unique_ptr<JobRunner>> runners_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace tandem::coordinator

#endif  // TANDEM_COORDINATOR_SCHEDULER_H_
