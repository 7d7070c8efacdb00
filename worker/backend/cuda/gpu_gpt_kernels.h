// Device kernels of the GPU stages' embedding and head (gpu_stage.h): the token (and, for GPT,
// position) embedding's gather and its gradient scatter, and the scaled fp32 -> bf16
// conversion of the head's softmax - onehot. Internal to
// the CUDA backend. Same conventions as cuda_kernels.h: device pointers, work only enqueued on
// `stream`, INVALID_ARGUMENT for bad shapes, the launch's error otherwise; backward kernels ADD.
// Thread-safety: thread-compatible.
#ifndef TANDEM_WORKER_BACKEND_CUDA_GPU_GPT_KERNELS_H_
#define TANDEM_WORKER_BACKEND_CUDA_GPU_GPT_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "worker/backend/cuda/cuda_kernels.h"

namespace tandem::worker::cuda {

// out[b, t, :] = wte[tokens[b, t], :] + wpe[t, :] (wpe null: no position embedding, as
// llama's). Tokens must be in [0, V) (the caller validates them on the host).
absl::Status EmbeddingForward(cudaStream_t stream,
                              const int32_t* tokens,  // (B, T)
                              const float* wte,       // (V, C)
                              const float* wpe,       // (>= T, C) or null
                              float* out,             // (B, T, C)
                              int64_t b, int64_t t, int64_t c);

// dwpe[t, :] += sum_b dout[b, t, :] (fixed order; dwpe null: none); dwte[tokens[b, t], :] +=
// dout[b, t, :] (atomicAdd: rows of repeated tokens add in an unspecified order).
absl::Status EmbeddingBackward(cudaStream_t stream,
                               const int32_t* tokens,  // (B, T)
                               const float* dout,      // (B, T, C)
                               float* dwte,            // (V, C) +=
                               float* dwpe,            // (>= T, C) += or null
                               int64_t b, int64_t t, int64_t c);

// out[i] = bf16(scale * in[i]) (round to nearest even).
absl::Status ScaledConvertToBf16(cudaStream_t stream, const float* in, float scale, bf16* out,
                                 int64_t count);

}  // namespace tandem::worker::cuda

#endif  // TANDEM_WORKER_BACKEND_CUDA_GPU_GPT_KERNELS_H_
