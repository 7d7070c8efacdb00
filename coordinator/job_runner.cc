#include "coordinator/job_runner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <future>
#include <map>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/clock.h"
#include "common/confined_path.h"
#include "common/log_context.h"
#include "common/model_desc.h"
#include "common/partitioner.h"
#include "common/planner.h"
#include "common/schedule_check.h"
#include "common/spec.h"
#include "common/step_number.h"
#include "common/step_profile.h"
#include "common/trace.h"
#include "coordinator/hf_export.h"
#include "coordinator/model_profiler.h"
#include "coordinator/step_timings.h"
#include "spdlog/spdlog.h"

namespace tandem::coordinator {

float LearningRateAt(const v1::OptimizerSpec& opt, int64_t step, int64_t total_steps) {
  const int64_t warmup = opt.warmup_steps();
  if (warmup > 0 && step < warmup) {
    return opt.lr() * static_cast<float>(step + 1) / static_cast<float>(warmup);
  }
  if (opt.lr_schedule() != "cosine") return opt.lr();
  // Cosine from lr (first step after warm-up) to lr * min_lr_ratio (last step).
  const int64_t span = total_steps - 1 - warmup;
  const double t =
      span <= 0 ? 1.0 : std::clamp(static_cast<double>(step - warmup) / span, 0.0, 1.0);
  const double lo = opt.lr() * static_cast<double>(opt.min_lr_ratio());
  return static_cast<float>(lo + 0.5 * (1.0 + std::cos(M_PI * t)) * (opt.lr() - lo));
}

bool CheckpointDue(const v1::JobSpec& spec, int64_t step) {
  const int every = spec.checkpoint().every();
  return step + 1 == spec.steps() || (every > 0 && (step + 1) % every == 0);
}

bool EvalDue(const v1::JobSpec& spec, int64_t step) {
  const int every = spec.eval().every();
  return every > 0 && ((step + 1) % every == 0 || step + 1 == spec.steps());
}

JobRunner::JobRunner(RunnerEnv env, v1::Job job, std::vector<WorkerRecord> workers)
    : env_(env),
      job_(std::move(job)),
      spec_(job_.spec()),
      workers_(std::move(workers)),
      attempt_(job_.restarts()) {
  for (const auto& w : workers_) clients_.push_back(env_.clients->Connect(w.address));
}

JobRunner::~JobRunner() {
  if (thread_.joinable()) thread_.join();
}

void JobRunner::Start() {
  thread_ = std::thread([this] { Run(); });
}

void JobRunner::Cancel(const std::string& reason) {
  absl::MutexLock lock(&mu_);
  if (interrupt_ != Interrupt::kNone) return;
  interrupt_ = Interrupt::kCancel;
  interrupt_reason_ = reason;
}

void JobRunner::Shutdown(const std::string& reason) {
  absl::MutexLock lock(&mu_);
  if (interrupt_ != Interrupt::kNone) return;
  interrupt_ = Interrupt::kShutdown;
  interrupt_reason_ = reason;
}

bool JobRunner::InterruptIs(Interrupt kind) {
  absl::MutexLock lock(&mu_);
  return interrupt_ == kind;
}

bool JobRunner::RankLost(int rank) {
  absl::MutexLock lock(&mu_);
  return lost_ranks_.count(rank) > 0;
}

void JobRunner::OnWorkerLost(const WorkerRecord& worker) {
  const double age = std::chrono::duration<double>(Clock::now() - worker.last_heartbeat).count();
  absl::MutexLock lock(&mu_);
  if (interrupt_ != Interrupt::kNone) return;
  interrupt_ = Interrupt::kWorkerLost;
  for (size_t r = 0; r < workers_.size(); ++r) {
    if (workers_[r].id == worker.id) lost_ranks_.insert(static_cast<int>(r));
  }
  interrupt_reason_ =
      absl::StrCat("worker ", worker.id, " (", worker.address, ", stage ", worker.stage,
                   ") was lost: no heartbeat for ", absl::StrFormat("%.1f", age), " s");
}

std::string JobRunner::WorkerName(int rank) const {
  const std::string worker =
      absl::StrCat("worker ", workers_[rank].id, " at ", workers_[rank].address);
  const std::vector<int> stages = plan_.schedule.placement.StagesOf(rank);
  if (stages.size() == 1) return absl::StrCat("stage ", stages[0], " (", worker, ")");
  return absl::StrCat("rank ", rank, " (stages ", absl::StrJoin(stages, ", "), "; ", worker, ")");
}

int JobRunner::LastStageRank() const { return plan_.schedule.placement.rank_of_stage.back(); }

absl::Status JobRunner::InterruptStatus() {
  absl::MutexLock lock(&mu_);
  switch (interrupt_) {
    case Interrupt::kNone:
      return absl::OkStatus();
    case Interrupt::kCancel:
      return absl::CancelledError(interrupt_reason_);
    case Interrupt::kWorkerLost:
      return absl::UnavailableError(interrupt_reason_);
    case Interrupt::kShutdown:
      return absl::UnavailableError(interrupt_reason_);
  }
  return absl::OkStatus();
}

absl::Duration RestartBackoff(const RunnerOptions& options, int restarts) {
  if (restarts <= 0 || options.restart_backoff <= absl::ZeroDuration()) {
    return absl::ZeroDuration();
  }
  absl::Duration wait = options.restart_backoff;
  for (int i = 1; i < restarts && wait < options.restart_backoff_max; ++i) wait *= 2;
  return std::min(wait, options.restart_backoff_max);
}

absl::Duration JobRunner::StepDeadline() const {
  if (slowest_step_seconds_ <= 0) return env_.options.step_timeout;
  const absl::Duration derived = absl::Seconds(kStepDeadlineFactor * slowest_step_seconds_);
  return std::min(env_.options.step_timeout, std::max(env_.options.step_deadline_floor, derived));
}

void JobRunner::Run() {
  const std::string& id = job_.id();
  ScopedLogContext log_context({.job = id});
  absl::Status status = Plan();
  // Only a fault after planning (configure, a step, a checkpoint, a lost worker) is worth a
  // restart; a plan that fails fails the same way again.
  const bool planned = status.ok();
  if (status.ok()) status = env_.store->Transition(id, v1::RUNNING, "");
  if (status.ok()) status = ConfigureAll();
  for (int64_t step = first_step_; status.ok() && step < spec_.steps(); ++step) {
    status = InterruptStatus();
    if (status.ok()) status = RunOneStep(step);
    if (status.ok() && CheckpointDue(spec_, step) && env_.checkpoints != nullptr &&
        env_.checkpoints->enabled()) {
      status = SaveCheckpoint(step);
    }
  }
  // Every ending releases the workers' stages; on failure this also unblocks any transfer.
  AbortAll(status.ok() ? "job finished" : std::string(status.message()));
  env_.registry->Release(id);
  if (env_.rendezvous != nullptr) env_.rendezvous->ErasePrefix(absl::StrCat(id, "/"));
  const bool shutting_down = !status.ok() && InterruptIs(Interrupt::kShutdown);
  if (shutting_down) {
    // The job stays RUNNING in the store: the next coordinator on this data root resumes it
    // from its latest checkpoint.
    spdlog::info("{}: left for the next coordinator to resume: {}", id,
                 std::string(status.message()));
  } else if (!status.ok() && status.code() != absl::StatusCode::kCancelled && planned &&
             job_.restarts() < spec_.max_restarts()) {
    const std::string cause = std::string(status.message());
    const int restart = job_.restarts() + 1;
    const int64_t resume = env_.store->RecordRestart(id, cause);
    const std::string reason = absl::StrCat(
        "restart ", restart, " of ", spec_.max_restarts(), " after: ", cause, "; resumes ",
        resume >= 0 ? absl::StrCat("from the checkpoint after step ", StepNumber(resume))
                    : std::string("from the start (no checkpoint yet)"));
    (void)env_.store->Transition(id, v1::QUEUED, reason);
    spdlog::warn("{}: {}", id, reason);
  } else if (status.ok()) {
    (void)env_.store->Transition(id, v1::SUCCEEDED, "");
    spdlog::info("{}: SUCCEEDED after {} steps", id, spec_.steps());
  } else if (status.code() == absl::StatusCode::kCancelled) {
    (void)env_.store->Transition(id, v1::CANCELLED, std::string(status.message()));
    spdlog::info("{}: CANCELLED: {}", id, std::string(status.message()));
  } else {
    std::string reason(status.message());
    if (job_.restarts() > 0) {
      reason = absl::StrCat("failed after ", job_.restarts(),
                            " restart(s); first cause: ", job_.first_failure(), "; last: ", reason);
    }
    (void)env_.store->Transition(id, v1::FAILED, reason);
    spdlog::warn("{}: FAILED: {}", id, reason);
  }
  finished_.store(true);
}

absl::Status JobRunner::Plan() {
  if (spec_.pipeline().plan() == "auto") {
    if (absl::Status s = ChooseAutoPlan(); !s.ok()) return s;
  }
  const v1::JobSpec& spec = spec_;
  std::optional<v1::ModelProfile> profile;
  const std::string key = ProfileKey(spec, DeviceKind(workers_[0].device), workers_[0].threads);
  if (env_.profiles != nullptr) profile = env_.profiles->Find(key);
  if (!profile.has_value() && spec.pipeline().partition() == "profile") {
    absl::StatusOr<v1::ModelProfile> measured = ProfileForJob(spec);
    if (!measured.ok()) return measured.status();
    profile = *std::move(measured);
  }
  absl::StatusOr<PipelinePlan> plan = PlanPipeline(spec, profile.has_value() ? &*profile : nullptr);
  if (!plan.ok()) return plan.status();
  plan_ = *std::move(plan);
  if (plan_.predicted_step_seconds > 0) {
    env_.store->SetPredictedStep(job_.id(), plan_.predicted_step_seconds);
  }
  if (const std::string& hf = spec.init().hf_file(); !hf.empty()) {
    if (env_.checkpoints == nullptr || !env_.checkpoints->enabled() || env_.models_root.empty()) {
      return absl::FailedPreconditionError("init.hf_file: this coordinator keeps no models");
    }
    const std::string import_id = absl::StrCat("import-", job_.id());
    // Confined to the models root on the file system too: no symlink out of it.
    absl::StatusOr<std::string> hf_path = ResolveConfined(env_.models_root, hf, "init.hf_file",
                                                          "the coordinator's <data-root>/models");
    if (!hf_path.ok()) return hf_path.status();
    if (absl::Status s =
            ImportGpt2Safetensors(*hf_path, spec.model(), *env_.checkpoints, import_id);
        !s.ok()) {
      return s;
    }
    restore_.set_job_id(import_id);
    restore_.set_step(0);
    restore_.set_weights_only(true);
    spdlog::info("{}: fine-tuning from {}", job_.id(), hf);
  }
  if (const std::string& from = spec.init().from_job(); !from.empty()) {
    if (env_.checkpoints == nullptr) {
      return absl::FailedPreconditionError("init.from_job: this coordinator keeps no checkpoints");
    }
    absl::StatusOr<int64_t> latest = env_.checkpoints->Latest(from);
    if (!latest.ok())
      return absl::FailedPreconditionError(
          absl::StrCat("init.from_job: ", latest.status().message()));
    restore_.set_job_id(from);
    restore_.set_step(*latest);
    first_step_ = *latest + 1;
    if (first_step_ >= spec.steps()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "init.from_job: the checkpoint of ", from, " is after step ", StepNumber(*latest),
          ", but this job has only ", spec.steps(), " steps; raise steps to continue training"));
    }
    env_.store->SetFirstStep(job_.id(), first_step_);
    spdlog::info("{}: resuming from the checkpoint of {} after step {}", job_.id(), from,
                 StepNumber(*latest));
  }
  // A restart (after a fault, or of a coordinator) continues from the job's own latest
  // complete checkpoint; without one it starts again as the spec says.
  if (job_.checkpoint_step() >= 0 && env_.checkpoints != nullptr && env_.checkpoints->enabled()) {
    absl::StatusOr<int64_t> own = env_.checkpoints->LatestReadable(job_.id());
    if (own.ok()) {
      restore_.set_job_id(job_.id());
      restore_.set_step(*own);
      restore_.set_weights_only(false);
      first_step_ = *own + 1;
      spdlog::info("{}: attempt {} resumes from its checkpoint after step {}", job_.id(), attempt_,
                   StepNumber(*own));
    } else {
      spdlog::warn("{}: its checkpoint after step {} cannot be read ({}); starting again",
                   job_.id(), StepNumber(job_.checkpoint_step()), own.status().ToString());
    }
  }
  // One row per stage: its worker, its layers and its actions in its worker's order.
  std::vector<v1::StageAssignment> stages;
  for (int s = 0; s < plan_.num_stages(); ++s) {
    const int r = plan_.schedule.placement.rank_of_stage[s];
    std::vector<Action> own;
    for (const Action& a : plan_.schedule.program[r]) {
      if (a.stage == s && IsComputeAction(a.kind)) own.push_back(a);
    }
    v1::StageAssignment a;
    a.set_stage(s);
    a.set_rank(r);
    a.set_worker_id(workers_[r].id);
    a.set_address(workers_[r].address);
    a.set_layer_begin(plan_.ranges[s].begin);
    a.set_layer_end(plan_.ranges[s].end);
    a.set_actions(ActionsToString(own));
    if (!plan_.stage_costs.empty()) {
      a.set_predicted_seconds(plan_.stage_costs[s].forward + plan_.stage_costs[s].backward);
      a.set_predicted_bytes(plan_.stage_bytes[s]);
    }
    stages.push_back(std::move(a));
  }
  env_.store->SetStages(job_.id(), stages);
  return absl::OkStatus();
}

