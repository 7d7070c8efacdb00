// JobStore's recovery on Open: the one-time import of the JSON files of earlier versions, and
// the reconciliation of every job with the checkpoints on disk after a restart (interrupted
// jobs go back to the queue at their latest complete checkpoint).
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/step_number.h"
#include "coordinator/checkpoint_store.h"
#include "coordinator/job_store.h"
#include "coordinator/job_store_internal.h"
#include "google/protobuf/util/json_util.h"
#include "spdlog/spdlog.h"

namespace tandem::coordinator {
namespace {

namespace fs = std::filesystem;
using Sync = SqliteDb::Sync;
using job_store_internal::DropStepsFrom;
using job_store_internal::NowMs;
using job_store_internal::NumRanks;
using job_store_internal::ParseJobId;

std::string ReadText(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

// Earlier versions kept <data_root>/jobs/<id>.json (history included) and
// <data_root>/timings/<id>.json. A database that has not imported them yet (a new one) takes
// them over once, in one transaction; the files are left as they were and no longer read.
absl::Status JobStore::ImportJsonFiles() {
  ASSIGN_OR_RETURN(
      SqliteStatement * q,
      db_->Prepare("SELECT value FROM meta WHERE key = 'json_import'", "reading meta"));
  ASSIGN_OR_RETURN(bool done, q->Next());
  RETURN_IF_ERROR(q->Run());
  if (done) return absl::OkStatus();

  const std::string purpose = "importing the jobs/*.json files";
  ASSIGN_OR_RETURN(SqliteDb::Transaction txn, db_->Begin(Sync::kFull, purpose));
  const fs::path dir = fs::path(data_root_) / "jobs";
  int imported = 0;
  std::error_code ec;
  for (const auto& file : fs::directory_iterator(dir, ec)) {
    if (file.path().extension() != ".json") continue;
    Entry e;
    if (auto s = google::protobuf::util::JsonStringToMessage(ReadText(file.path()), &e.job);
        !s.ok()) {
      spdlog::warn("job store: import: skipping unreadable {}: {}", file.path().string(),
                   s.ToString());
      continue;
    }
    if (!ParseJobId(e.job.id(), &e.seq)) {
      spdlog::warn("job store: import: skipping {}: bad job id '{}'", file.path().string(),
                   e.job.id());
      continue;
    }
    for (auto& step : *e.job.mutable_history()) e.history.push_back(std::move(step));
    e.job.clear_history();
    const fs::path timings = fs::path(data_root_) / "timings" / (e.job.id() + ".json");
    if (fs::exists(timings) &&
        !google::protobuf::util::JsonStringToMessage(ReadText(timings), &e.timings).ok()) {
      spdlog::warn("job store: import: {}: dropping unreadable step timings {}", e.job.id(),
                   timings.string());
      e.timings.Clear();
    }
    RETURN_IF_ERROR(PutJob(e, purpose));
    for (const v1::StepSummary& step : e.history) {
      ASSIGN_OR_RETURN(
          SqliteStatement * st,
          db_->Prepare(
              "INSERT OR REPLACE INTO steps (job_seq, step, loss, summary) VALUES (?1, ?2, ?3, ?4)",
              purpose));
      RETURN_IF_ERROR(st->Bind(1, e.seq)
                          .Bind(2, step.step())
                          .Bind(3, step.loss())
                          .BindBlob(4, step.SerializeAsString())
                          .Run());
    }
    if (e.timings.ByteSizeLong() > 0) RETURN_IF_ERROR(PutTimings(e, purpose));
    if (e.job.checkpoint_step() >= 0) {
      RETURN_IF_ERROR(PutCheckpoint(e, e.job.checkpoint_step(), NumRanks(e.job), purpose));
    }
    ++imported;
  }
  ASSIGN_OR_RETURN(
      SqliteStatement * st,
      db_->Prepare("INSERT OR REPLACE INTO meta (key, value) VALUES ('json_import', ?1)", purpose));
  RETURN_IF_ERROR(st->BindText(1, absl::StrCat(imported, " job(s) at unix ms ", NowMs())).Run());
  RETURN_IF_ERROR(txn.Commit());
  if (imported > 0) {
    spdlog::info("job store: imported {} job(s) from {}/*.json (the files are no longer used)",
                 imported, dir.string());
  }
  return absl::OkStatus();
}

absl::Status JobStore::Recover(const CheckpointStore& checkpoints) {
  std::map<int64_t, std::set<int64_t>> recorded;  // job seq -> checkpoint steps in the database
  {
    ASSIGN_OR_RETURN(SqliteStatement * q, db_->Prepare("SELECT job_seq, step FROM checkpoints",
                                                       "loading checkpoint records"));
    RETURN_IF_ERROR(q->ForEachRow(
        [&](const SqliteStatement& r) { recorded[r.ColumnInt(0)].insert(r.ColumnInt(1)); }));
  }
  const std::string purpose = "recovering jobs after a restart";
  ASSIGN_OR_RETURN(SqliteDb::Transaction txn, db_->Begin(Sync::kFull, purpose));
  {
    ASSIGN_OR_RETURN(
        SqliteStatement * st,
        db_->Prepare(
            "INSERT INTO meta (key, value) VALUES ('incarnation', '1') ON CONFLICT (key) DO UPDATE "
            "SET value = CAST(value AS INTEGER) + 1 RETURNING CAST(value AS INTEGER)",
            "counting the coordinator's starts"));
    ASSIGN_OR_RETURN(bool row, st->Next());
    incarnation_ = row ? st->ColumnInt(0) : 0;
    RETURN_IF_ERROR(st->Run());
  }
  for (auto& [seq, e] : jobs_) {
    v1::Job& job = e.job;
    bool changed = false;
    // The checkpoint to resume from: the latest complete one (its manifest on disk) whose
    // step the job had recorded. A record whose manifest is gone is ignored; a manifest
    // committed just before a crash took the record with it is adopted.
    const std::vector<int64_t> complete = checkpoints.CompleteSteps(job.id());
    int64_t latest = -1;
    for (int64_t step : complete) {
      if (step < job.steps_done()) latest = std::max(latest, step);
    }
    for (int64_t step : complete) {
      if (step <= latest && !recorded[seq].count(step)) {
        RETURN_IF_ERROR(PutCheckpoint(e, step, NumRanks(job), purpose));
      }
    }
    if (latest != job.checkpoint_step()) {
      if (latest > job.checkpoint_step()) {
        spdlog::warn(
            "job store: {}: adopting the checkpoint after step {}: its manifest was "
            "committed but its record was not written (the last recorded was {})",
            job.id(), StepNumber(latest),
            job.checkpoint_step() >= 0
                ? absl::StrCat("after step ", StepNumber(job.checkpoint_step()))
                : "none");
      } else {
        spdlog::warn(
            "job store: {}: ignoring the checkpoint after step {}: its manifest is "
            "missing; using {}",
            job.id(), StepNumber(job.checkpoint_step()),
            latest >= 0 ? absl::StrCat("the one after step ", StepNumber(latest)) : "none");
      }
      job.set_checkpoint_step(latest);
      changed = true;
    }
    // An unfinished job runs again from the step after its checkpoint: the steps recorded
    // after it are dropped, to be recorded again when they are rerun.
    const int64_t resume = latest >= 0 ? latest + 1 : job.first_step();
    if (!IsTerminal(job.state()) &&
        (job.steps_done() != resume || (!e.history.empty() && e.history.back().step() >= resume))) {
      DropStepsFrom(job, e.history, resume);
      RETURN_IF_ERROR(DeleteStepRows(seq, resume, purpose));
      job.set_steps_done(resume);
      changed = true;
    }
    if (!IsTerminal(job.state()) && job.state() != v1::QUEUED) {
      // Interrupted: back to the queue, ahead of the jobs submitted after it.
      job.set_state(v1::QUEUED);
      job.set_reason(latest >= 0 ? absl::StrCat("coordinator restarted; resumes from the "
                                                "checkpoint after step ",
                                                StepNumber(latest))
                                 : "coordinator restarted; runs again from the start (no "
                                   "checkpoint)");
      job.clear_stages();
      spdlog::info("job store: {} was interrupted by the restart: {}", job.id(), job.reason());
      changed = true;
    }
    if (changed) RETURN_IF_ERROR(PutJob(e, purpose));
    v1::JobEvent event;
    event.set_kind(v1::JobEvent::STATE);
    event.set_state(job.state());
    event.set_reason(job.reason());
    Append(e, std::move(event));
  }
  return txn.Commit();
}

}  // namespace tandem::coordinator
