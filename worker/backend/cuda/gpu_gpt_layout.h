// GpuGpt's host-only half (gpu_gpt.h is the device half): the config and its validation, the
// parameter layout (GpuGptParameterLayout: the CPU layers' tensors, order and shapes), the
// initial values drawn as the CPU layers draw them (InitGpuGptParameters) and the device-memory
// plan (PlanGpuGptMemory). Plain C++ with no CUDA: every build compiles it, and its tests run
// without a GPU.
// Thread-safety: the functions are pure (thread-safe).
#ifndef TANDEM_WORKER_BACKEND_CUDA_GPU_GPT_LAYOUT_H_
#define TANDEM_WORKER_BACKEND_CUDA_GPU_GPT_LAYOUT_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::worker::cuda {

enum class GpuPrecision { kFp32, kBf16 };

struct GpuGptConfig {
  // The model (the fields of worker::GptConfig).
  int64_t n_layer = 0;   // L
  int64_t n_head = 0;    // NH
  int64_t d_model = 0;   // C, a multiple of NH
  int64_t d_hidden = 0;  // MLP width H; 0 means 4 C
  int64_t seq_len = 0;   // maximum T (rows of wpe)
  int64_t vocab = 0;     // V
  bool tie_embeddings = true;
  // The micro-batch every call runs: B sequences of T tokens, 1 <= T <= seq_len.
  int64_t batch = 0;
  int64_t seq = 0;
  GpuPrecision precision = GpuPrecision::kBf16;
  uint64_t seed = 0;  // the CPU layers' init seed
  // The stage: global layers [layer_begin, layer_end) of [0, n_layer + 2); -1 means the end.
  int64_t layer_begin = 0;
  int64_t layer_end = -1;
};

// The config with d_hidden and layer_end resolved, or INVALID_ARGUMENT naming the field: a
// non-empty layer range within [0, n_layer + 2), dimensions in
// [1, 2^20] (n_layer in [0, 4096]), d_model a multiple of n_head, 1 <= seq <= seq_len,
// batch >= 1, and every GEMM and kernel dimension (B*T rows, T*T, the weight matrices) within
// the int range cuBLAS and the kernels take.
absl::StatusOr<GpuGptConfig> ValidateGpuGptConfig(const GpuGptConfig& config);

// One parameter tensor in the flat buffers.
struct GpuGptTensor {
  std::string name;            // GPT2LMHeadModel's, as in worker/model/gpt.h
  std::vector<int64_t> shape;  // as the CPU Parameter's
  size_t offset = 0;           // into the fp32 parameter / gradient / moment buffers
  size_t count = 0;            // elements
  bool decay = false;          // weight decay applies (2-D weights), as Parameter::decay
  bool compute_copy = false;   // has a bf16 compute copy (GEMM weights, in kBf16 only)
  size_t compute_offset = 0;   // into the bf16 buffer, when compute_copy
  // One copy of a parameter another stage holds too (tied wte, on a stage that has only one of
  // embedding and head): its gradient must be summed with the other copy's.
  bool tied = false;
  bool tied_copy = false;  // the head's copy (a tied wte on a stage without the embedding)
};

// The tensors of a validated config's stage, in the order gpu_gpt.h describes (Parameters).
std::vector<GpuGptTensor> GpuGptParameterLayout(const GpuGptConfig& config);

// The flat initial parameters (layout order), drawn exactly as the CPU layers draw them for
// config.seed. Host only.
std::vector<float> InitGpuGptParameters(const GpuGptConfig& config,
                                        const std::vector<GpuGptTensor>& layout);

// Device memory, in bytes, by purpose.
struct GpuGptMemory {
  size_t parameters = 0;       // fp32 master weights
  size_t compute_weights = 0;  // bf16 copies of the GEMM weights (0 in kFp32)
  size_t gradients = 0;        // fp32, one per parameter
  size_t optimizer_state = 0;  // AdamW m and v, fp32
  size_t activations = 0;      // saved for backward, one micro-batch (one slot), all layers
  size_t workspace = 0;        // scratch reused by every layer, token ids, loss, norm
  // The split backward's, one micro-batch between its I and W: the output gradients W needs
  // (allocated with a slot at its first I; not in total(), which 1F1B and GPipe never use).
  size_t weight_grad_inputs = 0;
  size_t total() const {
    return parameters + compute_weights + gradients + optimizer_state + activations + workspace;
  }
};

// What Create allocates for `config` (validated first; INVALID_ARGUMENT as above). Host only.
absl::StatusOr<GpuGptMemory> PlanGpuGptMemory(const GpuGptConfig& config);

}  // namespace tandem::worker::cuda

#endif  // TANDEM_WORKER_BACKEND_CUDA_GPU_GPT_LAYOUT_H_