absl::Status JobRunner::ChooseAutoPlan() {
  const v1::JobSpec written = spec_;
  // One profile per micro-batch size, kept here too: the spec as written is costed from the
  // one the search already got, even when there is no profile store to cache it.
  std::map<int, absl::StatusOr<v1::ModelProfile>> by_size;
  auto profile_at = [&](const v1::JobSpec& s) -> const absl::StatusOr<v1::ModelProfile>& {
    const int size = s.pipeline().micro_batch_size();
    auto it = by_size.find(size);
    if (it == by_size.end()) it = by_size.emplace(size, ProfileAt(s)).first;
    return it->second;
  };
  const std::vector<PlanCandidate> candidates = SearchPlans(written, profile_at);
  absl::StatusOr<PlanCandidate> best = ChoosePlan(candidates);
  if (!best.ok()) {
    return absl::Status(best.status().code(),
                        absl::StrCat("pipeline.plan: auto: ", best.status().message()));
  }
  double as_written = 0.0;
  if (const absl::StatusOr<v1::ModelProfile>& p = profile_at(written); p.ok()) {
    if (absl::StatusOr<PipelinePlan> plan = PlanPipeline(written, &*p); plan.ok()) {
      as_written = plan->predicted_step_seconds;
    }
  }
  int feasible = 0;
  for (const PlanCandidate& c : candidates) feasible += c.status.ok();
  const std::string note = absl::StrCat(DescribeChoice(*best, as_written), "; best of ", feasible,
                                        " feasible of ", candidates.size(), " candidates");
  spec_ = best->spec;
  env_.store->SetPlan(job_.id(), spec_.pipeline(), note);
  spdlog::info("{}: planned {}", job_.id(), note);
  return absl::OkStatus();
}

