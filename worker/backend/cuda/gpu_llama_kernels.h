// Device counterparts of the llama CPU reference kernels (worker/model/llama_kernels.h) that
// GpuLlama uses (gpu_llama.h): RMSNorm, rotary position embeddings and SwiGLU, forward and
// backward. The grouped-query attention is in cuda_kernels.h beside the multi-head one (it
// shares its GEMM and softmax kernels). Same conventions as cuda_kernels.h: device pointers,
// the CPU kernels' argument order after the stream, work only enqueued on `stream`,
// INVALID_ARGUMENT for bad shapes, the launch's error otherwise; backward kernels ADD (RoPE's
// backward, a rotation in place, overwrites). Reductions run in a fixed order.
// Thread-safety: thread-compatible.
#ifndef TANDEM_WORKER_BACKEND_CUDA_GPU_LLAMA_KERNELS_H_
#define TANDEM_WORKER_BACKEND_CUDA_GPU_LLAMA_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace tandem::worker::cuda {

// Per row: rstd = 1 / sqrt(mean(in^2) + eps) (the sum of squares in double, as the CPU's),
// out = in * rstd * gain. One block per row.
absl::Status RmsNormForward(cudaStream_t stream,
                            const float* in,    // (N, C)
                            const float* gain,  // (C)
                            float* out,         // (N, C)
                            float* rstd,        // (N) saved for backward
                            int64_t n, int64_t c, float eps);

// With xhat = in * rstd and dxhat = dout * gain: din += rstd * (dxhat - xhat mean(dxhat xhat))
// (din null: none); dgain += sum_rows dout * xhat (dgain null: none; 32 x 32 column tiles).
absl::Status RmsNormBackward(cudaStream_t stream,
                             const float* dout,  // (N, C)
                             const float* in,    // (N, C)
                             const float* gain,  // (C)
                             const float* rstd,  // (N)
                             float* din,         // (N, C) += or null
                             float* dgain,       // (C) += or null
                             int64_t n, int64_t c);

// Rotates every head of x in place by its token's position t (row b*T + t), HF's rotate_half:
// for j < hd/2, (x[j], x[j + hd/2]) -> (x[j] cos - x[j + hd/2] sin, x[j + hd/2] cos + x[j] sin)
// with cos / sin = table[t * hd/2 + j] (RopeBackward: the rotation by -angle, R^T).
absl::Status RopeForward(cudaStream_t stream,
                         float* x,          // (B, T, NHX * hd) in place
                         const float* cos,  // (>= T, hd/2)
                         const float* sin,  // (>= T, hd/2)
                         int64_t b, int64_t t, int64_t nhx, int64_t hd);
absl::Status RopeBackward(cudaStream_t stream,
                          float* dx,  // (B, T, NHX * hd) in: d out; out: d x
                          const float* cos, const float* sin, int64_t b, int64_t t, int64_t nhx,
                          int64_t hd);

// out = silu(gate) * up, silu(a) = a / (1 + exp(-a)). out may alias neither input.
absl::Status SwiGluForward(cudaStream_t stream, const float* gate, const float* up, float* out,
                           int64_t count);
// dgate += dout * up * s (1 + a (1 - s)) with s = sigmoid(a), a = gate; dup += dout * silu(a).
absl::Status SwiGluBackward(cudaStream_t stream, const float* gate, const float* up,
                            const float* dout, float* dgate, float* dup, int64_t count);

}  // namespace tandem::worker::cuda

#endif  // TANDEM_WORKER_BACKEND_CUDA_GPU_LLAMA_KERNELS_H_
