// CPU reference kernels for the layers, in forward/backward pairs (llm.c style).
//
// Layout: row-major; N rows (sequences or tokens), C input features, OC output features.
// Linear weights are (OC, C) as in PyTorch, so out = in * W^T + b. Backward kernels ADD into
// their gradient outputs (d*), which the caller zeroes: parameter gradients accumulate over
// micro-batches, and a residual branch can add its input gradient onto the skip path's.
// Counts are int64_t. All kernels are pure functions of their arguments and thread-compatible.
#ifndef TANDEM_WORKER_MODEL_KERNELS_H_
#define TANDEM_WORKER_MODEL_KERNELS_H_

#include <cstdint>

namespace tandem::worker::kernels {

inline constexpr float kLayerNormEps = 1e-5f;

// out = in * w^T + b (b may be null).
void LinearForward(const float* in,  // (N, C)
                   const float* w,   // (OC, C)
                   const float* b,   // (OC) or null
                   float* out,       // (N, OC)
                   int64_t n, int64_t c, int64_t oc);

// din += dout * w; dw += dout^T * in; db += sum_rows(dout). Any of din, dw and db may be null
// (the split backward computes din in one call and dw, db in another; in and w are read only
// for the outputs asked for).
void LinearBackward(const float* dout,  // (N, OC)
                    const float* in,    // (N, C)
                    const float* w,     // (OC, C)
                    float* din,         // (N, C) or null
                    float* dw,          // (OC, C) or null
                    float* db,          // (OC) or null
                    int64_t n, int64_t c, int64_t oc);

// Per row: out = (in - mean) * rstd * gain + bias, with rstd = 1/sqrt(var + eps) (biased var).
void LayerNormForward(const float* in,    // (N, C)
                      const float* gain,  // (C)
                      const float* bias,  // (C)
                      float* out,         // (N, C)
                      float* mean,        // (N) saved for backward
                      float* rstd,        // (N) saved for backward
                      int64_t n, int64_t c);

void LayerNormBackward(const float* dout,  // (N, C)
                       const float* in,    // (N, C)
                       const float* gain,  // (C)
                       const float* mean,  // (N)
                       const float* rstd,  // (N)
                       float* din,         // (N, C) +=
                       float* dgain,       // (C) +=
                       float* dbias,       // (C) +=
                       int64_t n, int64_t c);

// GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
void GeluForward(const float* in, float* out, int64_t count);
// din += gelu'(in) * dout.
void GeluBackward(const float* in, const float* dout, float* din, int64_t count);

// Row-wise softmax of logits into probs and per-row cross-entropy -log p[target] into
// losses. Returns the sum of the losses (in double). A target outside [0, V) is the
// caller's bug (callers validate targets first).
double SoftmaxCrossEntropyForward(const float* logits,     // (N, V)
                                  const int32_t* targets,  // (N)
                                  float* probs,            // (N, V)
                                  float* losses,           // (N)
                                  int64_t n, int64_t v);

// dlogits += (probs - onehot(target)) * scale.
void SoftmaxCrossEntropyBackward(const float* probs,      // (N, V)
                                 const int32_t* targets,  // (N)
                                 float scale, float* dlogits, int64_t n, int64_t v);

// ---------------------------------------------------------------------------------------
// GPT kernels.

// Linear backward with the output gradient scaled and no bias: din += scale * dout * w;
// dw += scale * dout^T * in. din or dw may be null. Lets a caller apply a late scalar (the loss
// gradient) inside the GEMMs instead of materialising a scaled copy of a large dout.
void ScaledLinearBackward(const float* dout,  // (N, OC)
                          const float* in,    // (N, C)
                          const float* w,     // (OC, C)
                          float scale,
                          float* din,  // (N, C) or null
                          float* dw,   // (OC, C) or null
                          int64_t n, int64_t c, int64_t oc);

// The causal attention GEMMs (here and in llama_kernels.h) run over tiles of kAttentionTile
// query rows: rows [r0, r0 + rows) see keys [0, r0 + rows) only, so the upper triangle beyond
// each tile's diagonal block is never multiplied (10/16 of the square at T = 256).
// Probabilities above the diagonal are exact zeros, so the partial sums match the full-square
// products exactly.
inline constexpr int64_t kAttentionTile = 64;

// Causal multi-head self-attention on a fused q | k | v projection (GPT-2 / llm.c layout):
// head h of q is columns [h*hd, (h+1)*hd) of the first C columns of qkv, k and v follow at
// offsets C and 2C (hd = C / NH). For each (b, h): att = softmax(q k^T / sqrt(hd)) with
// att[t][t'] = 0 for t' > t, and out[b, :, h*hd:(h+1)*hd] = att v. Two sgemm calls per
// (b, h), reading q, k, v in place (leading dimension 3C).
void CausalAttentionForward(const float* qkv,  // (B, T, 3C)
                            float* att,        // (B, NH, T, T) softmax probabilities, saved
                            float* out,        // (B, T, C) heads merged
                            int64_t b, int64_t t, int64_t c, int64_t nh);

// dqkv += d(out)/d(qkv)^T dout, from the saved probabilities. Four sgemm calls per (b, h).
void CausalAttentionBackward(const float* dout,  // (B, T, C)
                             const float* qkv,   // (B, T, 3C)
                             const float* att,   // (B, NH, T, T)
                             float* dqkv,        // (B, T, 3C) +=
                             int64_t b, int64_t t, int64_t c, int64_t nh);

// Fused softmax cross-entropy for a large vocabulary: overwrites each row of logits with
// softmax(row) - onehot(target), so that the caller's dlogits is that buffer times
// (d loss / normalizer), and returns the summed -log p[target] (in double). Targets must be
// in [0, V) (callers validate them).
double SoftmaxCrossEntropyInPlace(float* logits,           // (N, V) in: logits; out: p - onehot
                                  const int32_t* targets,  // (N)
                                  int64_t n, int64_t v);

// GeluForward / GeluBackward computed eight lanes at a time with a polynomial exp (tanh(u) =
// 1 - 2 / (exp(2u) + 1)); they agree with the reference kernels to 1e-6 absolute on the
// output and 1e-5 relative on the gradient (tests/worker/gpt_layers_test.cc). in-place
// (out == in) is allowed for the forward.
void GeluForwardFast(const float* in, float* out, int64_t count);
void GeluBackwardFast(const float* in, const float* dout, float* din, int64_t count);

// out[i] = a[i] + b[i]; out may alias a or b.
void Add(const float* a, const float* b, float* out, int64_t count);

}  // namespace tandem::worker::kernels

#endif  // TANDEM_WORKER_MODEL_KERNELS_H_
