// GpuGpt: the GPT-2 model of worker/model/gpt.h (embedding, L pre-LN blocks, head with a tied
// or untied LM head and cross-entropy), or one pipeline stage of it, trained on one CUDA device
// with the kernels of cuda_kernels.h: forward and backward of micro-batches, gradient
// accumulation, the gradient norm and AdamW (the formula of worker/model/optimizer.cc).
//
// A stage holds the layers [layer_begin, layer_end) of the global sequence [embedding (0),
// block_0 .. block_{L-1}, head (L+1)], as the CPU stage executor's layers do; the default range
// is the whole model. Forward(mb, ...) and Backward(mb, ...) run one micro-batch through the
// stage, in any interleaving a pipeline schedule needs: each micro-batch in flight keeps its
// saved activations in a slot taken from a pool at Forward and returned at Backward, so the
// memory follows the schedule's micro-batches in flight (GPipe M, 1F1B at most P). The head's
// backward runs at the end of a saving Forward (the loss's gradient is known then), so a slot
// keeps the (B, T, C) gradient of the head's input and never the (B, T, V) logits.
// ForwardBackward is the whole model's one-call path (benchmarks and tests).
//
// Parameters: one flat fp32 buffer of master weights in the CPU layers' order and shapes
// (GpuGptParameterLayout: the embedding's wte, wpe; per block the 12 tensors of
// GptBlock::Parameters(); the head's ln_f gain and bias and, when not tied, lm_head.weight).
// With tie_embeddings a stage holding both embedding and head has ONE wte, read by both; its
// gradient is the sum of what the CPU's two copies receive. A head stage without the embedding
// holds its own copy of wte (GpuGptTensor::tied_copy) whose gradient the pipeline must sum with
// the embedding stage's, as the CPU's tied copies. Initial values are bit-identical to the CPU
// layers' for the same seed (InitGpuGptParameters, tested without a GPU), and a test can also
// copy any values in (SetParameter).
//
// Precision: kFp32 runs every GEMM in fp32 (cuBLAS sgemm). kBf16 keeps fp32 master weights,
// gradients and optimizer state, and a bf16 compute copy of each GEMM weight (the blocks' four
// linears and the LM head), refreshed after each optimizer step; the GEMMs take bf16 operands
// and accumulate in fp32; LayerNorm, GELU, attention, softmax and the residual stream stay
// fp32, and the inputs of the linears are saved in bf16 for the weight gradients.
//
// Memory: Create allocates the parameters, gradients, optimizer moments, a workspace reused by
// every layer, and one activation slot (one micro-batch's saved activations, all layers of the
// stage; with selective_recompute, all but the attention probabilities and gelu(c_fc), which
// the backward rebuilds in the workspace), for the micro-batch shape (B, T); further slots are
// allocated when more micro-batches are in flight and kept for reuse. PlanGpuGptMemory gives the
// figures without a device. cuBLAS's own workspace (inside its handle) is not counted.
//
// The parameters, slots, optimizer and calls are GpuStage's (gpu_stage.h), shared with
// GpuLlama; this class is GPT-2's layers: LayerNorm, the fused c_attn, GELU, biases, wpe.
// Errors: as GpuStage (never exit; drop the object after a device error).
// Determinism: every reduction is in a fixed order except the token-embedding gradient, which
// scatters rows with atomicAdd (two positions holding the same token add in either order).
// Thread-safety: thread-compatible; one owner calls it at a time.
#ifndef TANDEM_WORKER_BACKEND_CUDA_GPU_GPT_H_
#define TANDEM_WORKER_BACKEND_CUDA_GPU_GPT_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/backend/cuda/adamw_hyper.h"
#include "worker/backend/cuda/gpu_gpt_layout.h"
#include "worker/backend/cuda/gpu_stage.h"

namespace tandem::worker::cuda {

using GpuGptTimes = GpuStageTimes;

// The calls (Forward, Backward, the split backward, Step, the tensor copies) are GpuStage's
// (gpu_stage.h); GpuGpt adds GPT-2's layers.
class GpuGpt final : public GpuStage {
 public:
  // Validates `config`, allocates every buffer on the current device, initialises the
  // parameters (InitGpuGptParameters) and zeroes gradients and moments. INVALID_ARGUMENT for a
  // bad config, FAILED_PRECONDITION without a usable device, RESOURCE_EXHAUSTED when the
  // memory does not fit. `hyper.lr` is ignored (each Step passes its own).
  static absl::StatusOr<std::unique_ptr<GpuGpt>> Create(const GpuGptConfig& config,
                                                        const AdamWHyper& hyper);
  ~GpuGpt() override;

  const GpuGptConfig& config() const { return config_; }

 private:
  struct Impl;  // the workspace and the passes over the blocks (gpu_gpt.cc)
  GpuGpt();
  void CarveWorkspace(uintptr_t base) override;
  absl::StatusOr<std::unique_ptr<Slot>> NewSlot() override;
  void CarveWeightGradInputs(Slot& slot, uintptr_t base) override;
  absl::Status ForwardPass(Slot& slot, float grad_scale) override;
  absl::StatusOr<const float*> BackwardPass(Slot& slot, const float* dout, bool split) override;
  absl::Status WeightPass(Slot& slot) override;
  // Selective recomputation: gelu(pre) into the workspace's act, as the forward made it.
  absl::Status RecomputeGelu(const float* pre);

  GpuGptConfig config_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::worker::cuda

#endif  // TANDEM_WORKER_BACKEND_CUDA_GPU_GPT_H_
