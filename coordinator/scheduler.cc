#include "coordinator/scheduler.h"

#include <optional>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/elastic_layout.h"
#include "common/spec.h"
#include "common/status_macros.h"
#include "coordinator/placement.h"
#include "coordinator/worker_registry.h"
#include "spdlog/spdlog.h"

namespace tandem::coordinator {

Scheduler::Scheduler(RunnerEnv env, absl::Duration tick) : env_(env), tick_(tick) {}

Scheduler::~Scheduler() { Stop(); }

void Scheduler::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void Scheduler::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stop_) return;
    stop_ = true;
    for (auto& [id, runner] : runners_) runner->Shutdown("the coordinator is shutting down");
  }
  if (thread_.joinable()) thread_.join();
  absl::MutexLock lock(&mu_);
  runners_.clear();  // joins each runner
}

void Scheduler::Notify() {
  absl::MutexLock lock(&mu_);
  notified_ = true;
}

void Scheduler::Loop() {
  absl::MutexLock lock(&mu_);
  while (!stop_) {
    Tick();
    auto wake = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || notified_; };
    mu_.AwaitWithTimeout(absl::Condition(&wake), tick_);
    notified_ = false;
  }
}

void Scheduler::Tick() {
  // Liveness: a lost worker fails the job it serves.
  for (const WorkerRecord& w : env_.registry->SweepLost()) {
    spdlog::warn("worker {} ({}) lost: no heartbeat", w.id, w.address);
    auto it = runners_.find(w.job_id);
    if (it != runners_.end()) it->second->OnWorkerLost(w);
  }
  // Reap finished runners.
  for (auto it = runners_.begin(); it != runners_.end();) {
    if (it->second->finished()) {
      it = runners_.erase(it);  // joins its thread
    } else {
      ++it;
    }
  }
  // Gang-allocate queued jobs in submission order.
  for (const std::string& id : env_.store->Queued()) {
    // A job stays QUEUED while its runner plans it (profiling can take a while): it has its
    // workers already.
    if (runners_.count(id) > 0) continue;
    auto job = env_.store->Get(id, /*with_history=*/false);
    if (!job.ok()) continue;
    // A job requeued after a fault waits out its restart backoff, stored with it (the runner
    // set it), so that a coordinator restarted meanwhile waits too.
    if (absl::Now() < absl::FromUnixMillis(job->not_before_unix_ms())) continue;
    const std::string kind = job->spec().device();
    // An elastic job takes the layout the idle workers allow (common/elastic_layout.h); a
    // change is recorded only once its gang is allocated, so that a gang that could not be
    // had leaves no resize behind.
    std::optional<v1::ResizeEvent> resize;
    if (IsElastic(job->spec())) {
      if (!ChooseElasticLayout(&*job, &resize)) continue;
    }
    // The gang: stages x replicas workers (replica-major: gang rank = replica x stages + rank).
    const int p = GangSize(job->spec());
    auto workers = env_.registry->Allocate(kind, p, id, job->spec().pipeline().stages());
    if (!workers.ok()) {
      // An elastic layout chosen for the idle workers, one of them gone meanwhile: the next
      // tick chooses again. The job's reason stays the cause its resize will carry.
      if (resize.has_value()) continue;
      const v1::PipelineSpec& pipe = job->spec().pipeline();
      env_.store->SetReason(id, env_.registry->AvailabilityText(
                                    kind, p,
                                    pipe.replicas() > 1 ? absl::StrCat(pipe.stages(), " stages x ",
                                                                       pipe.replicas(), " replicas")
                                                        : ""));
      continue;
    }
    if (resize.has_value()) {
      env_.store->RecordResize(id, job->spec().pipeline(), *std::move(resize));
      absl::StatusOr<v1::Job> updated = env_.store->Get(id, /*with_history=*/false);
      if (!updated.ok()) {
        env_.registry->Release(id);
        continue;
      }
      *job = *std::move(updated);
    }
    std::vector<std::string> nodes;
    for (const WorkerRecord& w : *workers) nodes.push_back(w.node);
    spdlog::info("{}: allocated {} {} worker(s): {}", id, p, kind,
                 DescribePlacement(nodes, job->spec().pipeline().stages(),
                                   std::max(1, job->spec().pipeline().replicas())));
    auto runner = std::make_unique<JobRunner>(env_, *std::move(job), *std::move(workers));
    try {
      runner->Start();
    } catch (const std::system_error& e) {
      // No thread for the run (the process is at its limit): the job stays queued and its
      // workers go back, to be tried again on a later tick, rather than the coordinator dying.
      runner.reset();
      env_.registry->Release(id);
      env_.store->SetReason(id, absl::StrCat("waiting: no thread to run the job on (", e.what(),
                                             "); the coordinator retries"));
      spdlog::error("{}: no thread to run the job on: {}", id, e.what());
      continue;
    }
    runners_[id] = std::move(runner);
  }
}