absl::StatusOr<v1::ModelProfile> JobRunner::ProfileAt(const v1::JobSpec& spec) {
  if (env_.profiles != nullptr) {
    std::optional<v1::ModelProfile> cached =
        env_.profiles->Find(ProfileKey(spec, DeviceKind(workers_[0].device), workers_[0].threads));
    if (cached.has_value()) return *std::move(cached);
  }
  return ProfileForJob(spec);
}

absl::StatusOr<v1::ModelProfile> JobRunner::ProfileForJob(const v1::JobSpec& spec) {
  env_.store->SetReason(
      job_.id(), absl::StrCat("planning: profiling micro-batches of ",
                              spec.pipeline().micro_batch_size(), " on worker ", workers_[0].id));
  // With a second worker the link between the first two is measured too (keys under the
  // job's prefix, dropped at its end like the rest).
  std::optional<LinkPeer> peer;
  if (workers_.size() >= 2) {
    peer = LinkPeer{&workers_[1], clients_[1].get(), absl::StrCat(job_.id(), "/link-probe/"),
                    env_.rendezvous};
  }
  return MeasureProfile(spec, workers_[0], *clients_[0], env_.options.profile_timeout,
                        env_.profiles, peer.has_value() ? &*peer : nullptr);
}

StageWorkerClient::Done JobRunner::Completion(Batch* batch, int rank) {
  return [this, batch, rank](absl::Status s) {
    absl::MutexLock lock(&mu_);
    if (!s.ok() && batch->failed++ == 0) batch->first_failure = rank;
    batch->results[rank] = std::move(s);
    --batch->pending;
  };
}

