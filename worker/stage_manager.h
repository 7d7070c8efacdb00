// StageManager: owns the one stage this worker runs for a job, and the rules for replacing,
// stepping and aborting it. It is the worker's business logic behind the StageWorker gRPC
// adapter (stage_service.h), and has no gRPC dependency: tests drive it in-process.
//
// Lifecycle: Configure(program) builds the corpus (cached across configures of the same data),
// the layers and the transport (through the injected TransportFactory), replacing any stage
// held before; RunStep runs one step of the configured job; Abort(job) unblocks a running step
// or a configure in progress, drops the stage and returns the worker to idle.
//
// Thread-safety: every method is thread-safe. Configure and RunStep block (for the connect and
// the step); Abort and GetStatus never wait for more than the abort of a running step.
#ifndef TANDEM_WORKER_STAGE_MANAGER_H_
#define TANDEM_WORKER_STAGE_MANAGER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/log_context.h"
#include "tandem/v1/worker.pb.h"
#include "worker/data/corpus.h"
#include "worker/executor.h"
#include "worker/heap_release.h"
#include "worker/link_probe.h"
#include "worker/peer_state.h"
#include "worker/profiler.h"
#include "worker/transport/group_collectives.h"
#include "worker/transport/transport.h"

namespace tandem::worker {

// Connects the data plane for `program` (num_ranks > 1). Must give up promptly (with any
// error) once `cancelled` becomes true.
using TransportFactory = std::function<absl::StatusOr<std::unique_ptr<Transport>>(
    const v1::StageProgram& program, const std::atomic<bool>& cancelled)>;

// Connects the collectives of a data-parallel group: `group_program` is
// DataParallelGroupProgram (rank = this replica, num_ranks = R, the group's rendezvous prefix).
// A CUDA worker's are NCCL on device memory; without one, the ring over a transport from the
// TransportFactory (host memory). Must give up promptly once `cancelled` becomes true.
using GroupFactory = std::function<absl::StatusOr<std::unique_ptr<GroupCollectives>>(
    const v1::StageProgram& group_program, const std::atomic<bool>& cancelled)>;

// Fetches the named tensors of a checkpoint into `out` (name -> raw bytes), e.g. from the
// coordinator's Checkpoints service.
using TensorSource = std::function<absl::Status(const v1::CheckpointRef& checkpoint,
                                                const std::vector<std::string>& names,
                                                std::map<std::string, std::string>* out)>;

// The worker's typed, validated configuration (from flags in main.cc).
struct WorkerConfig {
  // "cpu" or "cuda:N": reported in status; a program whose spec.device is another kind is
  // refused (FAILED_PRECONDITION).
  std::string device = "cpu";
  // The device's compute backend (jobs and layer profiles); null: the CPU's (CpuStageCompute,
  // profiled by ProfileLayers on the Layers directly).
  ComputeFactory compute;
  // Buffers in the device's memory (a "cuda" link probe's messages); null: none (a CPU
  // worker, whose probes use host memory).
  ProbeBufferAllocator device_buffers;
  // The data-parallel group's collectives; null: the ring over the TransportFactory's
  // transport (host memory, a CPU worker's).
  GroupFactory data_parallel_group;
  std::string data_root = ".";  // data.path of a "file" source resolves under it
  InjectedFault fault;          // test-only (--test-fail-at); none by default
  // Bytes a stage may take (parameters, gradients, optimizer state and one micro-batch's
  // activations, estimated before anything is allocated); 0 = the machine's physical memory.
  int64_t memory_bytes = 0;
  // Called whenever the worker goes idle (a job's stage dropped, a layer profile done) and
  // nothing else has started: ReleaseFreeHeap where the process keeps its heap (--keep_heap:
  // never trimmed while a job runs), so that an idle worker does not hold its last job's
  // peak; null: nothing (malloc trims by itself).
  std::function<HeapRelease()> release_heap;
  // Peer recovery: reads state that other workers kept (StageWorker.ReadState over gRPC);
  // null: a restore from peers uses this worker's own kept state only.
  PeerStateReader read_peer_state;
};

// A lower bound of what the program's stages take on a worker: 16 bytes per parameter (fp32
// value, gradient, AdamW's two moments) plus 4 bytes per activation element of one
// micro-batch per layer (micro_batch_size x seq_len (or 1) x d_model). The program must have
// passed ValidateStageProgram.
int64_t EstimateStageBytes(const v1::StageProgram& program);
// The same for one global layer of `spec`'s model (what ProfileLayers builds at a time).
int64_t EstimateLayerBytes(const v1::JobSpec& spec, int layer);

class StageManager {
 public:
  StageManager(WorkerConfig config, TransportFactory transport_factory,
               TensorSource tensor_source = nullptr);
  // Aborts and drops any stage.
  ~StageManager();

