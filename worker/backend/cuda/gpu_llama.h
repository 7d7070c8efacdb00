// GpuLlama: the llama model of worker/model/llama.h (token embedding, L pre-RMSNorm blocks
// with rotary grouped-query attention and a SwiGLU MLP, no biases, head with a tied or untied
// LM head and cross-entropy), or one pipeline stage of it, trained on one CUDA device. The
// stage's driving, parameters, optimizer and tensor copies are GpuStage's (gpu_stage.h), shared
// with GpuGpt; this class is llama's layers, with the kernels of gpu_llama_kernels.h (RMSNorm,
// RoPE, SwiGLU) and cuda_kernels.h (linears, grouped-query attention, cross-entropy).
//
// Parameters: the CPU layers' names, order, shapes and initial values (GpuLlamaParameterLayout,
// InitGpuLlamaParameters, tested without a GPU), so a job's losses agree between backends and
// checkpoints move between them.
// Precision: kFp32 runs every GEMM in fp32. kBf16 keeps fp32 master weights, gradients and
// moments and a bf16 compute copy of each GEMM weight (the seven linears per block and the LM
// head); the GEMMs take bf16 operands and accumulate in fp32; the linears' inputs are saved in
// bf16 for the weight gradients and their output gradients rounded to bf16 for the GEMMs;
// RMSNorm, RoPE (fp32 cos / sin tables on the device), attention, SwiGLU, softmax and the
// residual stream stay fp32.
// Saved activations per block and token (fp32 unless bf16 says; KVD = KV * hd): x, rms_1(x)
// (bf16 in kBf16) and its rstd, the rotated q and k, v, the (B, NH, T, T) probabilities, the
// merged heads (bf16 in kBf16), x1, rms_2(x1) (bf16) and its rstd, gate, up and silu(gate) * up
// (bf16). The split backward's I adds the input gradient and the RMSNorm gains' gradients (as
// the CPU's BackwardInput) and keeps the seven linears' output gradients for W.
// Determinism: every reduction is in a fixed order except the token-embedding gradient, which
// scatters rows with atomicAdd.
// Thread-safety: thread-compatible; one owner calls it at a time.
#ifndef TANDEM_WORKER_BACKEND_CUDA_GPU_LLAMA_H_
#define TANDEM_WORKER_BACKEND_CUDA_GPU_LLAMA_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/backend/cuda/adamw_hyper.h"
#include "worker/backend/cuda/gpu_llama_layout.h"
#include "worker/backend/cuda/gpu_stage.h"

namespace tandem::worker::cuda {

class GpuLlama final : public GpuStage {
 public:
  // Validates `config`, allocates every buffer on the current device, initialises the
  // parameters (InitGpuLlamaParameters) and the RoPE tables, and zeroes gradients and moments.
  // INVALID_ARGUMENT for a bad config, FAILED_PRECONDITION without a usable device,
  // RESOURCE_EXHAUSTED when the memory does not fit. `hyper.lr` is ignored.
  static absl::StatusOr<std::unique_ptr<GpuLlama>> Create(const GpuLlamaConfig& config,
                                                          const AdamWHyper& hyper);
  ~GpuLlama() override;

  const GpuLlamaConfig& config() const { return config_; }

 private:
  struct Impl;  // the workspace and the passes over the blocks (gpu_llama.cc)
  GpuLlama();
  void CarveWorkspace(uintptr_t base) override;
  absl::StatusOr<std::unique_ptr<Slot>> NewSlot() override;
  void CarveWeightGradInputs(Slot& slot, uintptr_t base) override;
  absl::Status ForwardPass(Slot& slot, float grad_scale) override;
  absl::StatusOr<const float*> BackwardPass(Slot& slot, const float* dout, bool split) override;
  absl::Status WeightPass(Slot& slot) override;

  GpuLlamaConfig config_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::worker::cuda

#endif  // TANDEM_WORKER_BACKEND_CUDA_GPU_LLAMA_H_