absl::Status JobRunner::AwaitBatch(Batch* batch, absl::Duration timeout, const std::string& what) {
  std::string abort_reason;
  {
    absl::MutexLock lock(&mu_);
    auto settled = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return batch->pending == 0 || batch->failed > 0 || interrupt_ != Interrupt::kNone;
    };
    mu_.AwaitWithTimeout(absl::Condition(&settled), timeout);
    if (batch->pending == 0) return absl::OkStatus();
    if (interrupt_ != Interrupt::kNone) {
      abort_reason = interrupt_reason_;
    } else if (batch->failed > 0) {
      const int r = batch->first_failure;
      abort_reason =
          absl::StrCat(what, ": ", WorkerName(r), " failed: ", batch->results[r].message());
    } else {
      abort_reason = absl::StrCat(what, " timed out after ", absl::FormatDuration(timeout));
    }
  }
  // Abort makes the workers return promptly; cancel the calls if they still do not (at once
  // for a worker known lost).
  AbortAll(abort_reason);
  for (size_t r = 0; r < clients_.size(); ++r) {
    if (RankLost(static_cast<int>(r))) clients_[r]->CancelPending();
  }
  auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return batch->pending == 0; };
  bool all_done;
  {
    absl::MutexLock lock(&mu_);
    all_done = mu_.AwaitWithTimeout(absl::Condition(&done), env_.options.abort_timeout);
  }
  if (!all_done) {
    for (auto& c : clients_) c->CancelPending();
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&done));
  }
  return InterruptStatus();
}

