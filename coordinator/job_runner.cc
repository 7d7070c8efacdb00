#include "coordinator/job_runner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <future>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/clock.h"
#include "common/elastic_layout.h"
#include "common/log_context.h"
#include "common/partitioner.h"
#include "common/spec.h"
#include "common/status_macros.h"
#include "common/step_number.h"
#include "coordinator/peer_recovery.h"
#include "coordinator/step_summary.h"
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

namespace {

std::vector<RelayMember> RelayMembers(const std::vector<WorkerRecord>& workers) {
  std::vector<RelayMember> members;
  for (const WorkerRecord& w : workers) members.push_back({w.address, w.node});
  return members;
}

}  // namespace

bool EvalDue(const v1::JobSpec& spec, int64_t step) {
  const int every = spec.eval().every();
  return every > 0 && ((step + 1) % every == 0 || step + 1 == spec.steps());
}

JobRunner::JobRunner(RunnerEnv env, v1::Job job, std::vector<WorkerRecord> workers)
    : env_(env),
      job_(std::move(job)),
      gang_(job_.id(), std::move(workers), *env_.clients, env_.registry, env_.options.abort_timeout,
            [this](int rank) { return WorkerName(rank); }),
      // Every run of the job a number of its own: restarts and resizes each start one.
      attempt_(job_.restarts() + job_.resizes_size()) {
  run_.spec = job_.spec();
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
  gang_.Interrupt(absl::CancelledError(reason));
}

void JobRunner::Shutdown(const std::string& reason) {
  absl::MutexLock lock(&mu_);
  if (interrupt_ != Interrupt::kNone) return;
  interrupt_ = Interrupt::kShutdown;
  gang_.Interrupt(absl::UnavailableError(reason));
}

bool JobRunner::InterruptIs(Interrupt kind) {
  absl::MutexLock lock(&mu_);
  return interrupt_ == kind;
}

void JobRunner::OnWorkerLost(const WorkerRecord& worker) {
  const double age = std::chrono::duration<double>(Clock::now() - worker.last_heartbeat).count();
  absl::MutexLock lock(&mu_);
  if (interrupt_ != Interrupt::kNone) return;
  interrupt_ = Interrupt::kWorkerLost;
  std::vector<int> lost;
  for (size_t r = 0; r < gang_.workers().size(); ++r) {
    if (gang_.workers()[r].id == worker.id) lost.push_back(static_cast<int>(r));
  }
  gang_.Interrupt(absl::UnavailableError(absl::StrCat(
                      "worker ", worker.id, " (", worker.address, ", stage ", worker.stage,
                      ") was lost: no heartbeat for ", absl::StrFormat("%.1f", age), " s")),
                  lost);
}

std::string JobRunner::WorkerName(int rank) const {
  const WorkerRecord& w = gang_.workers()[rank];
  const std::string worker = absl::StrCat("worker ", w.id, " at ", w.address);
  const Placement& placement = run_.pipeline.schedule.placement;
  if (placement.num_ranks < 1) return worker;  // not planned yet
  // A data-parallel gang is R pipelines: gang rank = replica x P + pipeline rank.
  const int replica = rank / placement.num_ranks;
  const std::string of_replica = Replicas() > 1 ? absl::StrCat(" of replica ", replica) : "";
  const std::vector<int> stages = placement.StagesOf(rank % placement.num_ranks);
  if (stages.size() == 1) {
    return absl::StrCat("stage ", stages[0], of_replica, " (", worker, ")");
  }
  return absl::StrCat("rank ", rank % placement.num_ranks, of_replica, " (stages ",
                      absl::StrJoin(stages, ", "), "; ", worker, ")");
}

int JobRunner::Replicas() const { return std::max(1, run_.spec.pipeline().replicas()); }

int JobRunner::PipelineRanks() const { return gang_.size() / Replicas(); }

int JobRunner::LastStageRank() const {
  return run_.pipeline.schedule.placement.rank_of_stage.back();
}

absl::Duration RestartBackoff(const RunnerOptions& options, int restarts) {
  if (restarts <= 0 || options.restart_backoff <= absl::ZeroDuration()) {
    return absl::ZeroDuration();
  }
  absl::Duration wait = options.restart_backoff;
  for (int i = 1; i < restarts && wait < options.restart_backoff_max; ++i) wait *= 2;
  return std::min(wait, options.restart_backoff_max);
}

