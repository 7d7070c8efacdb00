// GpuLlama's internals shared by its host half (gpu_llama_layout.cc: the memory plan) and its
// device half (gpu_llama.cc: the buffers themselves): where each tensor sits in the layout, and
// how a slot, the split backward's output gradients and the workspace are carved
// (gpu_stage_buffers.h). Not a public API: only gpu_llama.cc and gpu_llama_layout.cc include it.
#ifndef TANDEM_WORKER_BACKEND_CUDA_GPU_LLAMA_BUFFERS_H_
#define TANDEM_WORKER_BACKEND_CUDA_GPU_LLAMA_BUFFERS_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "worker/backend/cuda/gpu_llama_layout.h"
#include "worker/backend/cuda/gpu_stage_buffers.h"

namespace tandem::worker::cuda::gpu_llama_internal {

using gpu_stage_internal::Bf16Bits;
using gpu_stage_internal::Carver;

// Tensors per block, in LlamaBlock::Parameters() order.
enum BlockTensor { kRms1, kQW, kKW, kVW, kOW, kRms2, kGateW, kUpW, kDownW, kTensorsPerBlock };

inline GpuStageShape ShapeOf(const GpuLlamaConfig& cfg) {
  return StageShapeOf(cfg.n_layer, cfg.layer_begin, cfg.layer_end);
}

// Positions in a stage's layout: embed_tokens (embedding), 9 per block from block_base, the
// head's norm, then lm_head.weight (untied) or the head's embed_tokens copy (tied, no
// embedding).
struct LayoutIndex {
  size_t embed = 0;
  size_t block_base = 0;
  size_t norm = 0;
  size_t head_w = 0;  // the LM head's GEMM weight
  int64_t b0 = 0;
  size_t Block(int64_t layer, int k) const {
    return block_base + static_cast<size_t>(layer - b0) * kTensorsPerBlock + static_cast<size_t>(k);
  }
};
LayoutIndex IndexOf(const GpuLlamaConfig& cfg);

// Saved for backward, one micro-batch (N = B*T, KVD = KV * hd). Of each "_f" / "_h" pair only
// the fp32 (kFp32) or the bf16 (kBf16) member is allocated; the other stays null.
template <typename Half>
struct BlockActivations {
  float* xn1_f = nullptr;  // (N, C) rms_1(x), the input of q/k/v_proj
  Half* xn1_h = nullptr;
  float* rstd1 = nullptr;  // (N)
  float* q = nullptr;      // (N, C) rotated
  float* k = nullptr;      // (N, KVD) rotated
  float* v = nullptr;      // (N, KVD)
  float* att = nullptr;    // (B, NH, T, T) probabilities
  float* y_f = nullptr;    // (N, C) merged heads, the input of o_proj
  Half* y_h = nullptr;
  float* x1 = nullptr;     // (N, C) x + attn
  float* xn2_f = nullptr;  // (N, C) rms_2(x1), the input of gate/up_proj
  Half* xn2_h = nullptr;
  float* rstd2 = nullptr;  // (N)
  float* gate = nullptr;   // (N, H) gate_proj output
  float* up = nullptr;     // (N, H) up_proj output
  float* act_f = nullptr;  // (N, H) silu(gate) * up, the input of down_proj
  Half* act_h = nullptr;
};

template <typename Half>
struct Activations {
  // nb + 1 of (N, C): resid[0] the stage's input, resid[j + 1] the j-th block's output.
  std::vector<float*> resid;
  std::vector<BlockActivations<Half>> blocks;
  int32_t* tokens = nullptr;  // (N) embedding stage
  float* dhead = nullptr;     // (N, C) d loss / d (the head's input) (head stage)
};

// What a micro-batch's I keeps for its W: the seven linears' output gradients per block (the
// RMSNorm gains' gradients are added by I, as the CPU's BackwardInput does), and on the
// embedding stage the gradient of the embedding's output.
struct BlockGradients {
  float* down = nullptr;  // (N, C)
  float* gate = nullptr;  // (N, H)
  float* up = nullptr;    // (N, H)
  float* o = nullptr;     // (N, C)
  float* q = nullptr;     // (N, C) after RoPE's backward
  float* k = nullptr;     // (N, KVD) after RoPE's backward
  float* v = nullptr;     // (N, KVD)
};
struct WeightGradInputs {
  std::vector<BlockGradients> blocks;
  float* embedding = nullptr;  // (N, C)
};

template <typename Half>
struct Workspace {
  int32_t* targets = nullptr;  // (N) head
  float* xnf_f = nullptr;      // (N, C) rms_f(x), the input of the LM head (head)
  Half* xnf_h = nullptr;
  float* rstdf = nullptr;        // (N)
  float* logits = nullptr;       // (N, V) head
  float* losses = nullptr;       // (N) head
  double* loss_sum = nullptr;    // (1)
  double* norm_sq = nullptr;     // (1)
  float* out_f = nullptr;        // (N, max(C, H)) fp32 outputs before rounding (kBf16 only)
  Half* dout_h = nullptr;        // (N, max(V, H, C)) a GEMM's dout in bf16 (kBf16 only)
  float* dres_a = nullptr;       // (N, C) the residual stream's gradient, ping
  float* dres_b = nullptr;       // (N, C) pong
  float* dact = nullptr;         // (N, H) d (silu(gate) * up)
  float* dgate = nullptr;        // (N, H)
  float* dup = nullptr;          // (N, H)
  float* dsmall = nullptr;       // (N, C) d xn2, d y, d xn1, d xnf
  float* dq = nullptr;           // (N, C)
  float* dk = nullptr;           // (N, KVD)
  float* dv = nullptr;           // (N, KVD)
  float* att_scratch = nullptr;  // (NH, T, T) score gradients of one sequence
  float* rope_cos = nullptr;     // (T, hd/2) constant, uploaded at Create
  float* rope_sin = nullptr;     // (T, hd/2)
  // Selective recomputation only: the probabilities of the block at hand, which the slots do
  // not keep.
  float* att = nullptr;  // (B, NH, T, T)
};

inline size_t Kvd(const GpuLlamaConfig& cfg) {
  return static_cast<size_t>(cfg.n_kv_head * (cfg.d_model / cfg.n_head));
}

template <typename Half>
void CarveActivations(const GpuLlamaConfig& cfg, Carver& r, Activations<Half>* a) {
  const bool h16 = cfg.precision == GpuPrecision::kBf16;
  const GpuStageShape sh = ShapeOf(cfg);
  const size_t n = static_cast<size_t>(cfg.batch * cfg.seq), c = static_cast<size_t>(cfg.d_model),
               h = static_cast<size_t>(cfg.d_hidden), kvd = Kvd(cfg);
  const size_t att = static_cast<size_t>(cfg.batch * cfg.n_head) * static_cast<size_t>(cfg.seq) *
                     static_cast<size_t>(cfg.seq);
  // A bf16 or an fp32 buffer of `count`, as the mode says.
  auto either = [&](float** f, Half** hh, size_t count) {
    if (h16) {
      *hh = r.Take<Half>(count);
    } else {
      *f = r.Take<float>(count);
    }
  };
  a->resid.clear();
  for (int64_t l = 0; l <= sh.blocks(); ++l) a->resid.push_back(r.Take<float>(n * c));
  a->blocks.assign(static_cast<size_t>(sh.blocks()), BlockActivations<Half>{});
  for (BlockActivations<Half>& b : a->blocks) {
    either(&b.xn1_f, &b.xn1_h, n * c);
    b.rstd1 = r.Take<float>(n);
    b.q = r.Take<float>(n * c);
    b.k = r.Take<float>(n * kvd);
    b.v = r.Take<float>(n * kvd);
    if (!cfg.selective_recompute) b.att = r.Take<float>(att);
    either(&b.y_f, &b.y_h, n * c);
    b.x1 = r.Take<float>(n * c);
    either(&b.xn2_f, &b.xn2_h, n * c);
    b.rstd2 = r.Take<float>(n);
    b.gate = r.Take<float>(n * h);
    b.up = r.Take<float>(n * h);
    either(&b.act_f, &b.act_h, n * h);
  }
  if (sh.embedding) a->tokens = r.Take<int32_t>(n);
  if (sh.head) a->dhead = r.Take<float>(n * c);
}

inline void CarveWeightGradInputs(const GpuLlamaConfig& cfg, Carver& r, WeightGradInputs* g) {
  const GpuStageShape sh = ShapeOf(cfg);
  const size_t n = static_cast<size_t>(cfg.batch * cfg.seq), c = static_cast<size_t>(cfg.d_model),
               h = static_cast<size_t>(cfg.d_hidden), kvd = Kvd(cfg);
  g->blocks.assign(static_cast<size_t>(sh.blocks()), BlockGradients{});
  for (BlockGradients& b : g->blocks) {
    b.down = r.Take<float>(n * c);
    b.gate = r.Take<float>(n * h);
    b.up = r.Take<float>(n * h);
    b.o = r.Take<float>(n * c);
    b.q = r.Take<float>(n * c);
    b.k = r.Take<float>(n * kvd);
    b.v = r.Take<float>(n * kvd);
  }
  g->embedding = sh.embedding ? r.Take<float>(n * c) : nullptr;
}

template <typename Half>
void CarveWorkspace(const GpuLlamaConfig& cfg, Carver& r, Workspace<Half>* w) {
  const bool h16 = cfg.precision == GpuPrecision::kBf16;
  const GpuStageShape sh = ShapeOf(cfg);
  const size_t n = static_cast<size_t>(cfg.batch * cfg.seq), c = static_cast<size_t>(cfg.d_model),
               h = static_cast<size_t>(cfg.d_hidden), v = static_cast<size_t>(cfg.vocab),
               kvd = Kvd(cfg), t = static_cast<size_t>(cfg.seq);
  const size_t half = static_cast<size_t>(cfg.d_model / cfg.n_head / 2);
  if (sh.head) {
    w->targets = r.Take<int32_t>(n);
    if (h16) {
      w->xnf_h = r.Take<Half>(n * c);
    } else {
      w->xnf_f = r.Take<float>(n * c);
    }
    w->rstdf = r.Take<float>(n);
    w->logits = r.Take<float>(n * v);
    w->losses = r.Take<float>(n);
  }
  w->loss_sum = r.Take<double>(1);
  w->norm_sq = r.Take<double>(1);
  if (h16) {
    w->out_f = r.Take<float>(n * std::max(c, h));
    w->dout_h = r.Take<Half>(n * std::max({sh.head ? v : size_t{0}, h, c}));
  }
  w->dres_a = r.Take<float>(n * c);
  w->dres_b = r.Take<float>(n * c);
  if (sh.blocks() > 0) {
    w->dact = r.Take<float>(n * h);
    w->dgate = r.Take<float>(n * h);
    w->dup = r.Take<float>(n * h);
    w->dq = r.Take<float>(n * c);
    w->dk = r.Take<float>(n * kvd);
    w->dv = r.Take<float>(n * kvd);
    w->att_scratch = r.Take<float>(static_cast<size_t>(cfg.n_head) * t * t);
    w->rope_cos = r.Take<float>(t * half);
    w->rope_sin = r.Take<float>(t * half);
  }
  w->dsmall = r.Take<float>(n * c);
  if (cfg.selective_recompute && sh.blocks() > 0) {
    w->att = r.Take<float>(static_cast<size_t>(cfg.batch * cfg.n_head) * t * t);
  }
}

// The memory of a validated config with its layout.
GpuStageMemory PlanValidated(const GpuLlamaConfig& cfg, const std::vector<GpuTensor>& layout);

}  // namespace tandem::worker::cuda::gpu_llama_internal

#endif  // TANDEM_WORKER_BACKEND_CUDA_GPU_LLAMA_BUFFERS_H_
