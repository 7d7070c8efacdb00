// The stage executor: runs one worker's lowered action list over the step's micro-batches.
// A worker holds one or more pipeline stages ("chunks": the interleaved and V-shaped schedules
// place several on one worker); every action names its global stage. Compute actions are F,
// B (full backward), and the split backward of the zero-bubble schedules: I (input gradient,
// which the previous stage waits for) and W (weight gradients, later). Transfers are SEND_F,
// RECV_F, SEND_B and RECV_B to and from the rank holding the neighbouring stage; between two
// stages of this worker the activation or gradient is handed over in memory.
//
// The compute (layers, parameters, optimizer state and what forwards save for backwards) is a
// StageCompute (worker/stage_compute.h): the CPU backend by default, or one given to Create.
//
// A training step has two phases: RunStep(TRAIN) accumulates the gradients and reports their
// squared norm; the coordinator combines the norms of all workers and calls ApplyStep with
// the clipping scale (or skip, when the global norm is not finite). RunStep(EVAL) runs the
// forward-only program over fixed validation windows. No gRPC here: the gRPC adapter and the
// in-process tests drive it through the same interface.
//
// Per step and micro-batch mb, the sample indices are step*G + r*M*B + mb*B + i (G = R * M * B,
// the global batch; r the replica of R), so the data does not depend on the partition, the
// schedule, M or R. The last stage reports its replica's share of the step loss: the sum over
// its micro-batches of each one's cross-entropy / G (the coordinator adds the replicas').
//
// Data parallelism (R > 1): the program has a REDUCE_GRAD per stage after its last weight
// gradient. During that last B (or W) each layer's gradients are handed to the GradReducer as
// soon as the backward has added them, and at REDUCE_GRAD the rest; the step waits for the
// reductions after its last action, before the tied gradients are summed and the norm taken,
// so that every replica reports the same norm and applies the same update. With sharded
// optimizer state (optimizer.shard_state) the buckets are reduce-scattered instead, the norm
// covers this replica's segments (the coordinator adds every replica's), each replica updates
// its segments and ApplyStep all-gathers the parameters; a checkpoint gathers the moments.
//
// Memory: what a micro-batch holds (received input, saved contexts, gradients) is freed as
// soon as the program has no further use for it: the forward input after F, the contexts
// after B (or, split, what only I needed after I and the rest after W). A micro-batch the
// program recomputes (pipeline.recompute: full, an R action) keeps only its stage's input
// from F to R (StageCompute::ForwardKeepingInput), and its contexts from R on. The executor
// accounts these live activation bytes and reports their peak per step. A sent buffer is owned by
// the transport until the end of the step (Gloo has no non-blocking completion test) and is
// reported separately as send-buffer bytes.
//
// Overlapped pairs (DualPipe's F;B, Action.overlap_with_next): where the compute can run two
// chunks at once (StageCompute::runs_chunks_concurrently: the CUDA backend, each chunk its own
// stream), the pair's two compute actions run at the same time, the second on a thread of its
// own, when they touch no micro-batch in common; elsewhere one after the other. The live-bytes
// accounting they share is under a mutex.
//
// Thread-safety: RunStep is called by one thread at a time (a second concurrent call gets
// FAILED_PRECONDITION); Abort() may be called from any thread, and makes a running or later
// RunStep return ABORTED. After a failed or aborted step the executor refuses further steps
// (its gradients and transport are in an unknown state): drop it and configure again.
#ifndef TANDEM_WORKER_EXECUTOR_H_
#define TANDEM_WORKER_EXECUTOR_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "tandem/v1/common.pb.h"
#include "worker/data/corpus.h"
#include "worker/fault_injection.h"
#include "worker/grad_reducer.h"
#include "worker/model/layer.h"
#include "worker/stage_compute.h"
#include "worker/stage_program.h"
#include "worker/transport/transport.h"

