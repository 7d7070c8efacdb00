#include "worker/stage_manager.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <chrono>
#include <limits>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/partitioner.h"
#include "common/spec.h"
#include "common/status_macros.h"
#include "common/step_number.h"
#include "common/version.h"
#include "worker/cpu_stage_compute.h"
#include "worker/profiler.h"

namespace tandem::worker {

namespace {

int64_t PhysicalMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return std::numeric_limits<int64_t>::max();
  return static_cast<int64_t>(pages) * page;
}

}  // namespace

namespace {

// Bytes of global layer `g` of `spec`'s model, in double (a hostile spec must not overflow
// the estimate into something small): see EstimateStageBytes.
double LayerBytes(const v1::JobSpec& spec, const std::vector<int64_t>& params, int g) {
  const v1::ModelSpec& model = spec.model();
  const double rows = static_cast<double>(spec.pipeline().micro_batch_size()) *
                      (IsDecoder(model) ? model.seq_len() : 1);
  double bytes = 4.0 * rows * model.d_model();
  if (g >= 0 && static_cast<size_t>(g) < params.size()) {
    bytes += 16.0 * static_cast<double>(params[g]);
  }
  return bytes;
}

int64_t Saturate(double bytes) {
  return bytes >= 9.0e18 ? std::numeric_limits<int64_t>::max() : static_cast<int64_t>(bytes);
}

}  // namespace

int64_t EstimateStageBytes(const v1::StageProgram& program) {
  const std::vector<int64_t> params = LayerParameterCounts(program.spec().model());
  double bytes = 0;
  for (const v1::StageChunk& c : program.chunks()) {
    for (int g = c.layer_begin(); g < c.layer_end(); ++g) {
      bytes += LayerBytes(program.spec(), params, g);
    }
  }
  return Saturate(bytes);
}

int64_t EstimateLayerBytes(const v1::JobSpec& spec, int layer) {
  return Saturate(LayerBytes(spec, LayerParameterCounts(spec.model()), layer));
}

StageManager::StageManager(WorkerConfig config, TransportFactory transport_factory,
                           TensorSource tensor_source)
    : config_(std::move(config)),
      transport_factory_(std::move(transport_factory)),
      tensor_source_(std::move(tensor_source)),
      memory_bytes_(config_.memory_bytes > 0 ? config_.memory_bytes : PhysicalMemoryBytes()) {}

StageManager::~StageManager() { Shutdown(); }

std::unique_ptr<StageManager::Stage> StageManager::TakeStageLocked() {
  if (stage_ == nullptr) return nullptr;
  stage_->executor->Abort();
  mu_.Await(absl::Condition(
      +[](bool* running) { return !*running; }, &step_running_));
  return std::move(stage_);
}

void StageManager::CancelConfigureLocked() {
  if (configure_cancelled_ != nullptr) configure_cancelled_->store(true);
  configure_cancelled_.reset();
  configuring_job_.clear();
  ++generation_;
}

absl::StatusOr<Dataset> StageManager::DatasetFor(const v1::StageProgram& program) {
  const v1::JobSpec& spec = program.spec();
  const v1::DataSpec& data = spec.data();
  const int64_t window = TrainingWindow(spec.model());
  // Everything LoadDataset reads: the cache must not hand out another job's split.
  const std::string key =
      absl::StrCat(data.source(), "\n", data.path(), "\n", data.format(), "\n", data.val_path(),
                   "\n", data.val_fraction(), "\n", DataSeed(spec), "\n", data.synthetic_bytes(),
                   "\n", spec.model().vocab_size(), "\n", window, "\n", config_.data_root);
  absl::MutexLock lock(&data_mu_);
  if (data_.train != nullptr && data_key_ == key) return data_;
  ASSIGN_OR_RETURN(data_, LoadDataset(spec, config_.data_root, window));
  data_key_ = key;
  return data_;
}

namespace {

// "1" or "0,2": the stages a program holds.
std::string StagesOf(const v1::StageProgram& program) {
  std::string out;
  for (const v1::StageChunk& c : program.chunks()) {
    absl::StrAppend(&out, out.empty() ? "" : ",", c.stage());
  }
  return out;
}

}  // namespace