FailureKind ClassifyRunFailure(RunPhase phase, std::optional<absl::StatusCode> worker_code) {
  switch (phase) {
    case RunPhase::kPlan:
      return FailureKind::kPermanent;
    case RunPhase::kTrain:
      return FailureKind::kFault;
    case RunPhase::kConfigure:
      break;
  }
  // Only a worker's own answer can refuse a configuration.
  if (!worker_code.has_value()) return FailureKind::kFault;
  switch (*worker_code) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kResourceExhausted:
      return FailureKind::kPermanent;
    default:
      return FailureKind::kFault;
  }
}

absl::Duration JobRunner::StepDeadline() const {
  if (slowest_step_seconds_ <= 0) return env_.options.step_timeout;
  const absl::Duration derived = absl::Seconds(kStepDeadlineFactor * slowest_step_seconds_);
  return std::min(env_.options.step_timeout, std::max(env_.options.step_deadline_floor, derived));
}

void JobRunner::Run() {
  const std::string& id = job_.id();
  ScopedLogContext log_context({.job = id});
  // Where the run is: a failure is classified by it (ClassifyRunFailure).
  RunPhase phase = RunPhase::kPlan;
  absl::Status status = Plan();
  if (status.ok()) {
    phase = RunPhase::kConfigure;
    status = env_.store->Transition(id, v1::RUNNING, "");
  }
  if (status.ok()) status = ConfigureAll();
  if (status.ok()) phase = RunPhase::kTrain;
  if (status.ok() && run_.peers.holders_size() > 0) {
    env_.store->RecordPeerRecovery(id);
    spdlog::info(
        "{}: every worker restored its state after step {} from the {} worker(s) that "
        "kept it",
        id, StepNumber(run_.restore.step()), run_.peers.holders_size());
    ReleaseKeptStateOutsideTheGang();
  }
  // Peer recovery: from now on an abort asks the workers to keep their state after the last
  // step the whole gang completed (the restored one, at first).
  const bool peer_recovery = env_.options.peer_recovery && PeerRecoveryApplies(run_.spec);
  if (status.ok() && peer_recovery) gang_.set_retain_step(run_.first_step - 1);
  // An elastic job that can grow ends its run and is requeued for more workers: after any step
  // where its workers can keep their state for the bigger gang (peer recovery), else at a
  // checkpoint.
  const bool grow_from_peers =
      env_.options.peer_recovery && IsElastic(run_.spec) && !ShardsOptimizerState(run_.spec);
  std::optional<std::string> grow;
  bool permanent = false;  // the run failed in a way a restart would repeat
  int64_t grow_step = -1;  // the step after which a grow from the workers' state ends the run
  for (int64_t step = run_.first_step; status.ok() && step < run_.spec.steps(); ++step) {
    status = gang_.InterruptStatus();
    if (status.ok()) status = RunOneStep(step);
    if (status.ok()) ++steps_run_;
    // (The step's update travels with the next RunStep: a worker that the next RunStep does
    // not reach applies it when it keeps its state.)
    if (status.ok() && peer_recovery) {
      gang_.set_retain_step(step, pending_apply_.has_value() ? &*pending_apply_ : nullptr);
    }
    if (status.ok() && CheckpointDue(run_.spec, step) && env_.checkpoints != nullptr &&
        env_.checkpoints->enabled()) {
      absl::Status not_stored;
      status = Checkpoint(step, &not_stored);
      const bool stored = status.ok() && not_stored.ok();
      if (status.ok() && !not_stored.ok()) {
        status = CheckpointNotStored(step, not_stored);
        permanent = !status.ok();
      }
      if (stored && step + 1 < run_.spec.steps()) grow = GrowReason(step, false);
      if (grow.has_value()) break;
    } else if (status.ok() && grow_from_peers && step + 1 < run_.spec.steps()) {
      grow = GrowReason(step, true);
      if (grow.has_value()) {
        grow_step = step;
        break;
      }
    }
  }
  const bool shutting_down = !status.ok() && InterruptIs(Interrupt::kShutdown);
  const bool restarts = !status.ok() && !shutting_down && !permanent &&
                        status.code() != absl::StatusCode::kCancelled &&
                        ClassifyRunFailure(phase, WorkerErrorCode(status)) == FailureKind::kFault &&
                        job_.restarts() < run_.spec.max_restarts();
  // A restart resumes from the survivors' state when every stage has one (they kept it when
  // the failed batch of calls aborted them); otherwise they drop it.
  std::optional<v1::PeerState> survivors;
  if (restarts && peer_recovery && phase == RunPhase::kTrain) {
    std::vector<bool> lost(gang_.size());
    for (int r = 0; r < gang_.size(); ++r) lost[r] = gang_.RankLost(r);
    std::string why_not;
    survivors = SurvivorsState(gang_.retain_step(), gang_.workers(), lost, run_.pipeline,
                               Replicas(), &why_not);
    if (!survivors.has_value()) {
      spdlog::info("{}: no peer recovery: {}; resumes from the checkpoint", id, why_not);
    }
  }
  // A grow from the workers' state: every worker keeps its stage's (after applying the last
  // step's update, which no RunStep carried yet).
  std::optional<v1::PeerState> grow_state;
  if (status.ok() && grow_step >= 0) {
    std::string why_not;
    grow_state = SurvivorsState(grow_step, gang_.workers(), std::vector<bool>(gang_.size(), false),
                                run_.pipeline, Replicas(), &why_not);
    if (grow_state.has_value()) {
      gang_.set_retain_step(grow_step, pending_apply_.has_value() ? &*pending_apply_ : nullptr);
    } else {
      spdlog::warn(
          "{}: cannot keep the state for the grow ({}); it starts again from the "
          "checkpoint",
          id, why_not);
    }
  }
  if (!survivors.has_value() && !grow_state.has_value()) gang_.set_retain_step(-1);
  // Every ending releases the workers' stages; on failure this also unblocks any transfer.
  gang_.AbortAll(status.ok() ? (grow.has_value() ? *grow : "job finished")
                             : std::string(status.message()));
  env_.registry->Release(id);
  if (env_.rendezvous != nullptr) env_.rendezvous->ErasePrefix(absl::StrCat(id, "/"));
  if (status.ok() && grow.has_value()) {
    spdlog::info("{}: {}", id, *grow);
    if (absl::Status s = env_.store->RequeueToGrow(id, *grow, grow_state ? &*grow_state : nullptr);
        !s.ok()) {
      spdlog::error("{}: cannot requeue to grow: {}", id, s.ToString());
    }
  } else if (shutting_down) {
    // The job stays RUNNING in the store: the next coordinator on this data root resumes it
    // from its latest checkpoint.
    spdlog::info("{}: left for the next coordinator to resume: {}", id,
                 std::string(status.message()));
  } else if (restarts) {
    const std::string cause = std::string(status.message());
    const int restart = job_.restarts() + 1;
    // The backoff doubles with the restarts since a run last trained a step, not with all of
    // them: a job that trains between rare faults waits the base backoff each time. It is
    // stored with the job: a coordinator restarted meanwhile waits it out too.
    const int in_a_row = steps_run_ > 0 ? 1 : job_.restarts_in_a_row() + 1;
    const absl::Duration backoff = RestartBackoff(env_.options, in_a_row);
    const int64_t resume = env_.store->RecordRestart(id, cause, absl::Now() + backoff, in_a_row,
                                                     survivors ? &*survivors : nullptr);
    const std::string from =
        survivors.has_value() ? absl::StrCat("from the state ", survivors->holders_size(),
                                             " surviving worker(s) kept after step ",
                                             StepNumber(resume), " (peer recovery)")
        : resume >= 0         ? absl::StrCat("from the checkpoint after step ", StepNumber(resume))
                              : std::string("from the start (no checkpoint yet)");
    const std::string reason = absl::StrCat(
        "restart ", restart, " of ", run_.spec.max_restarts(), " after: ", cause, "; resumes ",
        from,
        backoff > absl::ZeroDuration()
            ? absl::StrCat("; waits ", absl::FormatDuration(backoff), " before its next run")
            : std::string());
    (void)env_.store->Transition(id, v1::QUEUED, reason);
    spdlog::warn("{}: {}", id, reason);
  } else if (status.ok()) {
    (void)env_.store->Transition(id, v1::SUCCEEDED, "");
    spdlog::info("{}: SUCCEEDED after {} steps", id, run_.spec.steps());
  } else if (status.code() == absl::StatusCode::kCancelled) {
    (void)env_.store->Transition(id, v1::CANCELLED, std::string(status.message()));
    spdlog::info("{}: CANCELLED: {}", id, std::string(status.message()));
  } else {
    std::string reason(status.message());
    if (phase == RunPhase::kConfigure && job_.restarts() < run_.spec.max_restarts()) {
      spdlog::warn("{}: not restarted: a worker refused its configuration, and would again", id);
    }
    if (job_.restarts() > 0) {
      reason = absl::StrCat("failed after ", job_.restarts(),
                            " restart(s); first cause: ", job_.first_failure(), "; last: ", reason);
    }
    (void)env_.store->Transition(id, v1::FAILED, reason);
    spdlog::warn("{}: FAILED: {}", id, reason);
  }
  for (Release& r : releases_) r.done.wait();
  finished_.store(true);
}

