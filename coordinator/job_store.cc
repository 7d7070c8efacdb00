#include "coordinator/job_store.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/pipeline_plan.h"
#include "common/schedule.h"
#include "common/spec.h"
#include "google/protobuf/util/json_util.h"
#include "spdlog/spdlog.h"

namespace tandem::coordinator {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kPersistEverySteps = 25;
constexpr size_t kMaxEvents = 20000;

int64_t NowMs() { return UnixMicros() / 1000; }

// Writes `message` as JSON to `path` through a temporary file, so that a crash leaves the old
// file or the new one, never half of one.
void WriteJson(const google::protobuf::Message& message, const fs::path& path) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  if (!google::protobuf::util::MessageToJsonString(message, &json, options).ok()) return;
  const fs::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << json;
    if (!out) {
      spdlog::error("job store: cannot write {}", tmp.string());
      return;
    }
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) spdlog::error("job store: cannot rename {}: {}", tmp.string(), ec.message());
}

std::string ReadText(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

bool ParseJobId(const std::string& id, int64_t* n) {
  return id.size() > 4 && id.rfind("job-", 0) == 0 && absl::SimpleAtoi(id.substr(4), n);
}

}  // namespace

bool IsTerminal(v1::JobState state) {
  return state == v1::SUCCEEDED || state == v1::FAILED || state == v1::CANCELLED;
}

absl::StatusOr<std::unique_ptr<JobStore>> JobStore::Open(const std::string& data_root,
                                                         const TimingRetention& retention) {
  std::unique_ptr<JobStore> store(new JobStore(data_root, retention));
  if (!data_root.empty()) {
    for (const char* dir : {"jobs", "timings"}) {
      std::error_code ec;
      fs::create_directories(fs::path(data_root) / dir, ec);
      if (ec) {
        return absl::FailedPreconditionError(
            absl::StrCat("cannot create ", data_root, "/", dir, ": ", ec.message()));
      }
    }
    absl::MutexLock lock(&store->mu_);
    if (absl::Status s = store->Load(); !s.ok()) return s;
  }
  return store;
}

absl::Status JobStore::Load() {
  for (const auto& file : fs::directory_iterator(fs::path(data_root_) / "jobs")) {
    if (file.path().extension() != ".json") continue;
    v1::Job job;
    if (auto s = google::protobuf::util::JsonStringToMessage(ReadText(file.path()), &job);
        !s.ok()) {
      spdlog::warn("job store: skipping unreadable {}: {}", file.path().string(), s.ToString());
      continue;
    }
    int64_t n = 0;
    if (!ParseJobId(job.id(), &n)) {
      spdlog::warn("job store: skipping {}: bad job id '{}'", file.path().string(), job.id());
      continue;
    }
    Entry& e = jobs_[n];
    e.job = std::move(job);
    const fs::path timings = fs::path(data_root_) / "timings" / (e.job.id() + ".json");
    if (fs::exists(timings)) {
      if (auto s = google::protobuf::util::JsonStringToMessage(ReadText(timings), &e.timings);
          !s.ok()) {
        spdlog::warn("job store: {}: dropping unreadable step timings {}: {}", e.job.id(),
                     timings.string(), s.ToString());
        e.timings.Clear();
      }
    }
    if (e.job.state() == v1::RUNNING) {
      e.job.set_state(v1::FAILED);
      e.job.set_reason("interrupted: the coordinator restarted while the job was running");
      e.job.set_finished_unix_ms(NowMs());
      Persist(e);
    }
    next_id_ = std::max(next_id_, n + 1);
  }
  spdlog::info("job store: {} job(s) loaded from {}", jobs_.size(), data_root_);
  return absl::OkStatus();
}

void JobStore::Persist(Entry& e) {
  if (data_root_.empty()) return;
  WriteJson(e.job, fs::path(data_root_) / "jobs" / (e.job.id() + ".json"));
  if (e.timings_dirty) {
    WriteJson(e.timings, fs::path(data_root_) / "timings" / (e.job.id() + ".json"));
    e.timings_dirty = false;
  }
}

void JobStore::Append(Entry& e, v1::JobEvent event) {
  event.set_job_id(e.job.id());
  event.set_total_steps(e.job.total_steps());
  e.events.push_back(std::move(event));
  while (e.events.size() > kMaxEvents) {
    e.events.pop_front();
    ++e.first_event;
  }
}

absl::StatusOr<std::string> JobStore::Add(const v1::JobSpec& spec) {
  absl::MutexLock lock(&mu_);
  const int64_t n = next_id_++;
  Entry& e = jobs_[n];
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
  v1::JobEvent event;
  event.set_kind(v1::JobEvent::STATE);
  event.set_state(v1::QUEUED);
  event.set_reason(job.reason());
  Append(e, std::move(event));
  Persist(e);
  return job.id();
}

JobStore::Entry* JobStore::Find(const std::string& job_id) {
  return const_cast<Entry*>(static_cast<const JobStore*>(this)->Find(job_id));
}

const JobStore::Entry* JobStore::Find(const std::string& job_id) const {
  int64_t n = 0;
  auto it = ParseJobId(job_id, &n) ? jobs_.find(n) : jobs_.end();
  return it == jobs_.end() ? nullptr : &it->second;
}

absl::StatusOr<v1::Job> JobStore::Get(const std::string& job_id, bool with_history) const {
  absl::MutexLock lock(&mu_);
  const Entry* e = Find(job_id);
  if (e == nullptr) return absl::NotFoundError(absl::StrCat("no job '", job_id, "'"));
  v1::Job job = e->job;
  if (!with_history) job.clear_history();
  return job;
}