absl::StatusOr<v1::ConfigureResponse> StageManager::Configure(const v1::StageProgram& program) {
  ScopedLogContext log_context({.job = program.job_id(), .stage = StagesOf(program)});
  RETURN_IF_ERROR(ValidateStageProgram(program));
  const std::string& job = program.job_id();
  if (program.spec().device() != DeviceKind(config_.device)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "configure of job ", job, ": the job runs on device ", program.spec().device(),
        " workers, and this worker is ", config_.device, " (a job never mixes device kinds)"));
  }
  if (const int64_t need = EstimateStageBytes(program); need > memory_bytes_) {
    std::string layers;
    for (const v1::StageChunk& c : program.chunks()) {
      absl::StrAppend(&layers, layers.empty() ? "" : ", ", "[", c.layer_begin(), ", ",
                      c.layer_end(), ")");
    }
    return absl::ResourceExhaustedError(absl::StrCat(
        "configure of job ", job, " rank ", program.rank(), ": its stage (layers ", layers,
        ") needs at least ", need, " bytes (", need >> 20,
        " MiB: parameters, gradients, optimizer state and one micro-batch's activations), but "
        "this worker has ",
        memory_bytes_, " bytes (", memory_bytes_ >> 20,
        " MiB); use more pipeline.stages, a smaller model or pipeline.micro_batch_size"));
  }
  std::unique_ptr<Stage> old;
  uint64_t generation = 0;
  std::shared_ptr<std::atomic<bool>> cancelled;
  std::shared_ptr<const KeptState> own_kept;  // read outside the lock
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return absl::UnavailableError("worker is shutting down");
    if (!configuring_job_.empty()) CancelConfigureLocked();  // the newest program wins
    old = TakeStageLocked();
    // A kept state serves the job's next run only (peer recovery): another job frees it.
    if (kept_ != nullptr && kept_->job_id() != job) {
      spdlog::info("dropping the state kept of job {} for job {}", kept_->job_id(), job);
      kept_.reset();
    }
    own_kept = kept_;
    generation = ++generation_;
    configuring_job_ = job;
    cancelled = std::make_shared<std::atomic<bool>>(false);
    configure_cancelled_ = cancelled;
  }
  if (old != nullptr) {
    spdlog::info("replacing the stage of job {} with a new program for job {}", old->job_id, job);
    old.reset();
  }

  auto build = [&]() -> absl::StatusOr<std::unique_ptr<StageExecutor>> {
    Dataset data;
    if (StageNeedsCorpus(program)) {
      ASSIGN_OR_RETURN(data, DatasetFor(program));
    }
    std::unique_ptr<Transport> transport;
    if (program.num_ranks() > 1) {
      if (!transport_factory_) {
        return absl::FailedPreconditionError("this worker has no transport for multi-rank jobs");
      }
      ASSIGN_OR_RETURN(transport, transport_factory_(program, *cancelled));
    }
    if (cancelled->load()) return absl::AbortedError("aborted while connecting");
    // Data parallelism: the group of this rank's copies in every replica connects collectives
    // of its own for the gradient reduction: the device's (NCCL) where the worker has them,
    // else the ring over a transport from the same factory.
    std::unique_ptr<GradReducer> reducer;
    // The reducer runs on a thread of its own: a worker out of threads refuses the program
    // rather than dying of the exception.
    const auto start_reducer = [](auto group) -> absl::StatusOr<std::unique_ptr<GradReducer>> {
      try {
        return std::make_unique<GradReducer>(std::move(group));
      } catch (const std::system_error& e) {
        return absl::ResourceExhaustedError(
            absl::StrCat("starting the gradient reduction's thread: ", e.what()));
      }
    };
    if (program.num_replicas() > 1) {
      const v1::StageProgram group_program = DataParallelGroupProgram(program);
      if (config_.data_parallel_group) {
        absl::StatusOr<std::unique_ptr<GroupCollectives>> group =
            config_.data_parallel_group(group_program, *cancelled);
        RETURN_IF_ERROR(WithPrefix(group.status(), "connecting the data-parallel group"));
        ASSIGN_OR_RETURN(reducer, start_reducer(*std::move(group)));
      } else {
        if (!transport_factory_) {
          return absl::FailedPreconditionError("this worker has no transport for data parallelism");
        }
        absl::StatusOr<std::unique_ptr<Transport>> group =
            transport_factory_(group_program, *cancelled);
        RETURN_IF_ERROR(WithPrefix(group.status(), "connecting the data-parallel group"));
        ASSIGN_OR_RETURN(reducer, start_reducer(*std::move(group)));
      }
    }
    if (cancelled->load()) return absl::AbortedError("aborted while connecting");
    std::unique_ptr<StageCompute> compute;
    if (config_.compute) {
      ASSIGN_OR_RETURN(compute, config_.compute(program));
    } else {
      ASSIGN_OR_RETURN(compute,
                       CpuStageCompute::Create(program, StageExecutor::MicroBatchSlots(program)));
    }
    absl::StatusOr<std::unique_ptr<StageExecutor>> ex = StageExecutor::Create(
        program, std::move(data), std::move(transport), std::move(compute), std::move(reducer));
    if (ex.ok()) (*ex)->set_fault(config_.fault);
    if (!ex.ok() || program.restore().job_id().empty()) return ex;
    // Resume: parameters and optimizer state by global name from the checkpoint, or from the
    // workers that kept them when the job's previous run was aborted (peer recovery).
    std::map<std::string, std::string> tensors;
    const bool weights_only = program.restore().weights_only();
    const bool from_peers = program.restore().peers_size() > 0;
    if (from_peers) {
      RETURN_IF_ERROR(FetchPeerState(program.restore(), (*ex)->RestoreNames(weights_only),
                                     own_kept.get(), config_.read_peer_state, &tensors));
    } else {
      if (!tensor_source_) {
        return absl::FailedPreconditionError("this worker cannot read checkpoints");
      }
      RETURN_IF_ERROR(
          tensor_source_(program.restore(), (*ex)->RestoreNames(weights_only), &tensors));
    }
    absl::Status restored = (*ex)->Restore(
        [&](const std::string& name) -> absl::StatusOr<absl::Span<const uint8_t>> {
          auto it = tensors.find(name);
          if (it == tensors.end()) {
            return absl::NotFoundError(absl::StrCat("tensor ", name, " was not fetched"));
          }
          return absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(it->second.data()),
                                           it->second.size());
        },
        weights_only);
    RETURN_IF_ERROR(restored);
    spdlog::info("job {} rank {}: restored {} tensors of {} after step {} from {}", job,
                 program.rank(), tensors.size(), program.restore().job_id(),
                 StepNumber(program.restore().step()),
                 from_peers ? "the workers that kept them" : "its checkpoint");
    return ex;
  };
  absl::StatusOr<std::unique_ptr<StageExecutor>> executor = build();
  if (!executor.ok()) {
    {
      absl::MutexLock lock(&mu_);
      RETURN_IF_ERROR(EndConfigureLocked(job, generation));
    }
    spdlog::warn("configure of job {} rank {} failed: {}", job, program.rank(),
                 executor.status().ToString());
    // The worker is idle now: what the partial build and a replaced stage touched goes back.
    ReleaseHeapIfIdle("a failed configure");
    return absl::Status(executor.status().code(),
                        absl::StrCat("configure of job ", job, " rank ", program.rank(), ": ",
                                     executor.status().message()));
  }

  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(EndConfigureLocked(job, generation));
  v1::ConfigureResponse resp;
  resp.set_parameter_count((*executor)->parameter_count());
  resp.set_parameter_bytes((*executor)->parameter_bytes());
  std::string held;
  for (const v1::StageChunk& c : program.chunks()) {
    absl::StrAppend(&held, held.empty() ? "" : ", ", "stage ", c.stage(), "/", program.num_stages(),
                    " layers [", c.layer_begin(), ", ", c.layer_end(), ")");
  }
  spdlog::info("configured job {} rank {}: {}; {} actions, {} parameters", job, program.rank(),
               held, program.actions_size(), resp.parameter_count());
  stage_ = std::make_unique<Stage>(
      Stage{job, *std::move(executor), StagesOf(program), program.attempt()});
  last_step_ = -1;
  return resp;
}