void JobRunner::ReleaseKeptStateOutsideTheGang() {
  for (const v1::StateHolder& holder : HoldersOutside(run_.peers, gang_.workers())) {
    Release& r = releases_.emplace_back();
    r.client = env_.clients->Connect(holder.address());
    r.done = std::async(std::launch::async, [this, holder, client = r.client.get()] {
      v1::AbortRequest req;
      req.set_job_id(job_.id());
      req.set_reason("the job's gang has restored the state this worker kept");
      const absl::Status s = client->Abort(req, env_.options.abort_timeout);
      if (s.ok()) {
        spdlog::info("{}: worker {} drops the state it kept (restored by the gang)", job_.id(),
                     holder.worker_id());
      } else {
        spdlog::info("{}: worker {} could not be told to drop the state it kept: {}", job_.id(),
                     holder.worker_id(), s.ToString());
      }
    });
  }
}

std::optional<std::string> JobRunner::GrowReason(int64_t step, bool from_peers) const {
  if (!IsElastic(job_.spec())) return std::nullopt;
  const int idle = env_.registry->IdleCount(job_.spec().device());
  if (idle == 0) return std::nullopt;
  v1::JobSpec written = job_.spec();
  if (job_.has_written_pipeline()) *written.mutable_pipeline() = job_.written_pipeline();
  const absl::StatusOr<v1::JobSpec> bigger = ElasticLayoutFor(written, gang_.size() + idle);
  if (!bigger.ok() || GangSize(*bigger) <= gang_.size()) return std::nullopt;
  return absl::StrCat("grow: ", idle, " idle worker(s); from ", gang_.size(), " to ",
                      GangSize(*bigger), " workers (", bigger->pipeline().stages(), " x ",
                      std::max(1, bigger->pipeline().replicas()), ") from ",
                      from_peers ? "its workers' state" : "the checkpoint", " after step ",
                      StepNumber(step));
}

