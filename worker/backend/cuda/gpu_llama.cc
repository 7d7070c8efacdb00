#include "worker/backend/cuda/gpu_llama.h"

#include <memory>
#include <utility>
#include <vector>

#include "common/status_macros.h"
#include "worker/backend/cuda/cuda_status.h"
#include "worker/backend/cuda/device.h"
#include "worker/backend/cuda/gpu_gpt_kernels.h"
#include "worker/backend/cuda/gpu_llama_buffers.h"
#include "worker/backend/cuda/gpu_llama_kernels.h"
#include "worker/backend/cuda/gpu_stage_core.h"

namespace tandem::worker::cuda {
namespace {

using gpu_llama_internal::BlockGradients;
using gpu_llama_internal::Carver;
using gpu_llama_internal::IndexOf;
using gpu_llama_internal::Kvd;
using gpu_llama_internal::LayoutIndex;
using gpu_llama_internal::PlanValidated;
using gpu_llama_internal::ShapeOf;
using gpu_llama_internal::WeightGradInputs;
using enum gpu_llama_internal::BlockTensor;
using Activations = gpu_llama_internal::Activations<bf16>;
using BlockActivations = gpu_llama_internal::BlockActivations<bf16>;
using Workspace = gpu_llama_internal::Workspace<bf16>;

struct LlamaSlot final : GpuStage::Slot {
  Activations a;
  WeightGradInputs g;
};

LlamaSlot& AsLlama(GpuStage::Slot& slot) { return static_cast<LlamaSlot&>(slot); }

}  // namespace

struct GpuLlama::Impl {
  GpuLlamaConfig cfg;
  GpuStageShape sh;
  LayoutIndex ix;
  Workspace w;
  int64_t hd = 0;   // head size C / NH
  int64_t kvd = 0;  // KV * hd
  float eps = 0.0f;
};

GpuLlama::GpuLlama() : impl_(std::make_unique<Impl>()) {}
GpuLlama::~GpuLlama() = default;

absl::StatusOr<std::unique_ptr<GpuLlama>> GpuLlama::Create(const GpuLlamaConfig& config,
                                                           const AdamWHyper& hyper) {
  ASSIGN_OR_RETURN(const GpuLlamaConfig cfg, ValidateGpuLlamaConfig(config));
  RETURN_IF_ERROR(CudaAvailable());
  std::unique_ptr<GpuLlama> g(new GpuLlama());
  Impl& im = *g->impl_;
  g->config_ = cfg;
  im.cfg = cfg;
  im.sh = ShapeOf(cfg);
  im.ix = IndexOf(cfg);
  im.hd = cfg.d_model / cfg.n_head;
  im.kvd = static_cast<int64_t>(Kvd(cfg));
  im.eps = static_cast<float>(cfg.rms_eps);  // as the CPU layers pass it
  std::vector<GpuTensor> layout = GpuLlamaParameterLayout(cfg);
  const GpuStageMemory memory = PlanValidated(cfg, layout);
  const std::vector<float> init = InitGpuLlamaParameters(cfg, layout);
  RETURN_IF_ERROR(g->Init({cfg.batch, cfg.seq, cfg.d_model, cfg.vocab}, cfg.precision, im.sh,
                          std::move(layout), memory, init, hyper));
  if (im.sh.blocks() > 0) {
    // The rotations of positions [0, T), constant for the stage's life.
    const size_t count = static_cast<size_t>(cfg.seq * (im.hd / 2));
    std::vector<float> cos(count), sin(count);
    GpuRopeTables(cfg.seq, im.hd, cfg.rope_theta, cos.data(), sin.data());
    Core& co = g->core();
    TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(im.w.rope_cos, cos.data(), count * sizeof(float),
                                                cudaMemcpyHostToDevice, co.s()));
    TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(im.w.rope_sin, sin.data(), count * sizeof(float),
                                                cudaMemcpyHostToDevice, co.s()));
    RETURN_IF_ERROR(co.stream.Synchronize());
  }
  return g;
}

void GpuLlama::CarveWorkspace(uintptr_t base) {
  Carver carver(base);
  Workspace& w = impl_->w;
  gpu_llama_internal::CarveWorkspace(impl_->cfg, carver, &w);
  core().UseWorkspace(w);
}

absl::StatusOr<std::unique_ptr<GpuStage::Slot>> GpuLlama::NewSlot() {
  auto slot = std::make_unique<LlamaSlot>();
  ASSIGN_OR_RETURN(slot->mem, DeviceBuffer<char>::Create(memory().activations));
  Carver carver(reinterpret_cast<uintptr_t>(slot->mem.data()));
  gpu_llama_internal::CarveActivations(impl_->cfg, carver, &slot->a);
  slot->tokens = slot->a.tokens;
  slot->input = slot->a.resid.front();
  slot->output = slot->a.resid.back();
  slot->dhead = slot->a.dhead;
  return slot;
}