namespace tandem::worker {

// The program checks and queries (ValidateStageProgram, MicroBatchesOf, StageNeedsCorpus,
// TransferPeers) are in worker/stage_program.h, the test-only fault (InjectedFault) in
// worker/fault_injection.h; both are included here for the executor's users.

class StageExecutor {
 public:
  // Builds the worker's layers on the CPU backend (CpuStageCompute: initialised from spec.seed
  // by global layer index) and its optimizer. `data` is required when StageNeedsCorpus(program)
  // (its validation split too when the program has eval actions); `transport` is required when
  // num_ranks > 1 (its rank is program.rank; peers are the ranks of program.stage_ranks), and
  // moves the buffers of the compute's device.
  static absl::StatusOr<std::unique_ptr<StageExecutor>> Create(
      const v1::StageProgram& program, Dataset data, std::unique_ptr<Transport> transport);
  // The same on a given compute backend, built for `program` with MicroBatchSlots(program)
  // slots. With program.num_replicas R > 1, `reducer` is required: the data-parallel group's
  // (rank program.replica of R), which sums the gradients at the REDUCE_GRAD actions.
  static absl::StatusOr<std::unique_ptr<StageExecutor>> Create(
      const v1::StageProgram& program, Dataset data, std::unique_ptr<Transport> transport,
      std::unique_ptr<StageCompute> compute, std::unique_ptr<GradReducer> reducer = nullptr);
  // Micro-batch slots per chunk a compute backend needs for `program`.
  static size_t MicroBatchSlots(const v1::StageProgram& program);
  ~StageExecutor();

  // TRAIN: runs the action list for `step`; the gradients stay pending for ApplyStep(step)
  // (FAILED_PRECONDITION if an earlier step's are still pending). EVAL: runs the eval program
  // (FAILED_PRECONDITION if the program has none); gradients are untouched. Errors name the
  // stage and the action, e.g. "stage 1: RECV_F mb 3 from stage 0: ...".
  absl::StatusOr<v1::StepReport> RunStep(int64_t step, v1::StepMode mode = v1::STEP_MODE_TRAIN);

  // Applies the pending gradients of `step`, multiplied by grad_scale, with learning_rate, and
  // zeroes them; with `skip` drops them and changes nothing else. FAILED_PRECONDITION when
  // `step`'s gradients are not pending; INVALID_ARGUMENT for a non-finite or negative rate or
  // a scale outside (0, 1]. Not thread-safe with RunStep (the caller serialises them).
  absl::Status ApplyStep(int64_t step, float learning_rate, float grad_scale = 1.0f,
                         bool skip = false);

  // The stage's state for a checkpoint, in host memory, viewed in place (valid until the next
  // RunStep/ApplyStep/Restore). Names are global: "<parameter name>" and
  // "<parameter name>.<optimizer key>"; a tied parameter and its state are listed by the first
  // stage only. A device backend's copy can fail (its error).
  using StateTensor = worker::StateTensor;
  absl::StatusOr<std::vector<StateTensor>> CheckpointTensors();
  bool has_pending_gradients() const { return pending_step_ >= 0; }
  int64_t pending_step() const { return pending_step_; }  // -1: none
  // Peer recovery: the step after which this worker's parameters and optimizer state are,
  // whole (what a surviving worker keeps when its run is aborted): -1 when there is none to
  // keep, i.e. before any step or restore, after an update that failed part-way, or with the
  // optimizer state sharded (each replica holds a segment only). A failed or aborted RunStep
  // leaves it as it was: a step changes gradients only; ApplyStep changes the state.
  int64_t KeepableStateStep() const {
    return shard_state_ || state_torn_ ? -1 : last_applied_step_;
  }
  // The names Restore() reads (every parameter copy, tied ones included, and their state).
  std::vector<std::string> RestoreNames(bool weights_only = false);
  // Loads the state from `lookup` (name -> bytes): INVALID_ARGUMENT naming a tensor whose size
  // disagrees with this stage's; the lookup's own error (e.g. NOT_FOUND) otherwise. Refused
  // while gradients are pending.
  using TensorLookup = worker::TensorLookup;
  // With `weights_only` the optimizer state is left fresh.
  absl::Status Restore(const TensorLookup& lookup, bool weights_only = false);