absl::Status JobRunner::Plan() {
  PlanningEnv planning;
  planning.store = env_.store;
  planning.rendezvous = env_.rendezvous;
  planning.checkpoints = env_.checkpoints;
  planning.models_root = env_.models_root;
  planning.profiles = env_.profiles;
  planning.profile_timeout = env_.options.profile_timeout;
  planning.speed_check_after = env_.options.profile_speed_check_after;
  // Under mu_: OnWorkerLost reads the gang's workers from another thread.
  planning.reorder_gang = [this](const std::vector<int>& order) {
    absl::MutexLock lock(&mu_);
    return gang_.Reorder(order);
  };
  RETURN_IF_ERROR(JobPlanner(std::move(planning), job_, gang_).Plan(&run_));
  // The step relay's groups, for the gang as planning left it.
  relay_ = PlanStepRelay(RelayMembers(gang_.workers()), env_.options.step_relay_min_workers);
  return absl::OkStatus();
}

absl::Status JobRunner::ConfigureAll() {
  const v1::JobSpec& spec = run_.spec;
  const int p = gang_.size();
  std::vector<v1::ConfigureResponse> responses(p);
  RETURN_IF_ERROR(gang_.CallAll(
      "configure", env_.options.configure_timeout, [&](int r, StageWorkerClient::Done done) {
        v1::ConfigureRequest req;
        *req.mutable_program() = StageProgramFor(
            run_.pipeline, spec, r, job_.id(), absl::StrCat(job_.id(), "/attempt-", attempt_, "/"));
        req.mutable_program()->set_attempt(attempt_);
        if (!run_.restore.job_id().empty()) {
          v1::CheckpointRef* restore = req.mutable_program()->mutable_restore();
          *restore = run_.restore;
          if (run_.peers.holders_size() > 0) {
            // Peer recovery: from the survivors of the failed run, those that held this
            // worker's layers first.
            std::vector<LayerRange> layers;
            for (const v1::StageChunk& c : req.program().chunks()) {
              layers.push_back({c.layer_begin(), c.layer_end()});
            }
            for (std::string& a : PeerOrderFor(run_.peers, layers))
              restore->add_peers(std::move(a));
          }
        }
        gang_.client(r).Configure(req, &responses[r], env_.options.configure_timeout,
                                  std::move(done));
      }));
  int64_t params = 0;
  for (const auto& resp : responses) params += resp.parameter_count();
  spdlog::info("{}: configured {} stage(s), {} parameters", job_.id(), p, params);
  if (!relay_.empty()) {
    std::vector<int> roots;
    for (const RelayGroup& g : relay_) roots.push_back(g.root);
    spdlog::info(
        "{}: the step relay: {} group(s) of up to {} workers; the coordinator calls "
        "rank(s) {}, which forward each step to the rest of their group",
        job_.id(), relay_.size(), relay_[0].children.size() + 1, absl::StrJoin(roots, ","));
  }
  return absl::OkStatus();
}

