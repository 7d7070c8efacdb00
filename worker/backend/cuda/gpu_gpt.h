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
// stage, nothing recomputed), for the micro-batch shape (B, T); further slots are allocated
// when more micro-batches are in flight and kept for reuse. PlanGpuGptMemory gives the figures
// without a device. cuBLAS's own workspace (inside its handle) is not counted.
//
// Errors: every call returns absl::Status / StatusOr; device failures come through the
// TANDEM_*_RETURN_IF_ERROR macros (never exit). After a device error the object should be
// dropped (its buffers may hold partial results).
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

namespace tandem::worker::cuda {

// Per-phase device times of the latest ForwardBackward and Step, from CUDA events on the
// model's stream, in milliseconds.
struct GpuGptTimes {
  float forward_ms = 0.0f;
  float backward_ms = 0.0f;
  float optimizer_ms = 0.0f;
};

class GpuGpt {
 public:
  // Validates `config`, allocates every buffer on the current device, initialises the
  // parameters (InitGpuGptParameters) and zeroes gradients and moments. INVALID_ARGUMENT for a
  // bad config, FAILED_PRECONDITION without a usable device, RESOURCE_EXHAUSTED when the
  // memory does not fit. `hyper.lr` is ignored (each Step passes its own).
  static absl::StatusOr<std::unique_ptr<GpuGpt>> Create(const GpuGptConfig& config,
                                                        const AdamWHyper& hyper);
  ~GpuGpt();
  GpuGpt(const GpuGpt&) = delete;
  GpuGpt& operator=(const GpuGpt&) = delete;

  bool has_embedding() const;
  bool has_head() const;

  // F of micro-batch `mb` (any int key, one Forward per key until its Backward): `tokens` (the
  // embedding's) and `targets` (the head's) are host arrays of B*T ids (row-major (B, T)) in
  // [0, V), checked before anything is enqueued (INVALID_ARGUMENT); `input` (a stage without
  // the embedding) and `output` (a stage without the head) are device arrays of (B, T, C)
  // floats. With `save`, what the backward needs stays in the micro-batch's slot, and on the
  // head stage the head's backward runs now with d loss = `grad_scale` per position. Returns
  // the micro-batch's SUMMED cross-entropy over its B*T positions on the head stage, else 0.
  // Waits for the device. FAILED_PRECONDITION when `mb` already has a saved forward.
  absl::StatusOr<double> Forward(int mb, const int32_t* tokens, const int32_t* targets,
                                 const float* input, float* output, float grad_scale, bool save);
  // B of `mb`: `dout` (device (B, T, C), a stage without the head) is d loss / d output;
  // writes d loss / d input into `din` (a stage without the embedding) and ADDS the parameter
  // gradients; frees the slot. INTERNAL when `mb` has no saved forward. Waits for the device.
  absl::Status Backward(int mb, const float* dout, float* din);
  // The split backward of zero-bubble schedules, B in two: BackwardInput (I) writes `din` as
  // Backward does and keeps, with the slot, each output gradient the weight gradients need;
  // BackwardWeight (W) then ADDS the parameter gradients, the same operations as Backward's,
  // and frees the slot. INTERNAL for I without a forward or twice, W without its I, and B
  // after I. Both wait for the device.
  absl::Status BackwardInput(int mb, const float* dout, float* din);
  absl::Status BackwardWeight(int mb);
  // Bytes held by `mb`'s saved forward (0 when none), with its output gradients between I
  // and W.
  size_t SavedBytes(int mb) const;
  // Returns every slot to the pool (after a failed step).
  void DropSaved();

  // The whole model (INVALID_ARGUMENT for a stage): Forward and Backward of one micro-batch,
  // ADDING into the gradients d(loss / accumulation)/d(params), where loss is the micro-batch's
  // mean cross-entropy over its B*T positions: over `accumulation` micro-batches the gradients
  // sum to those of the mean over all of them. Returns the micro-batch's mean loss.
  absl::StatusOr<float> ForwardBackward(const int32_t* tokens, const int32_t* targets,
                                        int64_t accumulation = 1);

  // The L2 norm of all gradients (the tied wte once), reduced in double. Waits for the device.
  absl::StatusOr<float> GradNorm();
  // The squared L2 norm of the gradients in double, the head's tied_copy left out unless
  // `include_tied_copy`. Waits for the device.
  absl::StatusOr<double> GradSquaredNorm(bool include_tied_copy);

  // One AdamW update of every parameter with learning rate `lr` of the gradients times
  // `grad_scale` (weight decay only where GpuGptTensor::decay), then zeroes the gradients and,
  // in kBf16, refreshes the compute copies. Returns the norm of the (unscaled) gradients before
  // the update. Waits for the device.
  absl::StatusOr<float> Step(float lr, float grad_scale = 1.0f);

  // Zeroes the gradients (without an update).
  absl::Status ZeroGradients();

  // Host copies of one tensor (index into layout()); `count` must equal its element count
  // (INVALID_ARGUMENT otherwise). SetParameter also refreshes its compute copy.
  absl::Status SetParameter(size_t index, const float* host, size_t count);
  absl::Status GetParameter(size_t index, float* host, size_t count) const;
  absl::Status GetGradient(size_t index, float* host, size_t count) const;
  // The AdamW moments of one tensor (host copies), and the update count every tensor shares.
  absl::Status GetMoments(size_t index, float* m, float* v, size_t count) const;
  absl::Status SetMoments(size_t index, const float* m, const float* v, size_t count);
  void set_steps(int64_t steps) { step_ = steps; }

  // Device access to one tensor's gradient (index into layout()), for the pipeline's tied
  // gradients: its address, adding `other` (device, same count) into it, copying it from
  // `other`.
  float* DeviceGradient(size_t index);
  absl::Status AddToGradient(size_t index, const float* other);
  absl::Status CopyGradientFrom(size_t index, const float* other);

  const GpuGptConfig& config() const { return config_; }
  const std::vector<GpuGptTensor>& layout() const { return layout_; }
  // Parameter count, the tied wte once.
  int64_t num_parameters() const { return static_cast<int64_t>(num_params_); }
  // What Create allocated (one activation slot), and the activation slots allocated so far.
  const GpuGptMemory& memory() const { return memory_; }
  size_t activation_slots() const;
  const GpuGptTimes& last_times() const { return times_; }
  int64_t steps() const { return step_; }

 private:
  struct Impl;  // device buffers, handles and the forward / backward passes (gpu_gpt.cc)
  GpuGpt();
  absl::Status CheckIndex(size_t index, size_t count) const;

  GpuGptConfig config_;
  AdamWHyper hyper_;
  std::vector<GpuGptTensor> layout_;
  size_t num_params_ = 0;
  GpuGptMemory memory_;
  GpuGptTimes times_;
  int64_t step_ = 0;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::worker::cuda

#endif  // TANDEM_WORKER_BACKEND_CUDA_GPU_GPT_H_
