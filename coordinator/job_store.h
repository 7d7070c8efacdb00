// The coordinator's job store: every job's spec, state, reason, stage assignment and step
// history, its checkpoint records, and the event log that WatchJob streams.
//
// The single owner of job state. Thread-safe. Without a data root, jobs live in memory only.
// With one, the store holds <data_root>/coordinator.lock (flock: a second coordinator on the
// same data root is refused) and persists everything in the SQLite database
// <data_root>/coordinator.db (WAL mode; coordinator/sqlite_db.h): one row per job (the v1::Job
// without its history, as a serialized proto, with indexed id, state and submission order),
// one row per step summary (appended by RecordStep: O(1) per step), each job's step timings,
// and one row per committed checkpoint. The in-memory copy answers every read; the database is
// written before each mutating call returns. What is durable when, and what Open does with
// jobs a killed coordinator left running: docs/architecture.md, "Persistence".
//
// Each job's per-action step timings (v1::JobTimings: the lowered program, and the records of
// the last steps and of steps sampled across the run, bounded by a TimingRetention) are kept
// apart from the job, so that GetJob stays small.
#ifndef TANDEM_COORDINATOR_JOB_STORE_H_
#define TANDEM_COORDINATOR_JOB_STORE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/checkpoint_store.h"
#include "coordinator/file_lock.h"
#include "coordinator/sqlite_db.h"
#include "coordinator/step_timings.h"
#include "tandem/v1/coordinator.pb.h"

namespace tandem::coordinator {

bool IsTerminal(v1::JobState state);

class JobStore {
 public:
  // Step summaries kept per job (the oldest are dropped first).
  static constexpr size_t kMaxHistory = 10000;
  // How often (in steps) a running job's step timings are written.
  static constexpr int64_t kTimingsEverySteps = 25;

  // Opens the store. An empty data_root keeps jobs in memory. Otherwise locks the data root
  // (FAILED_PRECONDITION naming the lock and its holder if another store holds it), opens or
  // creates the database (migrating its schema; a new database first imports the jobs/*.json
  // and timings/*.json files of earlier versions) and loads every job. A job found RUNNING was
  // interrupted by a coordinator restart: it goes back to QUEUED, ahead of jobs submitted after
  // it, at its latest complete checkpoint (one whose manifest exists under
  // <data_root>/checkpoints), its history cut after that step, so that the steps after it are
  // run again; QUEUED and finished jobs stay as they were.
  //
  // `checkpoints` is the coordinator's store of <data_root>/checkpoints: the manifests recovery
  // reconciles each job with. Only read during Open (not kept). It may be null only without a
  // data root (INVALID_ARGUMENT otherwise).
  static absl::StatusOr<std::unique_ptr<JobStore>> Open(const std::string& data_root,
                                                        const CheckpointStore* checkpoints,
                                                        const TimingRetention& retention = {});

  // How many times a store has opened this data root, this time included (1 for a new one);
  // 0 without a data root.
  int64_t incarnation() const { return incarnation_; }

  // Stores a validated spec (with defaults filled) as a new QUEUED job; returns its id.
  absl::StatusOr<std::string> Add(const v1::JobSpec& spec);

  // Every Job read (Get, List) carries its prediction_check (coordinator/prediction_check.h),
  // made then: over the history it carries, else over the latest retained steps.
  absl::StatusOr<v1::Job> Get(const std::string& job_id, bool with_history = true) const;
  // Which retained step summaries Get copies into Job.history: those after `after_step`
  // (-1: all), and of them at most the latest `limit` (0: no limit).
  struct HistoryWindow {
    int64_t after_step = -1;
    size_t limit = 0;
  };
  absl::StatusOr<v1::Job> Get(const std::string& job_id, const HistoryWindow& window) const;
  // All jobs in submission order, without history.
  std::vector<v1::Job> List() const;
  // Ids of QUEUED jobs in submission order.
  std::vector<std::string> Queued() const;