void GpuLlama::CarveWeightGradInputs(Slot& slot, uintptr_t base) {
  Carver carver(base);
  gpu_llama_internal::CarveWeightGradInputs(impl_->cfg, carver, &AsLlama(slot).g);
}

absl::Status GpuLlama::ForwardPass(Slot& slot, float grad_scale) {
  const Impl& im = *impl_;
  const GpuLlamaConfig& cfg = im.cfg;
  const Workspace& w = im.w;
  Core& co = core();
  Activations& a = AsLlama(slot).a;
  const int64_t b = cfg.batch, t = cfg.seq, c = cfg.d_model, h = cfg.d_hidden;
  const int64_t nh = cfg.n_head, kv = cfg.n_kv_head, hd = im.hd, kvd = im.kvd;
  const int64_t rows = co.rows;
  if (im.sh.embedding) {
    RETURN_IF_ERROR(
        EmbeddingForward(co.s(), a.tokens, co.P(im.ix.embed), nullptr, a.resid[0], b, t, c));
  }
  for (int64_t l = im.sh.b0; l < im.sh.b1; ++l) {
    const size_t j = static_cast<size_t>(l - im.sh.b0);
    BlockActivations& ba = a.blocks[j];
    const float* x = a.resid[j];
    float* out = a.resid[j + 1];
    auto idx = [&](int k) { return im.ix.Block(l, k); };
    // x1 = x + o_proj(attn(RoPE(q_proj(rms_1(x))), RoPE(k_proj(.)), v_proj(.))).
    RETURN_IF_ERROR(
        RmsNormForward(co.s(), x, co.P(idx(kRms1)), co.OutF(ba.xn1_f), ba.rstd1, rows, c, im.eps));
    RETURN_IF_ERROR(co.Round(ba.xn1_h, rows * c));
    RETURN_IF_ERROR(co.Linear(ba.xn1_f, ba.xn1_h, idx(kQW), -1, ba.q, c, c));
    RETURN_IF_ERROR(co.Linear(ba.xn1_f, ba.xn1_h, idx(kKW), -1, ba.k, c, kvd));
    RETURN_IF_ERROR(co.Linear(ba.xn1_f, ba.xn1_h, idx(kVW), -1, ba.v, c, kvd));
    RETURN_IF_ERROR(RopeForward(co.s(), ba.q, w.rope_cos, w.rope_sin, b, t, nh, hd));
    RETURN_IF_ERROR(RopeForward(co.s(), ba.k, w.rope_cos, w.rope_sin, b, t, kv, hd));
    // Selective recomputation: the probabilities go to the workspace, not the slot.
    float* att = im.cfg.selective_recompute ? w.att : ba.att;
    RETURN_IF_ERROR(GqaCausalAttentionForward(co.blas.get(), co.s(), ba.q, ba.k, ba.v, att,
                                              co.OutF(ba.y_f), b, t, nh, kv, hd));
    RETURN_IF_ERROR(co.Round(ba.y_h, rows * c));
    RETURN_IF_ERROR(co.Linear(ba.y_f, ba.y_h, idx(kOW), -1, ba.x1, c, c));
    RETURN_IF_ERROR(Add(co.s(), ba.x1, x, ba.x1, rows * c));
    // out = x1 + down_proj(silu(gate_proj(rms_2(x1))) * up_proj(rms_2(x1))).
    RETURN_IF_ERROR(RmsNormForward(co.s(), ba.x1, co.P(idx(kRms2)), co.OutF(ba.xn2_f), ba.rstd2,
                                   rows, c, im.eps));
    RETURN_IF_ERROR(co.Round(ba.xn2_h, rows * c));
    RETURN_IF_ERROR(co.Linear(ba.xn2_f, ba.xn2_h, idx(kGateW), -1, ba.gate, c, h));
    RETURN_IF_ERROR(co.Linear(ba.xn2_f, ba.xn2_h, idx(kUpW), -1, ba.up, c, h));
    RETURN_IF_ERROR(SwiGluForward(co.s(), ba.gate, ba.up, co.OutF(ba.act_f), rows * h));
    RETURN_IF_ERROR(co.Round(ba.act_h, rows * h));
    RETURN_IF_ERROR(co.Linear(ba.act_f, ba.act_h, idx(kDownW), -1, out, h, c));
    RETURN_IF_ERROR(Add(co.s(), out, ba.x1, out, rows * c));
  }
  if (!im.sh.head) return absl::OkStatus();
  // Head: rms_f, then the LM head's loss and, with grad_scale > 0, its backward into w.dsmall
  // and rms_f's backward into a.dhead.
  const float* x = a.resid[static_cast<size_t>(im.sh.blocks())];
  RETURN_IF_ERROR(
      RmsNormForward(co.s(), x, co.P(im.ix.norm), co.OutF(w.xnf_f), w.rstdf, rows, c, im.eps));
  RETURN_IF_ERROR(co.Round(w.xnf_h, rows * c));
  RETURN_IF_ERROR(co.LmHead(w.xnf_f, w.xnf_h, im.ix.head_w, grad_scale, w.dsmall, c, cfg.vocab));
  if (grad_scale <= 0.0f) return absl::OkStatus();
  RETURN_IF_ERROR(co.Zero(a.dhead, rows * c));
  return RmsNormBackward(co.s(), w.dsmall, x, co.P(im.ix.norm), w.rstdf, a.dhead, co.G(im.ix.norm),
                         rows, c);
}

