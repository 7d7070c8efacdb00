// The coordinator's job store: every job's spec, state, reason, stage assignment and step
// history, and the event log that WatchJob streams.
//
// The single owner of job state. Thread-safe. With a data root, each job is also written to
// <data_root>/jobs/<id>.json on every state change (and every few steps), and reloaded on
// start; without one, jobs live in memory only. (SQLite replaces the files in the reliability
// issue.)
//
// Each job's per-action step timings (v1::JobTimings: the lowered program, and the records of
// the last steps and of steps sampled across the run, bounded by a TimingRetention) are kept
// apart from the job, so that GetJob stays small, and written with it to
// <data_root>/timings/<id>.json.
#ifndef TANDEM_COORDINATOR_JOB_STORE_H_
#define TANDEM_COORDINATOR_JOB_STORE_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/step_timings.h"
#include "tandem/v1/coordinator.pb.h"

namespace tandem::coordinator {

bool IsTerminal(v1::JobState state);

class JobStore {
 public:
  // Step summaries kept per job (the oldest are dropped first).
  static constexpr size_t kMaxHistory = 10000;

  // Opens the store. An empty data_root keeps jobs in memory. Jobs found RUNNING on disk were
  // interrupted by a coordinator restart: they are marked FAILED with that reason.
  static absl::StatusOr<std::unique_ptr<JobStore>> Open(const std::string& data_root,
                                                        const TimingRetention& retention = {});

  // Stores a validated spec (with defaults filled) as a new QUEUED job; returns its id.
  absl::StatusOr<std::string> Add(const v1::JobSpec& spec);

  absl::StatusOr<v1::Job> Get(const std::string& job_id, bool with_history = true) const;
  // All jobs in submission order, without history.
  std::vector<v1::Job> List() const;
  // Ids of QUEUED jobs in submission order.
  std::vector<std::string> Queued() const;

  // Moves a job to `state`. FAILED_PRECONDITION if the job already ended (terminal states
  // are final); NOT_FOUND for an unknown id.
  absl::Status Transition(const std::string& job_id, v1::JobState state, const std::string& reason);
  // Updates the reason of a queued job without an event (the scheduler refreshes it often).
  void SetReason(const std::string& job_id, const std::string& reason);
  void SetStages(const std::string& job_id, const std::vector<v1::StageAssignment>& stages);
  void RecordStep(const std::string& job_id, const v1::StepSummary& step);
  // A fault ends the job's current run and it will be restarted: counts the restart, keeps
  // the first cause, and rolls the job's progress back to its latest checkpoint (the steps
  // after it run again, and their earlier records are dropped so that none counts twice).
  // The caller then moves it to QUEUED.
  void RecordRestart(const std::string& job_id, const std::string& cause);
  // The job's latest complete checkpoint (persisted at once).
  void SetCheckpoint(const std::string& job_id, int64_t step);
  // A resumed job starts at `step`.
  void SetFirstStep(const std::string& job_id, int64_t step);
  // The step time the plan predicts from the layer profile.
  // pipeline.plan: auto: the planner's choice replaces the spec's pipeline (which keeps
  // plan: auto) and `note` says why; the job's derived figures follow the new pipeline.
  void SetPlan(const std::string& job_id, const v1::PipelineSpec& pipeline,
               const std::string& note);
  void SetPredictedStep(const std::string& job_id, double seconds);

  // The lowered program the job's step timings index into (set before its first step).
  void SetTraceProgram(const std::string& job_id, const v1::TraceProgram& program);
  // Keeps a step's timings as the retention policy says (KeepStepTimings); they are written
  // with the job's next persist.
  void RecordStepTimings(const std::string& job_id, v1::StepTimings step);
  // Which kept step records GetTimings copies: all, only the latest (what a trace of the
  // latest step needs), or none (the program and the byte totals only).
  enum class TimingSteps { kAll, kLatest, kNone };
  // The job's program, byte totals and kept step timings (none kept: no steps). NOT_FOUND for
  // an unknown id.
  absl::StatusOr<v1::JobTimings> GetTimings(const std::string& job_id,
                                            TimingSteps steps = TimingSteps::kAll) const;
  // The job's retained step summaries after `after_step` (-1: all retained), ascending; cheap
  // when there are few, so that pollers (metrics, the dashboard) can follow a job's steps.
  // NOT_FOUND for an unknown id.
  absl::StatusOr<std::vector<v1::StepSummary>> StepsAfter(const std::string& job_id,
                                                          int64_t after_step) const;

  // Events after `cursor` (0 = from the start of the retained log), waiting up to `timeout`
  // for at least one. `cursor` is updated to the position to pass next time. `ended` is set
  // once the job is terminal and every event up to its end has been returned.
  struct Events {
    std::vector<v1::JobEvent> events;
    int64_t cursor = 0;
    bool ended = false;
  };
  absl::StatusOr<Events> WaitEvents(const std::string& job_id, int64_t cursor,
                                    absl::Duration timeout) const;

 private:
  struct Entry {
    v1::Job job;
    std::deque<v1::JobEvent> events;  // the retained tail of the job's event log
    int64_t first_event = 0;          // sequence number of events.front()
    int64_t steps_since_persist = 0;
    v1::JobTimings timings;
    bool timings_dirty = false;  // changed since last written
  };

  JobStore(std::string data_root, const TimingRetention& retention)
      : data_root_(std::move(data_root)), retention_(retention) {}
  absl::Status Load() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Persist(Entry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Append(Entry& e, v1::JobEvent event) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job `job_id` names ("job-N"), or null.
  Entry* Find(const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  const Entry* Find(const std::string& job_id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string data_root_;
  const TimingRetention retention_;
  mutable absl::Mutex mu_;
  int64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<int64_t, Entry> jobs_ ABSL_GUARDED_BY(mu_);  // by numeric id: submission order
};

}  // namespace tandem::coordinator

#endif  // TANDEM_COORDINATOR_JOB_STORE_H_