absl::Status JobRunner::RunOneStep(int64_t step) {
  ScopedLogContext log_context({.step = step});
  const v1::JobSpec& spec = run_.spec;
  const PipelinePlan& plan = run_.pipeline;
  const int p = gang_.size();
  const std::string what = absl::StrCat("step ", StepNumber(step));
  const auto t0 = std::chrono::steady_clock::now();

  // Phase 1: forward and backward on every stage; gradients stay on the workers.
  std::vector<v1::RunStepResponse> responses(p);
  v1::RunStepRequest req;
  req.set_job_id(job_.id());
  req.set_step(step);
  req.set_mode(v1::STEP_MODE_TRAIN);
  req.set_attempt(attempt_);
  if (pending_apply_.has_value()) {
    *req.mutable_apply_first() = *std::move(pending_apply_);
    pending_apply_.reset();
  }
  const absl::Duration deadline = StepDeadline();
  RETURN_IF_ERROR(RunStepOnAll(what, req, deadline, &responses));
  const double run_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  // The step's timings on the coordinator's clock, kept for `tandem trace`; the summary's
  // per-stage busy time comes from the same record, so that the trace and the summary agree.
  std::vector<v1::StepReport> step_reports;
  std::vector<std::string> worker_ids;
  step_reports.reserve(p);
  for (int r = 0; r < p; ++r) {
    // Moved, not copied: at a thousand workers the copies were a visible share of the step.
    step_reports.push_back(std::move(*responses[r].mutable_report()));
    step_reports.back().set_rank(r);  // the rank the runner asked, whatever the report says
    worker_ids.push_back(gang_.workers()[r].id);
  }
  v1::StepTimings timings =
      StepTimingsOf(step, step_reports, env_.registry->ClockOffsets(worker_ids));
  std::vector<const v1::StepReport*> reports;
  for (const auto& report : step_reports) reports.push_back(&report);
  // The step's replay prices its messages as the plan did (its profile's link), so that the
  // replay against the measured pipeline leaves out only the compute's error.
  std::vector<double> transfers;
  for (const ActionCosts& c : plan.stage_costs) transfers.push_back(c.transfer);
  StepReports reported = SummarizeReports(step, plan.schedule, plan.num_stages(), reports, timings,
                                          spec.optimizer().grad_clip(), Replicas(),
                                          ShardsOptimizerState(spec), transfers);
  v1::StepSummary& summary = reported.summary;
  if (!reported.has_loss) {
    return absl::InternalError(
        absl::StrCat(what, ": ", WorkerName(LastStageRank()), " reported no loss"));
  }
  for (const std::string& warning : reported.warnings) {
    spdlog::warn("{}: {}: {}", job_.id(), what, warning);
  }

  // Phase 2: the global gradient norm decides clipping and skipping, the same on every stage.
  v1::ApplyStepRequest apply;
  apply.set_job_id(job_.id());
  apply.set_step(step);
  apply.set_learning_rate(LearningRateAt(spec.optimizer(), step, spec.steps()));
  apply.set_grad_scale(reported.grad_scale);
  apply.set_skip(!reported.finite);
  apply.set_attempt(attempt_);
  // The update lands with the next step's RunStep, unless something must see it first.
  const bool last = step + 1 >= spec.steps();
  const bool checkpoint =
      CheckpointDue(spec, step) && env_.checkpoints != nullptr && env_.checkpoints->enabled();
  if (last || checkpoint || EvalDue(spec, step)) {
    std::vector<v1::ApplyStepResponse> applied(p);
    RETURN_IF_ERROR(gang_.CallAll(absl::StrCat(what, " apply"), deadline, [&](int r, auto done) {
      gang_.client(r).ApplyStep(apply, &applied[r], deadline, std::move(done));
    }));
  } else {
    pending_apply_ = apply;
  }
  if (!reported.finite) {
    spdlog::warn("{}: {}: non-finite gradient (norm {}, loss {}); update skipped", job_.id(), what,
                 reported.grad_norm, summary.loss());
  }

  StepThroughput throughput;
  throughput.run_seconds = run_seconds;
  throughput.step_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  throughput.max_exec_us = reported.max_exec_us;
  throughput.max_call_us = reported.max_call_us;
  throughput.tokens_per_step = job_.tokens_per_step();
  throughput.model_flops_per_token = ModelFlopsPerToken(spec.model());
  for (const WorkerRecord& w : gang_.workers()) throughput.peak_flops.push_back(w.peak_flops);
  summary.set_learning_rate(apply.learning_rate());
  SetThroughput(throughput, &summary);
  slowest_step_seconds_ = std::max(slowest_step_seconds_, throughput.step_seconds);
  if (EvalDue(spec, step)) {
    ASSIGN_OR_RETURN(const double val, RunEval(step));
    summary.set_has_val_loss(true);
    summary.set_val_loss(val);
  }
  if (step == run_.first_step) {
    // The whole gang: every replica's pipeline (the same program), on the gang's ranks.
    env_.store->SetTraceProgram(job_.id(),
                                TraceProgramOf(ReplicatedSchedule(plan.schedule, Replicas())));
  }
  env_.store->RecordStepTimings(job_.id(), std::move(timings));
  env_.store->RecordStep(job_.id(), summary);
  return absl::OkStatus();
}

