#include "coordinator/job_store.h"

#include <algorithm>
#include <filesystem>
#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/pipeline_plan.h"
#include "common/schedule.h"
#include "common/spec.h"
#include "common/status_macros.h"
#include "common/step_number.h"
#include "coordinator/job_store_internal.h"
#include "coordinator/prediction_check.h"
#include "spdlog/spdlog.h"

namespace tandem::coordinator {
namespace {

namespace fs = std::filesystem;
using Sync = SqliteDb::Sync;

constexpr size_t kMaxEvents = 20000;
constexpr char kDatabaseFile[] = "coordinator.db";
constexpr char kLockFile[] = "coordinator.lock";

// The schema, as migrations: [i] takes PRAGMA user_version i to i + 1. A shipped migration is
// never edited; a change of schema appends one. The v1::Job and v1::StepSummary blobs are the
// records; the other columns of `jobs` and `steps` repeat a few of their fields for indexes
// and for people reading the database with the sqlite3 shell.
const std::vector<std::string>& Migrations() {
  static const auto* migrations = new std::vector<std::string>{
      R"sql(
CREATE TABLE jobs (
  seq INTEGER PRIMARY KEY,           -- the N of job-N: the submission order
  id TEXT NOT NULL UNIQUE,
  name TEXT NOT NULL,
  state TEXT NOT NULL,               -- v1::JobState name
  reason TEXT NOT NULL,
  steps_done INTEGER NOT NULL,
  total_steps INTEGER NOT NULL,
  checkpoint_step INTEGER NOT NULL,  -- -1: none
  created_unix_ms INTEGER NOT NULL,
  updated_unix_ms INTEGER NOT NULL,
  job BLOB NOT NULL                  -- v1::Job without history
);
CREATE INDEX jobs_by_state ON jobs (state, seq);
CREATE TABLE steps (                 -- the step history: one row per v1::StepSummary
  job_seq INTEGER NOT NULL REFERENCES jobs (seq),
  step INTEGER NOT NULL,
  loss REAL NOT NULL,
  summary BLOB NOT NULL,             -- v1::StepSummary
  PRIMARY KEY (job_seq, step)
) WITHOUT ROWID;
CREATE TABLE timings (               -- each job's kept per-action step timings
  job_seq INTEGER PRIMARY KEY REFERENCES jobs (seq),
  timings BLOB NOT NULL              -- v1::JobTimings
);
CREATE TABLE checkpoints (           -- checkpoints committed (their manifest written)
  job_seq INTEGER NOT NULL REFERENCES jobs (seq),
  step INTEGER NOT NULL,             -- the step after which
  num_stages INTEGER NOT NULL,       -- stage files: one per worker rank
  committed_unix_ms INTEGER NOT NULL,
  PRIMARY KEY (job_seq, step)
) WITHOUT ROWID;
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
)sql",
  };
  return *migrations;
}

}  // namespace

namespace job_store_internal {

int64_t NowMs() { return UnixMicros() / 1000; }

bool ParseJobId(const std::string& id, int64_t* n) {
  return id.size() > 4 && id.rfind("job-", 0) == 0 && absl::SimpleAtoi(id.substr(4), n);
}

int NumRanks(const v1::Job& job) {
  int ranks = 0;
  for (const auto& s : job.stages()) ranks = std::max(ranks, s.rank() + 1);
  return ranks;
}

namespace {

// The latest validation loss and training loss after the history changed.
void RefreshLatest(v1::Job& job, const std::deque<v1::StepSummary>& history) {
  job.set_last_loss(history.empty() ? 0.0 : history.back().loss());
  job.set_has_val_loss(false);
  job.set_last_val_loss(0.0);
  for (auto it = history.rbegin(); it != history.rend(); ++it) {
    if (it->has_val_loss()) {
      job.set_has_val_loss(true);
      job.set_last_val_loss(it->val_loss());
      break;
    }
  }
}

}  // namespace

int64_t DropStepsFrom(v1::Job& job, std::deque<v1::StepSummary>& history, int64_t first) {
  int64_t dropped = 0;
  while (!history.empty() && history.back().step() >= first) {
    if (history.back().skipped())
      job.set_skipped_steps(std::max<int64_t>(0, job.skipped_steps() - 1));
    history.pop_back();
    ++dropped;
  }
  if (dropped > 0) RefreshLatest(job, history);
  return dropped;
}

}  // namespace job_store_internal

