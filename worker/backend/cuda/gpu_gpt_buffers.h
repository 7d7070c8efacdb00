// GpuGpt's internals shared by its host half (gpu_gpt_layout.cc: the memory plan) and its
// device half (gpu_gpt.cc: the buffers themselves): which layers a stage holds, where each
// tensor sits in the layout, and how one allocation is carved (gpu_stage_buffers.h) into the
// saved activations, the split backward's output gradients and the workspace. Not a public
// API: only gpu_gpt.cc and gpu_gpt_layout.cc include it.
#ifndef TANDEM_WORKER_BACKEND_CUDA_GPU_GPT_BUFFERS_H_
#define TANDEM_WORKER_BACKEND_CUDA_GPU_GPT_BUFFERS_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "worker/backend/cuda/gpu_gpt_layout.h"
#include "worker/backend/cuda/gpu_stage_buffers.h"

namespace tandem::worker::cuda::gpu_gpt_internal {

using gpu_stage_internal::Bf16Bits;
using gpu_stage_internal::Carver;

// Tensors per block, in GptBlock::Parameters() order.
enum BlockTensor {
  kLn1G,
  kLn1B,
  kAttnW,
  kAttnB,
  kAttnProjW,
  kAttnProjB,
  kLn2G,
  kLn2B,
  kFcW,
  kFcB,
  kMlpProjW,
  kMlpProjB,
  kTensorsPerBlock
};
using StageShape = GpuStageShape;
StageShape ShapeOf(const GpuGptConfig& cfg);

// Positions in a stage's layout: wte, wpe (embedding), 12 per block from block_base, ln_f gain
// and bias (head), then lm_head.weight (untied) or the head's wte copy (tied, no embedding).
struct LayoutIndex {
  size_t wte = 0, wpe = 1;
  size_t block_base = 0;
  size_t lnf = 0;
  size_t head_w = 0;  // the LM head's GEMM weight
  int64_t b0 = 0;
  size_t Block(int64_t layer, int k) const {
    return block_base + static_cast<size_t>(layer - b0) * kTensorsPerBlock + static_cast<size_t>(k);
  }
};

LayoutIndex IndexOf(const GpuGptConfig& cfg);

// The memory of a validated config with its layout (PlanGpuGptMemory without the validation).
GpuGptMemory PlanValidated(const GpuGptConfig& cfg, const std::vector<GpuGptTensor>& layout);

// Saved for backward, one micro-batch. Of each "_f" / "_h" pair only the fp32 (kFp32) or the
// bf16 (kBf16) member is allocated; the other stays null. With selective recomputation att and
// act are not allocated (null): the workspace's stand in for them.
template <typename Half>
struct BlockActivations {
  float* ln1_f = nullptr;  // (N, C) ln_1(x), the input of c_attn
  Half* ln1_h = nullptr;
  float* mean1 = nullptr;  // (N)
  float* rstd1 = nullptr;  // (N)
  float* qkv = nullptr;    // (N, 3C)
  float* att = nullptr;    // (B, NH, T, T) probabilities
  float* y_f = nullptr;    // (N, C) merged heads, the input of attn.c_proj
  Half* y_h = nullptr;
  float* x1 = nullptr;     // (N, C) x + attn
  float* ln2_f = nullptr;  // (N, C) ln_2(x1), the input of c_fc
  Half* ln2_h = nullptr;
  float* mean2 = nullptr;  // (N)
  float* rstd2 = nullptr;  // (N)
  float* pre = nullptr;    // (N, H) c_fc output
  float* act_f = nullptr;  // (N, H) gelu(pre), the input of mlp.c_proj
  Half* act_h = nullptr;
};

// One slot: what one micro-batch's forward saves for its backward.
template <typename Half>
struct Activations {
  // nb + 1 of (N, C): resid[0] the stage's input (the embedding's output, or the received
  // activation), resid[j + 1] the output of the stage's j-th block.
  std::vector<float*> resid;
  std::vector<BlockActivations<Half>> blocks;
  int32_t* tokens = nullptr;  // (N) the embedding's input (embedding stage)
  float* dhead = nullptr;     // (N, C) d loss / d (the head's input), from the forward (head)
};

// What a micro-batch's I keeps for its W (the split backward): the output gradient of each
// GEMM and each LayerNorm of every block, and on the embedding stage the gradient of the
// embedding's output. W reads them with the slot's saved inputs.
struct BlockGradients {
  float* mlp_proj = nullptr;   // (N, C) d out of mlp.c_proj
  float* fc = nullptr;         // (N, H) d out of c_fc (gelu' applied)
  float* ln2 = nullptr;        // (N, C) d out of ln_2
  float* attn_proj = nullptr;  // (N, C) d out of attn.c_proj
  float* attn = nullptr;       // (N, 3C) d out of c_attn
  float* ln1 = nullptr;        // (N, C) d out of ln_1
};
struct WeightGradInputs {
  std::vector<BlockGradients> blocks;
  float* embedding = nullptr;  // (N, C) d resid[0] (embedding stage)
};

template <typename Half>
struct Workspace {
  int32_t* targets = nullptr;  // (N)
  float* lnf_f = nullptr;      // (N, C) ln_f(x), the input of the LM head (head)
  Half* lnf_h = nullptr;
  float* meanf = nullptr;        // (N)
  float* rstdf = nullptr;        // (N)
  float* logits = nullptr;       // (N, V); softmax - onehot after the loss (head)
  float* losses = nullptr;       // (N)
  double* loss_sum = nullptr;    // (1)
  double* norm_sq = nullptr;     // (1)
  float* out_f = nullptr;        // (N, max(C, H)) fp32 outputs before rounding (kBf16 only)
  Half* dout_h = nullptr;        // (N, max(V, H, 3C)) a GEMM's dout in bf16 (kBf16 only)
  float* dres_a = nullptr;       // (N, C) the residual stream's gradient, ping
  float* dres_b = nullptr;       // (N, C) pong
  float* dbig = nullptr;         // (N, max(H, 3C)) d act, then d qkv
  float* dpre = nullptr;         // (N, H)
  float* dsmall = nullptr;       // (N, C) d ln_2, d y, d ln_1, d ln_f
  float* att_scratch = nullptr;  // (NH, T, T)
  // Selective recomputation only: the probabilities and gelu(c_fc) of the block at hand, which
  // the slots do not keep (the fp32 or the bf16 act, as the slots' pair would be).
  float* att = nullptr;    // (B, NH, T, T)
  float* act_f = nullptr;  // (N, H)
  Half* act_h = nullptr;
};

template <typename Half>
void CarveActivations(const GpuGptConfig& cfg, Carver& r, Activations<Half>* a) {
  const bool h16 = cfg.precision == GpuPrecision::kBf16;
  const StageShape sh = ShapeOf(cfg);
  const size_t n = static_cast<size_t>(cfg.batch * cfg.seq), c = static_cast<size_t>(cfg.d_model),
               h = static_cast<size_t>(cfg.d_hidden);
  const size_t att = static_cast<size_t>(cfg.batch * cfg.n_head) * static_cast<size_t>(cfg.seq) *
                     static_cast<size_t>(cfg.seq);
  a->resid.clear();
  for (int64_t l = 0; l <= sh.blocks(); ++l) a->resid.push_back(r.Take<float>(n * c));
  a->blocks.assign(static_cast<size_t>(sh.blocks()), BlockActivations<Half>{});
  for (BlockActivations<Half>& b : a->blocks) {
    if (h16) {
      b.ln1_h = r.Take<Half>(n * c);
    } else {
      b.ln1_f = r.Take<float>(n * c);
    }
    b.mean1 = r.Take<float>(n);
    b.rstd1 = r.Take<float>(n);
    b.qkv = r.Take<float>(n * 3 * c);
    if (!cfg.selective_recompute) b.att = r.Take<float>(att);
    if (h16) {
      b.y_h = r.Take<Half>(n * c);
    } else {
      b.y_f = r.Take<float>(n * c);
    }
    b.x1 = r.Take<float>(n * c);
    if (h16) {
      b.ln2_h = r.Take<Half>(n * c);
    } else {
      b.ln2_f = r.Take<float>(n * c);
    }
    b.mean2 = r.Take<float>(n);
    b.rstd2 = r.Take<float>(n);
    b.pre = r.Take<float>(n * h);
    if (cfg.selective_recompute) continue;  // att and act are rebuilt in the workspace
    if (h16) {
      b.act_h = r.Take<Half>(n * h);
    } else {
      b.act_f = r.Take<float>(n * h);
    }
  }
  if (sh.embedding) a->tokens = r.Take<int32_t>(n);
  if (sh.head) a->dhead = r.Take<float>(n * c);
}

void CarveWeightGradInputs(const GpuGptConfig& cfg, Carver& r, WeightGradInputs* g);

template <typename Half>
void CarveWorkspace(const GpuGptConfig& cfg, Carver& r, Workspace<Half>* w) {
  const bool h16 = cfg.precision == GpuPrecision::kBf16;
  const StageShape sh = ShapeOf(cfg);
  const size_t n = static_cast<size_t>(cfg.batch * cfg.seq), c = static_cast<size_t>(cfg.d_model),
               h = static_cast<size_t>(cfg.d_hidden), v = static_cast<size_t>(cfg.vocab);
  if (sh.head) {
    w->targets = r.Take<int32_t>(n);
    if (h16) {
      w->lnf_h = r.Take<Half>(n * c);
    } else {
      w->lnf_f = r.Take<float>(n * c);
    }
    w->meanf = r.Take<float>(n);
    w->rstdf = r.Take<float>(n);
    w->logits = r.Take<float>(n * v);
    w->losses = r.Take<float>(n);
  }
  w->loss_sum = r.Take<double>(1);
  w->norm_sq = r.Take<double>(1);
  if (h16) {
    w->out_f = r.Take<float>(n * std::max(c, h));
    w->dout_h = r.Take<Half>(n * std::max({sh.head ? v : size_t{0}, h, 3 * c}));
  }
  w->dres_a = r.Take<float>(n * c);
  w->dres_b = r.Take<float>(n * c);
  w->dbig = r.Take<float>(n * std::max(h, 3 * c));
  w->dpre = r.Take<float>(n * h);
  w->dsmall = r.Take<float>(n * c);
  w->att_scratch =
      r.Take<float>(static_cast<size_t>(cfg.n_head * cfg.seq) * static_cast<size_t>(cfg.seq));
  if (cfg.selective_recompute && sh.blocks() > 0) {
    w->att = r.Take<float>(static_cast<size_t>(cfg.batch * cfg.n_head) *
                           static_cast<size_t>(cfg.seq) * static_cast<size_t>(cfg.seq));
    if (h16) {
      w->act_h = r.Take<Half>(n * h);
    } else {
      w->act_f = r.Take<float>(n * h);
    }
  }
}

}  // namespace tandem::worker::cuda::gpu_gpt_internal

#endif  // TANDEM_WORKER_BACKEND_CUDA_GPU_GPT_BUFFERS_H_