  StageManager(const StageManager&) = delete;
  StageManager& operator=(const StageManager&) = delete;

  // INVALID_ARGUMENT for a bad program, RESOURCE_EXHAUSTED when its stages cannot fit the
  // worker's memory (EstimateStageBytes over WorkerConfig::memory_bytes, checked before any
  // allocation), NOT_FOUND for missing data, UNAVAILABLE /
  // DEADLINE_EXCEEDED when the transport cannot connect, ABORTED when an Abort (or a newer
  // Configure) overtook it, UNAVAILABLE after Shutdown().
  absl::StatusOr<v1::ConfigureResponse> Configure(const v1::StageProgram& program);

  // FAILED_PRECONDITION when `job_id` is not the configured job or a step is running;
  // otherwise what the executor returns (ABORTED when aborted meanwhile; FAILED_PRECONDITION
  // for a training step already applied, i.e. a duplicate or out-of-order step, or one
  // before the pending step's apply; INVALID_ARGUMENT for a negative step).
  // `attempt` must be the configured program's (StageProgram.attempt): a call from an earlier
  // run of the job gets FAILED_PRECONDITION.
  // With `apply_first` (RunStepRequest.apply_first) the previous step's update is applied
  // first, as ApplyStep would; its failure is the call's, and the step does not run.
  absl::StatusOr<v1::StepReport> RunStep(const std::string& job_id, int64_t step,
                                         v1::StepMode mode = v1::STEP_MODE_TRAIN,
                                         int32_t attempt = 0,
                                         const v1::ApplyStepRequest* apply_first = nullptr);

  // Applies (or skips) the pending update of `step`; same preconditions as RunStep, then
  // what StageExecutor::ApplyStep returns.
  absl::Status ApplyStep(const v1::ApplyStepRequest& request);

  // Hands the stage's state after `step` to `write` (while no step runs). FAILED_PRECONDITION
  // when the job is not configured, a step is running or gradients are pending.
  absl::Status SaveCheckpoint(
      const std::string& job_id, int64_t step,
      const std::function<absl::Status(const std::vector<StageExecutor::StateTensor>&)>& write,
      int32_t attempt = 0);

  // Times and measures single layers at a job's shape (worker/profiler.h). FAILED_PRECONDITION
  // while a job is configured or configuring here, or another profile or a link probe runs:
  // a profile must have the device to itself. INVALID_ARGUMENT for a spec that does not
  // validate; RESOURCE_EXHAUSTED for a layer bigger than the worker's memory. `passes`: all,
  // or only the forward and backward (a speed check).
  absl::StatusOr<std::vector<v1::LayerProfile>> ProfileLayers(
      const v1::JobSpec& spec, const std::vector<int>& layers, int repeats,
      ProfilePasses passes = ProfilePasses::kAll);

  // Times the link to one other worker (worker/link_probe.h): connects rank request.rank() of
  // a 2-rank transport under request.rendezvous_prefix() through the transport factory, as a
  // job of request.device() does (the probe program's spec.device and, for "cuda",
  // spec.pipeline.transport say which; a "cuda" probe's messages are
  // WorkerConfig::device_buffers), and tears it down afterwards.
  // INVALID_ARGUMENT naming the bad field; FAILED_PRECONDITION while the worker is busy (as
  // for ProfileLayers), when it has no transport, or for a "cuda" probe on a worker of
  // another kind;
  // UNAVAILABLE after Shutdown(), which also cancels a running probe (ABORTED); otherwise
  // what LinkProbe::Run returns (DEADLINE_EXCEEDED when the peer does not show up in time).
  absl::StatusOr<v1::ProbeLinkResponse> ProbeLink(const v1::ProbeLinkRequest& request);

  // Idempotent; OK for a job this worker does not hold. INVALID_ARGUMENT for an empty id.
  // With `retain_step` (peer recovery) the worker keeps a copy of the stage's state when it is
  // the state after that step (StageExecutor::KeepableStateStep), for ReadState and for its
  // own next Configure of the job; a state kept earlier of the job stays when there is no
  // stage to take. Without it, any state kept of the job is dropped too. A kept state is
  // dropped as well by a Configure of another job and by the first step of the job's next run.
  // `retain_apply` is retain_step's update (AbortRequest.retain_apply): a worker whose state is
  // one step short, with that step's gradients pending, applies it first.
  absl::Status Abort(const std::string& job_id, const std::string& reason,
                     std::optional<int64_t> retain_step = std::nullopt,
                     const v1::ApplyStepRequest* retain_apply = nullptr);