using job_store_internal::DropStepsFrom;
using job_store_internal::NowMs;
using job_store_internal::NumRanks;
using job_store_internal::ParseJobId;

bool IsTerminal(v1::JobState state) {
  return state == v1::SUCCEEDED || state == v1::FAILED || state == v1::CANCELLED;
}

absl::StatusOr<std::unique_ptr<JobStore>> JobStore::Open(const std::string& data_root,
                                                         const CheckpointStore* checkpoints,
                                                         const TimingRetention& retention) {
  std::unique_ptr<JobStore> store(new JobStore(data_root, retention));
  if (!data_root.empty()) {
    if (checkpoints == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("the job store of the data root ", data_root, " needs its checkpoints"));
    }
    std::error_code ec;
    fs::create_directories(data_root, ec);
    if (ec) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot create the data root ", data_root, ": ", ec.message()));
    }
    absl::MutexLock lock(&store->mu_);
    RETURN_IF_ERROR(store->OpenDatabase(*checkpoints));
  }
  return store;
}

absl::Status JobStore::OpenDatabase(const CheckpointStore& checkpoints) {
  const fs::path root(data_root_);
  ASSIGN_OR_RETURN(lock_, FileLock::Acquire((root / kLockFile).string(),
                                            absl::StrCat("the data root ", data_root_)));
  ASSIGN_OR_RETURN(db_, SqliteDb::Open((root / kDatabaseFile).string()));
  RETURN_IF_ERROR(db_->Migrate(Migrations()));
  RETURN_IF_ERROR(ImportJsonFiles());
  RETURN_IF_ERROR(Load());
  RETURN_IF_ERROR(Recover(checkpoints));
  spdlog::info("job store: {} job(s) loaded from {}", jobs_.size(), db_->path());
  return absl::OkStatus();
}

absl::Status JobStore::Load() {
  {
    ASSIGN_OR_RETURN(SqliteStatement * q,
                     db_->Prepare("SELECT seq, job FROM jobs ORDER BY seq", "loading jobs"));
    RETURN_IF_ERROR(q->ForEachRow([&](const SqliteStatement& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      const int64_t seq = r.ColumnInt(0);
      v1::Job job;
      int64_t n = 0;
      if (!job.ParseFromString(r.ColumnBlob(1)) || !ParseJobId(job.id(), &n) || n != seq) {
        spdlog::warn("job store: skipping the unreadable row of job-{}", seq);
        return;
      }
      Entry& e = jobs_[seq];
      e.seq = seq;
      e.job = std::move(job);
      next_id_ = std::max(next_id_, seq + 1);
    }));
  }
  {
    ASSIGN_OR_RETURN(SqliteStatement * q,
                     db_->Prepare("SELECT job_seq, step, summary FROM steps ORDER BY job_seq, step",
                                  "loading step history"));
    RETURN_IF_ERROR(q->ForEachRow([&](const SqliteStatement& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      auto it = jobs_.find(r.ColumnInt(0));
      if (it == jobs_.end()) return;
      v1::StepSummary step;
      if (!step.ParseFromString(r.ColumnBlob(2))) {
        spdlog::warn("job store: job-{}: skipping the unreadable row of step {}", it->first,
                     StepNumber(r.ColumnInt(1)));
        return;
      }
      auto& history = it->second.history;
      if (!history.empty()) history.back().clear_stage_memory();  // the latest step's only
      history.push_back(std::move(step));
      if (history.size() > kMaxHistory) history.pop_front();
    }));
  }
  {
    ASSIGN_OR_RETURN(SqliteStatement * q,
                     db_->Prepare("SELECT job_seq, timings FROM timings", "loading step timings"));
    RETURN_IF_ERROR(q->ForEachRow([&](const SqliteStatement& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      auto it = jobs_.find(r.ColumnInt(0));
      if (it == jobs_.end()) return;
      if (!it->second.timings.ParseFromString(r.ColumnBlob(1))) {
        spdlog::warn("job store: job-{}: dropping unreadable step timings", it->first);
        it->second.timings.Clear();
      }
    }));
  }
  return absl::OkStatus();
}