absl::Status JobRunner::CallAll(const std::string& what, absl::Duration timeout,
                                const std::function<void(int, StageWorkerClient::Done)>& issue) {
  const int p = static_cast<int>(workers_.size());
  Batch batch(p);
  batch.deadline = timeout;
  for (int r = 0; r < p; ++r) issue(r, Completion(&batch, r));
  if (absl::Status s = AwaitBatch(&batch, timeout + absl::Seconds(5), what); !s.ok()) return s;
  for (int r = 0; r < p; ++r) {
    if (!batch.results[r].ok()) return Diagnose(what, batch);
  }
  return absl::OkStatus();
}

absl::Status JobRunner::ConfigureAll() {
  const v1::JobSpec& spec = spec_;
  const int p = static_cast<int>(workers_.size());
  std::vector<v1::ConfigureResponse> responses(p);
  absl::Status s = CallAll(
      "configure", env_.options.configure_timeout, [&](int r, StageWorkerClient::Done done) {
        v1::ConfigureRequest req;
        *req.mutable_program() = StageProgramFor(
            plan_, spec, r, job_.id(), absl::StrCat(job_.id(), "/attempt-", attempt_, "/"));
        req.mutable_program()->set_attempt(attempt_);
        if (!restore_.job_id().empty()) *req.mutable_program()->mutable_restore() = restore_;
        clients_[r]->Configure(req, &responses[r], env_.options.configure_timeout, std::move(done));
      });
  if (!s.ok()) return s;
  int64_t params = 0;
  for (const auto& resp : responses) params += resp.parameter_count();
  spdlog::info("{}: configured {} stage(s), {} parameters", job_.id(), p, params);
  return absl::OkStatus();
}

