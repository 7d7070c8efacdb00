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
#include "worker/backend/cuda/gpu_stage_layout.h"

namespace tandem::worker::cuda {

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
  // Selective recomputation (pipeline.recompute: selective), as the CPU block's: a slot keeps
  // neither the attention probabilities nor gelu(c_fc); the backward rebuilds both, in the
  // workspace, from the saved qkv and c_fc output (the weight pass rebuilds gelu too).
  bool selective_recompute = false;
};

// The config with d_hidden and layer_end resolved, or INVALID_ARGUMENT naming the field: a
// non-empty layer range within [0, n_layer + 2), dimensions in
// [1, 2^20] (n_layer in [0, 4096]), d_model a multiple of n_head, 1 <= seq <= seq_len,
// batch >= 1, and every GEMM and kernel dimension (B*T rows, T*T, the weight matrices) within
// the int range cuBLAS and the kernels take.
absl::StatusOr<GpuGptConfig> ValidateGpuGptConfig(const GpuGptConfig& config);

// The shared stage types (gpu_stage_layout.h) under the names GpuGpt has always used.
using GpuGptTensor = GpuTensor;
using GpuGptMemory = GpuStageMemory;

// The tensors of a validated config's stage, in the order gpu_gpt.h describes (Parameters).
std::vector<GpuGptTensor> GpuGptParameterLayout(const GpuGptConfig& config);

// The flat initial parameters (layout order), drawn exactly as the CPU layers draw them for
// config.seed. Host only.
std::vector<float> InitGpuGptParameters(const GpuGptConfig& config,
                                        const std::vector<GpuGptTensor>& layout);

// What Create allocates for `config` (validated first; INVALID_ARGUMENT as above). Host only.
absl::StatusOr<GpuGptMemory> PlanGpuGptMemory(const GpuGptConfig& config);

}  // namespace tandem::worker::cuda

#endif  // TANDEM_WORKER_BACKEND_CUDA_GPU_GPT_LAYOUT_H_