absl::Status JobStore::PutJob(const Entry& e, const std::string& purpose) {
  ASSIGN_OR_RETURN(
      SqliteStatement * st,
      db_->Prepare(
          "INSERT INTO jobs (seq, id, name, state, reason, steps_done, total_steps, "
          "checkpoint_step, "
          "created_unix_ms, updated_unix_ms, job) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, "
          "?11) ON CONFLICT (seq) DO UPDATE SET name = excluded.name, state = excluded.state, "
          "reason = excluded.reason, steps_done = excluded.steps_done, total_steps = "
          "excluded.total_steps, checkpoint_step = excluded.checkpoint_step, updated_unix_ms = "
          "excluded.updated_unix_ms, job = excluded.job",
          purpose));
  const v1::Job& job = e.job;
  return st->Bind(1, e.seq)
      .BindText(2, job.id())
      .BindText(3, job.name())
      .BindText(4, v1::JobState_Name(job.state()))
      .BindText(5, job.reason())
      .Bind(6, job.steps_done())
      .Bind(7, job.total_steps())
      .Bind(8, job.checkpoint_step())
      .Bind(9, job.created_unix_ms())
      .Bind(10, NowMs())
      .BindBlob(11, job.SerializeAsString())
      .Run();
}

absl::Status JobStore::PutTimings(const Entry& e, const std::string& purpose) {
  ASSIGN_OR_RETURN(
      SqliteStatement * st,
      db_->Prepare("INSERT OR REPLACE INTO timings (job_seq, timings) VALUES (?1, ?2)", purpose));
  return st->Bind(1, e.seq).BindBlob(2, e.timings.SerializeAsString()).Run();
}

absl::Status JobStore::PutCheckpoint(const Entry& e, int64_t step, int num_stages,
                                     const std::string& purpose) {
  ASSIGN_OR_RETURN(
      SqliteStatement * st,
      db_->Prepare(
          "INSERT OR REPLACE INTO checkpoints (job_seq, step, num_stages, committed_unix_ms) "
          "VALUES (?1, ?2, ?3, ?4)",
          purpose));
  return st->Bind(1, e.seq).Bind(2, step).Bind(3, num_stages).Bind(4, NowMs()).Run();
}

absl::Status JobStore::Persist(Entry& e, bool durable, const std::string& purpose,
                               TimingsWrite timings, const std::function<absl::Status()>& also) {
  if (db_ == nullptr) return absl::OkStatus();
  const bool write_timings = e.timings_dirty && (timings == TimingsWrite::kIfDirty ||
                                                 e.steps_since_timings_write >= kTimingsEverySteps);
  absl::Status s = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::Status {
    ASSIGN_OR_RETURN(SqliteDb::Transaction txn,
                     db_->Begin(durable ? Sync::kFull : Sync::kNormal, purpose));
    if (also) RETURN_IF_ERROR(also());
    RETURN_IF_ERROR(PutJob(e, purpose));
    if (write_timings) RETURN_IF_ERROR(PutTimings(e, purpose));
    return txn.Commit();
  }();
  if (!s.ok()) {
    spdlog::error("job store: {}", s.ToString());
  } else if (write_timings) {
    e.timings_dirty = false;
    e.steps_since_timings_write = 0;
  }
  return s;
}

void JobStore::Append(Entry& e, v1::JobEvent event) {
  event.set_job_id(e.job.id());
  event.set_total_steps(e.job.total_steps());
  e.events.push_back(std::move(event));
  while (e.events.size() > kMaxEvents) {
    e.events.pop_front();
    ++e.first_event;
  }
  events_cv_.SignalAll();
}