absl::Status StageManager::EndConfigureLocked(const std::string& job, uint64_t generation) {
  const bool current = generation_ == generation;
  if (current) {
    configuring_job_.clear();
    configure_cancelled_.reset();
  }
  if (!current || shut_down_) {
    return absl::AbortedError(
        absl::StrCat("configure of job ", job, " was aborted or replaced by a newer program"));
  }
  return absl::OkStatus();
}

absl::StatusOr<StageExecutor*> StageManager::BeginStepLocked(const std::string& job_id,
                                                             int32_t attempt) {
  if (shut_down_) return absl::UnavailableError("worker is shutting down");
  if (stage_ == nullptr || stage_->job_id != job_id) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id, " is not configured on this worker",
                     stage_ == nullptr ? std::string(" (it holds no job)")
                                       : absl::StrCat(" (it holds job ", stage_->job_id, ")")));
  }
  if (stage_->attempt != attempt) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", job_id, ": the call is for attempt ", attempt, ", but this worker runs attempt ",
        stage_->attempt, " (a late call from an earlier run of the job)"));
  }
  if (step_running_) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id, ": a step is already running on this worker"));
  }
  step_running_ = true;
  return stage_->executor.get();  // kept alive until step_running_ is false
}

absl::StatusOr<StageExecutor*> StageManager::BeginStep(
    const std::string& job_id, int32_t attempt, int64_t step,
    std::optional<ScopedLogContext>* log_context) {
  absl::MutexLock lock(&mu_);
  const bool holds = stage_ != nullptr && stage_->job_id == job_id;
  log_context->emplace(
      LogContext{.job = job_id, .stage = holds ? stage_->stages : "", .step = step});
  return BeginStepLocked(job_id, attempt);
}