bool Scheduler::ChooseElasticLayout(v1::Job* job, std::optional<v1::ResizeEvent>* resize) {
  v1::JobSpec written = job->spec();
  if (job->has_written_pipeline()) *written.mutable_pipeline() = job->written_pipeline();
  const int idle = env_.registry->IdleCount(job->spec().device());
  absl::StatusOr<v1::JobSpec> layout = ElasticLayoutFor(written, idle);
  if (!layout.ok()) {
    env_.store->SetReason(job->id(), std::string(layout.status().message()));
    return false;
  }
  const v1::PipelineSpec& from = job->spec().pipeline();
  const v1::PipelineSpec& to = layout->pipeline();
  if (from.stages() == to.stages() && from.replicas() == to.replicas() &&
      from.micro_batches() == to.micro_batches() &&
      from.micro_batch_size() == to.micro_batch_size()) {
    return true;  // the layout of its last run (or as written): nothing changes
  }
  v1::ResizeEvent event;
  // Why: its first run, a restart after a fault (the reason it was requeued with), or a grow.
  event.set_cause(job->steps_done() == 0 && job->restarts() == 0 && job->resizes_size() == 0
                      ? absl::StrCat("start: ", idle, " idle worker(s)")
                      : job->reason());
  event.set_from_stages(from.stages());
  event.set_from_replicas(std::max(1, from.replicas()));
  event.set_from_micro_batches(from.micro_batches());
  event.set_from_workers(GangSize(job->spec()));
  event.set_to_stages(to.stages());
  event.set_to_replicas(std::max(1, to.replicas()));
  event.set_to_micro_batches(to.micro_batches());
  event.set_to_workers(GangSize(*layout));
  spdlog::info("{}: elastic: {} x {} (M {}) -> {} x {} (M {}) on {} of {} idle worker(s): {}",
               job->id(), event.from_stages(), event.from_replicas(), event.from_micro_batches(),
               event.to_stages(), event.to_replicas(), event.to_micro_batches(), event.to_workers(),
               idle, event.cause());
  *job->mutable_spec()->mutable_pipeline() = to;
  *resize = std::move(event);
  return true;
}

absl::StatusOr<v1::Job> Scheduler::Cancel(const std::string& job_id) {
  {
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(const v1::Job job, env_.store->Get(job_id, /*with_history=*/false));
    if (IsTerminal(job.state())) {
      return absl::FailedPreconditionError(
          absl::StrCat("job ", job_id, " already ended (", v1::JobState_Name(job.state()), ")"));
    }
    auto it = runners_.find(job_id);
    if (it != runners_.end()) {
      it->second->Cancel("cancelled by the user");
    } else {
      RETURN_IF_ERROR(env_.store->Transition(job_id, v1::CANCELLED, "cancelled by the user"));
    }
  }
  return env_.store->Get(job_id, /*with_history=*/false);
}

}  // namespace tandem::coordinator