absl::StatusOr<std::string> JobStore::Add(const v1::JobSpec& spec) {
  absl::MutexLock lock(&mu_);
  const int64_t n = next_id_++;
  Entry& e = jobs_[n];
  e.seq = n;
  v1::Job& job = e.job;
  job.set_id(absl::StrCat("job-", n));
  job.set_name(spec.name());
  *job.mutable_spec() = spec;
  job.set_state(v1::QUEUED);
  job.set_reason("waiting to be scheduled");
  job.set_checkpoint_step(-1);
  job.set_created_unix_ms(NowMs());
  job.set_total_steps(spec.steps());
  job.set_effective_batch(EffectiveBatch(spec));
  job.set_tokens_per_step(TokensPerStep(spec));
  job.set_bubble_fraction_ideal(PredictedBubble(spec));
  // Every layout of an elastic job is planned from the pipeline as submitted.
  if (IsElastic(spec)) *job.mutable_written_pipeline() = spec.pipeline();
  if (absl::Status s = Persist(e, /*durable=*/true, absl::StrCat("submitting ", job.id()));
      !s.ok()) {
    jobs_.erase(n);
    return WithPrefix(s, "the job was not stored");
  }
  const std::string id = job.id();
  v1::JobEvent event;
  event.set_kind(v1::JobEvent::STATE);
  event.set_state(v1::QUEUED);
  event.set_reason(job.reason());
  Append(e, std::move(event));
  return id;
}

JobStore::Entry* JobStore::Find(const std::string& job_id) {
  return const_cast<Entry*>(static_cast<const JobStore*>(this)->Find(job_id));
}

const JobStore::Entry* JobStore::Find(const std::string& job_id) const {
  int64_t n = 0;
  auto it = ParseJobId(job_id, &n) ? jobs_.find(n) : jobs_.end();
  return it == jobs_.end() ? nullptr : &it->second;
}

namespace {

// The position of the first summary of a step after `after_step` in an ascending history
// (its size when there is none); a poller asks for the few latest, so search from the end.
size_t FirstAfter(const std::deque<v1::StepSummary>& history, int64_t after_step) {
  size_t first = history.size();
  while (first > 0 && history[first - 1].step() > after_step) --first;
  return first;
}

// `job` (a copy of a stored job, with the steps of `history` it carries) with its
// prediction_check: over those steps, or over the latest kPredictionCheckSteps of `retained`
// where it carries none.
void FillPredictionCheck(const std::deque<v1::StepSummary>& retained, v1::Job& job) {
  if (job.predicted_step_seconds() <= 0) return;
  std::vector<const v1::StepSummary*> steps;
  if (job.history_size() > 0) {
    for (const v1::StepSummary& s : job.history()) steps.push_back(&s);
  } else {
    const size_t n = std::min(retained.size(), static_cast<size_t>(kPredictionCheckSteps));
    for (size_t i = retained.size() - n; i < retained.size(); ++i) steps.push_back(&retained[i]);
  }
  if (std::optional<v1::PredictionCheck> c = CheckPrediction(job, steps); c.has_value()) {
    *job.mutable_prediction_check() = *std::move(c);
  }
}

}  // namespace

absl::StatusOr<v1::Job> JobStore::Get(const std::string& job_id, bool with_history) const {
  if (with_history) return Get(job_id, HistoryWindow{});
  absl::MutexLock lock(&mu_);
  const Entry* e = Find(job_id);
  if (e == nullptr) return absl::NotFoundError(absl::StrCat("no job '", job_id, "'"));
  v1::Job job = e->job;
  FillPredictionCheck(e->history, job);
  return job;
}

absl::StatusOr<v1::Job> JobStore::Get(const std::string& job_id,
                                      const HistoryWindow& window) const {
  absl::MutexLock lock(&mu_);
  const Entry* e = Find(job_id);
  if (e == nullptr) return absl::NotFoundError(absl::StrCat("no job '", job_id, "'"));
  v1::Job job = e->job;
  const auto& history = e->history;
  size_t first = FirstAfter(history, window.after_step);
  if (window.limit > 0 && history.size() - first > window.limit) {
    first = history.size() - window.limit;
  }
  job.mutable_history()->Reserve(static_cast<int>(history.size() - first));
  for (size_t i = first; i < history.size(); ++i) *job.add_history() = history[i];
  FillPredictionCheck(history, job);
  return job;
}