absl::Status JobRunner::RunStepOnAll(const std::string& what, const v1::RunStepRequest& req,
                                     absl::Duration deadline,
                                     std::vector<v1::RunStepResponse>* responses) {
  if (relay_.empty()) {
    return gang_.CallAll(what, deadline, [&](int r, auto done) {
      gang_.client(r).RunStep(req, &(*responses)[r], deadline, std::move(done));
    });
  }
  // One request per group (its root's, carrying the group's other workers), found by rank.
  std::vector<int> roots;
  std::vector<v1::RunStepRequest> rooted(relay_.size(), req);
  std::vector<const v1::RunStepRequest*> request_of(gang_.size(), nullptr);
  for (size_t i = 0; i < relay_.size(); ++i) {
    roots.push_back(relay_[i].root);
    rooted[i].mutable_relay()->Add(relay_[i].children.begin(), relay_[i].children.end());
    request_of[relay_[i].root] = &rooted[i];
  }
  RETURN_IF_ERROR(gang_.CallRanks(what, deadline, roots, [&](int r, auto done) {
    gang_.client(r).RunStep(*request_of[r], &(*responses)[r], deadline, std::move(done));
  }));
  // Every rank's report, from its group's root; a rank reported twice or never is a fault of
  // the relaying worker, which the step cannot be summed without.
  std::vector<bool> reported(gang_.size(), false);
  for (int root : roots) reported[root] = true;
  for (int root : roots) {
    for (v1::RelayedStep& relayed : *(*responses)[root].mutable_relayed()) {
      const int r = relayed.rank();
      if (r < 0 || r >= gang_.size() || reported[r]) {
        return absl::InternalError(absl::StrCat(what, ": ", WorkerName(root),
                                                " relayed a report for rank ", r,
                                                r >= 0 && r < gang_.size() ? " twice" : ""));
      }
      reported[r] = true;
      *(*responses)[r].mutable_report() = std::move(*relayed.mutable_report());
    }
    (*responses)[root].clear_relayed();
  }
  for (int r = 0; r < gang_.size(); ++r) {
    if (!reported[r]) {
      return absl::InternalError(
          absl::StrCat(what, ": no report of ", WorkerName(r), " came back through the relay"));
    }
  }
  return absl::OkStatus();
}