  // Moves a job to `state` (RUNNING clears its restart backoff). FAILED_PRECONDITION if the job
  // already ended (terminal states are final); NOT_FOUND for an unknown id.
  absl::Status Transition(const std::string& job_id, v1::JobState state, const std::string& reason);
  // Updates the reason of a queued job without an event (the scheduler refreshes it often;
  // it is not written to the database by itself, only with the job's next write).
  void SetReason(const std::string& job_id, const std::string& reason);
  void SetStages(const std::string& job_id, const std::vector<v1::StageAssignment>& stages);
  // Appends a step to the job's history. A step recorded again (a job rerun from a
  // checkpoint) supersedes the one recorded before and every later one.
  void RecordStep(const std::string& job_id, const v1::StepSummary& step);
  // A fault ends the job's current run and it will be restarted: counts the restart, keeps
  // the first cause, stores `not_before` (its restart backoff: the scheduler allocates it no
  // workers before this wall-clock time, Job.not_before_unix_ms; durable, so that it holds
  // across a coordinator restart), and rolls the job's progress back to its latest checkpoint
  // (the steps after it run again, and their earlier records are dropped so that none counts
  // twice). The caller then moves it to QUEUED. Returns the checkpoint step the next run
  // resumes after (-1: none, it starts again; also for an unknown job).
  // `in_a_row` is stored as Job.restarts_in_a_row.
  // With `peers` (peer recovery: the failed run's survivors kept its state after peers->step)
  // the progress rolls back to that step instead, which is returned, and the next run's plan
  // restores from them (Job.peer_state); without, any peer state of the job is cleared.
  int64_t RecordRestart(const std::string& job_id, const std::string& cause, absl::Time not_before,
                        int in_a_row = 0, const v1::PeerState* peers = nullptr);
  // A run restored its state from its peers: counts it (Job.peer_recoveries) and clears the
  // job's peer state (a later failure records its own).
  void RecordPeerRecovery(const std::string& job_id);
  // An elastic job's run takes another layout (common/elastic_layout.h): spec.pipeline
  // becomes `pipeline` (the derived figures follow) and `event` is appended to its resizes,
  // with its time and the steps its latest restart had to redo. Durable.
  void RecordResize(const std::string& job_id, const v1::PipelineSpec& pipeline,
                    v1::ResizeEvent event);
  // An elastic job ends its run to grow on more workers: QUEUED with `reason`, no restart
  // counted, no backoff, nothing to redo. It resumes from `peers` (its workers kept their state
  // after peers->step, the job's last step) or, without, from its checkpoint (the run ended there).
  absl::Status RequeueToGrow(const std::string& job_id, const std::string& reason,
                             const v1::PeerState* peers = nullptr);
  // The job's latest complete checkpoint, recorded once its manifest is committed (durable
  // before the call returns).
  void SetCheckpoint(const std::string& job_id, int64_t step);
  // A checkpoint the coordinator could not store (`cause` names its step and why): counted on
  // the job and sent to its watchers as a WARNING event; its checkpoint stays the one before.
  void RecordCheckpointFailure(const std::string& job_id, const std::string& cause);
  // A resumed job starts at `step`.
  void SetFirstStep(const std::string& job_id, int64_t step);
  // pipeline.plan: auto: the planner's choice replaces the spec's pipeline (which keeps
  // plan: auto) and `note` says why; the job's derived figures follow the new pipeline.
  void SetPlan(const std::string& job_id, const v1::PipelineSpec& pipeline,
               const std::string& note);
  // The step time the plan predicts from the layer profile, and its update phase's part.
  void SetPredictedStep(const std::string& job_id, double step_seconds, double update_seconds);
  // What the speed check of the job's cached profile found (Job.profile_speed_ratio).
  void SetProfileSpeedRatio(const std::string& job_id, double ratio);

  // The lowered program the job's step timings index into (set before its first step).
  void SetTraceProgram(const std::string& job_id, const v1::TraceProgram& program);
  // Keeps a step's timings as the retention policy says (KeepStepTimings); they are written
  // to the database every kTimingsEverySteps steps and with every state change and checkpoint.
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
    int64_t seq = 0;                      // the N of job-N: submission order
    v1::Job job;                          // without history
    std::deque<v1::StepSummary> history;  // the retained step summaries, ascending
    std::deque<v1::JobEvent> events;      // the retained tail of the job's event log
    int64_t first_event = 0;              // sequence number of events.front()
    v1::JobTimings timings;
    bool timings_dirty = false;             // changed since last written
    int64_t steps_since_timings_write = 0;  // steps recorded since
  };

  JobStore(std::string data_root, const TimingRetention& retention)
      : data_root_(std::move(data_root)), retention_(retention) {}
  // Opening with a data root: the lock, the schema, the import of JSON files, the load, the
  // recovery.
  absl::Status OpenDatabase(const CheckpointStore& checkpoints) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Load() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Recovery (job_store_recovery.cc): the one-time import of the JSON files of earlier
  // versions, ...
  absl::Status ImportJsonFiles() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // ... and the reconciliation of each job's checkpoint with the manifests in `checkpoints`,
  // which requeues interrupted jobs.
  absl::Status Recover(const CheckpointStore& checkpoints) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Writes the job's row (and its timings when dirty and `timings` allows) in one
  // transaction with whatever `also` writes; logs and returns the error. A no-op in memory.
  enum class TimingsWrite { kIfDirty, kIfDue };
  absl::Status Persist(Entry& e, bool durable, const std::string& purpose,
                       TimingsWrite timings = TimingsWrite::kIfDirty,
                       const std::function<absl::Status()>& also = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Deletes the database's step rows of job `seq` from step `from` on (a rerun or a restart
  // supersedes them).
  absl::Status DeleteStepRows(int64_t seq, int64_t from, const std::string& purpose)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status PutJob(const Entry& e, const std::string& purpose)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status PutTimings(const Entry& e, const std::string& purpose)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status PutCheckpoint(const Entry& e, int64_t step, int num_stages,
                             const std::string& purpose) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  void Append(Entry& e, v1::JobEvent event) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job `job_id` names ("job-N"), or null.
  Entry* Find(const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  const Entry* Find(const std::string& job_id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string data_root_;
  const TimingRetention retention_;
  mutable absl::Mutex mu_;
  // Signalled when any job's event log grows. WaitEvents waits on it rather than on a
  // Condition of mu_: a Condition is evaluated at every release of mu_ (every RPC), for every
  // waiting watcher.
  mutable absl::CondVar events_cv_;
  std::unique_ptr<FileLock> lock_;                     // held while open, with a data root
  int64_t incarnation_ = 0;                            // set by Open
  std::unique_ptr<SqliteDb> db_ ABSL_GUARDED_BY(mu_);  // null: memory only
  int64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<int64_t, Entry> jobs_ ABSL_GUARDED_BY(mu_);  // by seq: submission order
};

}  // namespace tandem::coordinator

#endif  // TANDEM_COORDINATOR_JOB_STORE_H_