std::vector<v1::Job> JobStore::List() const {
  absl::MutexLock lock(&mu_);
  std::vector<v1::Job> out;
  for (const auto& [n, e] : jobs_) {
    out.push_back(e.job);
    FillPredictionCheck(e.history, out.back());
  }
  return out;
}

std::vector<std::string> JobStore::Queued() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> out;
  for (const auto& [n, e] : jobs_) {
    if (e.job.state() == v1::QUEUED) out.push_back(e.job.id());
  }
  return out;
}

absl::Status JobStore::Transition(const std::string& job_id, v1::JobState state,
                                  const std::string& reason) {
  absl::MutexLock lock(&mu_);
  Entry* found = Find(job_id);
  if (found == nullptr) return absl::NotFoundError(absl::StrCat("no job '", job_id, "'"));
  Entry& e = *found;
  if (IsTerminal(e.job.state())) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id, " already ended (", v1::JobState_Name(e.job.state()), ")"));
  }
  const v1::JobState from = e.job.state();
  e.job.set_state(state);
  e.job.set_reason(reason);
  if (state == v1::RUNNING) {
    e.job.set_started_unix_ms(NowMs());
    e.job.clear_not_before_unix_ms();  // its backoff is over
  }
  if (IsTerminal(state)) e.job.set_finished_unix_ms(NowMs());
  v1::JobEvent event;
  event.set_kind(v1::JobEvent::STATE);
  event.set_state(state);
  event.set_reason(reason);
  Append(e, std::move(event));
  // The state stands in memory either way (the process goes on with it); the error says it
  // may not survive a restart.
  return Persist(
      e, /*durable=*/true,
      absl::StrCat(job_id, ": ", v1::JobState_Name(from), " -> ", v1::JobState_Name(state)));
}

void JobStore::SetReason(const std::string& job_id, const std::string& reason) {
  absl::MutexLock lock(&mu_);
  Entry* e = Find(job_id);
  if (e != nullptr && !IsTerminal(e->job.state())) {
    e->job.set_reason(reason);
  }
}

void JobStore::SetStages(const std::string& job_id,
                         const std::vector<v1::StageAssignment>& stages) {
  absl::MutexLock lock(&mu_);
  Entry* e = Find(job_id);
  if (e == nullptr) return;
  auto* field = e->job.mutable_stages();
  field->Clear();
  for (const auto& s : stages) *field->Add() = s;
  (void)Persist(*e, /*durable=*/false, absl::StrCat(job_id, ": recording its stages"));
}