absl::StatusOr<const float*> GpuLlama::BackwardPass(Slot& slot, const float* dout, bool split) {
  const Impl& im = *impl_;
  const GpuLlamaConfig& cfg = im.cfg;
  const Workspace& w = im.w;
  Core& co = core();
  Activations& a = AsLlama(slot).a;
  WeightGradInputs* g = split ? &AsLlama(slot).g : nullptr;
  const int64_t b = cfg.batch, t = cfg.seq, c = cfg.d_model, h = cfg.d_hidden;
  const int64_t nh = cfg.n_head, kv = cfg.n_kv_head, hd = im.hd, kvd = im.kvd;
  const int64_t rows = co.rows;
  float* cur = w.dres_a;    // d loss / d (the current block's output)
  float* other = w.dres_b;  // becomes d loss / d (its input)
  RETURN_IF_ERROR(co.Copy(cur, dout, rows * c));
  for (int64_t l = im.sh.b1 - 1; l >= im.sh.b0; --l) {
    const size_t j = static_cast<size_t>(l - im.sh.b0);
    BlockActivations& ba = a.blocks[j];
    BlockGradients* bg = g == nullptr ? nullptr : &g->blocks[j];
    const float* x = a.resid[j];
    auto idx = [&](int k) { return im.ix.Block(l, k); };
    // A linear's backward: B adds its weight gradient now; I only its input gradient.
    auto linear = [&](const float* d, const float* in_f, const bf16* in_h, int wk, float* din,
                      int64_t in_c, int64_t out_c) {
      return bg != nullptr ? co.LinearInputGrad(d, idx(wk), din, in_c, out_c)
                           : co.LinearGrad(d, in_f, in_h, idx(wk), -1, din, in_c, out_c);
    };
    // MLP branch: dx1 = dout + rms_2'(gate_proj'(dgate) + up_proj'(dup)) with
    // (dgate, dup) = swiglu'(down_proj'(dout)). I keeps the linears' output gradients in bg.
    if (bg != nullptr) RETURN_IF_ERROR(co.Copy(bg->down, cur, rows * c));
    RETURN_IF_ERROR(co.Zero(w.dact, rows * h));
    RETURN_IF_ERROR(linear(cur, ba.act_f, ba.act_h, kDownW, w.dact, h, c));
    float* dgate = bg != nullptr ? bg->gate : w.dgate;
    float* dup = bg != nullptr ? bg->up : w.dup;
    RETURN_IF_ERROR(co.Zero(dgate, rows * h));
    RETURN_IF_ERROR(co.Zero(dup, rows * h));
    RETURN_IF_ERROR(SwiGluBackward(co.s(), ba.gate, ba.up, w.dact, dgate, dup, rows * h));
    float* dxn2 = w.dsmall;
    RETURN_IF_ERROR(co.Zero(dxn2, rows * c));
    RETURN_IF_ERROR(linear(dgate, ba.xn2_f, ba.xn2_h, kGateW, dxn2, c, h));
    RETURN_IF_ERROR(linear(dup, ba.xn2_f, ba.xn2_h, kUpW, dxn2, c, h));
    RETURN_IF_ERROR(co.Copy(other, cur, rows * c));
    // The gain's gradient in B and in I alike (the CPU's BackwardInput adds it too).
    RETURN_IF_ERROR(RmsNormBackward(co.s(), dxn2, ba.x1, co.P(idx(kRms2)), ba.rstd2, other,
                                    co.G(idx(kRms2)), rows, c));
    // Attention branch: dx = dx1 + rms_1'(q_proj'(RoPE'(dq)) + k_proj'(RoPE'(dk)) + v_proj'(dv))
    // with (dq, dk, dv) = attn'(o_proj'(dx1)).
    if (bg != nullptr) RETURN_IF_ERROR(co.Copy(bg->o, other, rows * c));
    float* dy = w.dsmall;
    RETURN_IF_ERROR(co.Zero(dy, rows * c));
    RETURN_IF_ERROR(linear(other, ba.y_f, ba.y_h, kOW, dy, c, c));
    float* dq = bg != nullptr ? bg->q : w.dq;
    float* dk = bg != nullptr ? bg->k : w.dk;
    float* dv = bg != nullptr ? bg->v : w.dv;
    RETURN_IF_ERROR(co.Zero(dq, rows * c));
    RETURN_IF_ERROR(co.Zero(dk, rows * kvd));
    RETURN_IF_ERROR(co.Zero(dv, rows * kvd));
    const float* att = ba.att;
    if (im.cfg.selective_recompute) {  // the probabilities again, bit for bit, from q, k, v
      RETURN_IF_ERROR(GqaCausalAttentionForward(co.blas.get(), co.s(), ba.q, ba.k, ba.v, w.att,
                                                nullptr, b, t, nh, kv, hd));
      att = w.att;
    }
    RETURN_IF_ERROR(GqaCausalAttentionBackward(co.blas.get(), co.s(), dy, ba.q, ba.k, ba.v, att, dq,
                                               dk, dv, w.att_scratch, b, t, nh, kv, hd));
    RETURN_IF_ERROR(RopeBackward(co.s(), dq, w.rope_cos, w.rope_sin, b, t, nh, hd));
    RETURN_IF_ERROR(RopeBackward(co.s(), dk, w.rope_cos, w.rope_sin, b, t, kv, hd));
    float* dxn1 = w.dsmall;  // dy is spent
    RETURN_IF_ERROR(co.Zero(dxn1, rows * c));
    RETURN_IF_ERROR(linear(dq, ba.xn1_f, ba.xn1_h, kQW, dxn1, c, c));
    RETURN_IF_ERROR(linear(dk, ba.xn1_f, ba.xn1_h, kKW, dxn1, c, kvd));
    RETURN_IF_ERROR(linear(dv, ba.xn1_f, ba.xn1_h, kVW, dxn1, c, kvd));
    RETURN_IF_ERROR(RmsNormBackward(co.s(), dxn1, x, co.P(idx(kRms1)), ba.rstd1, other,
                                    co.G(idx(kRms1)), rows, c));
    std::swap(cur, other);
  }
  if (im.sh.embedding) {
    if (g != nullptr) {
      RETURN_IF_ERROR(co.Copy(g->embedding, cur, rows * c));
    } else {
      RETURN_IF_ERROR(
          EmbeddingBackward(co.s(), a.tokens, cur, co.G(im.ix.embed), nullptr, b, t, c));
    }
  }
  return cur;
}

