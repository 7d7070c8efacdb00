// GpuStage: what every architecture's GPU pipeline stage shares (GpuGpt, gpu_gpt.h; GpuLlama,
// gpu_llama.h): one stage of a decoder [embedding (0), block_0 .. block_{L-1}, head (L+1)] on
// one CUDA device, holding the layers [layer_begin, layer_end), with
//  - the parameters: one flat fp32 buffer of master weights in the CPU layers' order (layout()),
//    their gradients and AdamW moments, and in kBf16 a bf16 compute copy of each GEMM weight,
//    refreshed after each optimizer step and each SetParameter;
//  - the micro-batch driving: Forward(mb, ...) and Backward(mb, ...) (or the split backward's
//    BackwardInput / BackwardWeight) in any interleaving a pipeline schedule needs, each
//    micro-batch in flight keeping its saved activations in a slot taken from a pool at
//    Forward and returned at Backward (slots are allocated on demand and kept); the head's
//    backward runs at the end of a saving Forward, so a slot keeps the (B, T, C) gradient of the
//    head's input, never the (B, T, V) logits;
//  - the optimizer (gradient norm, AdamW per tensor), the tied-embedding gradient plumbing, the
//    host copies of single tensors, and CUDA-event timings.
// An architecture supplies the passes over its layers (the protected hooks, implemented on the
// device in its .cc with gpu_stage_core.h) and its host half: config validation, layout,
// initial values and memory plan.
//
// Errors: every call returns absl::Status / StatusOr; device failures come through the
// TANDEM_*_RETURN_IF_ERROR macros (never exit). After a device error the object should be
// dropped (its buffers may hold partial results).
// Thread-safety: thread-compatible; one owner calls it at a time. The header names no CUDA
// type, so CUDA-free code (cuda_stage_compute.cc) holds stages through it.
#ifndef TANDEM_WORKER_BACKEND_CUDA_GPU_STAGE_H_
#define TANDEM_WORKER_BACKEND_CUDA_GPU_STAGE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/backend/cuda/adamw_hyper.h"
#include "worker/backend/cuda/gpu_stage_layout.h"

namespace tandem::worker::cuda {

// Per-phase device times of the latest forward, backward and Step, from CUDA events on the
// stage's stream, in milliseconds.
struct GpuStageTimes {
  float forward_ms = 0.0f;
  float backward_ms = 0.0f;
  float optimizer_ms = 0.0f;
};

class GpuStage {
 public:
  virtual ~GpuStage();
  GpuStage(const GpuStage&) = delete;
  GpuStage& operator=(const GpuStage&) = delete;

  bool has_embedding() const { return shape_.embedding; }
  bool has_head() const { return shape_.head; }

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
  // BackwardWeight (W) then ADDS the remaining parameter gradients, so that I then W adds what
  // B adds, and frees the slot. INTERNAL for I without a forward or twice, W without its I, and
  // B after I. Both wait for the device.
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

  // The L2 norm of all gradients (a tied embedding once), reduced in double. Waits.
  absl::StatusOr<float> GradNorm();
  // The squared L2 norm of the gradients in double, the head's tied_copy left out unless
  // `include_tied_copy`. Waits for the device.
  absl::StatusOr<double> GradSquaredNorm(bool include_tied_copy);

  // One AdamW update of every parameter with learning rate `lr` of the gradients times
  // `grad_scale` (weight decay only where GpuTensor::decay), then zeroes the gradients and,
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
  // Every gradient of the stage as one device buffer (the layout's offsets index it), for the
  // data-parallel all-reduce: one NCCL call per stage rather than one per tensor.
  float* DeviceGradients();
  size_t gradient_elements() const;
  absl::Status AddToGradient(size_t index, const float* other);
  absl::Status CopyGradientFrom(size_t index, const float* other);

  const std::vector<GpuTensor>& layout() const { return layout_; }
  // Parameter count, a tied embedding once.
  int64_t num_parameters() const { return static_cast<int64_t>(num_params_); }
  // What Create allocated (one activation slot), and the activation slots allocated so far.
  const GpuStageMemory& memory() const { return memory_; }
  size_t activation_slots() const;
  const GpuStageTimes& last_times() const { return times_; }
  int64_t steps() const { return step_; }

  // Internal to the backend, complete only in gpu_stage_core.h: the device state, and one
  // micro-batch's saved forward (each architecture derives its own).
  struct Core;
  struct Slot;

 protected:
  // The shape every call runs: B sequences of T tokens of width C, vocabulary V.
  struct Dims {
    int64_t batch = 0, seq = 0, d_model = 0, vocab = 0;
  };
  GpuStage();
  // For an architecture's Create, after its config is validated: allocates the parameters
  // (`layout`, initial values `init`), gradients, moments, compute copies, the workspace
  // (memory.workspace bytes, carved by CarveWorkspace) and one activation slot (NewSlot), on
  // the current device. FAILED_PRECONDITION without a device, RESOURCE_EXHAUSTED when it does
  // not fit.
  absl::Status Init(const Dims& dims, GpuPrecision precision, const GpuStageShape& shape,
                    std::vector<GpuTensor> layout, const GpuStageMemory& memory,
                    const std::vector<float>& init, const AdamWHyper& hyper);

  // ---- The architecture's passes (device work enqueued on core().stream).
  // Carves the workspace allocation at `base` (memory().workspace bytes), setting the shared
  // buffers of core().
  virtual void CarveWorkspace(uintptr_t base) = 0;
  // A new slot with memory().activations bytes allocated and carved (Slot's pointers set).
  virtual absl::StatusOr<std::unique_ptr<Slot>> NewSlot() = 0;
  // Carves the slot's split-backward buffers at `base` (memory().weight_grad_inputs bytes).
  virtual void CarveWeightGradInputs(Slot& slot, uintptr_t base) = 0;
  // The stage's layers on the slot: from slot.tokens (on the device; embedding stage) or
  // slot.input (filled), to slot.output (no head) or, on the head stage, the loss summed into
  // core's loss_sum and, with grad_scale > 0, the head's backward into slot.dhead.
  virtual absl::Status ForwardPass(Slot& slot, float grad_scale) = 0;
  // From d loss / d (the last block's output) `dout` (device, (N, C): slot.dhead or the
  // caller's) down to d loss / d (the stage's input), returned (a workspace buffer; unused on
  // the embedding stage, which adds its gradient). With `split` (I) the weight gradients are
  // left for WeightPass, their inputs kept in the slot's split buffers.
  virtual absl::StatusOr<const float*> BackwardPass(Slot& slot, const float* dout, bool split) = 0;
  // W: adds the weight gradients an I left.
  virtual absl::Status WeightPass(Slot& slot) = 0;

  Core& core() { return *core_; }
  const GpuStageShape& shape() const { return shape_; }

 private:
  absl::Status CheckIndex(size_t index, size_t count) const;
  absl::StatusOr<Slot*> Acquire();
  void Release(Slot* slot);
  absl::Status EnsureWeightGradInputs(Slot& slot);
  absl::Status StartBackward(int mb, const float* dout, float* din, bool split, const char* what);

  Dims dims_;
  GpuStageShape shape_;
  AdamWHyper hyper_;
  std::vector<GpuTensor> layout_;
  size_t num_params_ = 0;
  GpuStageMemory memory_;
  GpuStageTimes times_;
  int64_t step_ = 0;
  std::unique_ptr<Core> core_;
};

}  // namespace tandem::worker::cuda

#endif  // TANDEM_WORKER_BACKEND_CUDA_GPU_STAGE_H_
