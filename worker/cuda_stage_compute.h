// CudaStageCompute: the StageCompute of a CUDA device. Each chunk of the worker's program is a
// cuda::GpuStage (worker/backend/cuda/gpu_stage.h) of the spec's architecture, a GpuGpt (gpt)
// or a GpuLlama (llama), holding the chunk's layer range on the device, with its fp32 master
// weights, gradients and AdamW moments, bf16 compute copies of the GEMM weights (precision bf16)
// and pooled activation slots; activations and gradients between stages are device buffers (the
// NCCL transport moves them; two chunks of this worker hand them over in device memory, no copy
// through the host).
//
// Semantics match the CPU backend's (CpuStageCompute): the same parameter names, initial
// values and checkpoint tensors (so a checkpoint moves between CPU and GPU jobs), the loss as
// summed cross-entropy / loss normalizer, the tied wte's two copies summed by the executor.
// The split backward (I, then W) keeps each micro-batch's output gradients from I to W, so
// W's weight gradients can fill a zero-bubble schedule's bubble. gpt and llama models with
// AdamW only (the spec validation says so first).
//
// Recomputation (pipeline.recompute full, an R in the program) is per stage here, not per
// layer as on the CPU: the F of a recomputed micro-batch runs without saving and keeps only
// its input buffer (on device; the first stage keeps nothing, its tokens are the caller's);
// the R runs the stage's saving forward again from it, at once, wherever the R stands (an R
// right before its backward too), so between the R and the backward the micro-batch holds the
// stage's whole working set (the plan counts it so for cuda). The arithmetic is the saving
// forward's own, so the backward computes what it would have without recomputation.
//
// Every call makes the worker's device current on the calling thread (gRPC may call from any
// thread) and returns when the device is done, so that the transport may read the outputs.
// The header names no CUDA type (the device is reached through worker/backend/cuda/device.h
// and gpu_stage.h), so that main.cc includes it without the CUDA headers.
// Thread-safety: as StageCompute.
#ifndef TANDEM_WORKER_CUDA_STAGE_COMPUTE_H_
#define TANDEM_WORKER_CUDA_STAGE_COMPUTE_H_

#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "tandem/v1/common.pb.h"
#include "worker/stage_compute.h"

namespace tandem::worker {
namespace cuda {
class GpuStage;  // worker/backend/cuda/gpu_stage.h
}  // namespace cuda

// "cuda:N" -> N, or INVALID_ARGUMENT naming the text.
absl::StatusOr<int> ParseCudaDevice(absl::string_view device);

// `bytes` zeroed bytes of memory on CUDA device `device`, outside any compute (a link probe's
// messages). RESOURCE_EXHAUSTED when the device has not that much free.
absl::StatusOr<StageBufferPtr> NewDeviceBuffer(int device, size_t bytes);

class CudaStageCompute final : public StageCompute {
 public:
  class BufferPool;  // reused micro-batch buffers (cuda_stage_compute.cc)

  // The stages of every chunk of a program that ValidateStageProgram accepted, on CUDA device
  // `device`. INVALID_ARGUMENT for a model or optimizer the backend does not run;
  // FAILED_PRECONDITION without the device; RESOURCE_EXHAUSTED when it does not fit.
  static absl::StatusOr<std::unique_ptr<CudaStageCompute>> Create(const v1::StageProgram& program,
                                                                  int device);
  ~CudaStageCompute() override;

  std::string device() const override;
  absl::StatusOr<StageBufferPtr> NewBuffer(const std::vector<int64_t>& shape) override;
  absl::StatusOr<double> Forward(int chunk, int mb, StageBufferPtr input,
                                 const MicroBatchData& data, bool save,
                                 StageBufferPtr* output) override;
  absl::Status Backward(int chunk, int mb, v1::ActionKind kind, StageBufferPtr grad_output,
                        StageBufferPtr* grad_input) override;
  bool recomputes() const override { return true; }
  absl::StatusOr<double> ForwardKeepingInput(int chunk, int mb, StageBufferPtr input,
                                             const MicroBatchData& data,
                                             StageBufferPtr* output) override;
  absl::Status Recompute(int chunk, int mb, const MicroBatchData& data, bool at_backward) override;
  int64_t last_device_us(int chunk) const override {
    return last_device_us_[static_cast<size_t>(chunk)];
  }
  // An R's: the kept input and the refilled slot at once; 0 after a backward.
  size_t LastCallPeakSavedBytes(int chunk) const override {
    return last_call_peak_[static_cast<size_t>(chunk)];
  }
  bool runs_chunks_concurrently() const override { return true; }
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
  // Data parallelism: each chunk's gradients are one device buffer, reduced as one bucket at
  // the chunk's REDUCE_GRAD (NCCL on the group's stream; no per-layer hook, so the reduction
  // follows the backward rather than overlapping it). The spans are DEVICE memory, for the
  // NCCL group collectives only. Sharded optimizer state is not supported (LayerParameters
  // stays UNIMPLEMENTED; the spec validation refuses it first).
  int num_layers(int chunk) const override;
  absl::StatusOr<std::vector<absl::Span<float>>> LayerGradients(int chunk, int layer) override;

 private:
  CudaStageCompute() = default;
  absl::Status Use() const;  // makes device_ current on this thread
  // F of `chunk` for `mb` from device `input` (null on the first stage): Forward's body, also
  // the R's saving forward from a kept input.
  absl::StatusOr<double> ForwardFrom(int chunk, int mb, const float* input,
                                     const MicroBatchData& data, bool save, StageBufferPtr* output);
  // (stage, tensor index) of every tied copy, in TiedGradients() order.
  std::vector<std::pair<size_t, size_t>> TiedCopies() const;

  int device_ = 0;
  int64_t activation_elements_ = 0;      // B * T * C
  std::vector<int64_t> last_device_us_;  // per chunk
  std::vector<size_t> last_call_peak_;   // per chunk: LastCallPeakSavedBytes
  std::vector<std::unique_ptr<cuda::GpuStage>> stages_;
  // (chunk, micro-batch) -> the input its F kept for its R (null on the first stage, whose
  // input is the tokens). An entry means "recomputed, not yet recomputed back".
  // Guarded by kept_mu_ (two chunks' calls may run at once).
  mutable absl::Mutex kept_mu_;
  std::map<std::pair<int, int>, StageBufferPtr> kept_inputs_ ABSL_GUARDED_BY(kept_mu_);
  std::shared_ptr<BufferPool> pool_;
  int64_t parameter_count_ = 0;
  std::vector<StaticMemory> static_memory_;
  // Host copies behind the latest CheckpointTensors() (stable addresses).
  std::deque<std::vector<float>> host_f32_;
  std::deque<int64_t> host_steps_;
};

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_CUDA_STAGE_COMPUTE_H_