  // Unblocks a running RunStep (it returns ABORTED). Thread-safe, idempotent.
  void Abort();

  const v1::StageProgram& program() const { return program_; }
  int64_t parameter_count() const { return compute_->parameter_count(); }
  int64_t parameter_bytes() const {
    return parameter_count() * static_cast<int64_t>(sizeof(float));
  }
  // "cpu" or "cuda:N".
  std::string device() const { return compute_->device(); }
  // The stage's parameters in layer order, when the backend keeps them on the host (for
  // tests); not thread-safe with RunStep.
  std::vector<Parameter*> Parameters() { return compute_->HostParameters(); }

  // Arms a test-only fault for later steps (see InjectedFault).
  void set_fault(const InjectedFault& fault) { fault_ = fault; }

 private:
  struct MicroBatch;
  // One stage held by this worker.
  struct Chunk {
    int stage = 0;
    int layer_begin = 0;
    int layer_end = 0;
    bool first = false;  // holds the embedding (stage 0)
    bool last = false;   // holds the head (the last stage)
    int prev = -1;       // chunk index of stage - 1 when it is on this worker, else -1
    int next = -1;       // chunk index of stage + 1 when it is on this worker, else -1
    int prev_rank = -1;  // rank of stage - 1 (-1 on the first stage)
    int next_rank = -1;  // rank of stage + 1 (-1 on the last stage)
  };

  // Create after ValidateStageProgram(program) passed (once).
  static absl::StatusOr<std::unique_ptr<StageExecutor>> CreateValidated(
      const v1::StageProgram& program, Dataset data, std::unique_ptr<Transport> transport,
      std::unique_ptr<StageCompute> compute, std::unique_ptr<GradReducer> reducer);
  StageExecutor(const v1::StageProgram& program, Dataset data, std::unique_ptr<Transport> transport,
                std::unique_ptr<StageCompute> compute, std::unique_ptr<GradReducer> reducer);