absl::Status StageManager::ApplyStep(const v1::ApplyStepRequest& request) {
  std::optional<ScopedLogContext> log_context;
  ASSIGN_OR_RETURN(StageExecutor * executor,
                   BeginStep(request.job_id(), request.attempt(), request.step(), &log_context));
  absl::Status s = executor->ApplyStep(request.step(), request.learning_rate(),
                                       request.grad_scale(), request.skip());
  absl::MutexLock lock(&mu_);
  step_running_ = false;
  return s;
}

absl::StatusOr<v1::StepReport> StageManager::RunStep(const std::string& job_id, int64_t step,
                                                     v1::StepMode mode, int32_t attempt,
                                                     const v1::ApplyStepRequest* apply_first) {
  std::optional<ScopedLogContext> log_context;
  ASSIGN_OR_RETURN(StageExecutor * executor, BeginStep(job_id, attempt, step, &log_context));
  // The previous step's update first (the coordinator folds its ApplyStep into this call).
  absl::Status applied = absl::OkStatus();
  const auto update_start = std::chrono::steady_clock::now();
  if (apply_first != nullptr) {
    if (apply_first->job_id() != job_id || apply_first->step() >= step) {
      applied = absl::InvalidArgumentError(
          absl::StrCat("run of step ", StepNumber(step), " of job ", job_id,
                       ": apply_first is step ", StepNumber(apply_first->step()), " of job '",
                       apply_first->job_id(), "'; expected an earlier step of the same job"));
    } else {
      applied = executor->ApplyStep(apply_first->step(), apply_first->learning_rate(),
                                    apply_first->grad_scale(), apply_first->skip());
    }
  }
  const int64_t update_us = std::chrono::duration_cast<std::chrono::microseconds>(
                                std::chrono::steady_clock::now() - update_start)
                                .count();
  absl::StatusOr<v1::StepReport> report =
      applied.ok() ? executor->RunStep(step, mode) : absl::StatusOr<v1::StepReport>(applied);
  if (report.ok() && apply_first != nullptr) report->set_update_us(update_us);
  if (!report.ok() && report.status().code() != absl::StatusCode::kAborted) {
    spdlog::error("{} step failed: {}", mode == v1::STEP_MODE_EVAL ? "validation" : "training",
                  report.status().ToString());
  }
  absl::MutexLock lock(&mu_);
  step_running_ = false;
  if (report.ok() && mode == v1::STEP_MODE_TRAIN) last_step_ = step;
  // The job's new run trains: every worker of it was configured, so no one reads the state
  // kept of the previous run any more.
  if (report.ok() && kept_ != nullptr) kept_.reset();
  return report;
}