void JobStore::RecordStep(const std::string& job_id, const v1::StepSummary& step) {
  absl::MutexLock lock(&mu_);
  Entry* found = Find(job_id);
  if (found == nullptr) return;
  Entry& e = *found;
  // A step recorded again (the job was rerun from a checkpoint) replaces its earlier record
  // and every later one: each step counts once.
  DropStepsFrom(e.job, e.history, step.step());
  e.job.set_steps_done(step.step() + 1);
  if (const int64_t since = e.job.recovering_since_unix_ms(); since > 0) {
    const double seconds = std::max<int64_t>(0, NowMs() - since) / 1e3;
    e.job.set_last_recovery_seconds(seconds);
    e.job.set_recovery_seconds_total(e.job.recovery_seconds_total() + seconds);
    e.job.set_recovering_since_unix_ms(0);
  }
  e.job.set_last_loss(step.loss());
  if (step.skipped()) e.job.set_skipped_steps(e.job.skipped_steps() + 1);
  if (step.has_val_loss()) {
    e.job.set_has_val_loss(true);
    e.job.set_last_val_loss(step.val_loss());
  }
  // The memory breakdown is constant but for the activations' peak (in stage_peak_bytes): only
  // the latest step keeps it, so that a long history does not carry it per step.
  if (!e.history.empty()) e.history.back().clear_stage_memory();
  e.history.push_back(step);
  bool trimmed = false;
  while (e.history.size() > kMaxHistory) {
    e.history.pop_front();
    trimmed = true;
  }
  v1::JobEvent event;
  event.set_kind(v1::JobEvent::STEP);
  event.set_state(e.job.state());
  *event.mutable_step() = step;
  Append(e, std::move(event));
  if (db_ == nullptr) return;
  ++e.steps_since_timings_write;
  const std::string purpose = absl::StrCat(job_id, ": recording step ", StepNumber(step.step()));
  const int64_t oldest = e.history.front().step();
  (void)Persist(
      e, /*durable=*/false, purpose, TimingsWrite::kIfDue,
      [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::Status {
        // (Nothing to delete but on a rerun; an index probe otherwise.)
        RETURN_IF_ERROR(DeleteStepRows(e.seq, step.step(), purpose));
        if (trimmed) {
          ASSIGN_OR_RETURN(
              SqliteStatement * st,
              db_->Prepare("DELETE FROM steps WHERE job_seq = ?1 AND step < ?2", purpose));
          RETURN_IF_ERROR(st->Bind(1, e.seq).Bind(2, oldest).Run());
        }
        ASSIGN_OR_RETURN(SqliteStatement * st,
                         db_->Prepare("INSERT OR REPLACE INTO steps (job_seq, step, loss, summary) "
                                      "VALUES (?1, ?2, ?3, ?4)",
                                      purpose));
        return st->Bind(1, e.seq)
            .Bind(2, step.step())
            .Bind(3, step.loss())
            .BindBlob(4, step.SerializeAsString())
            .Run();
      });
}

absl::Status JobStore::DeleteStepRows(int64_t seq, int64_t from, const std::string& purpose) {
  ASSIGN_OR_RETURN(SqliteStatement * del,
                   db_->Prepare("DELETE FROM steps WHERE job_seq = ?1 AND step >= ?2", purpose));
  return del->Bind(1, seq).Bind(2, from).Run();
}

int64_t JobStore::RecordRestart(const std::string& job_id, const std::string& cause,
                                absl::Time not_before, int in_a_row, const v1::PeerState* peers) {
  absl::MutexLock lock(&mu_);
  Entry* e = Find(job_id);
  if (e == nullptr) return -1;
  e->job.set_restarts(e->job.restarts() + 1);
  e->job.set_restarts_in_a_row(in_a_row);
  // A fault in the middle of a recovery keeps the first fault's start.
  if (e->job.recovering_since_unix_ms() == 0) e->job.set_recovering_since_unix_ms(NowMs());
  if (e->job.first_failure().empty()) e->job.set_first_failure(cause);
  e->job.set_not_before_unix_ms(not_before > absl::UnixEpoch() ? absl::ToUnixMillis(not_before)
                                                               : 0);
  // The next run starts after the checkpoint (or the survivors' state): what was recorded
  // after it runs again.
  if (peers != nullptr) {
    *e->job.mutable_peer_state() = *peers;
  } else {
    e->job.clear_peer_state();
  }
  const int64_t resume = peers != nullptr                ? peers->step() + 1
                         : e->job.checkpoint_step() >= 0 ? e->job.checkpoint_step() + 1
                                                         : e->job.first_step();
  const int64_t redone = std::max<int64_t>(0, e->job.steps_done() - resume);
  e->job.set_steps_redone(e->job.steps_redone() + redone);
  e->job.set_last_steps_redone(redone);
  DropStepsFrom(e->job, e->history, resume);
  e->job.set_steps_done(resume);
  const std::string purpose = absl::StrCat(job_id, ": recording restart ", e->job.restarts());
  (void)Persist(*e, /*durable=*/true, purpose, TimingsWrite::kIfDirty,
                [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::Status {
                  if (db_ == nullptr) return absl::OkStatus();
                  return DeleteStepRows(e->seq, resume, purpose);
                });
  return peers != nullptr ? peers->step() : e->job.checkpoint_step();
}

void JobStore::RecordPeerRecovery(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  Entry* e = Find(job_id);
  if (e == nullptr) return;
  e->job.set_peer_recoveries(e->job.peer_recoveries() + 1);
  e->job.clear_peer_state();
  (void)Persist(*e, /*durable=*/true, absl::StrCat(job_id, ": recording a peer recovery"));
}

void JobStore::RecordResize(const std::string& job_id, const v1::PipelineSpec& pipeline,
                            v1::ResizeEvent event) {
  absl::MutexLock lock(&mu_);
  Entry* e = Find(job_id);
  if (e == nullptr) return;
  *e->job.mutable_spec()->mutable_pipeline() = pipeline;
  e->job.set_effective_batch(EffectiveBatch(e->job.spec()));
  e->job.set_tokens_per_step(TokensPerStep(e->job.spec()));
  e->job.set_bubble_fraction_ideal(PredictedBubble(e->job.spec()));
  event.set_unix_ms(NowMs());
  event.set_checkpoint_step(e->job.checkpoint_step());
  event.set_steps_redone(e->job.last_steps_redone());
  const v1::PeerState& peers = e->job.peer_state();
  if (peers.holders_size() > 0 && peers.step() >= e->job.checkpoint_step()) {
    event.set_state_source(absl::StrCat("kept state after step ", StepNumber(peers.step())));
  } else if (e->job.checkpoint_step() >= 0) {
    event.set_state_source(
        absl::StrCat("checkpoint after step ", StepNumber(e->job.checkpoint_step())));
  } else {
    event.set_state_source("the start");
  }
  *e->job.add_resizes() = std::move(event);
  (void)Persist(*e, /*durable=*/true, absl::StrCat(job_id, ": recording a resize"));
}

absl::Status JobStore::RequeueToGrow(const std::string& job_id, const std::string& reason,
                                     const v1::PeerState* peers) {
  {
    absl::MutexLock lock(&mu_);
    Entry* e = Find(job_id);
    if (e == nullptr) return absl::NotFoundError(absl::StrCat("no job ", job_id));
    e->job.set_last_steps_redone(0);
    if (peers != nullptr) {
      *e->job.mutable_peer_state() = *peers;
    } else {
      e->job.clear_peer_state();
    }
  }
  return Transition(job_id, v1::QUEUED, reason);
}

void JobStore::SetCheckpoint(const std::string& job_id, int64_t step) {
  absl::MutexLock lock(&mu_);
  Entry* e = Find(job_id);
  if (e == nullptr) return;
  e->job.set_checkpoint_step(step);
  const int num_stages = NumRanks(e->job);
  const std::string purpose =
      absl::StrCat(job_id, ": recording the checkpoint after step ", StepNumber(step));
  (void)Persist(*e, /*durable=*/true, purpose, TimingsWrite::kIfDirty,
                [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                  return PutCheckpoint(*e, step, num_stages, purpose);
                });
}

void JobStore::RecordCheckpointFailure(const std::string& job_id, const std::string& cause) {
  absl::MutexLock lock(&mu_);
  Entry* e = Find(job_id);
  if (e == nullptr) return;
  e->job.set_checkpoint_failures(e->job.checkpoint_failures() + 1);
  e->job.set_last_checkpoint_failure(cause);
  v1::JobEvent event;
  event.set_kind(v1::JobEvent::WARNING);
  event.set_state(e->job.state());
  event.set_reason(cause);
  Append(*e, std::move(event));
  // Not durable: the disk that refused the checkpoint may refuse this too, and the count is
  // advice, not state a restart needs.
  (void)Persist(*e, /*durable=*/false, absl::StrCat(job_id, ": recording a checkpoint failure"));
}

void JobStore::SetFirstStep(const std::string& job_id, int64_t step) {
  absl::MutexLock lock(&mu_);
  Entry* e = Find(job_id);
  if (e == nullptr) return;
  e->job.set_first_step(step);
  e->job.set_steps_done(step);
  (void)Persist(*e, /*durable=*/false, absl::StrCat(job_id, ": recording its first step"));
}

void JobStore::SetPlan(const std::string& job_id, const v1::PipelineSpec& pipeline,
                       const std::string& note) {
  absl::MutexLock lock(&mu_);
  Entry* e = Find(job_id);
  if (e == nullptr) return;
  *e->job.mutable_spec()->mutable_pipeline() = pipeline;
  e->job.set_plan(note);
  e->job.set_effective_batch(EffectiveBatch(e->job.spec()));
  e->job.set_tokens_per_step(TokensPerStep(e->job.spec()));
  e->job.set_bubble_fraction_ideal(PredictedBubble(e->job.spec()));
  (void)Persist(*e, /*durable=*/false, absl::StrCat(job_id, ": recording its plan"));
}

void JobStore::SetPredictedStep(const std::string& job_id, double step_seconds,
                                double update_seconds) {
  absl::MutexLock lock(&mu_);
  Entry* e = Find(job_id);
  if (e == nullptr) return;
  e->job.set_predicted_step_seconds(step_seconds);
  e->job.set_predicted_update_seconds(update_seconds);
  (void)Persist(*e, /*durable=*/false, absl::StrCat(job_id, ": recording its predicted step"));
}

void JobStore::SetProfileSpeedRatio(const std::string& job_id, double ratio) {
  absl::MutexLock lock(&mu_);
  Entry* e = Find(job_id);
  if (e == nullptr) return;
  e->job.set_profile_speed_ratio(ratio);
  (void)Persist(*e, /*durable=*/false, absl::StrCat(job_id, ": recording its profile's speed"));
}

void JobStore::SetTraceProgram(const std::string& job_id, const v1::TraceProgram& program) {
  absl::MutexLock lock(&mu_);
  Entry* e = Find(job_id);
  if (e == nullptr) return;
  e->timings.set_job_id(job_id);
  *e->timings.mutable_program() = program;
  e->timings_dirty = true;
}

void JobStore::RecordStepTimings(const std::string& job_id, v1::StepTimings step) {
  absl::MutexLock lock(&mu_);
  Entry* e = Find(job_id);
  if (e == nullptr) return;
  e->timings.set_job_id(job_id);
  KeepStepTimings(&e->timings, std::move(step), retention_);
  e->timings_dirty = true;
}

absl::StatusOr<v1::JobTimings> JobStore::GetTimings(const std::string& job_id,
                                                    TimingSteps steps) const {
  absl::MutexLock lock(&mu_);
  const Entry* e = Find(job_id);
  if (e == nullptr) return absl::NotFoundError(absl::StrCat("no job '", job_id, "'"));
  if (steps == TimingSteps::kAll) return e->timings;
  v1::JobTimings out;
  out.set_job_id(e->timings.job_id());
  *out.mutable_program() = e->timings.program();
  out.set_sample_stride(e->timings.sample_stride());
  *out.mutable_rank_bytes_sent() = e->timings.rank_bytes_sent();
  *out.mutable_rank_bytes_received() = e->timings.rank_bytes_received();
  if (steps == TimingSteps::kLatest && !e->timings.steps().empty()) {
    *out.add_steps() = *e->timings.steps().rbegin();
  }
  return out;
}

absl::StatusOr<std::vector<v1::StepSummary>> JobStore::StepsAfter(const std::string& job_id,
                                                                  int64_t after_step) const {
  absl::MutexLock lock(&mu_);
  const Entry* e = Find(job_id);
  if (e == nullptr) return absl::NotFoundError(absl::StrCat("no job '", job_id, "'"));
  const auto& history = e->history;
  const size_t first = FirstAfter(history, after_step);
  return std::vector<v1::StepSummary>(history.begin() + static_cast<ptrdiff_t>(first),
                                      history.end());
}

absl::StatusOr<JobStore::Events> JobStore::WaitEvents(const std::string& job_id, int64_t cursor,
                                                      absl::Duration timeout) const {
  int64_t n = 0;
  if (!ParseJobId(job_id, &n)) return absl::NotFoundError(absl::StrCat("no job '", job_id, "'"));
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(n);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job '", job_id, "'"));
  const Entry& e = it->second;
  const absl::Time deadline = absl::Now() + timeout;
  while (e.first_event + static_cast<int64_t>(e.events.size()) <= cursor) {
    if (events_cv_.WaitWithDeadline(&mu_, deadline)) break;  // timed out
  }
  Events out;
  int64_t from = std::max(cursor, e.first_event);
  const int64_t end = e.first_event + static_cast<int64_t>(e.events.size());
  for (int64_t i = from; i < end; ++i) out.events.push_back(e.events[i - e.first_event]);
  out.cursor = end;
  out.ended = IsTerminal(e.job.state());
  return out;
}

}  // namespace tandem::coordinator