  // RunStep's phases, in order.
  // The request itself: a valid step and mode, and (TRAIN) a step after the last applied one
  // with no gradients pending. INVALID_ARGUMENT or FAILED_PRECONDITION.
  absl::Status CheckStepRequest(int64_t step, v1::StepMode mode) const;
  // The executor's state (checked once RunStep holds running_): ABORTED after Abort(),
  // FAILED_PRECONDITION after a failed step.
  absl::Status CheckRunnable() const;
  // Zeroes the step's loss and its activation and send-buffer accounting.
  void ResetStepCounters();
  // Runs the action list (the eval one with `eval`), adding each action's timing to `report`;
  // waits for the sends and frees the step's buffers.
  absl::Status RunActions(int64_t step, bool eval, v1::StepReport* report);
  // TRAIN only: sums the tied gradients, reports the gradient norm, and leaves the gradients
  // pending for ApplyStep(step).
  absl::Status FinishTrainingStep(int64_t step, v1::StepReport* report);
  // Where a step's report counts from.
  struct StepStart {
    int64_t bytes_sent = 0;
    int64_t bytes_received = 0;
    std::chrono::steady_clock::time_point time;
  };
  // Loss, transfer bytes, memory and times of the step.
  void FillReport(const StepStart& start, v1::StepReport* report) const;
  // Marks the executor broken, drops what the compute saved, and returns `s` (ABORTED if the
  // stage was aborted) prefixed with the stage and `what`.
  absl::Status FailStep(absl::Status s, absl::string_view what);
  // Makes the copies of every tied parameter equal to their summed gradient: locally when
  // both copies are here, else by exchanging with the worker holding the other copy.
  absl::Status SumTiedGradients();
  absl::Status RunAction(const v1::Action& action, int64_t step, bool eval);
  // Data parallelism: posts the reduction of `chunk`'s layer `layer` (once per step), and at
  // the chunk's REDUCE_GRAD every layer not posted yet, last first.
  absl::Status PostLayerReduction(int chunk, int layer);
  absl::Status PostChunkReduction(int chunk);
  // After the last action: waits for the reductions and stretches each REDUCE_GRAD's timing
  // over its reduction (from its first bucket's hand-over to its last one's end).
  absl::Status FinishReductions(v1::StepReport* report);
  // Sharded optimizer state, after the update: every parameter's segments from their owners.
  absl::Status GatherParameters();
  absl::Status Forward(int chunk, int mb, int64_t step, bool eval);
  // R: re-runs the forward of a micro-batch whose F kept only its layers' inputs, saving for
  // the backward, now or (recompute_at_backward_) layer by layer inside it (training only).
  absl::Status Recompute(int chunk, int mb);
  // B (input and weight gradients), I (input gradient only) or W (weight gradients of a
  // micro-batch whose I ran).
  absl::Status Backward(int chunk, int mb, v1::ActionKind kind);
  // Whether actions[i] and actions[i + 1] form an overlapped pair that runs at once here (see
  // the file comment), and running them so: both timed from one start, each to its own end.
  bool RunsConcurrently(const google::protobuf::RepeatedPtrField<v1::Action>& actions, int i,
                        int64_t step) const;
  absl::Status RunOverlappedPair(const google::protobuf::RepeatedPtrField<v1::Action>& actions,
                                 const std::vector<int>& next_recv, int i, int64_t step,
                                 v1::StepReport* report);
  // Before compute action i: posts the program's next receive (next_recv[i], if any); a
  // failure fails the step.
  absl::Status PostNextRecv(const google::protobuf::RepeatedPtrField<v1::Action>& actions,
                            const std::vector<int>& next_recv, int i);
  // After action `a` ran: its device time on `timing` (a compute action) and its micro-batch's
  // live bytes re-counted, with the compute's transient peak for R and the backwards.
  void AccountAction(const v1::Action& a, v1::ActionTiming* timing, bool eval);
  // The peer and tag of the receive `a` (RECV_F or RECV_B).
  struct RecvEnds {
    int peer = -1;
    uint64_t tag = 0;
  };
  RecvEnds RecvEndsOf(const v1::Action& a) const;
  // Posts the receive `a` into its micro-batch's buffer, unless it is already posted.
  absl::Status PostRecv(const v1::Action& a);
  MicroBatch& Mb(int chunk, int mb);
  // Re-counts the micro-batch's live bytes (its buffers and the compute's SavedBytes) into the
  // rank's and the chunk's live and peak bytes; `saved_during` > 0 is the compute's transient
  // peak for it inside the action just run (StageCompute::LastCallPeakSavedBytes).
  void Account(int chunk, int mb, size_t saved_during = 0);
  // Account for the neighbouring chunk whose output (F) or input gradient (B, I) an action
  // took over; while an overlapped pair runs on two threads, deferred until both end: the
  // other thread may be running that chunk, and reading its saved bytes then races with it
  // in the compute (a GpuStage's slot map).
  void AccountHandover(int chunk, int mb);
  // Moves a buffer that a posted send reads into the buffers kept until the step's end.
  StageBuffer& KeepForSend(StageBufferPtr b);
  std::string Where(const v1::Action& a) const;

