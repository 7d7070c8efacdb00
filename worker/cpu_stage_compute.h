// CpuStageCompute: the StageCompute of the CPU backend. Each chunk runs the layers of
// worker/model (gpt or mlp_lm, initialised from spec.seed by global layer index) on host
// tensors, one Optimizer (worker/model/optimizer.h) covers every chunk's parameters, and each
// micro-batch keeps one SavedContext per layer from its forward to its backward.
// Thread-safety: as StageCompute.
#ifndef TANDEM_WORKER_CPU_STAGE_COMPUTE_H_
#define TANDEM_WORKER_CPU_STAGE_COMPUTE_H_

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "tandem/v1/common.pb.h"
#include "worker/model/layer.h"
#include "worker/model/optimizer.h"
#include "worker/stage_compute.h"

namespace tandem::worker {

class CpuStageCompute final : public StageCompute {
 public:
  // The layers of every chunk of a program that ValidateStageProgram accepted, with `slots`
  // micro-batch slots per chunk; INVALID_ARGUMENT from the layers or the optimizer spec.
  static absl::StatusOr<std::unique_ptr<CpuStageCompute>> Create(const v1::StageProgram& program,
                                                                 size_t slots);

  std::string device() const override { return "cpu"; }
  absl::StatusOr<StageBufferPtr> NewBuffer(const std::vector<int64_t>& shape) override;
  absl::StatusOr<double> Forward(int chunk, int mb, StageBufferPtr input,
                                 const MicroBatchData& data, bool save,
                                 StageBufferPtr* output) override;
  bool recomputes() const override { return true; }
  absl::StatusOr<double> ForwardKeepingInput(int chunk, int mb, StageBufferPtr input,
                                             const MicroBatchData& data,
                                             StageBufferPtr* output) override;
  absl::Status Recompute(int chunk, int mb, const MicroBatchData& data, bool at_backward) override;
  size_t LastCallPeakSavedBytes(int chunk) const override {
    return last_call_peak_[static_cast<size_t>(chunk)];
  }
  bool runs_chunks_concurrently() const override { return concurrent_chunks_; }
  // Lets the executor run two chunks' compute calls at once (a second thread, beyond the
  // worker's --threads): the calls of different chunks share no state here. For the tests of
  // the executor's overlapped pairs; off by default.
  void AllowConcurrentChunks() {
    concurrent_chunks_ = true;
    running_.assign(chunks_.size(), std::thread::id());
  }
  // With AllowConcurrentChunks, over every instance: how many times SavedBytes read a chunk
  // while another thread was inside a compute call of that chunk. A device backend's per-chunk
  // state (a GpuStage's slot map) may be changing then, so the executor must not; its tests
  // require 0.
  static int64_t ReadsOfARunningChunk() { return reads_of_running_.load(); }
  absl::Status Backward(int chunk, int mb, v1::ActionKind kind, StageBufferPtr grad_output,
                        StageBufferPtr* grad_input) override;
  size_t SavedBytes(int chunk, int mb) const override;
  void DropSaved() override;
  int64_t parameter_count() const override { return parameter_count_; }
  StaticMemory static_memory(int chunk) const override { return static_memory_[chunk]; }
  std::vector<TiedGradient> TiedGradients() override;
  absl::Status SumLocalTiedGradients() override;
  absl::Status AddToTiedGradient(size_t index, StageBuffer& other) override;
  absl::StatusOr<GradStats> GradientStats(bool count_tied) override;
  absl::Status Apply(float learning_rate, float grad_scale, bool skip) override;
  absl::StatusOr<std::vector<StateTensor>> CheckpointTensors(bool list_tied) override;
  std::vector<std::string> RestoreNames(bool weights_only) override;
  absl::Status Restore(const TensorLookup& lookup, bool weights_only,
                       absl::string_view where) override;
  std::vector<Parameter*> HostParameters() override;
  int num_layers(int chunk) const override { return static_cast<int>(chunks_[chunk].size()); }
  absl::StatusOr<std::vector<absl::Span<float>>> LayerGradients(int chunk, int layer) override;
  absl::StatusOr<std::vector<absl::Span<float>>> LayerParameters(int chunk, int layer) override;
  void set_layer_done_hook(LayerDoneHook hook) override { layer_done_ = std::move(hook); }

 private:
  CpuStageCompute() = default;
  std::vector<SavedContext>& Saved(int chunk, int mb) {
    return saved_[static_cast<size_t>(chunk) * slots_ + static_cast<size_t>(mb)];
  }
  // The tied parameters' copies here, by name (each name's in layer order), and flattened.
  std::map<std::string, std::vector<Parameter*>> TiedByName();
  std::vector<Parameter*> TiedCopies();
  // LayerGradients / LayerParameters: the gradient (or value) spans of a layer.
  absl::StatusOr<std::vector<absl::Span<float>>> LayerSpans(int chunk, int layer, bool values);

  std::vector<std::vector<std::unique_ptr<Layer>>> chunks_;  // the layers of each chunk
  std::unique_ptr<Optimizer> optimizer_;
  std::vector<ElementRange> shard_;  // per HostParameters() entry when sharded; else empty
  size_t slots_ = 0;
  std::vector<std::vector<SavedContext>> saved_;  // chunk * slots_ + mb: one per layer
  // chunk * slots_ + mb: the per-layer checkpoints ForwardKeepingInput kept for Recompute
  // (each layer's input, (B, T, D) or (B, D); empty for a first layer that reads tokens),
  // whether they are kept, and, for a micro-batch armed by Recompute(at_backward), the data
  // its backward recomputes with.
  struct Checkpoint {
    std::vector<Tensor> inputs;  // one per layer
    bool kept = false;
    bool at_backward = false;
    MicroBatchData data;
    size_t Bytes() const;
  };
  Checkpoint& CheckpointOf(int chunk, int mb) {
    return checkpoints_[static_cast<size_t>(chunk) * slots_ + static_cast<size_t>(mb)];
  }
  // B or I of an armed micro-batch: each layer's forward recomputed from its checkpoint just
  // before that layer's backward.
  absl::Status RecomputingBackward(int chunk, int mb, bool split, Tensor g, Tensor& grad_input);
  std::vector<Checkpoint> checkpoints_;
  std::vector<size_t> last_call_peak_;  // per chunk: LastCallPeakSavedBytes
  // Raises the chunk's LastCallPeakSavedBytes to what `mb` holds now.
  void NotePeak(int chunk, int mb) {
    size_t& peak = last_call_peak_[static_cast<size_t>(chunk)];
    peak = std::max(peak, SavedBytes(chunk, mb));
  }
  bool concurrent_chunks_ = false;
  // With concurrent_chunks_: per chunk, the thread inside one of its compute calls (a default
  // id when none), set for the call's duration by a Running.
  class Running;
  mutable std::mutex running_mu_;
  std::vector<std::thread::id> running_;
  static std::atomic<int64_t> reads_of_running_;
  int64_t parameter_count_ = 0;
  std::vector<StaticMemory> static_memory_;
  LayerDoneHook layer_done_;
};

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_CPU_STAGE_COMPUTE_H_
