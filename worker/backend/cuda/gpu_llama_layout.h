// GpuLlama's host-only half (gpu_llama.h is the device half): the config and its validation,
// the parameter layout (GpuLlamaParameterLayout: the CPU llama layers' tensors, order and
// shapes, worker/model/llama.h), the initial values drawn as the CPU layers draw them
// (InitGpuLlamaParameters), the RoPE tables and the device-memory plan (PlanGpuLlamaMemory).
// Plain C++ with no CUDA: every build compiles it, and its tests run without a GPU.
// Thread-safety: the functions are pure (thread-safe).
#ifndef TANDEM_WORKER_BACKEND_CUDA_GPU_LLAMA_LAYOUT_H_
#define TANDEM_WORKER_BACKEND_CUDA_GPU_LLAMA_LAYOUT_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/backend/cuda/gpu_stage_layout.h"

namespace tandem::worker::cuda {

struct GpuLlamaConfig {
  // The model (the fields of worker::LlamaConfig).
  int64_t n_layer = 0;    // L
  int64_t n_head = 0;     // NH query heads
  int64_t n_kv_head = 0;  // KV key/value heads, dividing NH; 0 means NH
  int64_t d_model = 0;    // C, a multiple of NH with an even head size hd = C / NH
  int64_t d_hidden = 0;   // H, the SwiGLU width (>= 1; the spec resolves its default)
  int64_t seq_len = 0;    // maximum T
  int64_t vocab = 0;      // V
  double rope_theta = 10000.0;
  double rms_eps = 1e-5;
  bool tie_embeddings = false;
  // The micro-batch every call runs: B sequences of T tokens, 1 <= T <= seq_len.
  int64_t batch = 0;
  int64_t seq = 0;
  GpuPrecision precision = GpuPrecision::kBf16;
  uint64_t seed = 0;  // the CPU layers' init seed
  // The stage: global layers [layer_begin, layer_end) of [0, n_layer + 2); -1 means the end.
  int64_t layer_begin = 0;
  int64_t layer_end = -1;
  // Selective recomputation (pipeline.recompute: selective), as the CPU block's: a slot keeps
  // no attention probabilities; the backward rebuilds them, in the workspace, from the saved
  // q, k and v.
  bool selective_recompute = false;
};

// The config with n_kv_head and layer_end resolved, or INVALID_ARGUMENT naming the field: a
// non-empty layer range, dimensions in [1, 2^20] (n_layer in [0, 4096]), n_kv_head dividing
// n_head, d_model a multiple of n_head with an even head size, rope_theta and rms_eps finite
// and > 0, 1 <= seq <= seq_len, batch >= 1, and every GEMM and kernel dimension within the int
// range cuBLAS and the kernels take.
absl::StatusOr<GpuLlamaConfig> ValidateGpuLlamaConfig(const GpuLlamaConfig& config);

// The tensors of a validated config's stage, in the CPU layers' Parameters() order: the
// embedding's model.embed_tokens.weight; per block input_layernorm, q_proj, k_proj, v_proj,
// o_proj, post_attention_layernorm, gate_proj, up_proj, down_proj; the head's model.norm and,
// when not tied, lm_head.weight. With tie_embeddings a stage holding both ends has ONE
// embed_tokens, read by both (its gradient the sum of what the CPU's two copies get); a head
// stage without the embedding holds its own copy (tied_copy).
std::vector<GpuTensor> GpuLlamaParameterLayout(const GpuLlamaConfig& config);

// The flat initial parameters (layout order), drawn exactly as the CPU layers draw them for
// config.seed. Host only.
std::vector<float> InitGpuLlamaParameters(const GpuLlamaConfig& config,
                                          const std::vector<GpuTensor>& layout);

// The RoPE tables for positions [0, max_t), bit-identical to kernels::RopeTables
// (worker/model/llama_kernels.h; tested): cos / sin (max_t, hd/2) of p * theta^(-2j / hd),
// computed in float32 as Hugging Face does.
void GpuRopeTables(int64_t max_t, int64_t hd, double theta, float* cos, float* sin);

// What Create allocates for `config` (validated first; INVALID_ARGUMENT as above). Host only.
absl::StatusOr<GpuStageMemory> PlanGpuLlamaMemory(const GpuLlamaConfig& config);

}  // namespace tandem::worker::cuda

#endif  // TANDEM_WORKER_BACKEND_CUDA_GPU_LLAMA_LAYOUT_H_