absl::Status StageManager::SaveCheckpoint(
    const std::string& job_id, int64_t step,
    const std::function<absl::Status(const std::vector<StageExecutor::StateTensor>&)>& write,
    int32_t attempt) {
  std::optional<ScopedLogContext> log_context;
  ASSIGN_OR_RETURN(StageExecutor * executor, BeginStep(job_id, attempt, step, &log_context));
  absl::Status s;
  if (executor->has_pending_gradients()) {
    s = absl::FailedPreconditionError(
        absl::StrCat("job ", job_id, ": checkpoint of step ", step,
                     " requested while gradients are pending (ApplyStep first)"));
  } else {
    absl::StatusOr<std::vector<StageExecutor::StateTensor>> tensors = executor->CheckpointTensors();
    s = tensors.ok() ? write(*tensors) : tensors.status();
  }
  absl::MutexLock lock(&mu_);
  step_running_ = false;
  return s;
}

absl::Status StageManager::Abort(const std::string& job_id, const std::string& reason,
                                 std::optional<int64_t> retain_step,
                                 const v1::ApplyStepRequest* retain_apply) {
  if (job_id.empty()) return absl::InvalidArgumentError("abort: job_id is empty");
  ScopedLogContext log_context({.job = job_id});
  std::unique_ptr<Stage> old;
  bool cancelled_configure = false;
  {
    absl::MutexLock lock(&mu_);
    if (configuring_job_ == job_id) {
      CancelConfigureLocked();
      cancelled_configure = true;
    }
    if (stage_ != nullptr && stage_->job_id == job_id) old = TakeStageLocked();
    if (!retain_step.has_value() && kept_ != nullptr && kept_->job_id() == job_id) {
      spdlog::info("dropping the state kept of job {} after step {}", job_id,
                   StepNumber(kept_->step()));
      kept_.reset();
    }
  }
  const bool dropped = old != nullptr;
  if (dropped || cancelled_configure) {
    spdlog::info("aborted job {}{}{}", job_id, reason.empty() ? "" : ": ", reason);
  }
  // Peer recovery: keep the stage's state for the job's next run (outside the lock: a copy).
  if (old != nullptr && retain_step.has_value()) {
    std::shared_ptr<const KeptState> kept;
    StageExecutor& executor = *old->executor;
    // The RunStep that would have applied the step's update never came: apply it here.
    if (retain_apply != nullptr && retain_apply->step() == *retain_step &&
        executor.pending_step() == *retain_step &&
        executor.KeepableStateStep() == *retain_step - 1) {
      const absl::Status applied =
          executor.ApplyStep(retain_apply->step(), retain_apply->learning_rate(),
                             retain_apply->grad_scale(), retain_apply->skip());
      if (!applied.ok()) {
        spdlog::warn("job {}: applying step {}'s update to keep the state failed: {}", job_id,
                     StepNumber(*retain_step), applied.ToString());
      }
    }
    const int64_t at = executor.KeepableStateStep();
    if (at != *retain_step) {
      spdlog::info(
          "job {}: keeps no state for peer recovery: asked for the state after step {}, "
          "and this worker's is {}",
          job_id, StepNumber(*retain_step),
          at < 0 ? std::string("none whole") : absl::StrCat("after step ", StepNumber(at)));
    } else {
      absl::StatusOr<std::vector<StageExecutor::StateTensor>> tensors =
          executor.CheckpointTensors();
      absl::StatusOr<std::shared_ptr<const KeptState>> copy =
          tensors.ok() ? KeptState::Copy(job_id, at, *tensors)
                       : absl::StatusOr<std::shared_ptr<const KeptState>>(tensors.status());
      if (copy.ok()) {
        kept = *std::move(copy);
        spdlog::info("job {}: keeps its state after step {} ({} bytes) for peer recovery", job_id,
                     StepNumber(at), kept->bytes());
      } else {
        spdlog::warn("job {}: cannot keep its state for peer recovery: {}", job_id,
                     copy.status().ToString());
      }
    }
    old.reset();  // before the lock: the executor's memory goes first
    absl::MutexLock lock(&mu_);
    // A newer Configure of another job meanwhile wins.
    if (kept != nullptr && (configuring_job_.empty() || configuring_job_ == job_id) &&
        (stage_ == nullptr || stage_->job_id == job_id)) {
      kept_ = std::move(kept);
    }
  }
  old.reset();
  if (dropped) ReleaseHeapIfIdle("dropping the stage");
  return absl::OkStatus();
}

