// CPU reference kernels for the layers, in forward/backward pairs (llm.c style).
//
// Layout: row-major; N rows (sequences or tokens), C input features, OC output features.
// Linear weights are (OC, C) as in PyTorch, so out = in * W^T + b. Backward kernels ADD into
// their gradient outputs (d*), which the caller zeroes: parameter gradients accumulate over
// micro-batches, and a residual branch can add its input gradient onto the skip path's.
// Counts are int64_t. All kernels are pure functions of their arguments and thread-compatible.
//
// Threads: the kernels marked "threaded" split their work over KernelThreads() threads, each
// thread taking whole rows, columns, element ranges or (batch, head) pairs, never a share of
// one sum: every output element is computed by the same arithmetic in the same order at any
// thread count, so results are bit-identical at 1 and N threads (tests/worker/
// llama_layers_test.cc checks each Llama kernel and the block). That includes the GEMMs: a
// threaded kernel splits a GEMM's output rows over its threads and runs OpenBLAS on each
// calling thread alone, so OpenBLAS's own pool stays asleep instead of spinning beside ours.
#ifndef TANDEM_WORKER_MODEL_KERNELS_H_
#define TANDEM_WORKER_MODEL_KERNELS_H_

#include <cstdint>
#include <functional>

namespace tandem::worker::kernels {

inline constexpr float kLayerNormEps = 1e-5f;

// How many threads the threaded kernels use: OpenBLAS's thread count
// (openblas_set_num_threads; tandem-worker's --threads), so one setting governs a stage's GEMMs
// and the rest of its kernels.
int KernelThreads();

// Calls fn(begin, end) on consecutive ranges that together cover [0, count), each on its own
// thread (the caller runs the first), and returns when all have returned. At most `threads`
// ranges, each at least min_per_thread long (one range when count < 2 * min_per_thread), so
// small work stays on the calling thread. fn must be safe to run concurrently on disjoint
// ranges. Threads are started per call (tens of microseconds): meant for work of a millisecond
// or more.
void ParallelFor(int threads, int64_t count, int64_t min_per_thread,
                 const std::function<void(int64_t, int64_t)>& fn);

// ParallelFor over [0, count) elements of a flat array, on KernelThreads() threads, in ranges
// whose bounds (except count) are multiples of 4096 and which hold at least 64 K elements.
void ParallelForElements(int64_t count, const std::function<void(int64_t, int64_t)>& fn);

// out = in * w^T + b (b may be null). Threaded (the GEMM by rows of out).
void LinearForward(const float* in,  // (N, C)
                   const float* w,   // (OC, C)
                   const float* b,   // (OC) or null
                   float* out,       // (N, OC)
                   int64_t n, int64_t c, int64_t oc);

// din += dout * w; dw += dout^T * in; db += sum_rows(dout). Any of din, dw and db may be null
// (the split backward computes din in one call and dw, db in another; in and w are read only
// for the outputs asked for). Threaded: the din GEMM by rows of din, the dw GEMM by rows of dw;
// db is summed over the rows in order on the calling thread.
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
// gradient) inside the GEMMs instead of materialising a scaled copy of a large dout. Threaded
// as LinearBackward.
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

// Where the attention kernels find their operands: B sequences of T tokens, NH query heads
// and KV key/value heads (KV divides NH) of size hd. Query head h of token (b, t) is at
// q[(b*T + t) * ldq + h*hd, + hd); kv head g at k[(b*T + t) * ldk + g*hd, + hd) (v likewise);
// the merged heads' output (and its gradient) has row stride ldo. Gradients share their
// operand's stride.
struct AttentionLayout {
  int64_t b, t, nh, kv, hd;
  int64_t ldq, ldk, ldo;
};

// Causal grouped-query self-attention on strided q, k and v (threaded): query head h reads
// key/value head g = h / (NH / KV). For each (b, h): att = softmax(q_h k_g^T / sqrt(hd)) with
// att[t][t'] = 0 for t' > t (exact zeros), and out's columns of head h = att v_g. Two sgemm
// calls per (b, h) and query tile, reading q, k, v in place; the (b, h) pairs are spread over
// KernelThreads() threads, each GEMM running on its caller's thread. The softmax uses the
// polynomial exp of simd.h (relative error < 1e-7).
void StridedCausalAttentionForward(const AttentionLayout& layout,
                                   const float* q,  // (B, T, ldq)
                                   const float* k,  // (B, T, ldk)
                                   const float* v,  // (B, T, ldk)
                                   float* att,      // (B, NH, T, T) softmax probabilities, saved
                                   float* out);     // (B, T, ldo) heads merged

// dq, dk, dv += the attention's gradients, from the saved probabilities (threaded over (b, kv
// head) pairs). The key/value gradients of a kv head are the sum over its NH / KV query heads,
// added in head order by one thread, so the result does not depend on the thread count. Four
// sgemm calls per (b, h) and tile.
void StridedCausalAttentionBackward(const AttentionLayout& layout,
                                    const float* dout,  // (B, T, ldo)
                                    const float* q,     // (B, T, ldq)
                                    const float* k,     // (B, T, ldk)
                                    const float* v,     // (B, T, ldk)
                                    const float* att,   // (B, NH, T, T)
                                    float* dq,          // (B, T, ldq) +=
                                    float* dk,          // (B, T, ldk) +=
                                    float* dv);         // (B, T, ldk) +=

// Causal multi-head self-attention on a fused q | k | v projection (GPT-2 / llm.c layout):
// head h of q is columns [h*hd, (h+1)*hd) of the first C columns of qkv, k and v follow at
// offsets C and 2C (hd = C / NH). StridedCausalAttentionForward with KV = NH and leading
// dimensions 3C (q, k, v) and C (out).
void CausalAttentionForward(const float* qkv,  // (B, T, 3C)
                            float* att,        // (B, NH, T, T) softmax probabilities, saved
                            float* out,        // (B, T, C) heads merged
                            int64_t b, int64_t t, int64_t c, int64_t nh);

// dqkv += d(out)/d(qkv)^T dout, from the saved probabilities (StridedCausalAttentionBackward).
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

// GeluForward / GeluBackward computed four lanes at a time with a polynomial exp (tanh(u) =
// 1 - 2 / (exp(2u) + 1)); they agree with the reference kernels to 1e-6 absolute on the
// output and 1e-5 relative on the gradient (tests/worker/gpt_layers_test.cc). in-place
// (out == in) is allowed for the forward. Threaded.
void GeluForwardFast(const float* in, float* out, int64_t count);
void GeluBackwardFast(const float* in, const float* dout, float* din, int64_t count);

// out[i] = a[i] + b[i]; out may alias a or b. Threaded.
void Add(const float* a, const float* b, float* out, int64_t count);

// sum of x[i]^2 in double, over eight interleaved partial sums (element i into sum i % 8, the
// eight added pairwise at the end): the gradient norm's pass, bound by memory rather than by
// one chain of dependent additions. NaN or infinity in x makes the result so.
double SumOfSquares(const float* x, int64_t count);

}  // namespace tandem::worker::kernels

#endif  // TANDEM_WORKER_MODEL_KERNELS_H_