absl::Status GpuLlama::WeightPass(Slot& slot) {
  const Impl& im = *impl_;
  const GpuLlamaConfig& cfg = im.cfg;
  Core& co = core();
  Activations& a = AsLlama(slot).a;
  const WeightGradInputs& g = AsLlama(slot).g;
  const int64_t b = cfg.batch, t = cfg.seq, c = cfg.d_model, h = cfg.d_hidden, kvd = im.kvd;
  // BackwardPass's order, so that each parameter gets the same sum.
  for (int64_t l = im.sh.b1 - 1; l >= im.sh.b0; --l) {
    const size_t j = static_cast<size_t>(l - im.sh.b0);
    const BlockActivations& ba = a.blocks[j];
    const BlockGradients& bg = g.blocks[j];
    auto idx = [&](int k) { return im.ix.Block(l, k); };
    RETURN_IF_ERROR(co.LinearWeightGrad(bg.down, ba.act_f, ba.act_h, idx(kDownW), -1, h, c));
    RETURN_IF_ERROR(co.LinearWeightGrad(bg.gate, ba.xn2_f, ba.xn2_h, idx(kGateW), -1, c, h));
    RETURN_IF_ERROR(co.LinearWeightGrad(bg.up, ba.xn2_f, ba.xn2_h, idx(kUpW), -1, c, h));
    RETURN_IF_ERROR(co.LinearWeightGrad(bg.o, ba.y_f, ba.y_h, idx(kOW), -1, c, c));
    RETURN_IF_ERROR(co.LinearWeightGrad(bg.q, ba.xn1_f, ba.xn1_h, idx(kQW), -1, c, c));
    RETURN_IF_ERROR(co.LinearWeightGrad(bg.k, ba.xn1_f, ba.xn1_h, idx(kKW), -1, c, kvd));
    RETURN_IF_ERROR(co.LinearWeightGrad(bg.v, ba.xn1_f, ba.xn1_h, idx(kVW), -1, c, kvd));
  }
  if (im.sh.embedding) {
    RETURN_IF_ERROR(
        EmbeddingBackward(co.s(), a.tokens, g.embedding, co.G(im.ix.embed), nullptr, b, t, c));
  }
  return absl::OkStatus();
}

}  // namespace tandem::worker::cuda