void StageManager::ReleaseHeapIfIdle(const char* what) {
  if (!config_.release_heap) return;
  {
    absl::MutexLock lock(&mu_);
    // A job or profile starting meanwhile would only fault the memory back in.
    if (!BusyReasonLocked().empty() || shut_down_) return;
  }
  const HeapRelease r = config_.release_heap();
  const int64_t returned = r.resident_before_bytes - r.resident_after_bytes;
  if (returned >= (int64_t{1} << 20)) {
    spdlog::info("idle after {}: returned {} MiB of free heap to the OS, resident {} -> {} MiB",
                 what, returned >> 20, r.resident_before_bytes >> 20, r.resident_after_bytes >> 20);
  }
}

void StageManager::AbortStep(const std::string& job_id, const std::string& reason) {
  absl::MutexLock lock(&mu_);
  if (configuring_job_ == job_id) CancelConfigureLocked();
  if (stage_ == nullptr || stage_->job_id != job_id) return;
  stage_->executor->Abort();
  spdlog::info("aborted the step of job {}: {}", job_id, reason);
}

absl::Status StageManager::ReadState(
    const std::string& job_id, int64_t step, const std::vector<std::string>& names,
    const std::function<absl::Status(const std::vector<StageExecutor::StateTensor>&)>& write) {
  std::shared_ptr<const KeptState> kept;
  {
    absl::MutexLock lock(&mu_);
    kept = kept_;
  }
  if (kept == nullptr || !kept->Holds(job_id, step)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this worker keeps no state of job ", job_id, " after step ", StepNumber(step),
        kept == nullptr ? std::string(" (it keeps none)")
                        : absl::StrCat(" (it keeps job ", kept->job_id(), " after step ",
                                       StepNumber(kept->step()), ")")));
  }
  return write(kept->Select(names));
}

void StageManager::Shutdown() {
  std::unique_ptr<Stage> old;
  {
    absl::MutexLock lock(&mu_);
    shut_down_ = true;
    if (probe_ != nullptr) probe_->Cancel();
    if (!configuring_job_.empty()) CancelConfigureLocked();
    old = TakeStageLocked();
  }
}

v1::WorkerStatus StageManager::GetStatus() const {
  absl::MutexLock lock(&mu_);
  v1::WorkerStatus s;
  s.set_worker_id(worker_id_);
  s.set_version(kVersion);
  s.set_device(config_.device);
  s.set_last_step(last_step_);
  if (stage_ != nullptr) {
    s.set_state(v1::BUSY);
    s.set_job_id(stage_->job_id);
    s.set_stage(stage_->executor->program().chunks(0).stage());
  } else if (!configuring_job_.empty()) {
    s.set_state(v1::BUSY);
    s.set_job_id(configuring_job_);
  } else {
    s.set_state(v1::IDLE);
  }
  return s;
}

void StageManager::set_worker_id(const std::string& id) {
  absl::MutexLock lock(&mu_);
  worker_id_ = id;
}

StageManager::Snapshot StageManager::GetSnapshot() const {
  absl::MutexLock lock(&mu_);
  Snapshot s;
  if (stage_ != nullptr) {
    s.state = v1::BUSY;
    s.job_id = stage_->job_id;
  } else if (!configuring_job_.empty()) {
    s.state = v1::BUSY;
    s.job_id = configuring_job_;
  }
  return s;
}

