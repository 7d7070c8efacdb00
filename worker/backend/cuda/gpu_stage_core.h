// GpuStage's device state and the helpers every architecture's passes use (gpu_stage.h):
// the stream and cuBLAS handle, the parameter buffers and their accessors, the slot pool's
// Slot, the workspace buffers the shared code reads (targets, loss, norm, the bf16 scratch),
// and the linears, rounding and LM-head loss in both precisions. Internal to the CUDA backend:
// only gpu_stage.cc and the architectures' .cc files include it.
#ifndef TANDEM_WORKER_BACKEND_CUDA_GPU_STAGE_CORE_H_
#define TANDEM_WORKER_BACKEND_CUDA_GPU_STAGE_CORE_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "worker/backend/cuda/cuda_handles.h"
#include "worker/backend/cuda/cuda_kernels.h"
#include "worker/backend/cuda/device_buffer.h"
#include "worker/backend/cuda/gpu_stage.h"
#include "worker/backend/cuda/gpu_stage_buffers.h"

namespace tandem::worker::cuda {

// One micro-batch's saved forward: its memory and the pointers every stage has; an
// architecture derives it with its layers' saved activations and split-backward buffers.
struct GpuStage::Slot {
  virtual ~Slot() = default;
  DeviceBuffer<char> mem;
  // The split backward's: allocated at the slot's first I, kept with the slot.
  DeviceBuffer<char> grad_mem;
  bool awaiting_w = false;    // I ran, W not yet
  int32_t* tokens = nullptr;  // (N) the embedding's input (embedding stage)
  float* input = nullptr;     // (N, C) the stage's input (the embedding's output, or received)
  float* output = nullptr;    // (N, C) the last block's output (== input without blocks)
  float* dhead = nullptr;     // (N, C) d loss / d (the head's input), from the forward (head)
};

struct GpuStage::Core {
  GpuPrecision precision = GpuPrecision::kBf16;
  int64_t rows = 0;  // N = B * T
  const std::vector<GpuTensor>* layout = nullptr;
  CudaStream stream;
  CublasHandle blas;
  DeviceBuffer<float> params, grads, m, v;  // (P) each, layout order
  DeviceBuffer<bf16> compute;               // the GEMM weights' bf16 copies (kBf16)
  DeviceBuffer<char> work_mem;
  // The workspace buffers the shared code uses, carved by the architecture (CarveWorkspace).
  int32_t* targets = nullptr;  // (N) head stage
  float* logits = nullptr;     // (N, V) head stage; softmax - onehot after the loss
  float* losses = nullptr;     // (N) head stage
  double* loss_sum = nullptr;  // (1)
  double* norm_sq = nullptr;   // (1)
  float* out_f = nullptr;      // (N, widest row-kernel output) fp32 before rounding (kBf16)
  bf16* dout_h = nullptr;      // (N, widest GEMM output) a GEMM's dout in bf16 (kBf16)
  // The slot pool: every slot allocated so far, the free ones, micro-batch -> its forward.
  std::vector<std::unique_ptr<Slot>> slots;
  std::vector<Slot*> free_slots;
  std::map<int, Slot*> in_use;
  // fwd_start, fwd_end, bwd_start, bwd_end, opt_start, opt_end.
  CudaEvent ev[6];

  // Takes the shared buffers above from an architecture's carved workspace, which names them
  // alike (gpu_gpt_buffers.h, gpu_llama_buffers.h).
  template <typename Workspace>
  void UseWorkspace(const Workspace& w) {
    targets = w.targets;
    logits = w.logits;
    losses = w.losses;
    loss_sum = w.loss_sum;
    norm_sq = w.norm_sq;
    out_f = w.out_f;
    dout_h = w.dout_h;
  }

  bool bf16_mode() const { return precision == GpuPrecision::kBf16; }
  cudaStream_t s() const { return stream.get(); }
  float* P(size_t i) { return params.data() + (*layout)[i].offset; }
  float* G(size_t i) { return grads.data() + (*layout)[i].offset; }
  const bf16* H(size_t i) { return compute.data() + (*layout)[i].compute_offset; }
  float* Bias(int64_t bi) { return bi < 0 ? nullptr : P(static_cast<size_t>(bi)); }
  float* BiasGrad(int64_t bi) { return bi < 0 ? nullptr : G(static_cast<size_t>(bi)); }

  // out (N, OC) = in w^T + b (fp32 out; bias index < 0: none). The fp32 or the bf16 input is
  // read, as the mode says.
  absl::Status Linear(const float* in_f, const bf16* in_h, size_t wi, int64_t bi, float* out,
                      int64_t c, int64_t oc);
  // din += dout w; dw += dout^T in; db += colsum(dout) (the bias sum from the fp32 dout in
  // both modes; bi < 0: no bias).
  absl::Status LinearGrad(const float* dout, const float* in_f, const bf16* in_h, size_t wi,
                          int64_t bi, float* din, int64_t c, int64_t oc);
  // The two halves of LinearGrad, for the split backward: din += dout w (I) ...
  absl::Status LinearInputGrad(const float* dout, size_t wi, float* din, int64_t c, int64_t oc);
  // ... and dw += dout^T in, db += colsum(dout) (W): the same operations as LinearGrad's, so
  // I then W adds the same gradients as B.
  absl::Status LinearWeightGrad(const float* dout, const float* in_f, const bf16* in_h, size_t wi,
                                int64_t bi, int64_t c, int64_t oc);

  // A row kernel's fp32 output: the saved buffer itself (kFp32) or the scratch out_f that is
  // then rounded into the saved bf16 buffer (Round).
  float* OutF(float* saved_f) { return bf16_mode() ? out_f : saved_f; }
  absl::Status Round(bf16* saved_h, int64_t count);
  absl::Status Zero(float* p, int64_t count);
  absl::Status Copy(float* dst, const float* src, int64_t count);

  // The LM head on its normalised input xn (N, C) (fp32 or bf16 as the mode says) with weight
  // tensor `head_w` (V, C): logits, the softmax cross-entropy (loss summed into loss_sum), and
  // with grad_scale > 0 its backward: dxn = grad_scale (p - onehot) W (written; dxn zeroed
  // first) and dW += grad_scale (p - onehot)^T xn.
  absl::Status LmHead(const float* xn_f, const bf16* xn_h, size_t head_w, float grad_scale,
                      float* dxn, int64_t c, int64_t vocab);
};

}  // namespace tandem::worker::cuda

#endif  // TANDEM_WORKER_BACKEND_CUDA_GPU_STAGE_CORE_H_