absl::Status JobRunner::Checkpoint(int64_t step, absl::Status* not_stored) {
  const bool last = step + 1 == run_.spec.steps();
  for (int attempt = 1;; ++attempt) {
    RETURN_IF_ERROR(SaveCheckpoint(step, not_stored));
    if (not_stored->ok() || !last || attempt == kFinalCheckpointTries) return absl::OkStatus();
    spdlog::warn(
        "{}: the final checkpoint (after step {}) was not stored: {}; trying again in {} "
        "(try {} of {})",
        job_.id(), StepNumber(step), std::string(not_stored->message()),
        absl::FormatDuration(env_.options.checkpoint_retry_delay), attempt + 1,
        kFinalCheckpointTries);
    // Waits in slices, so that a cancel or shutdown meanwhile ends the wait.
    const absl::Time until = absl::Now() + env_.options.checkpoint_retry_delay;
    while (absl::Now() < until) {
      RETURN_IF_ERROR(gang_.InterruptStatus());
      absl::SleepFor(std::min(absl::Milliseconds(100), until - absl::Now()));
    }
  }
}

absl::Status JobRunner::CheckpointNotStored(int64_t step, const absl::Status& cause) {
  const std::string& id = job_.id();
  const absl::StatusOr<int64_t> latest = env_.checkpoints->Latest(id);
  if (step + 1 < run_.spec.steps()) {
    const std::string kept =
        latest.ok() ? absl::StrCat("after step ", StepNumber(*latest)) : std::string("none");
    const std::string what =
        absl::StrCat("checkpoint after step ", StepNumber(step), " not stored (", cause.message(),
                     "); the job trains on, its latest checkpoint ", kept);
    spdlog::warn("{}: {}", id, what);
    env_.store->RecordCheckpointFailure(id, what);
    return absl::OkStatus();
  }
  const std::string what = absl::StrCat(
      "the final checkpoint (after step ", StepNumber(step), ") was not stored after ",
      kFinalCheckpointTries, " tries (", cause.message(),
      "), so the trained state is lost with the run; ",
      latest.ok() ? absl::StrCat("its latest checkpoint is after step ", StepNumber(*latest),
                                 ": free space in the coordinator's data root and submit the job "
                                 "again with init.from_job: ",
                                 id, " to train the steps after it again")
                  : std::string("it has no checkpoint to resume from"));
  env_.store->RecordCheckpointFailure(id, what);
  return absl::ResourceExhaustedError(what);
}