absl::StatusOr<std::vector<v1::LayerProfile>> StageManager::ProfileLayers(
    const v1::JobSpec& spec, const std::vector<int>& layers, int repeats, ProfilePasses passes) {
  const v1::JobSpec full = WithDefaults(spec);
  if (absl::Status s = ValidateJobSpec(full); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("profile: ", s.message()));
  }
  for (int layer : layers) {
    if (const int64_t need = EstimateLayerBytes(full, layer); need > memory_bytes_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "profile: layer ", layer, " needs at least ", need, " bytes (", need >> 20,
          " MiB), but this worker has ", memory_bytes_, " bytes (", memory_bytes_ >> 20, " MiB)"));
    }
  }
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return absl::UnavailableError("profile: the worker is shutting down");
    if (const std::string busy = BusyReasonLocked(); !busy.empty()) {
      return absl::FailedPreconditionError(absl::StrCat("profile: the worker is busy (", busy,
                                                        "); a profile needs the device to itself"));
    }
    profiling_ = true;
  }
  absl::StatusOr<std::vector<v1::LayerProfile>> out =
      config_.compute ? ProfileLayersOn(full, layers, repeats, config_.compute, passes)
                      : worker::ProfileLayers(full, layers, repeats, passes);
  {
    absl::MutexLock lock(&mu_);
    profiling_ = false;
  }
  if (out.ok()) {
    spdlog::info("profiled {} layer(s) of a {} model at micro-batch {}{}", out->size(),
                 full.model().arch(), full.pipeline().micro_batch_size(),
                 passes == ProfilePasses::kAll ? "" : " (forward and backward only)");
  }
  ReleaseHeapIfIdle("a layer profile");
  return out;
}

std::string StageManager::BusyReasonLocked() const {
  if (stage_ != nullptr) return absl::StrCat("job ", stage_->job_id);
  if (!configuring_job_.empty()) return absl::StrCat("job ", configuring_job_);
  if (profiling_) return "a layer profile";
  if (probe_ != nullptr) return "a link probe";
  return "";
}

absl::StatusOr<v1::ProbeLinkResponse> StageManager::ProbeLink(const v1::ProbeLinkRequest& request) {
  ASSIGN_OR_RETURN(LinkProbeOptions options, LinkProbeOptionsFrom(request));
  if (!transport_factory_) {
    return absl::FailedPreconditionError("probe link: this worker has no transport");
  }
  // A "cuda" probe times NCCL between device buffers, as a cuda job moves its tensors.
  const bool cuda = options.device == "cuda";
  if (cuda && (DeviceKind(config_.device) != "cuda" || !config_.device_buffers)) {
    return absl::FailedPreconditionError(
        absl::StrCat("probe link: device cuda was asked of a ", config_.device,
                     " worker (the probe times the data plane of the workers' own device kind)"));
  }
  LinkProbe probe(options);
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return absl::UnavailableError("probe link: the worker is shutting down");
    if (const std::string busy = BusyReasonLocked(); !busy.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "probe link: the worker is busy (", busy, "); a link probe needs the device to itself"));
    }
    probe_ = &probe;
  }
  // The same program fields a job's transport is connected from.
  v1::StageProgram program;
  program.set_job_id("link-probe");
  program.set_rank(options.rank);
  program.set_num_ranks(2);
  program.set_rendezvous_prefix(request.rendezvous_prefix());
  program.mutable_spec()->set_device(options.device);  // which transport the factory connects
  if (cuda) program.mutable_spec()->mutable_pipeline()->set_transport(options.transport);
  absl::StatusOr<LinkProbeResult> result = probe.Run(
      [&](const std::atomic<bool>& cancelled) { return transport_factory_(program, cancelled); },
      cuda ? config_.device_buffers : nullptr);
  {
    absl::MutexLock lock(&mu_);
    probe_ = nullptr;
  }
  if (!result.ok()) {
    spdlog::warn("{}", result.status().ToString());
    return result.status();
  }
  spdlog::info("probed the {} link as rank {} under {}: {} size(s), {} B one way in {:.1f} us{}",
               !cuda                         ? "Gloo"
               : options.transport == "gloo" ? "host-staged Gloo"
                                             : "NCCL",
               options.rank, request.rendezvous_prefix(), result->samples.size(),
               result->samples.front().bytes(), result->samples.front().one_way_seconds() * 1e6,
               result->allreduce_seconds.empty()
                   ? std::string()
                   : absl::StrCat("; all-reduce of ", options.allreduce_bytes, " B in ",
                                  result->allreduce_seconds.front(), " s"));
  v1::ProbeLinkResponse out;
  for (v1::LinkSample& s : result->samples) *out.add_samples() = std::move(s);
  for (double t : result->allreduce_seconds) out.add_allreduce_seconds(t);
  return out;
}

}  // namespace tandem::worker