  // Unblocks the job's running step (it returns ABORTED), and makes every later step of this
  // stage fail so, but keeps the stage until Abort (a step relay's relaying worker, whose
  // forwarded call failed: the coordinator aborts the gang next). No-op for another job.
  void AbortStep(const std::string& job_id, const std::string& reason);

  // Hands the kept state's tensors among `names` (only those it holds) to `write`.
  // FAILED_PRECONDITION when this worker keeps no state of `job_id` after `step`.
  absl::Status ReadState(
      const std::string& job_id, int64_t step, const std::vector<std::string>& names,
      const std::function<absl::Status(const std::vector<StageExecutor::StateTensor>&)>& write);

  // Aborts everything and refuses new work (for process shutdown).
  void Shutdown();

  // worker_id is filled in from set_worker_id (the registration).
  v1::WorkerStatus GetStatus() const;
  void set_worker_id(const std::string& id);

  // For heartbeats: BUSY with the job id while a job is configured (or configuring).
  struct Snapshot {
    v1::WorkerState state = v1::IDLE;
    std::string job_id;
  };
  Snapshot GetSnapshot() const;

 private:
  struct Stage {
    std::string job_id;
    std::unique_ptr<StageExecutor> executor;
    std::string stages;   // its stage indices, for log lines ("1", "0,2")
    int32_t attempt = 0;  // StageProgram.attempt
  };

  // Aborts the stage, waits for its step to end, and hands it to the caller (to destroy
  // outside the lock).
  std::unique_ptr<Stage> TakeStageLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CancelConfigureLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Checks that `job_id` is configured and idle and marks a step running; the returned
  // executor stays alive until step_running_ is cleared.
  absl::StatusOr<StageExecutor*> BeginStepLocked(const std::string& job_id, int32_t attempt)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // BeginStepLocked under the lock, with the log context set to the job, its stages and `step`
  // (-1: none) for the caller's scope.
  absl::StatusOr<StageExecutor*> BeginStep(const std::string& job_id, int32_t attempt, int64_t step,
                                           std::optional<ScopedLogContext>* log_context);
  // Ends the Configure of `generation`: aborted where a newer program replaced it or the worker
  // shut down meanwhile.
  absl::Status EndConfigureLocked(const std::string& job, uint64_t generation)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // With config_.release_heap and nothing configured, configuring or profiling: calls it,
  // logging what it returned after `what`.
  void ReleaseHeapIfIdle(const char* what);
  // What keeps the device from a profile or a link probe ("job j-1", "a layer profile", "a
  // link probe"), or empty when the worker is idle.
  std::string BusyReasonLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job's data, reused across configures that ask for the same data and window.
  absl::StatusOr<Dataset> DatasetFor(const v1::StageProgram& program);

  const WorkerConfig config_;
  const TransportFactory transport_factory_;
  const TensorSource tensor_source_;
  const int64_t memory_bytes_;  // config_.memory_bytes, or the physical memory

  mutable absl::Mutex mu_;
  std::string worker_id_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<Stage> stage_ ABSL_GUARDED_BY(mu_);
  // Peer recovery: the state kept of an aborted run (Abort with retain_step), if any.
  std::shared_ptr<const KeptState> kept_ ABSL_GUARDED_BY(mu_);
  bool step_running_ ABSL_GUARDED_BY(mu_) = false;
  int64_t last_step_ ABSL_GUARDED_BY(mu_) = -1;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  bool profiling_ ABSL_GUARDED_BY(mu_) = false;
  LinkProbe* probe_ ABSL_GUARDED_BY(mu_) = nullptr;  // the running link probe, if any
  // A Configure in progress: its job, generation and cancel flag. Abort or a newer Configure
  // bumps the generation so that the older one does not install its stage.
  std::string configuring_job_ ABSL_GUARDED_BY(mu_);
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  std::shared_ptr<std::atomic<bool>> configure_cancelled_ ABSL_GUARDED_BY(mu_);

  // The last dataset loaded, reused when a configure asks for the same data.
  absl::Mutex data_mu_;
  std::string data_key_ ABSL_GUARDED_BY(data_mu_);
  Dataset data_ ABSL_GUARDED_BY(data_mu_);
};

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_STAGE_MANAGER_H_