absl::Status JobRunner::SaveCheckpoint(int64_t step, absl::Status* not_stored) {
  ScopedLogContext log_context({.step = step});
  *not_stored = absl::OkStatus();
  // Replica 0's workers hold the whole model (every replica holds the same state): one file per
  // stage, written once. With sharded optimizer state every replica takes part, gathering the
  // moments to replica 0, which alone streams them (the others send an empty index).
  const int p = PipelineRanks();
  const int callees = ShardsOptimizerState(run_.spec) ? gang_.size() : p;
  const std::string what = absl::StrCat("checkpoint after step ", StepNumber(step));
  // Each rank's stream: the worker's failure, or the coordinator's storage failing under it.
  struct StageSave {
    absl::Status worker;
    absl::Status storage;
  };
  // The store's own errors are the coordinator's storage (a full or read-only disk); an index
  // it refuses (INVALID_ARGUMENT) or more bytes than it declared (OUT_OF_RANGE) are the stream's.
  auto storage_failed = [](const absl::Status& s) {
    return !s.ok() && s.code() != absl::StatusCode::kInvalidArgument &&
           s.code() != absl::StatusCode::kOutOfRange;
  };
  std::vector<std::future<StageSave>> saves;
  for (int r = 0; r < callees; ++r) {
    saves.push_back(std::async(std::launch::async, [&, r]() -> StageSave {
      v1::SaveCheckpointRequest req;
      req.set_job_id(job_.id());
      req.set_step(step);
      req.set_attempt(attempt_);
      std::unique_ptr<StageFileWriter> writer;
      absl::Status storage;
      absl::Status s = gang_.client(r).SaveCheckpoint(
          req, env_.options.step_timeout, [&](const v1::TensorChunk& chunk) -> absl::Status {
            if (r >= p) {  // another replica's: it only helped gather
              return chunk.index_size() == 0 && chunk.data().empty()
                         ? absl::OkStatus()
                         : absl::DataLossError("a replica other than 0 streamed checkpoint data");
            }
            // Once the coordinator's storage has failed the rest is drained, not cancelled, so
            // that the worker's call ends as usual before the next one reaches it.
            if (!storage.ok()) return absl::OkStatus();
            absl::Status done;
            if (writer == nullptr) {
              std::vector<TensorInfo> index;
              for (const auto& m : chunk.index()) {
                index.push_back({m.name(), m.dtype(), {m.shape().begin(), m.shape().end()}});
              }
              absl::StatusOr<std::unique_ptr<StageFileWriter>> begun =
                  env_.checkpoints->BeginStage(job_.id(), step, r, std::move(index));
              if (begun.ok()) writer = *std::move(begun);
              done = begun.status();
            } else {
              done = writer->Append(chunk.data().data(), chunk.data().size());
            }
            if (!storage_failed(done)) return done;
            storage = done;
            writer.reset();  // its temporary file goes now: a full disk gets the space back
            return absl::OkStatus();
          });
      // (Diagnose names the worker of a failure.)
      if (!s.ok()) return {s, absl::OkStatus()};
      if (r >= p) return {absl::OkStatus(), absl::OkStatus()};
      if (!storage.ok()) return {absl::OkStatus(), storage};
      if (writer == nullptr)
        return {absl::DataLossError("empty checkpoint stream"), absl::OkStatus()};
      return {absl::OkStatus(), writer->Commit()};
    }));
  }
  std::vector<absl::Status> results(callees);
  bool failed = false;
  for (int r = 0; r < callees; ++r) {
    StageSave save = saves[r].get();
    results[r] = std::move(save.worker);
    failed = failed || !results[r].ok();
    if (!save.storage.ok() && not_stored->ok()) *not_stored = std::move(save.storage);
  }
  // As for a step: probe the workers, so that a dead one is named as the cause and marked LOST
  // (else the restart could pick it again before its heartbeats are missed).
  if (failed) {
    *not_stored = absl::OkStatus();
    env_.checkpoints->Discard(job_.id(), step);
    return gang_.Diagnose(what, results, env_.options.step_timeout);
  }
  if (not_stored->ok()) {
    *not_stored = env_.checkpoints->Commit(job_.id(), step, p, run_.spec.checkpoint().keep());
  }
  if (!not_stored->ok()) {
    env_.checkpoints->Discard(job_.id(), step);
    return absl::OkStatus();
  }
  env_.store->SetCheckpoint(job_.id(), step);
  return absl::OkStatus();
}

absl::StatusOr<double> JobRunner::RunEval(int64_t step) {
  // Replica 0 alone: the validation windows are fixed, so every replica would compute the same.
  const int p = PipelineRanks();
  std::vector<v1::RunStepResponse> responses(p);
  v1::RunStepRequest req;
  req.set_job_id(job_.id());
  req.set_step(step);
  req.set_mode(v1::STEP_MODE_EVAL);
  req.set_attempt(attempt_);
  RETURN_IF_ERROR(gang_.CallAll(
      absl::StrCat("validation after step ", StepNumber(step)), env_.options.step_timeout,
      [&](int r, auto done) {
        gang_.client(r).RunStep(req, &responses[r], env_.options.step_timeout, std::move(done));
      },
      p));
  for (const auto& resp : responses) {
    if (resp.report().has_loss()) return resp.report().loss();
  }
  return absl::InternalError(absl::StrCat("validation after step ", StepNumber(step), ": ",
                                          WorkerName(LastStageRank()), " reported no loss"));
}

}  // namespace tandem::coordinator
