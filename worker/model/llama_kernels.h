// CPU reference kernels of the `llama` architecture (worker/model/llama.h), in forward/backward
// pairs, with the conventions of kernels.h: row-major; N rows (tokens, B*T); backward kernels
// ADD into their gradient outputs, which the caller zeroes (the RoPE backward, an orthogonal
// map applied to a buffer the caller owns, works in place instead). Counts are int64_t. All
// kernels are pure functions of their arguments and thread-compatible. Those marked
// "threaded" spread their work over kernels::KernelThreads() threads with results that do not
// depend on the thread count (see kernels.h).
//
// Head layout: a (B, T, NHX * hd) activation holds head h of token (b, t) at columns
// [h*hd, (h+1)*hd) of row b*T + t (NHX = NH for queries, KV for keys and values).
#ifndef TANDEM_WORKER_MODEL_LLAMA_KERNELS_H_
#define TANDEM_WORKER_MODEL_LLAMA_KERNELS_H_

#include <cstdint>

namespace tandem::worker::kernels {

// RMSNorm (Zhang & Sennrich 2019), per row: rstd = 1 / sqrt(mean(in^2) + eps) (the mean in
// double), out = in * rstd * gain. Threaded (by rows).
void RmsNormForward(const float* in,    // (N, C)
                    const float* gain,  // (C)
                    float* out,         // (N, C)
                    float* rstd,        // (N) saved for backward
                    int64_t n, int64_t c, float eps);

// With xhat = in * rstd and dxhat = dout * gain:
// din += rstd * (dxhat - xhat * mean(dxhat * xhat)); dgain += dout * xhat. Threaded: din by
// rows, dgain by columns (each column summed over the rows in order).
void RmsNormBackward(const float* dout,  // (N, C)
                     const float* in,    // (N, C)
                     const float* gain,  // (C)
                     const float* rstd,  // (N)
                     float* din,         // (N, C) +=
                     float* dgain,       // (C) +=
                     int64_t n, int64_t c);

// Rotary position embedding tables (Su et al. 2021) for positions [0, max_t) and head size hd
// (even): cos[p * hd/2 + j] = cos(p * inv_freq[j]), sin likewise, inv_freq[j] =
// theta^(-2j / hd) for j < hd/2. Computed in float32 as Hugging Face's
// LlamaRotaryEmbedding does (the exponent, inv_freq and the angle p * inv_freq rounded to
// float; cos and sin of that angle correctly rounded), so that a checkpoint sees the same
// rotations here and in transformers.
void RopeTables(int64_t max_t, int64_t hd, double theta,
                float* cos,   // (max_t, hd/2)
                float* sin);  // (max_t, hd/2)

// Rotates every head of x in place by its token's position t (0 for the first token of each
// sequence), in Hugging Face's rotate_half convention: with half = hd/2 and for j < half,
//   out[j]        = x[j] cos(t w_j) - x[j + half] sin(t w_j)
//   out[j + half] = x[j + half] cos(t w_j) + x[j] sin(t w_j).
// Each pair (j, j + half) is rotated by +t w_j; position 0 is the identity. Threaded (by rows).
void RopeForward(float* x,          // (B, T, NHX * hd) in place
                 const float* cos,  // (>= T, hd/2) from RopeTables
                 const float* sin,  // (>= T, hd/2)
                 int64_t b, int64_t t, int64_t nhx, int64_t hd);

// The gradient through RopeForward, in place: dx = R(t)^T dout, the rotation by -t w_j.
// Threaded (by rows).
void RopeBackward(float* dx,  // (B, T, NHX * hd) in: d out; out: d x
                  const float* cos, const float* sin, int64_t b, int64_t t, int64_t nhx,
                  int64_t hd);

// SwiGLU (Shazeer 2020): out = silu(gate) * up, silu(a) = a * sigmoid(a). The reference:
// scalar, std::exp.
void SwiGluForward(const float* gate, const float* up, float* out, int64_t count);
// dgate += dout * up * silu'(gate), silu'(a) = s (1 + a (1 - s)) with s = sigmoid(a);
// dup += dout * silu(gate). The reference.
void SwiGluBackward(const float* gate, const float* up, const float* dout, float* dgate, float* dup,
                    int64_t count);

// What LlamaBlock runs: SwiGluForward four lanes at a time with simd.h's polynomial exp
// (relative error < 1e-7), threaded. Agrees with the reference to 1e-6 relative
// (tests/worker/llama_layers_test.cc).
void SwiGluForwardFast(const float* gate, const float* up, float* out, int64_t count);
// One pass of the backward: act = silu(gate) * up (bit-identical to SwiGluForwardFast's out;
// the down projection's weight gradient needs it; act may be null), and dgate, dup += as
// SwiGluBackward, from one sigmoid per element. Threaded; agrees with the reference to 1e-6
// relative.
void SwiGluBackwardFast(const float* gate, const float* up, const float* dout,
                        float* act,    // (count) = silu(gate) * up, or null
                        float* dgate,  // (count) +=
                        float* dup,    // (count) +=
                        int64_t count);

// Causal grouped-query self-attention (Ainslie et al. 2023) on separate q, k and v: query
// head h reads key/value head g = h / (NH / KV) (KV divides NH; KV == NH is multi-head
// attention, KV == 1 multi-query). For each (b, h): att = softmax(q_h k_g^T / sqrt(hd)) with
// att[t][t'] = 0 for t' > t, and out[b, :, h*hd:(h+1)*hd] = att v_g. Two sgemm calls per
// (b, h) and tile of 64 query rows, reading q, k, v in place; the upper triangle beyond each
// tile's diagonal block is never multiplied. Masked probabilities are exact zeros.
// kernels::StridedCausalAttentionForward on packed heads: threaded over (b, h), polynomial exp.
void GqaCausalAttentionForward(const float* q,  // (B, T, NH * hd)
                               const float* k,  // (B, T, KV * hd)
                               const float* v,  // (B, T, KV * hd)
                               float* att,      // (B, NH, T, T) softmax probabilities, saved
                               float* out,      // (B, T, NH * hd) heads merged
                               int64_t b, int64_t t, int64_t nh, int64_t kv, int64_t hd);

// dq, dk, dv += the attention's gradients, from the saved probabilities. The key/value
// gradients of a kv head are the sum over its NH / KV query heads (added in head order, so
// the result is deterministic at any thread count). Four sgemm calls per (b, h) and tile.
// kernels::StridedCausalAttentionBackward: threaded over (b, kv head).
void GqaCausalAttentionBackward(const float* dout,  // (B, T, NH * hd)
                                const float* q,     // (B, T, NH * hd)
                                const float* k,     // (B, T, KV * hd)
                                const float* v,     // (B, T, KV * hd)
                                const float* att,   // (B, NH, T, T)
                                float* dq,          // (B, T, NH * hd) +=
                                float* dk,          // (B, T, KV * hd) +=
                                float* dv,          // (B, T, KV * hd) +=
                                int64_t b, int64_t t, int64_t nh, int64_t kv, int64_t hd);

}  // namespace tandem::worker::kernels

#endif  // TANDEM_WORKER_MODEL_LLAMA_KERNELS_H_