  InjectedFault fault_;
  const v1::StageProgram program_;
  const int rank_;
  const int num_stages_;
  const int micro_batches_;
  const int eval_micro_batches_;    // 0 when the program has no eval actions
  const int64_t micro_batch_size_;  // B
  const bool decoder_;              // arch gpt or llama (else mlp_lm)
  const int64_t seq_len_;           // T (a decoder; 1 for mlp_lm)
  const int64_t window_;            // tokens a sample reads (T + 1, or context + 1)
  const int64_t d_model_;           // D: width of the activations between stages
  const int replica_;               // this worker's pipeline replica (0 without data parallelism)
  const int replicas_;              // R >= 1
  // optimizer.shard_state in effect (ZeRO stage 1): gradients are reduce-scattered, each
  // replica updates its segment of every parameter and ApplyStep all-gathers the rest.
  const bool shard_state_;
  const std::string prefix_;  // "stage 2" or "rank 1 (stages 1, 6)" for messages
  std::vector<Chunk> chunks_;
  // Per action of the training (eval) list: the first receive after it, or -1.
  std::vector<int> next_recv_;
  std::vector<int> eval_next_recv_;
  std::vector<int> chunk_of_stage_;  // per global stage: index into chunks_, or -1
  // chunk * mb_slots_ + micro-batch: the training program has an R for it, so its F keeps
  // only its layers' inputs (and, on the first and last stage, its tokens and targets) until
  // the R; and whether that R comes right before the micro-batch's backward (the next compute
  // action of this rank after it is its B or I), so that the backward recomputes one layer at
  // a time (StageCompute::Recompute's at_backward), keeping the tokens and targets until then.
  std::vector<bool> recomputed_;
  std::vector<bool> recompute_at_backward_;
  // Data parallelism: per chunk, the index of its last weight-gradient action (B or W) in the
  // training list, during which layers are posted as they finish, or -1; and which layers of
  // it are posted this step.
  std::vector<int> last_grad_action_;
  std::vector<std::vector<bool>> layer_posted_;
  bool holds_first_ = false;                    // some chunk holds the embedding
  bool holds_last_ = false;                     // some chunk holds the head
  std::unique_ptr<WindowSampler> sampler_;      // training split; null without first/last
  std::unique_ptr<WindowSampler> val_sampler_;  // validation split, when evaluating
  std::vector<int32_t> windows_;                // (B, window) scratch for sampling

  // Step state, used by the RunStep thread only.
  size_t mb_slots_ = 0;           // micro-batch slots per chunk
  std::vector<MicroBatch> mbs_;   // chunk * mb_slots_ + micro-batch
  std::vector<size_t> mb_bytes_;  // bytes held by each micro-batch, as last accounted
  // Guards the accounting below while an overlapped pair's two actions run.
  std::mutex account_mu_;
  bool pair_running_ = false;                           // an overlapped pair on two threads
  std::vector<std::pair<int, int>> deferred_accounts_;  // (chunk, mb) for after it
  size_t live_bytes_ = 0;
  size_t peak_bytes_ = 0;
  // Per chunk: live and peak activation bytes in the step.
  std::vector<size_t> chunk_live_bytes_;
  std::vector<size_t> chunk_peak_bytes_;
  std::vector<StageBufferPtr> send_buffers_;  // read by posted sends; freed after WaitSends
  size_t send_bytes_ = 0;
  double loss_ = 0.0;
  int64_t pending_step_ = -1;  // the step whose gradients await ApplyStep
  // The latest step whose update was applied (or skipped), or the restored checkpoint's step:
  // a training step at or before it is refused, so that a late or repeated RunStep can never
  // lead to a second update.
  int64_t last_applied_step_ = -1;
  bool state_torn_ = false;  // an update failed part-way: the state is no step's

  std::atomic<bool> running_{false};
  std::atomic<bool> aborted_{false};
  std::atomic<bool> broken_{false};
  std::unique_ptr<StageCompute> compute_;
  // The whole optimizer state gathered for the latest CheckpointTensors (sharded state only).
  std::vector<std::vector<float>> gathered_;
  // Its thread reads the compute's gradients: destroyed (joined) before the compute.
  std::unique_ptr<GradReducer> reducer_;
  // Declared last so it is destroyed first, while the send buffers in mbs_ still exist.
  std::unique_ptr<Transport> transport_;
};

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_EXECUTOR_H_