absl::Status JobRunner::RunOneStep(int64_t step) {
  ScopedLogContext log_context({.step = step});
  const v1::JobSpec& spec = spec_;
  const int p = static_cast<int>(workers_.size());
  const std::string what = absl::StrCat("step ", StepNumber(step));
  const auto t0 = std::chrono::steady_clock::now();

  // Phase 1: forward and backward on every stage; gradients stay on the workers.
  std::vector<v1::RunStepResponse> responses(p);
  v1::RunStepRequest req;
  req.set_job_id(job_.id());
  req.set_step(step);
  req.set_mode(v1::STEP_MODE_TRAIN);
  req.set_attempt(attempt_);
  const absl::Duration deadline = StepDeadline();
  absl::Status s = CallAll(what, deadline, [&](int r, auto done) {
    clients_[r]->RunStep(req, &responses[r], deadline, std::move(done));
  });
  if (!s.ok()) return s;
  const double run_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  v1::StepSummary summary;
  summary.set_step(step);
  int64_t max_exec_us = 0;
  bool has_loss = false;
  bool finite = true;
  double norm_sq = 0.0;
  for (const auto& resp : responses) {
    const v1::StepReport& rep = resp.report();
    if (rep.has_loss()) {
      summary.set_loss(rep.loss());
      has_loss = true;
    }
    finite = finite && rep.grads_finite();
    norm_sq += rep.grad_norm_sq();
    max_exec_us = std::max(max_exec_us, rep.exec_us());
    summary.set_bytes_sent(summary.bytes_sent() + rep.bytes_sent());
    summary.set_peak_activation_bytes(
        std::max(summary.peak_activation_bytes(), rep.peak_activation_bytes()));
    summary.add_rank_peak_activation_bytes(rep.peak_activation_bytes());
  }
  // Per stage: static + peak activations, and their parts, as each stage's worker measured them.
  std::vector<v1::StageMemory> stage_memory(static_cast<size_t>(plan_.num_stages()));
  for (int s = 0; s < plan_.num_stages(); ++s) stage_memory[static_cast<size_t>(s)].set_stage(s);
  for (const auto& resp : responses) {
    for (const v1::StageMemory& m : resp.report().stage_memory()) {
      if (m.stage() >= 0 && m.stage() < plan_.num_stages()) {
        stage_memory[static_cast<size_t>(m.stage())] = m;
      }
    }
  }
  for (const v1::StageMemory& m : stage_memory) {
    summary.add_stage_peak_bytes(m.static_bytes() + m.peak_activation_bytes());
    *summary.add_stage_memory() = m;
  }
  if (!has_loss) {
    return absl::InternalError(
        absl::StrCat(what, ": ", WorkerName(LastStageRank()), " reported no loss"));
  }
  std::vector<const v1::StepReport*> reports;
  for (const auto& resp : responses) reports.push_back(&resp.report());
  if (absl::StatusOr<StepProfile> profile = ProfileStep(plan_.schedule, reports); profile.ok()) {
    summary.set_bubble_measured(profile->measured_bubble);
    summary.set_bubble_predicted(profile->predicted_bubble);
    for (double b : profile->busy_seconds) summary.add_busy_seconds(b);
    for (const ActionCosts& c : profile->stage_costs) {
      summary.add_stage_seconds(
          c.forward + (c.backward > 0 ? c.backward : c.backward_input + c.backward_weight));
    }
  } else {
    spdlog::warn("{}: {}: cannot profile the step: {}", job_.id(), what,
                 profile.status().ToString());
  }
  // The step's timings on the coordinator's clock, kept for `tandem trace`; the per-stage busy
  // time comes from the same record, so that the trace and the summary agree.
  std::vector<v1::StepReport> step_reports;
  std::vector<std::string> worker_ids;
  for (int r = 0; r < p; ++r) {
    step_reports.push_back(responses[r].report());
    step_reports.back().set_rank(r);  // the rank the runner asked, whatever the report says
    worker_ids.push_back(workers_[r].id);
  }
  v1::StepTimings timings =
      StepTimingsOf(step, step_reports, env_.registry->ClockOffsets(worker_ids));
  if (absl::StatusOr<StepTimeline> t = TimelineOf(plan_.schedule, timings); t.ok()) {
    for (const StageTimes& st : t->stages) {
      summary.add_stage_busy_seconds(static_cast<double>(st.busy_us) * 1e-6);
      summary.add_stage_comm_seconds(static_cast<double>(st.comm_us) * 1e-6);
      summary.add_stage_idle_seconds(static_cast<double>(st.idle_us) * 1e-6);
    }
  } else {
    spdlog::warn("{}: {}: cannot build the step's timeline: {}", job_.id(), what,
                 t.status().ToString());
  }

  // Phase 2: the global gradient norm decides clipping and skipping, the same on every stage.
  const double norm = std::sqrt(norm_sq);
  finite = finite && std::isfinite(norm) && std::isfinite(summary.loss());
  const float clip = spec.optimizer().grad_clip();
  v1::ApplyStepRequest apply;
  apply.set_job_id(job_.id());
  apply.set_step(step);
  apply.set_learning_rate(LearningRateAt(spec.optimizer(), step, spec.steps()));
  apply.set_grad_scale(finite && clip > 0 && norm > clip ? static_cast<float>(clip / norm) : 1.0f);
  apply.set_skip(!finite);
  apply.set_attempt(attempt_);
  std::vector<v1::ApplyStepResponse> applied(p);
  s = CallAll(absl::StrCat(what, " apply"), deadline, [&](int r, auto done) {
    clients_[r]->ApplyStep(apply, &applied[r], deadline, std::move(done));
  });
  if (!s.ok()) return s;
  if (!finite) {
    spdlog::warn("{}: {}: non-finite gradient (norm {}, loss {}); update skipped", job_.id(), what,
                 norm, summary.loss());
  }

  const double step_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  summary.set_grad_norm(norm);
  summary.set_learning_rate(apply.learning_rate());
  summary.set_skipped(!finite);
  summary.set_step_seconds(step_seconds);
  slowest_step_seconds_ = std::max(slowest_step_seconds_, step_seconds);
  summary.set_max_worker_exec_seconds(static_cast<double>(max_exec_us) * 1e-6);
  // The RunStep phase's wall time minus the slowest worker's execution: what the coordinator
  // adds to the critical path of the pipeline itself.
  summary.set_coordinator_overhead_seconds(
      std::max(0.0, run_seconds - summary.max_worker_exec_seconds()));
  summary.set_tokens_per_second(step_seconds > 0 ? job_.tokens_per_step() / step_seconds : 0);
  // MFU against the sum of the workers' measured peaks; one unknown peak leaves it 0.
  double peak = 0.0;
  bool peaks_known = true;
  for (const WorkerRecord& w : workers_) {
    peaks_known = peaks_known && w.peak_flops > 0;
    peak += w.peak_flops;
  }
  if (peaks_known && step_seconds > 0) {
    summary.set_mfu(ModelFlopsPerToken(spec_.model()) *
                    static_cast<double>(job_.tokens_per_step()) / step_seconds / peak);
  }
  if (EvalDue(spec, step)) {
    absl::StatusOr<double> val = RunEval(step);
    if (!val.ok()) return val.status();
    summary.set_has_val_loss(true);
    summary.set_val_loss(*val);
  }
  if (step == first_step_) env_.store->SetTraceProgram(job_.id(), TraceProgramOf(plan_.schedule));
  env_.store->RecordStepTimings(job_.id(), std::move(timings));
  env_.store->RecordStep(job_.id(), summary);
  return absl::OkStatus();
}

