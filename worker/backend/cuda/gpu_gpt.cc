#include "worker/backend/cuda/gpu_gpt.h"

#include <memory>
#include <utility>

#include "common/status_macros.h"
#include "worker/backend/cuda/device.h"
#include "worker/backend/cuda/gpu_gpt_buffers.h"
#include "worker/backend/cuda/gpu_gpt_kernels.h"
#include "worker/backend/cuda/gpu_stage_core.h"

namespace tandem::worker::cuda {
namespace {

using gpu_gpt_internal::BlockGradients;
using gpu_gpt_internal::Carver;
using gpu_gpt_internal::IndexOf;
using gpu_gpt_internal::LayoutIndex;
using gpu_gpt_internal::PlanValidated;
using gpu_gpt_internal::ShapeOf;
using gpu_gpt_internal::StageShape;
using gpu_gpt_internal::WeightGradInputs;
using enum gpu_gpt_internal::BlockTensor;
using Activations = gpu_gpt_internal::Activations<bf16>;
using BlockActivations = gpu_gpt_internal::BlockActivations<bf16>;
using Workspace = gpu_gpt_internal::Workspace<bf16>;
using gpu_gpt_internal::CarveActivations;

// One activation slot: the blocks' saved activations and, after a first I, the output
// gradients W reads.
struct GptSlot final : GpuStage::Slot {
  Activations a;
  WeightGradInputs g;
};

GptSlot& AsGpt(GpuStage::Slot& slot) { return static_cast<GptSlot&>(slot); }

}  // namespace

struct GpuGpt::Impl {
  GpuGptConfig cfg;
  StageShape sh;
  LayoutIndex ix;
  Workspace w;
};

GpuGpt::GpuGpt() : impl_(std::make_unique<Impl>()) {}
GpuGpt::~GpuGpt() = default;

absl::StatusOr<std::unique_ptr<GpuGpt>> GpuGpt::Create(const GpuGptConfig& config,
                                                       const AdamWHyper& hyper) {
  ASSIGN_OR_RETURN(const GpuGptConfig cfg, ValidateGpuGptConfig(config));
  RETURN_IF_ERROR(CudaAvailable());
  std::unique_ptr<GpuGpt> g(new GpuGpt());
  g->config_ = cfg;
  g->impl_->cfg = cfg;
  g->impl_->sh = ShapeOf(cfg);
  g->impl_->ix = IndexOf(cfg);
  std::vector<GpuGptTensor> layout = GpuGptParameterLayout(cfg);
  const GpuGptMemory memory = PlanValidated(cfg, layout);
  const std::vector<float> init = InitGpuGptParameters(cfg, layout);
  RETURN_IF_ERROR(g->Init({cfg.batch, cfg.seq, cfg.d_model, cfg.vocab}, cfg.precision, g->impl_->sh,
                          std::move(layout), memory, init, hyper));
  return g;
}

void GpuGpt::CarveWorkspace(uintptr_t base) {
  Carver carver(base);
  Workspace& w = impl_->w;
  gpu_gpt_internal::CarveWorkspace(impl_->cfg, carver, &w);
  core().UseWorkspace(w);
}

absl::StatusOr<std::unique_ptr<GpuStage::Slot>> GpuGpt::NewSlot() {
  auto slot = std::make_unique<GptSlot>();
  ASSIGN_OR_RETURN(slot->mem, DeviceBuffer<char>::Create(memory().activations));
  Carver carver(reinterpret_cast<uintptr_t>(slot->mem.data()));
  CarveActivations(impl_->cfg, carver, &slot->a);
  slot->tokens = slot->a.tokens;
  slot->input = slot->a.resid.front();
  slot->output = slot->a.resid.back();
  slot->dhead = slot->a.dhead;
  return slot;
}

void GpuGpt::CarveWeightGradInputs(Slot& slot, uintptr_t base) {
  Carver carver(base);
  gpu_gpt_internal::CarveWeightGradInputs(impl_->cfg, carver, &AsGpt(slot).g);
}

absl::Status GpuGpt::ForwardPass(Slot& slot, float grad_scale) {
  const GpuGptConfig& cfg = impl_->cfg;
  const StageShape& sh = impl_->sh;
  const LayoutIndex& ix = impl_->ix;
  Workspace& w = impl_->w;
  Core& co = core();
  Activations& a = AsGpt(slot).a;
  const int64_t b = cfg.batch, t = cfg.seq, c = cfg.d_model, h = cfg.d_hidden, nh = cfg.n_head;
  const int64_t rows = co.rows;
  if (sh.embedding) {
    RETURN_IF_ERROR(
        EmbeddingForward(co.s(), a.tokens, co.P(ix.wte), co.P(ix.wpe), a.resid[0], b, t, c));
  }
  for (int64_t l = sh.b0; l < sh.b1; ++l) {
    const size_t j = static_cast<size_t>(l - sh.b0);
    BlockActivations& ba = a.blocks[j];
    const float* x = a.resid[j];
    float* out = a.resid[j + 1];
    auto idx = [&](int k) { return ix.Block(l, k); };
    auto bias = [&](int k) { return static_cast<int64_t>(ix.Block(l, k)); };
    // Selective recomputation: the probabilities and gelu(c_fc) go to the workspace, not
    // the slot, which the backward rebuilds them from.
    float* att = cfg.selective_recompute ? w.att : ba.att;
    float* act_f = cfg.selective_recompute ? w.act_f : ba.act_f;
    bf16* act_h = cfg.selective_recompute ? w.act_h : ba.act_h;
    // x1 = x + c_proj(attn(c_attn(ln_1(x)))).
    RETURN_IF_ERROR(LayerNormForward(co.s(), x, co.P(idx(kLn1G)), co.P(idx(kLn1B)),
                                     co.OutF(ba.ln1_f), ba.mean1, ba.rstd1, rows, c));
    RETURN_IF_ERROR(co.Round(ba.ln1_h, rows * c));
    RETURN_IF_ERROR(co.Linear(ba.ln1_f, ba.ln1_h, idx(kAttnW), bias(kAttnB), ba.qkv, c, 3 * c));
    RETURN_IF_ERROR(
        CausalAttentionForward(co.blas.get(), co.s(), ba.qkv, att, co.OutF(ba.y_f), b, t, c, nh));
    RETURN_IF_ERROR(co.Round(ba.y_h, rows * c));
    RETURN_IF_ERROR(co.Linear(ba.y_f, ba.y_h, idx(kAttnProjW), bias(kAttnProjB), ba.x1, c, c));
    RETURN_IF_ERROR(Add(co.s(), ba.x1, x, ba.x1, rows * c));
    // out = x1 + c_proj(gelu(c_fc(ln_2(x1)))).
    RETURN_IF_ERROR(LayerNormForward(co.s(), ba.x1, co.P(idx(kLn2G)), co.P(idx(kLn2B)),
                                     co.OutF(ba.ln2_f), ba.mean2, ba.rstd2, rows, c));
    RETURN_IF_ERROR(co.Round(ba.ln2_h, rows * c));
    RETURN_IF_ERROR(co.Linear(ba.ln2_f, ba.ln2_h, idx(kFcW), bias(kFcB), ba.pre, c, h));
    RETURN_IF_ERROR(GeluForward(co.s(), ba.pre, co.OutF(act_f), rows * h));
    RETURN_IF_ERROR(co.Round(act_h, rows * h));
    RETURN_IF_ERROR(co.Linear(act_f, act_h, idx(kMlpProjW), bias(kMlpProjB), out, h, c));
    RETURN_IF_ERROR(Add(co.s(), out, ba.x1, out, rows * c));
  }
  if (!sh.head) return absl::OkStatus();
  // Head: ln_f, then the LM head's loss and, with grad_scale > 0, its backward into w.dsmall and
  // ln_f's backward into a.dhead.
  const float* x = a.resid[static_cast<size_t>(sh.blocks())];
  RETURN_IF_ERROR(LayerNormForward(co.s(), x, co.P(ix.lnf), co.P(ix.lnf + 1), co.OutF(w.lnf_f),
                                   w.meanf, w.rstdf, rows, c));
  RETURN_IF_ERROR(co.Round(w.lnf_h, rows * c));
  RETURN_IF_ERROR(co.LmHead(w.lnf_f, w.lnf_h, ix.head_w, grad_scale, w.dsmall, c, cfg.vocab));
  if (grad_scale <= 0.0f) return absl::OkStatus();
  RETURN_IF_ERROR(co.Zero(a.dhead, rows * c));
  return LayerNormBackward(co.s(), w.dsmall, x, co.P(ix.lnf), w.meanf, w.rstdf, a.dhead,
                           co.G(ix.lnf), co.G(ix.lnf + 1), rows, c);
}

absl::StatusOr<const float*> GpuGpt::BackwardPass(Slot& slot, const float* dout, bool split) {
  const GpuGptConfig& cfg = impl_->cfg;
  const StageShape& sh = impl_->sh;
  const LayoutIndex& ix = impl_->ix;
  Workspace& w = impl_->w;
  Core& co = core();
  Activations& a = AsGpt(slot).a;
  WeightGradInputs* g = split ? &AsGpt(slot).g : nullptr;
  const int64_t b = cfg.batch, t = cfg.seq, c = cfg.d_model, h = cfg.d_hidden, nh = cfg.n_head;
  const int64_t rows = co.rows;
  float* cur = w.dres_a;    // d loss / d (the current block's output)
  float* other = w.dres_b;  // becomes d loss / d (its input)
  RETURN_IF_ERROR(co.Copy(cur, dout, rows * c));
  for (int64_t l = sh.b1 - 1; l >= sh.b0; --l) {
    const size_t j = static_cast<size_t>(l - sh.b0);
    BlockActivations& ba = a.blocks[j];
    BlockGradients* bg = g == nullptr ? nullptr : &g->blocks[j];
    const float* x = a.resid[j];
    auto idx = [&](int k) { return ix.Block(l, k); };
    // A linear's backward: B adds its weight gradients now; I only its input gradient.
    auto linear = [&](const float* d, const float* in_f, const bf16* in_h, int wk, int bk,
                      float* din, int64_t in_c, int64_t out_c) {
      return bg != nullptr ? co.LinearInputGrad(d, idx(wk), din, in_c, out_c)
                           : co.LinearGrad(d, in_f, in_h, idx(wk), static_cast<int64_t>(idx(bk)),
                                           din, in_c, out_c);
    };
    // A LayerNorm's: the same, its gain's and bias's gradients in B only.
    auto layer_norm = [&](const float* d, const float* in, int gk, int bk, const float* mean,
                          const float* rstd, float* din) {
      return LayerNormBackward(co.s(), d, in, co.P(idx(gk)), mean, rstd, din,
                               bg != nullptr ? nullptr : co.G(idx(gk)),
                               bg != nullptr ? nullptr : co.G(idx(bk)), rows, c);
    };
    // MLP branch: dx1 = dout + ln_2'(c_fc'(gelu'(c_proj'(dout)))). I keeps each output gradient
    // W needs in bg (the buffers B uses are scratch).
    if (bg != nullptr) RETURN_IF_ERROR(co.Copy(bg->mlp_proj, cur, rows * c));
    // Selective recomputation: B's weight gradient of mlp.c_proj reads gelu(c_fc) again (I's
    // input gradient does not; W rebuilds it for itself).
    const float* act_f = ba.act_f;
    const bf16* act_h = ba.act_h;
    if (cfg.selective_recompute) {
      if (bg == nullptr) RETURN_IF_ERROR(RecomputeGelu(ba.pre));
      act_f = w.act_f;
      act_h = w.act_h;
    }
    float* dact = w.dbig;
    RETURN_IF_ERROR(co.Zero(dact, rows * h));
    RETURN_IF_ERROR(linear(cur, act_f, act_h, kMlpProjW, kMlpProjB, dact, h, c));
    float* dpre = bg != nullptr ? bg->fc : w.dpre;
    RETURN_IF_ERROR(co.Zero(dpre, rows * h));
    RETURN_IF_ERROR(GeluBackward(co.s(), ba.pre, dact, dpre, rows * h));
    float* dln2 = bg != nullptr ? bg->ln2 : w.dsmall;
    RETURN_IF_ERROR(co.Zero(dln2, rows * c));
    RETURN_IF_ERROR(linear(dpre, ba.ln2_f, ba.ln2_h, kFcW, kFcB, dln2, c, h));
    RETURN_IF_ERROR(co.Copy(other, cur, rows * c));
    RETURN_IF_ERROR(layer_norm(dln2, ba.x1, kLn2G, kLn2B, ba.mean2, ba.rstd2, other));
    // Attention branch: dx = dx1 + ln_1'(c_attn'(attn'(c_proj'(dx1)))).
    if (bg != nullptr) RETURN_IF_ERROR(co.Copy(bg->attn_proj, other, rows * c));
    RETURN_IF_ERROR(co.Zero(w.dsmall, rows * c));
    RETURN_IF_ERROR(linear(other, ba.y_f, ba.y_h, kAttnProjW, kAttnProjB, w.dsmall, c, c));
    float* dqkv = bg != nullptr ? bg->attn : w.dbig;
    RETURN_IF_ERROR(co.Zero(dqkv, rows * 3 * c));
    const float* att = ba.att;
    if (cfg.selective_recompute) {  // the probabilities again, bit for bit, from the saved qkv
      RETURN_IF_ERROR(
          CausalAttentionForward(co.blas.get(), co.s(), ba.qkv, w.att, nullptr, b, t, c, nh));
      att = w.att;
    }
    RETURN_IF_ERROR(CausalAttentionBackward(co.blas.get(), co.s(), w.dsmall, ba.qkv, att, dqkv,
                                            w.att_scratch, b, t, c, nh));
    float* dln1 = bg != nullptr ? bg->ln1 : w.dsmall;
    RETURN_IF_ERROR(co.Zero(dln1, rows * c));
    RETURN_IF_ERROR(linear(dqkv, ba.ln1_f, ba.ln1_h, kAttnW, kAttnB, dln1, c, 3 * c));
    RETURN_IF_ERROR(layer_norm(dln1, x, kLn1G, kLn1B, ba.mean1, ba.rstd1, other));
    std::swap(cur, other);
  }
  if (sh.embedding) {
    if (g != nullptr) {
      RETURN_IF_ERROR(co.Copy(g->embedding, cur, rows * c));
    } else {
      RETURN_IF_ERROR(
          EmbeddingBackward(co.s(), a.tokens, cur, co.G(ix.wte), co.G(ix.wpe), b, t, c));
    }
  }
  return cur;
}

absl::Status GpuGpt::RecomputeGelu(const float* pre) {
  Core& co = core();
  Workspace& w = impl_->w;
  const int64_t n = co.rows * impl_->cfg.d_hidden;
  RETURN_IF_ERROR(GeluForward(co.s(), pre, co.OutF(w.act_f), n));
  return co.Round(w.act_h, n);
}

absl::Status GpuGpt::WeightPass(Slot& slot) {
  const GpuGptConfig& cfg = impl_->cfg;
  const StageShape& sh = impl_->sh;
  const LayoutIndex& ix = impl_->ix;
  Core& co = core();
  Activations& a = AsGpt(slot).a;
  const WeightGradInputs& g = AsGpt(slot).g;
  Workspace& w = impl_->w;
  const int64_t b = cfg.batch, t = cfg.seq, c = cfg.d_model, h = cfg.d_hidden;
  const int64_t rows = co.rows;
  // BackwardPass's order, so that each parameter gets the same sum.
  for (int64_t l = sh.b1 - 1; l >= sh.b0; --l) {
    const size_t j = static_cast<size_t>(l - sh.b0);
    const BlockActivations& ba = a.blocks[j];
    const BlockGradients& bg = g.blocks[j];
    auto idx = [&](int k) { return ix.Block(l, k); };
    auto bias = [&](int k) { return static_cast<int64_t>(ix.Block(l, k)); };
    if (cfg.selective_recompute) RETURN_IF_ERROR(RecomputeGelu(ba.pre));
    RETURN_IF_ERROR(co.LinearWeightGrad(bg.mlp_proj, cfg.selective_recompute ? w.act_f : ba.act_f,
                                        cfg.selective_recompute ? w.act_h : ba.act_h,
                                        idx(kMlpProjW), bias(kMlpProjB), h, c));
    RETURN_IF_ERROR(co.LinearWeightGrad(bg.fc, ba.ln2_f, ba.ln2_h, idx(kFcW), bias(kFcB), c, h));
    RETURN_IF_ERROR(LayerNormBackward(co.s(), bg.ln2, ba.x1, co.P(idx(kLn2G)), ba.mean2, ba.rstd2,
                                      nullptr, co.G(idx(kLn2G)), co.G(idx(kLn2B)), rows, c));
    RETURN_IF_ERROR(
        co.LinearWeightGrad(bg.attn_proj, ba.y_f, ba.y_h, idx(kAttnProjW), bias(kAttnProjB), c, c));
    RETURN_IF_ERROR(
        co.LinearWeightGrad(bg.attn, ba.ln1_f, ba.ln1_h, idx(kAttnW), bias(kAttnB), c, 3 * c));
    RETURN_IF_ERROR(LayerNormBackward(co.s(), bg.ln1, a.resid[j], co.P(idx(kLn1G)), ba.mean1,
                                      ba.rstd1, nullptr, co.G(idx(kLn1G)), co.G(idx(kLn1B)), rows,
                                      c));
  }
  if (sh.embedding) {
    RETURN_IF_ERROR(
        EmbeddingBackward(co.s(), a.tokens, g.embedding, co.G(ix.wte), co.G(ix.wpe), b, t, c));
  }
  return absl::OkStatus();
}

}  // namespace tandem::worker::cuda
