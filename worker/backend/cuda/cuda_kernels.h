// Device counterparts of the CPU reference kernels (worker/model/kernels.h) and of the AdamW
// update (worker/model/optimizer.cc), on fp32 device pointers, plus bf16 GEMMs with fp32
// accumulation and fp32 <-> bf16 conversions.
//
// Each function takes the same arguments in the same order as its CPU reference, preceded by
// the stream it is ordered on (and, for GEMMs, a cuBLAS handle, which it binds to that stream),
// and has the same semantics: row-major layouts, Linear weights (OC, C), backward kernels ADD
// into their gradient outputs. All pointers are device pointers unless a comment says
// otherwise. Every function only enqueues work: it returns once the work is launched, with
// INVALID_ARGUMENT for bad shapes and the launch's or the library's error otherwise (errors of
// the work itself surface at the next synchronisation). Nothing here allocates device memory;
// where a kernel needs scratch space the caller passes it.
// Reductions (bias / gain gradients, losses, norms) run in a fixed order, so results are
// bit-reproducible run to run on one device.
// Thread-safety: thread-compatible (a cuBLAS handle is used by one thread at a time).
#ifndef TANDEM_WORKER_BACKEND_CUDA_CUDA_KERNELS_H_
#define TANDEM_WORKER_BACKEND_CUDA_CUDA_KERNELS_H_

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "worker/backend/cuda/adamw_hyper.h"