absl::Status JobRunner::SaveCheckpoint(int64_t step) {
  ScopedLogContext log_context({.step = step});
  const int p = static_cast<int>(workers_.size());
  const std::string what = absl::StrCat("checkpoint after step ", StepNumber(step));
  std::vector<std::future<absl::Status>> saves;
  for (int r = 0; r < p; ++r) {
    saves.push_back(std::async(std::launch::async, [this, r, step]() -> absl::Status {
      v1::SaveCheckpointRequest req;
      req.set_job_id(job_.id());
      req.set_step(step);
      req.set_attempt(attempt_);
      std::unique_ptr<SafetensorsWriter> writer;
      absl::Status s = clients_[r]->SaveCheckpoint(
          req, env_.options.step_timeout, [&](const v1::TensorChunk& chunk) -> absl::Status {
            if (writer == nullptr) {
              std::vector<TensorInfo> index;
              for (const auto& m : chunk.index()) {
                index.push_back({m.name(), m.dtype(), {m.shape().begin(), m.shape().end()}});
              }
              auto w = env_.checkpoints->BeginStage(job_.id(), step, r, std::move(index));
              if (!w.ok()) return w.status();
              writer = *std::move(w);
              return absl::OkStatus();
            }
            return writer->Append(chunk.data().data(), chunk.data().size());
          });
      if (s.ok() && writer == nullptr) s = absl::DataLossError("empty checkpoint stream");
      if (s.ok()) s = writer->Commit();
      if (!s.ok()) return absl::Status(s.code(), absl::StrCat(WorkerName(r), ": ", s.message()));
      return absl::OkStatus();
    }));
  }
  Batch batch(p);
  batch.deadline = env_.options.step_timeout;
  for (int r = 0; r < p; ++r) {
    batch.results[r] = saves[r].get();
    if (!batch.results[r].ok() && batch.first_failure < 0) batch.first_failure = r;
  }
  // As for a step: probe the workers, so that a dead one is named as the cause and marked LOST
  // (else the restart could pick it again before its heartbeats are missed).
  if (batch.first_failure >= 0) return Diagnose(what, batch);
  if (absl::Status s = env_.checkpoints->Commit(job_.id(), step, p, spec_.checkpoint().keep());
      !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
  }
  env_.store->SetCheckpoint(job_.id(), step);
  return absl::OkStatus();
}