std::vector<v1::Job> JobStore::List() const {
  absl::MutexLock lock(&mu_);
  std::vector<v1::Job> out;
  for (const auto& [n, e] : jobs_) {
    out.push_back(e.job);
    out.back().clear_history();
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
  e.job.set_state(state);
  e.job.set_reason(reason);
  if (state == v1::RUNNING) e.job.set_started_unix_ms(NowMs());
  if (IsTerminal(state)) e.job.set_finished_unix_ms(NowMs());
  v1::JobEvent event;
  event.set_kind(v1::JobEvent::STATE);
  event.set_state(state);
  event.set_reason(reason);
  Append(e, std::move(event));
  Persist(e);
  return absl::OkStatus();
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
  Persist(*e);
}

namespace {

// Drops the history records of steps at or after `from` (a rerun supersedes them) and brings
// the job's progress figures back to what the rest says.
void RollBackTo(v1::Job& job, int64_t from) {
  auto* history = job.mutable_history();
  int keep = history->size();
  while (keep > 0 && history->Get(keep - 1).step() >= from) --keep;
  if (keep == history->size()) return;
  for (int i = keep; i < history->size(); ++i) {
    if (history->Get(i).skipped()) job.set_skipped_steps(job.skipped_steps() - 1);
  }
  history->DeleteSubrange(keep, history->size() - keep);
  job.set_steps_done(std::max<int64_t>(job.first_step(), from));
  job.set_last_loss(keep > 0 ? history->Get(keep - 1).loss() : 0.0);
  job.set_has_val_loss(false);
  job.set_last_val_loss(0.0);
  for (int i = keep - 1; i >= 0; --i) {
    if (history->Get(i).has_val_loss()) {
      job.set_has_val_loss(true);
      job.set_last_val_loss(history->Get(i).val_loss());
      break;
    }
  }
}

}  // namespace

void JobStore::RecordStep(const std::string& job_id, const v1::StepSummary& step) {
  absl::MutexLock lock(&mu_);
  Entry* found = Find(job_id);
  if (found == nullptr) return;
  Entry& e = *found;
  RollBackTo(e.job, step.step());  // a step run again replaces its record and later ones
  e.job.set_steps_done(step.step() + 1);
  e.job.set_last_loss(step.loss());
  if (step.skipped()) e.job.set_skipped_steps(e.job.skipped_steps() + 1);
  if (step.has_val_loss()) {
    e.job.set_has_val_loss(true);
    e.job.set_last_val_loss(step.val_loss());
  }
  auto* history = e.job.mutable_history();
  *history->Add() = step;
  if (static_cast<size_t>(history->size()) > kMaxHistory) {
    history->DeleteSubrange(0, history->size() - static_cast<int>(kMaxHistory));
  }
  v1::JobEvent event;
  event.set_kind(v1::JobEvent::STEP);
  event.set_state(e.job.state());
  *event.mutable_step() = step;
  Append(e, std::move(event));
  if (++e.steps_since_persist >= kPersistEverySteps) {
    e.steps_since_persist = 0;
    Persist(e);
  }
}

void JobStore::RecordRestart(const std::string& job_id, const std::string& cause) {
  absl::MutexLock lock(&mu_);
  Entry* e = Find(job_id);
  if (e == nullptr) return;
  e->job.set_restarts(e->job.restarts() + 1);
  if (e->job.first_failure().empty()) e->job.set_first_failure(cause);
  RollBackTo(e->job, e->job.checkpoint_step() + 1);
  Persist(*e);
}

void JobStore::SetCheckpoint(const std::string& job_id, int64_t step) {
  absl::MutexLock lock(&mu_);
  Entry* e = Find(job_id);
  if (e == nullptr) return;
  e->job.set_checkpoint_step(step);
  Persist(*e);
}

void JobStore::SetFirstStep(const std::string& job_id, int64_t step) {
  absl::MutexLock lock(&mu_);
  Entry* e = Find(job_id);
  if (e == nullptr) return;
  e->job.set_first_step(step);
  e->job.set_steps_done(step);
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
  Persist(*e);
}

void JobStore::SetPredictedStep(const std::string& job_id, double seconds) {
  absl::MutexLock lock(&mu_);
  Entry* e = Find(job_id);
  if (e == nullptr) return;
  e->job.set_predicted_step_seconds(seconds);
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
  const auto& history = e->job.history();
  int first = history.size();
  while (first > 0 && history.Get(first - 1).step() > after_step) --first;
  return std::vector<v1::StepSummary>(history.begin() + first, history.end());
}

absl::StatusOr<JobStore::Events> JobStore::WaitEvents(const std::string& job_id, int64_t cursor,
                                                      absl::Duration timeout) const {
  int64_t n = 0;
  if (!ParseJobId(job_id, &n)) return absl::NotFoundError(absl::StrCat("no job '", job_id, "'"));
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(n);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job '", job_id, "'"));
  const Entry& e = it->second;
  auto has_new = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return e.first_event + static_cast<int64_t>(e.events.size()) > cursor;
  };
  mu_.AwaitWithTimeout(absl::Condition(&has_new), timeout);
  Events out;
  int64_t from = std::max(cursor, e.first_event);
  const int64_t end = e.first_event + static_cast<int64_t>(e.events.size());
  for (int64_t i = from; i < end; ++i) out.events.push_back(e.events[i - e.first_event]);
  out.cursor = end;
  out.ended = IsTerminal(e.job.state());
  return out;
}

}  // namespace tandem::coordinator