namespace tandem::worker::cuda {

using bf16 = __nv_bfloat16;

// ---- Linear (cuBLAS sgemm, fp32).

// out = in * w^T + b (b may be null).
absl::Status LinearForward(cublasHandle_t blas, cudaStream_t stream,
                           const float* in,  // (N, C)
                           const float* w,   // (OC, C)
                           const float* b,   // (OC) or null
                           float* out,       // (N, OC)
                           int64_t n, int64_t c, int64_t oc);

// din += dout * w; dw += dout^T * in; db += sum_rows(dout). Any of din, dw, db may be null.
absl::Status LinearBackward(cublasHandle_t blas, cudaStream_t stream,
                            const float* dout,  // (N, OC)
                            const float* in,    // (N, C)
                            const float* w,     // (OC, C)
                            float* din,         // (N, C) or null
                            float* dw,          // (OC, C) or null
                            float* db,          // (OC) or null
                            int64_t n, int64_t c, int64_t oc);

// din += scale * dout * w; dw += scale * dout^T * in. din or dw may be null.
absl::Status ScaledLinearBackward(cublasHandle_t blas, cudaStream_t stream,
                                  const float* dout,  // (N, OC)
                                  const float* in,    // (N, C)
                                  const float* w,     // (OC, C)
                                  float scale,
                                  float* din,  // (N, C) or null
                                  float* dw,   // (OC, C) or null
                                  int64_t n, int64_t c, int64_t oc);

// ---- Linear in bf16 (cublasGemmEx: bf16 inputs, fp32 accumulation CUBLAS_COMPUTE_32F, fp32
// outputs). Same semantics as the fp32 overloads; the bias and the gradients stay fp32 (the
// master copies), only the GEMM operands are bf16.
absl::Status LinearForward(cublasHandle_t blas, cudaStream_t stream,
                           const bf16* in,  // (N, C)
                           const bf16* w,   // (OC, C)
                           const float* b,  // (OC) or null
                           float* out,      // (N, OC)
                           int64_t n, int64_t c, int64_t oc);
// The same with a bf16 output (the next layer's bf16 input). The GEMM accumulates in fp32 and
// rounds once; the bias is then added in fp32 and rounded again: out = bf16(bf16(in w^T) + b).
absl::Status LinearForward(cublasHandle_t blas, cudaStream_t stream,
                           const bf16* in,  // (N, C)
                           const bf16* w,   // (OC, C)
                           const float* b,  // (OC) or null
                           bf16* out,       // (N, OC)
                           int64_t n, int64_t c, int64_t oc);
absl::Status LinearBackward(cublasHandle_t blas, cudaStream_t stream,
                            const bf16* dout,  // (N, OC)
                            const bf16* in,    // (N, C)
                            const bf16* w,     // (OC, C)
                            float* din,        // (N, C) or null, +=
                            float* dw,         // (OC, C) or null, +=
                            float* db,         // (OC) or null, +=
                            int64_t n, int64_t c, int64_t oc);

// ---- Elementwise and row kernels.

// Per row: out = (in - mean) * rstd * gain + bias (biased variance, eps kLayerNormEps).
absl::Status LayerNormForward(cudaStream_t stream,
                              const float* in,    // (N, C)
                              const float* gain,  // (C)
                              const float* bias,  // (C)
                              float* out,         // (N, C)
                              float* mean,        // (N) saved for backward
                              float* rstd,        // (N) saved for backward
                              int64_t n, int64_t c);

// din null: only the parameters' gradients; dgain and dbias null (both): only din (the split
// backward's two halves).
absl::Status LayerNormBackward(cudaStream_t stream,
                               const float* dout,  // (N, C)
                               const float* in,    // (N, C)
                               const float* gain,  // (C)
                               const float* mean,  // (N)
                               const float* rstd,  // (N)
                               float* din,         // (N, C) += or null
                               float* dgain,       // (C) += or null
                               float* dbias,       // (C) += or null
                               int64_t n, int64_t c);

// GELU, tanh approximation; out may alias in.
absl::Status GeluForward(cudaStream_t stream, const float* in, float* out, int64_t count);
// din += gelu'(in) * dout.
absl::Status GeluBackward(cudaStream_t stream, const float* in, const float* dout, float* din,
                          int64_t count);

// out[i] = a[i] + b[i]; out may alias a or b.
absl::Status Add(cudaStream_t stream, const float* a, const float* b, float* out, int64_t count);

// ---- Attention.

// Causal multi-head self-attention on a fused q | k | v projection, as the CPU kernel:
// att = softmax(q k^T / sqrt(hd)) masked to t' <= t (zeros above the diagonal), out = att v.
// cublasSgemmStridedBatched over the heads of each sequence, and a masked softmax kernel.
// With out null only att is computed: selective recomputation rebuilds the probabilities
// before the backward, bit for bit as the forward made them (the same calls on the same qkv).
absl::Status CausalAttentionForward(cublasHandle_t blas, cudaStream_t stream,
                                    const float* qkv,  // (B, T, 3C)
                                    float* att,        // (B, NH, T, T) probabilities, saved
                                    float* out,        // (B, T, C), or null
                                    int64_t b, int64_t t, int64_t c, int64_t nh);

// dqkv += d(out)/d(qkv)^T dout, from the saved probabilities. `scratch` holds the score
// gradients of one sequence at a time.
absl::Status CausalAttentionBackward(cublasHandle_t blas, cudaStream_t stream,
                                     const float* dout,  // (B, T, C)
                                     const float* qkv,   // (B, T, 3C)
                                     const float* att,   // (B, NH, T, T)
                                     float* dqkv,        // (B, T, 3C) +=
                                     float* scratch,     // (NH, T, T)
                                     int64_t b, int64_t t, int64_t c, int64_t nh);

// Causal grouped-query self-attention on separate q, k and v, as the CPU kernel
// (worker/model/llama_kernels.h): query head h reads key/value head g = h / (NH / KV); att =
// softmax(q_h k_g^T / sqrt(hd)) masked to t' <= t (zeros above the diagonal), out_h = att v_g.
// Per sequence, cublasSgemmStridedBatched over the KV groups for each of the NH / KV query heads
// of a group, and the masked softmax kernel. With out null only att is computed (as
// CausalAttentionForward's).
absl::Status GqaCausalAttentionForward(cublasHandle_t blas, cudaStream_t stream,
                                       const float* q,  // (B, T, NH * hd)
                                       const float* k,  // (B, T, KV * hd)
                                       const float* v,  // (B, T, KV * hd)
                                       float* att,      // (B, NH, T, T) probabilities, saved
                                       float* out,      // (B, T, NH * hd), or null
                                       int64_t b, int64_t t, int64_t nh, int64_t kv, int64_t hd);

// dq, dk, dv += the attention's gradients, from the saved probabilities; a kv head's gradients
// sum its NH / KV query heads' in head order (deterministic). `scratch` holds the score
// gradients of one sequence at a time.
absl::Status GqaCausalAttentionBackward(cublasHandle_t blas, cudaStream_t stream,
                                        const float* dout,  // (B, T, NH * hd)
                                        const float* q,     // (B, T, NH * hd)
                                        const float* k,     // (B, T, KV * hd)
                                        const float* v,     // (B, T, KV * hd)
                                        const float* att,   // (B, NH, T, T)
                                        float* dq,          // (B, T, NH * hd) +=
                                        float* dk,          // (B, T, KV * hd) +=
                                        float* dv,          // (B, T, KV * hd) +=
                                        float* scratch,     // (NH, T, T)
                                        int64_t b, int64_t t, int64_t nh, int64_t kv, int64_t hd);

// ---- Loss.

// Fused softmax cross-entropy, as the CPU SoftmaxCrossEntropyInPlace: each row of logits
// becomes softmax(row) - onehot(target); losses[i] = -log p[target] and *loss_sum (a device
// double) = the sum of the losses, reduced on the device in a fixed order. Targets must be in
// [0, V) (callers validate them; an out-of-range target is ignored, its loss NaN).
absl::Status SoftmaxCrossEntropyInPlace(cudaStream_t stream,
                                        float* logits,           // (N, V) in place
                                        const int32_t* targets,  // (N)
                                        float* losses,           // (N) out
                                        double* loss_sum,        // (1) out
                                        int64_t n, int64_t v);

// ---- Optimizer.

// One AdamW update of one parameter, the formula of worker/model/optimizer.cc:
// m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2; w -= lr (mhat / (sqrt(vhat) + eps) + wd w)
// with mhat = m / (1 - b1^step), vhat = v / (1 - b2^step) (bias corrections computed on the
// host in double, as on the CPU); then g = 0. `step` is the parameter's step count after this
// update (1 on the first). w are the fp32 master weights.
absl::Status AdamWStep(cudaStream_t stream,
                       float* w,  // (count) master weights
                       float* g,  // (count) gradient; zeroed
                       float* m,  // (count) first moment
                       float* v,  // (count) second moment
                       int64_t count, const AdamWHyper& hyper, bool decay, int64_t step);

// *sum_sq (a device double) += sum of g[i]^2, accumulated in double in a fixed order. Call it
// once per parameter onto one accumulator (zeroed by the caller) for the global norm.
absl::Status GradSquaredNorm(cudaStream_t stream, const float* g, int64_t count, double* sum_sq);

// ---- bf16 conversions (round to nearest even).

// The bf16 compute copy of fp32 master weights (or activations).
absl::Status ConvertToBf16(cudaStream_t stream, const float* in, bf16* out, int64_t count);
absl::Status ConvertToFloat(cudaStream_t stream, const bf16* in, float* out, int64_t count);

}  // namespace tandem::worker::cuda

#endif  // TANDEM_WORKER_BACKEND_CUDA_CUDA_KERNELS_H_