absl::StatusOr<double> JobRunner::RunEval(int64_t step) {
  const int p = static_cast<int>(workers_.size());
  std::vector<v1::RunStepResponse> responses(p);
  v1::RunStepRequest req;
  req.set_job_id(job_.id());
  req.set_step(step);
  req.set_mode(v1::STEP_MODE_EVAL);
  req.set_attempt(attempt_);
  absl::Status s = CallAll(absl::StrCat("validation after step ", StepNumber(step)),
                           env_.options.step_timeout, [&](int r, auto done) {
                             clients_[r]->RunStep(req, &responses[r], env_.options.step_timeout,
                                                  std::move(done));
                           });
  if (!s.ok()) return s;
  for (const auto& resp : responses) {
    if (resp.report().has_loss()) return resp.report().loss();
  }
  return absl::InternalError(absl::StrCat("validation after step ", StepNumber(step), ": ",
                                          WorkerName(LastStageRank()), " reported no loss"));
}

absl::Status JobRunner::Diagnose(const std::string& what, const Batch& batch) {
  if (absl::Status interrupted = InterruptStatus(); !interrupted.ok()) return interrupted;
  const int p = static_cast<int>(workers_.size());
  std::vector<std::future<absl::Status>> probes;
  for (int r = 0; r < p; ++r) {
    probes.push_back(
        std::async(std::launch::async, [this, r] { return clients_[r]->Probe(absl::Seconds(2)); }));
  }
  std::string first_error;
  if (batch.first_failure >= 0) {
    const int r = batch.first_failure;
    const absl::Status& e = batch.results[r];
    if (e.code() == absl::StatusCode::kDeadlineExceeded) {
      // The call's own deadline passed: say which, and what that usually means.
      first_error = absl::StrCat(WorkerName(r), " timed out: no answer within ",
                                 absl::FormatDuration(batch.deadline), " (", e.message(),
                                 "); it may be hung, or waiting on a peer or a link that is down");
    } else {
      first_error = absl::StrCat(WorkerName(r), ": ", e.ToString());
    }
  }
  for (int r = 0; r < p; ++r) {
    absl::Status probe = probes[r].get();
    if (!probe.ok()) {
      {
        absl::MutexLock lock(&mu_);
        lost_ranks_.insert(r);
      }
      env_.registry->MarkLost(workers_[r].id);
      return absl::UnavailableError(absl::StrCat(what, ": ", WorkerName(r), " is unreachable (",
                                                 probe.ToString(),
                                                 "); first error: ", first_error));
    }
  }
  return absl::InternalError(absl::StrCat(what, ": ", first_error));
}

void JobRunner::AbortAll(const std::string& reason) {
  v1::AbortRequest req;
  req.set_job_id(job_.id());
  req.set_reason(reason);
  std::vector<std::future<absl::Status>> calls;
  for (size_t r = 0; r < clients_.size(); ++r) {
    if (RankLost(static_cast<int>(r))) {
      calls.push_back(std::async(std::launch::deferred, [] { return absl::OkStatus(); }));
      continue;
    }
    calls.push_back(std::async(std::launch::async, [this, r, &req] {
      return clients_[r]->Abort(req, env_.options.abort_timeout);
    }));
  }
  for (size_t r = 0; r < calls.size(); ++r) {
    absl::Status s = calls[r].get();
    if (!s.ok()) {
      spdlog::warn("{}: abort of {} failed: {}", job_.id(), WorkerName(static_cast<int>(r)),
                   s.ToString());
    }
  }
}

}  // namespace tandem::coordinator
