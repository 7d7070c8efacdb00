// The stage executor: runs one stage's lowered action list (RECV_F/F/SEND_F/RECV_B/B/SEND_B
// over the step's micro-batches). A training step has two phases: RunStep(TRAIN) accumulates
// the gradients and reports their squared norm; the coordinator combines the norms of all
// stages and calls ApplyStep with the clipping scale (or skip, when the global norm is not
// finite). RunStep(EVAL) runs the forward-only program over fixed validation windows. No gRPC
// here: the gRPC adapter and the in-process tests drive it through the same interface.
//
// Per step and micro-batch mb, the sample indices are step*G + mb*B + i (G = B * M, the
// global batch), so the data does not depend on the partition or on M. The last stage reports
// the step loss: the sum over micro-batches of each one's cross-entropy divided by G.
//
// Thread-safety: RunStep is called by one thread at a time (a second concurrent call gets
// FAILED_PRECONDITION); Abort() may be called from any thread, and makes a running or later
// RunStep return ABORTED. After a failed or aborted step the executor refuses further steps
// (its gradients and transport are in an unknown state): drop it and configure again.
#ifndef TANDEM_WORKER_EXECUTOR_H_
#define TANDEM_WORKER_EXECUTOR_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "tandem/v1/common.pb.h"
#include "worker/data/corpus.h"
#include "worker/model/layer.h"
#include "worker/model/optimizer.h"
#include "worker/transport/transport.h"

namespace tandem::worker {

// Static checks of a stage program (INVALID_ARGUMENT with a message naming the field):
// ranks and stages, the layer range against the model, batch sizes, and the action list
// (every action on this stage, micro-batches in range, each micro-batch's F, B and transfers
// exactly once and in an order that can run). Cheap; call it before building anything.
absl::Status ValidateStageProgram(const v1::StageProgram& program);

// Micro-batches per step: program.micro_batches, or the spec's when the program leaves it 0.
int MicroBatchesOf(const v1::StageProgram& program);

// Whether the stage reads the data (it holds the embedding or the head).
bool StageNeedsCorpus(const v1::StageProgram& program);

class StageExecutor {
 public:
  // Builds the stage's layers (initialised from spec.seed by global layer index) and its
  // optimizer. `data` is required when StageNeedsCorpus(program) (its validation split too
  // when the program has eval actions); `transport` is required when num_ranks > 1 (rank ==
  // stage; peers are stage - 1 and stage + 1, and the last stage for tied parameters).
  static absl::StatusOr<std::unique_ptr<StageExecutor>> Create(
      const v1::StageProgram& program, Dataset data, std::unique_ptr<Transport> transport);
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

  // One tensor of the stage's state for a checkpoint, viewed in place (valid until the next
  // RunStep/ApplyStep/Restore). Names are global: "<parameter name>" and
  // "<parameter name>.<optimizer key>"; a tied parameter and its state are listed by the first
  // stage only.
  struct StateTensor {
    std::string name;
    std::string dtype;  // "F32" or "I64"
    std::vector<int64_t> shape;
    const void* data = nullptr;
    size_t bytes = 0;
  };
  std::vector<StateTensor> CheckpointTensors();
  bool has_pending_gradients() const { return pending_step_ >= 0; }
  // The names Restore() reads (every parameter copy, tied ones included, and their state).
  std::vector<std::string> RestoreNames(bool weights_only = false);
  // Loads the state from `lookup` (name -> bytes): INVALID_ARGUMENT naming a tensor whose size
  // disagrees with this stage's; the lookup's own error (e.g. NOT_FOUND) otherwise. Refused
  // while gradients are pending.
  using TensorLookup =
      std::function<absl::StatusOr<absl::Span<const uint8_t>>(const std::string& name)>;
  // With `weights_only` the optimizer state is left fresh.
  absl::Status Restore(const TensorLookup& lookup, bool weights_only = false);

  // Unblocks a running RunStep (it returns ABORTED). Thread-safe, idempotent.
  void Abort();

  const v1::StageProgram& program() const { return program_; }
  int64_t parameter_count() const { return parameter_count_; }
  int64_t parameter_bytes() const { return parameter_count_ * static_cast<int64_t>(sizeof(float)); }
  // The stage's parameters in layer order (for tests and checkpoints); not thread-safe with
  // RunStep.
  std::vector<Parameter*> Parameters();

 private:
  struct MicroBatch;

  StageExecutor(const v1::StageProgram& program, Dataset data,
                std::unique_ptr<Transport> transport);
  // Makes the copies of every tied parameter equal to their summed gradient: locally when
  // both copies are here, else by exchanging with the stage holding the other copy.
  absl::Status SumTiedGradients();
  absl::Status RunAction(const v1::Action& action, int64_t step, bool eval);
  absl::Status Forward(int mb, int64_t step, bool eval);
  absl::Status Backward(int mb);
  void Account(int mb);

  const v1::StageProgram program_;
  const int stage_;
  const int num_stages_;
  const int micro_batches_;
  const int eval_micro_batches_;    // 0 when the program has no eval actions
  const int64_t micro_batch_size_;  // B
  const bool gpt_;                  // arch gpt (else mlp_lm)
  const int64_t seq_len_;           // T (gpt; 1 for mlp_lm)
  const int64_t window_;            // tokens a sample reads (T + 1, or context + 1)
  const int64_t d_model_;           // D: width of the activations between stages
  const bool first_;
  const bool last_;
  std::vector<std::unique_ptr<Layer>> layers_;
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<WindowSampler> sampler_;      // training split; null on middle stages
  std::unique_ptr<WindowSampler> val_sampler_;  // validation split, when evaluating
  std::vector<int32_t> windows_;                // (B, window) scratch for sampling
  int64_t parameter_count_ = 0;

  // Step state, used by the RunStep thread only.
  std::vector<MicroBatch> mbs_;   // one per micro-batch
  std::vector<size_t> mb_bytes_;  // bytes held by each micro-batch, as last accounted
  size_t live_bytes_ = 0;
  size_t peak_bytes_ = 0;
  double loss_ = 0.0;
  int64_t pending_step_ = -1;  // the step whose gradients await ApplyStep

  std::atomic<bool> running_{false};
  std::atomic<bool> aborted_{false};
  std::atomic<bool> broken_{false};
  // Declared last so it is destroyed first, while the send buffers in mbs_ still exist.
  std::unique_ptr<Transport> transport_;
};

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_EXECUTOR_H_
