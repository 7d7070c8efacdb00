#include "worker/backend/cuda/gpu_gpt.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/backend/cuda/cuda_handles.h"
#include "worker/backend/cuda/cuda_status.h"
#include "worker/backend/cuda/device.h"
#include "worker/backend/cuda/device_buffer.h"
#include "worker/backend/cuda/gpu_gpt_buffers.h"
#include "worker/backend/cuda/gpu_gpt_kernels.h"

namespace tandem::worker::cuda {
namespace {

using gpu_gpt_internal::BlockGradients;
using gpu_gpt_internal::Carver;
using gpu_gpt_internal::ComputeCopyElements;
using gpu_gpt_internal::IndexOf;
using gpu_gpt_internal::LayoutIndex;
using gpu_gpt_internal::ParameterElements;
using gpu_gpt_internal::PlanValidated;
using gpu_gpt_internal::ShapeOf;
using gpu_gpt_internal::StageShape;
using gpu_gpt_internal::WeightGradInputs;
using enum gpu_gpt_internal::BlockTensor;
// The buffers carved out of device memory, with the device's bf16 (the plan sizes them with
// Bf16Bits, which must be as large).
static_assert(sizeof(bf16) == sizeof(gpu_gpt_internal::Bf16Bits));
using Activations = gpu_gpt_internal::Activations<bf16>;
using BlockActivations = gpu_gpt_internal::BlockActivations<bf16>;
using Workspace = gpu_gpt_internal::Workspace<bf16>;
using gpu_gpt_internal::CarveActivations;
using gpu_gpt_internal::CarveWeightGradInputs;
using gpu_gpt_internal::CarveWorkspace;

}  // namespace

// ---------------------------------------------------------------------------------------

// One activation slot: its memory and the pointers carved out of it.
struct Slot {
  DeviceBuffer<char> mem;
  Activations a;
  // The split backward's: allocated at the slot's first I, kept with the slot.
  DeviceBuffer<char> grad_mem;
  WeightGradInputs g;
  bool awaiting_w = false;  // I ran, W not yet
};

struct GpuGpt::Impl {
  GpuGptConfig cfg;
  StageShape sh;
  LayoutIndex ix;
  const std::vector<GpuGptTensor>* layout = nullptr;
  CudaStream stream;
  CublasHandle blas;
  DeviceBuffer<float> params, grads, m, v;  // (P) each, layout order
  DeviceBuffer<bf16> compute;               // the GEMM weights' bf16 copies (kBf16)
  DeviceBuffer<char> work_mem;
  Workspace w;
  size_t slot_bytes = 0;
  size_t grad_bytes = 0;                     // a slot's WeightGradInputs
  std::vector<std::unique_ptr<Slot>> slots;  // every slot allocated so far
  std::vector<Slot*> free_slots;
  std::map<int, Slot*> in_use;  // micro-batch -> its saved forward
  // fwd_start, fwd_end, bwd_start, bwd_end, opt_start, opt_end.
  CudaEvent ev[6];

  bool bf16_mode() const { return cfg.precision == GpuPrecision::kBf16; }
  cudaStream_t s() const { return stream.get(); }
  int64_t n() const { return cfg.batch * cfg.seq; }
  float* P(size_t i) { return params.data() + (*layout)[i].offset; }
  float* G(size_t i) { return grads.data() + (*layout)[i].offset; }
  const bf16* H(size_t i) { return compute.data() + (*layout)[i].compute_offset; }

  // A free slot (allocated when none is).
  absl::StatusOr<Slot*> Acquire() {
    if (!free_slots.empty()) {
      Slot* slot = free_slots.back();
      free_slots.pop_back();
      return slot;
    }
    auto slot = std::make_unique<Slot>();
    ASSIGN_OR_RETURN(slot->mem, DeviceBuffer<char>::Create(slot_bytes));
    Carver carver(reinterpret_cast<uintptr_t>(slot->mem.data()));
    CarveActivations(cfg, carver, &slot->a);
    slots.push_back(std::move(slot));
    return slots.back().get();
  }
  void Release(Slot* slot) {
    slot->awaiting_w = false;
    free_slots.push_back(slot);
  }
  // Runs `body` between the backward events and sets *ms to its device time; waits for the
  // device.
  template <typename Body>
  absl::Status TimedBackward(float* ms, Body body) {
    TANDEM_CUDA_RETURN_IF_ERROR(cudaEventRecord(ev[2].get(), s()));
    RETURN_IF_ERROR(body());
    TANDEM_CUDA_RETURN_IF_ERROR(cudaEventRecord(ev[3].get(), s()));
    RETURN_IF_ERROR(stream.Synchronize());
    TANDEM_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(ms, ev[2].get(), ev[3].get()));
    return absl::OkStatus();
  }
  // The slot's WeightGradInputs, allocated on its first I.
  absl::Status EnsureGradInputs(Slot* slot) {
    if (slot->grad_mem.data() != nullptr || grad_bytes == 0) return absl::OkStatus();
    ASSIGN_OR_RETURN(slot->grad_mem, DeviceBuffer<char>::Create(grad_bytes));
    Carver carver(reinterpret_cast<uintptr_t>(slot->grad_mem.data()));
    CarveWeightGradInputs(cfg, carver, &slot->g);
    return absl::OkStatus();
  }

  // out (N, OC) = in w^T + b (fp32 out; bias index < 0: none). The fp32 or the bf16 input is
  // read, as the mode says.
  absl::Status Linear(const float* in_f, const bf16* in_h, size_t wi, int64_t bi, float* out,
                      int64_t rows, int64_t c, int64_t oc) {
    const float* b = bi < 0 ? nullptr : P(static_cast<size_t>(bi));
    if (bf16_mode()) return LinearForward(blas.get(), s(), in_h, H(wi), b, out, rows, c, oc);
    return LinearForward(blas.get(), s(), in_f, P(wi), b, out, rows, c, oc);
  }

  // din += dout w; dw += dout^T in; db += colsum(dout) (the bias sum from the fp32 dout in
  // both modes).
  absl::Status LinearGrad(const float* dout, const float* in_f, const bf16* in_h, size_t wi,
                          size_t bi, float* din, int64_t rows, int64_t c, int64_t oc) {
    if (!bf16_mode()) {
      return LinearBackward(blas.get(), s(), dout, in_f, P(wi), din, G(wi), G(bi), rows, c, oc);
    }
    RETURN_IF_ERROR(ConvertToBf16(s(), dout, w.dout_h, rows * oc));
    RETURN_IF_ERROR(
        LinearBackward(blas.get(), s(), w.dout_h, in_h, H(wi), din, G(wi), nullptr, rows, c, oc));
    return LinearBackward(blas.get(), s(), dout, nullptr, nullptr, nullptr, nullptr, G(bi), rows, c,
                          oc);
  }

  // The two halves of LinearGrad, for the split backward: din += dout w (I) ...
  absl::Status LinearInputGrad(const float* dout, size_t wi, float* din, int64_t rows, int64_t c,
                               int64_t oc) {
    if (!bf16_mode()) {
      return LinearBackward(blas.get(), s(), dout, nullptr, P(wi), din, nullptr, nullptr, rows, c,
                            oc);
    }
    RETURN_IF_ERROR(ConvertToBf16(s(), dout, w.dout_h, rows * oc));
    return LinearBackward(blas.get(), s(), w.dout_h, nullptr, H(wi), din, nullptr, nullptr, rows, c,
                          oc);
  }
  // ... and dw += dout^T in, db += colsum(dout) (W): the same operations as LinearGrad's, so
  // I then W adds the same gradients as B.
  absl::Status LinearWeightGrad(const float* dout, const float* in_f, const bf16* in_h, size_t wi,
                                size_t bi, int64_t rows, int64_t c, int64_t oc) {
    if (!bf16_mode()) {
      return LinearBackward(blas.get(), s(), dout, in_f, nullptr, nullptr, G(wi), G(bi), rows, c,
                            oc);
    }
    RETURN_IF_ERROR(ConvertToBf16(s(), dout, w.dout_h, rows * oc));
    RETURN_IF_ERROR(LinearBackward(blas.get(), s(), w.dout_h, in_h, nullptr, nullptr, G(wi),
                                   nullptr, rows, c, oc));
    return LinearBackward(blas.get(), s(), dout, nullptr, nullptr, nullptr, nullptr, G(bi), rows, c,
                          oc);
  }

  // A row kernel's fp32 output: the saved buffer itself (kFp32) or the scratch that is then
  // rounded into the saved bf16 buffer (Round).
  float* OutF(float* saved_f) { return bf16_mode() ? w.out_f : saved_f; }
  absl::Status Round(bf16* saved_h, int64_t count) {
    if (!bf16_mode()) return absl::OkStatus();
    return ConvertToBf16(s(), w.out_f, saved_h, count);
  }

  absl::Status Zero(float* p, int64_t count) {
    TANDEM_CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(p, 0, static_cast<size_t>(count) * sizeof(float), s()));
    return absl::OkStatus();
  }
  absl::Status Copy(float* dst, const float* src, int64_t count) {
    TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
        dst, src, static_cast<size_t>(count) * sizeof(float), cudaMemcpyDeviceToDevice, s()));
    return absl::OkStatus();
  }

  // The blocks from resid[0] (already there), then, on the head stage, the loss into
  // w.loss_sum and, with `grad_scale` > 0, the head's backward into a.dhead.
  absl::Status Forward(Activations& a, float grad_scale);
  // From d loss / d (the last block's output) in `cur` (w.dres_a) down to d loss / d resid[0],
  // left in the returned buffer (one of w.dres_a / w.dres_b). With `g` null (B) the parameter
  // gradients are added on the way; otherwise (I, the split backward) only the input gradient
  // is computed, and each output gradient the weight gradients need is kept in `g` for
  // BackwardWeight (W), which adds them.
  absl::StatusOr<float*> Backward(Activations& a, WeightGradInputs* g = nullptr);
  absl::Status BackwardWeight(Activations& a, const WeightGradInputs& g);
  absl::Status SquaredNorm(bool include_tied_copy);
};

absl::Status GpuGpt::Impl::Forward(Activations& a, float grad_scale) {
  const int64_t b = cfg.batch, t = cfg.seq, c = cfg.d_model, h = cfg.d_hidden, nh = cfg.n_head;
  const int64_t rows = n();
  for (int64_t l = sh.b0; l < sh.b1; ++l) {
    const size_t j = static_cast<size_t>(l - sh.b0);
    BlockActivations& ba = a.blocks[j];
    const float* x = a.resid[j];
    float* out = a.resid[j + 1];
    auto idx = [&](int k) { return ix.Block(l, k); };
    // x1 = x + c_proj(attn(c_attn(ln_1(x)))).
    RETURN_IF_ERROR(LayerNormForward(s(), x, P(idx(kLn1G)), P(idx(kLn1B)), OutF(ba.ln1_f), ba.mean1,
                                     ba.rstd1, rows, c));
    RETURN_IF_ERROR(Round(ba.ln1_h, rows * c));
    RETURN_IF_ERROR(Linear(ba.ln1_f, ba.ln1_h, idx(kAttnW), static_cast<int64_t>(idx(kAttnB)),
                           ba.qkv, rows, c, 3 * c));
    RETURN_IF_ERROR(
        CausalAttentionForward(blas.get(), s(), ba.qkv, ba.att, OutF(ba.y_f), b, t, c, nh));
    RETURN_IF_ERROR(Round(ba.y_h, rows * c));
    RETURN_IF_ERROR(Linear(ba.y_f, ba.y_h, idx(kAttnProjW), static_cast<int64_t>(idx(kAttnProjB)),
                           ba.x1, rows, c, c));
    RETURN_IF_ERROR(Add(s(), ba.x1, x, ba.x1, rows * c));
    // out = x1 + c_proj(gelu(c_fc(ln_2(x1)))).
    RETURN_IF_ERROR(LayerNormForward(s(), ba.x1, P(idx(kLn2G)), P(idx(kLn2B)), OutF(ba.ln2_f),
                                     ba.mean2, ba.rstd2, rows, c));
    RETURN_IF_ERROR(Round(ba.ln2_h, rows * c));
    RETURN_IF_ERROR(
        Linear(ba.ln2_f, ba.ln2_h, idx(kFcW), static_cast<int64_t>(idx(kFcB)), ba.pre, rows, c, h));
    RETURN_IF_ERROR(GeluForward(s(), ba.pre, OutF(ba.act_f), rows * h));
    RETURN_IF_ERROR(Round(ba.act_h, rows * h));
    RETURN_IF_ERROR(Linear(ba.act_f, ba.act_h, idx(kMlpProjW), static_cast<int64_t>(idx(kMlpProjB)),
                           out, rows, h, c));
    RETURN_IF_ERROR(Add(s(), out, ba.x1, out, rows * c));
  }
  if (!sh.head) return absl::OkStatus();
  // Head: ln_f, logits = ln_f W^T, softmax cross-entropy in place (logits become p - onehot).
  const float* x = a.resid[static_cast<size_t>(sh.blocks())];
  RETURN_IF_ERROR(
      LayerNormForward(s(), x, P(ix.lnf), P(ix.lnf + 1), OutF(w.lnf_f), w.meanf, w.rstdf, rows, c));
  RETURN_IF_ERROR(Round(w.lnf_h, rows * c));
  RETURN_IF_ERROR(Linear(w.lnf_f, w.lnf_h, ix.head_w, -1, w.logits, rows, c, cfg.vocab));
  RETURN_IF_ERROR(
      SoftmaxCrossEntropyInPlace(s(), w.logits, w.targets, w.losses, w.loss_sum, rows, cfg.vocab));
  if (grad_scale <= 0.0f) return absl::OkStatus();
  // The head's backward: d ln_f = scale (p - onehot) W; dW += scale (p - onehot)^T ln_f; then
  // ln_f's backward into a.dhead.
  RETURN_IF_ERROR(Zero(w.dsmall, rows * c));
  if (bf16_mode()) {
    RETURN_IF_ERROR(ScaledConvertToBf16(s(), w.logits, grad_scale, w.dout_h, rows * cfg.vocab));
    RETURN_IF_ERROR(LinearBackward(blas.get(), s(), w.dout_h, w.lnf_h, H(ix.head_w), w.dsmall,
                                   G(ix.head_w), nullptr, rows, c, cfg.vocab));
  } else {
    RETURN_IF_ERROR(ScaledLinearBackward(blas.get(), s(), w.logits, w.lnf_f, P(ix.head_w),
                                         grad_scale, w.dsmall, G(ix.head_w), rows, c, cfg.vocab));
  }
  RETURN_IF_ERROR(Zero(a.dhead, rows * c));
  return LayerNormBackward(s(), w.dsmall, x, P(ix.lnf), w.meanf, w.rstdf, a.dhead, G(ix.lnf),
                           G(ix.lnf + 1), rows, c);
}

absl::StatusOr<float*> GpuGpt::Impl::Backward(Activations& a, WeightGradInputs* g) {
  const int64_t b = cfg.batch, t = cfg.seq, c = cfg.d_model, h = cfg.d_hidden, nh = cfg.n_head;
  const int64_t rows = n();
  float* cur = w.dres_a;    // d loss / d (the current block's output)
  float* other = w.dres_b;  // becomes d loss / d (its input)
  for (int64_t l = sh.b1 - 1; l >= sh.b0; --l) {
    const size_t j = static_cast<size_t>(l - sh.b0);
    BlockActivations& ba = a.blocks[j];
    BlockGradients* bg = g == nullptr ? nullptr : &g->blocks[j];
    const float* x = a.resid[j];
    auto idx = [&](int k) { return ix.Block(l, k); };
    // A linear's backward: B adds its weight gradients now; I only its input gradient.
    auto linear = [&](const float* dout, const float* in_f, const bf16* in_h, int wk, int bk,
                      float* din, int64_t in_c, int64_t out_c) {
      return bg != nullptr ? LinearInputGrad(dout, idx(wk), din, rows, in_c, out_c)
                           : LinearGrad(dout, in_f, in_h, idx(wk), idx(bk), din, rows, in_c, out_c);
    };
    // A LayerNorm's: the same, its gain's and bias's gradients in B only.
    auto layer_norm = [&](const float* dout, const float* in, int gk, int bk, const float* mean,
                          const float* rstd, float* din) {
      return LayerNormBackward(s(), dout, in, P(idx(gk)), mean, rstd, din,
                               bg != nullptr ? nullptr : G(idx(gk)),
                               bg != nullptr ? nullptr : G(idx(bk)), rows, c);
    };
    // MLP branch: dx1 = dout + ln_2'(c_fc'(gelu'(c_proj'(dout)))). I keeps each output gradient
    // W needs in bg (the buffers B uses are scratch).
    if (bg != nullptr) RETURN_IF_ERROR(Copy(bg->mlp_proj, cur, rows * c));
    float* dact = w.dbig;
    RETURN_IF_ERROR(Zero(dact, rows * h));
    RETURN_IF_ERROR(linear(cur, ba.act_f, ba.act_h, kMlpProjW, kMlpProjB, dact, h, c));
    float* dpre = bg != nullptr ? bg->fc : w.dpre;
    RETURN_IF_ERROR(Zero(dpre, rows * h));
    RETURN_IF_ERROR(GeluBackward(s(), ba.pre, dact, dpre, rows * h));
    float* dln2 = bg != nullptr ? bg->ln2 : w.dsmall;
    RETURN_IF_ERROR(Zero(dln2, rows * c));
    RETURN_IF_ERROR(linear(dpre, ba.ln2_f, ba.ln2_h, kFcW, kFcB, dln2, c, h));
    RETURN_IF_ERROR(Copy(other, cur, rows * c));
    RETURN_IF_ERROR(layer_norm(dln2, ba.x1, kLn2G, kLn2B, ba.mean2, ba.rstd2, other));
    // Attention branch: dx = dx1 + ln_1'(c_attn'(attn'(c_proj'(dx1)))).
    if (bg != nullptr) RETURN_IF_ERROR(Copy(bg->attn_proj, other, rows * c));
    RETURN_IF_ERROR(Zero(w.dsmall, rows * c));
    RETURN_IF_ERROR(linear(other, ba.y_f, ba.y_h, kAttnProjW, kAttnProjB, w.dsmall, c, c));
    float* dqkv = bg != nullptr ? bg->attn : w.dbig;
    RETURN_IF_ERROR(Zero(dqkv, rows * 3 * c));
    RETURN_IF_ERROR(CausalAttentionBackward(blas.get(), s(), w.dsmall, ba.qkv, ba.att, dqkv,
                                            w.att_scratch, b, t, c, nh));
    float* dln1 = bg != nullptr ? bg->ln1 : w.dsmall;
    RETURN_IF_ERROR(Zero(dln1, rows * c));
    RETURN_IF_ERROR(linear(dqkv, ba.ln1_f, ba.ln1_h, kAttnW, kAttnB, dln1, c, 3 * c));
    RETURN_IF_ERROR(layer_norm(dln1, x, kLn1G, kLn1B, ba.mean1, ba.rstd1, other));
    std::swap(cur, other);
  }
  if (sh.embedding) {
    if (g != nullptr) {
      RETURN_IF_ERROR(Copy(g->embedding, cur, rows * c));
    } else {
      RETURN_IF_ERROR(EmbeddingBackward(s(), a.tokens, cur, G(ix.wte), G(ix.wpe), b, t, c));
    }
  }
  return cur;
}

absl::Status GpuGpt::Impl::BackwardWeight(Activations& a, const WeightGradInputs& g) {
  const int64_t b = cfg.batch, t = cfg.seq, c = cfg.d_model, h = cfg.d_hidden;
  const int64_t rows = n();
  // Backward's order, so that each parameter gets the same sum.
  for (int64_t l = sh.b1 - 1; l >= sh.b0; --l) {
    const size_t j = static_cast<size_t>(l - sh.b0);
    const BlockActivations& ba = a.blocks[j];
    const BlockGradients& bg = g.blocks[j];
    auto idx = [&](int k) { return ix.Block(l, k); };
    RETURN_IF_ERROR(LinearWeightGrad(bg.mlp_proj, ba.act_f, ba.act_h, idx(kMlpProjW),
                                     idx(kMlpProjB), rows, h, c));
    RETURN_IF_ERROR(LinearWeightGrad(bg.fc, ba.ln2_f, ba.ln2_h, idx(kFcW), idx(kFcB), rows, c, h));
    RETURN_IF_ERROR(LayerNormBackward(s(), bg.ln2, ba.x1, P(idx(kLn2G)), ba.mean2, ba.rstd2,
                                      nullptr, G(idx(kLn2G)), G(idx(kLn2B)), rows, c));
    RETURN_IF_ERROR(LinearWeightGrad(bg.attn_proj, ba.y_f, ba.y_h, idx(kAttnProjW), idx(kAttnProjB),
                                     rows, c, c));
    RETURN_IF_ERROR(
        LinearWeightGrad(bg.attn, ba.ln1_f, ba.ln1_h, idx(kAttnW), idx(kAttnB), rows, c, 3 * c));
    RETURN_IF_ERROR(LayerNormBackward(s(), bg.ln1, a.resid[j], P(idx(kLn1G)), ba.mean1, ba.rstd1,
                                      nullptr, G(idx(kLn1G)), G(idx(kLn1B)), rows, c));
  }
  if (sh.embedding) {
    RETURN_IF_ERROR(EmbeddingBackward(s(), a.tokens, g.embedding, G(ix.wte), G(ix.wpe), b, t, c));
  }
  return absl::OkStatus();
}

absl::Status GpuGpt::Impl::SquaredNorm(bool include_tied_copy) {
  TANDEM_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(w.norm_sq, 0, sizeof(double), s()));
  for (size_t i = 0; i < layout->size(); ++i) {
    if ((*layout)[i].tied_copy && !include_tied_copy) continue;
    RETURN_IF_ERROR(
        cuda::GradSquaredNorm(s(), G(i), static_cast<int64_t>((*layout)[i].count), w.norm_sq));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------

GpuGpt::GpuGpt() : impl_(std::make_unique<Impl>()) {}
GpuGpt::~GpuGpt() = default;

absl::StatusOr<std::unique_ptr<GpuGpt>> GpuGpt::Create(const GpuGptConfig& config,
                                                       const AdamWHyper& hyper) {
  ASSIGN_OR_RETURN(const GpuGptConfig cfg, ValidateGpuGptConfig(config));
  RETURN_IF_ERROR(CudaAvailable());
  std::unique_ptr<GpuGpt> g(new GpuGpt());
  g->config_ = cfg;
  g->hyper_ = hyper;
  g->layout_ = GpuGptParameterLayout(cfg);
  g->num_params_ = ParameterElements(g->layout_);
  g->memory_ = PlanValidated(cfg, g->layout_);
  Impl& im = *g->impl_;
  im.cfg = cfg;
  im.sh = ShapeOf(cfg);
  im.ix = IndexOf(cfg);
  im.layout = &g->layout_;
  im.slot_bytes = g->memory_.activations;
  im.grad_bytes = g->memory_.weight_grad_inputs;

  ASSIGN_OR_RETURN(im.stream, CudaStream::Create());
  ASSIGN_OR_RETURN(im.blas, CublasHandle::Create(im.stream.get()));
  for (CudaEvent& e : im.ev) {
    ASSIGN_OR_RETURN(e, CudaEvent::Create(cudaEventDefault));
  }
  for (DeviceBuffer<float>* b : {&im.params, &im.grads, &im.m, &im.v}) {
    ASSIGN_OR_RETURN(*b, DeviceBuffer<float>::Create(g->num_params_));
  }
  ASSIGN_OR_RETURN(im.compute, DeviceBuffer<bf16>::Create(ComputeCopyElements(g->layout_)));
  ASSIGN_OR_RETURN(im.work_mem, DeviceBuffer<char>::Create(g->memory_.workspace));
  Carver work_carver(reinterpret_cast<uintptr_t>(im.work_mem.data()));
  CarveWorkspace(cfg, work_carver, &im.w);
  // The first slot now, so that a model that cannot hold one micro-batch fails here.
  ASSIGN_OR_RETURN(Slot* const first, im.Acquire());
  im.Release(first);

  const std::vector<float> init = InitGpuGptParameters(cfg, g->layout_);
  RETURN_IF_ERROR(im.params.CopyFromHost(init.data(), init.size()));
  for (DeviceBuffer<float>* b : {&im.grads, &im.m, &im.v}) {
    RETURN_IF_ERROR(b->Zero(im.s()));
  }
  for (size_t i = 0; i < g->layout_.size(); ++i) {
    const GpuGptTensor& t = g->layout_[i];
    if (t.compute_copy) {
      RETURN_IF_ERROR(ConvertToBf16(im.s(), im.P(i), im.compute.data() + t.compute_offset,
                                    static_cast<int64_t>(t.count)));
    }
  }
  RETURN_IF_ERROR(im.stream.Synchronize());
  return g;
}

bool GpuGpt::has_embedding() const { return impl_->sh.embedding; }
bool GpuGpt::has_head() const { return impl_->sh.head; }
size_t GpuGpt::activation_slots() const { return impl_->slots.size(); }

namespace {
absl::Status CheckIds(const char* what, const int32_t* ids, int64_t rows, int64_t vocab) {
  if (ids == nullptr) return absl::InvalidArgumentError(absl::StrCat("null ", what, "s"));
  for (int64_t i = 0; i < rows; ++i) {
    if (ids[i] < 0 || ids[i] >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " ", ids[i], " at position ", i, " is outside the vocabulary [0, ", vocab, ")"));
    }
  }
  return absl::OkStatus();
}
}  // namespace

absl::StatusOr<double> GpuGpt::Forward(int mb, const int32_t* tokens, const int32_t* targets,
                                       const float* input, float* output, float grad_scale,
                                       bool save) {
  Impl& im = *impl_;
  const int64_t rows = im.n(), c = config_.d_model;
  if (save && im.in_use.contains(mb)) {
    return absl::FailedPreconditionError(
        absl::StrCat("forward of micro-batch ", mb, ": it already has a saved forward"));
  }
  if (im.sh.embedding) {
    RETURN_IF_ERROR(CheckIds("token", tokens, rows, config_.vocab));
  } else if (input == nullptr) {
    return absl::InvalidArgumentError("forward: a stage without the embedding needs an input");
  }
  if (im.sh.head) {
    RETURN_IF_ERROR(CheckIds("target", targets, rows, config_.vocab));
  } else if (output == nullptr) {
    return absl::InvalidArgumentError("forward: a stage without the head needs an output");
  }
  ASSIGN_OR_RETURN(Slot* const slot, im.Acquire());
  Activations& a = slot->a;
  auto run = [&]() -> absl::StatusOr<double> {
    const size_t id_bytes = static_cast<size_t>(rows) * sizeof(int32_t);
    TANDEM_CUDA_RETURN_IF_ERROR(cudaEventRecord(im.ev[0].get(), im.s()));
    if (im.sh.embedding) {
      TANDEM_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(a.tokens, tokens, id_bytes, cudaMemcpyHostToDevice, im.s()));
      RETURN_IF_ERROR(EmbeddingForward(im.s(), a.tokens, im.P(im.ix.wte), im.P(im.ix.wpe),
                                       a.resid[0], config_.batch, config_.seq, c));
    } else {
      RETURN_IF_ERROR(im.Copy(a.resid[0], input, rows * c));
    }
    if (im.sh.head) {
      TANDEM_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(im.w.targets, targets, id_bytes, cudaMemcpyHostToDevice, im.s()));
    }
    RETURN_IF_ERROR(im.Forward(a, save ? grad_scale : 0.0f));
    if (!im.sh.head) {
      RETURN_IF_ERROR(im.Copy(output, a.resid[static_cast<size_t>(im.sh.blocks())], rows * c));
    }
    TANDEM_CUDA_RETURN_IF_ERROR(cudaEventRecord(im.ev[1].get(), im.s()));
    double loss_sum = 0.0;
    if (im.sh.head) {
      TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&loss_sum, im.w.loss_sum, sizeof(double),
                                                  cudaMemcpyDeviceToHost, im.s()));
    }
    RETURN_IF_ERROR(im.stream.Synchronize());
    TANDEM_CUDA_RETURN_IF_ERROR(
        cudaEventElapsedTime(&times_.forward_ms, im.ev[0].get(), im.ev[1].get()));
    return loss_sum;
  };
  absl::StatusOr<double> loss = run();
  if (loss.ok() && save) {
    im.in_use[mb] = slot;
  } else {
    im.Release(slot);
  }
  return loss;
}

absl::Status GpuGpt::Backward(int mb, const float* dout, float* din) {
  Impl& im = *impl_;
  const int64_t rows = im.n(), c = config_.d_model;
  auto it = im.in_use.find(mb);
  if (it == im.in_use.end()) {
    return absl::InternalError(absl::StrCat("backward of micro-batch ", mb, " without a forward"));
  }
  if (!im.sh.head && dout == nullptr) {
    return absl::InvalidArgumentError("backward: a stage without the head needs dout");
  }
  if (!im.sh.embedding && din == nullptr) {
    return absl::InvalidArgumentError("backward: a stage without the embedding needs din");
  }
  if (it->second->awaiting_w) {
    return absl::InternalError(
        absl::StrCat("backward of micro-batch ", mb, " whose input gradient already ran (I)"));
  }
  Slot* slot = it->second;
  im.in_use.erase(it);
  absl::Status s = im.TimedBackward(&times_.backward_ms, [&]() -> absl::Status {
    RETURN_IF_ERROR(im.Copy(im.w.dres_a, im.sh.head ? slot->a.dhead : dout, rows * c));
    ASSIGN_OR_RETURN(float* const dx, im.Backward(slot->a));
    if (!im.sh.embedding) RETURN_IF_ERROR(im.Copy(din, dx, rows * c));
    return absl::OkStatus();
  });
  im.Release(slot);
  return s;
}

absl::Status GpuGpt::BackwardInput(int mb, const float* dout, float* din) {
  Impl& im = *impl_;
  const int64_t rows = im.n(), c = config_.d_model;
  auto it = im.in_use.find(mb);
  if (it == im.in_use.end()) {
    return absl::InternalError(absl::StrCat("I of micro-batch ", mb, " without a forward"));
  }
  if (it->second->awaiting_w) {
    return absl::InternalError(absl::StrCat("I of micro-batch ", mb, " twice"));
  }
  if (!im.sh.head && dout == nullptr) {
    return absl::InvalidArgumentError("backward: a stage without the head needs dout");
  }
  if (!im.sh.embedding && din == nullptr) {
    return absl::InvalidArgumentError("backward: a stage without the embedding needs din");
  }
  Slot* slot = it->second;
  RETURN_IF_ERROR(im.EnsureGradInputs(slot));
  RETURN_IF_ERROR(im.TimedBackward(&times_.backward_ms, [&]() -> absl::Status {
    RETURN_IF_ERROR(im.Copy(im.w.dres_a, im.sh.head ? slot->a.dhead : dout, rows * c));
    ASSIGN_OR_RETURN(float* const dx, im.Backward(slot->a, &slot->g));
    if (!im.sh.embedding) RETURN_IF_ERROR(im.Copy(din, dx, rows * c));
    return absl::OkStatus();
  }));
  slot->awaiting_w = true;
  return absl::OkStatus();
}

absl::Status GpuGpt::BackwardWeight(int mb) {
  Impl& im = *impl_;
  auto it = im.in_use.find(mb);
  if (it == im.in_use.end() || !it->second->awaiting_w) {
    return absl::InternalError(absl::StrCat("W of micro-batch ", mb, " before its I"));
  }
  Slot* slot = it->second;
  im.in_use.erase(it);
  absl::Status s =
      im.TimedBackward(&times_.backward_ms, [&] { return im.BackwardWeight(slot->a, slot->g); });
  im.Release(slot);
  return s;
}

size_t GpuGpt::SavedBytes(int mb) const {
  auto it = impl_->in_use.find(mb);
  if (it == impl_->in_use.end()) return 0;
  return impl_->slot_bytes + (it->second->awaiting_w ? impl_->grad_bytes : 0);
}

void GpuGpt::DropSaved() {
  for (auto& [mb, slot] : impl_->in_use) impl_->Release(slot);
  impl_->in_use.clear();
}

absl::StatusOr<float> GpuGpt::ForwardBackward(const int32_t* tokens, const int32_t* targets,
                                              int64_t accumulation) {
  Impl& im = *impl_;
  const int64_t rows = im.n();
  if (!im.sh.embedding || !im.sh.head) {
    return absl::InvalidArgumentError("ForwardBackward: the config is a stage, not the model");
  }
  if (tokens == nullptr || targets == nullptr) {
    return absl::InvalidArgumentError("ForwardBackward: null tokens or targets");
  }
  if (accumulation < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("ForwardBackward: accumulation must be >= 1, got ", accumulation));
  }
  const float scale =
      static_cast<float>(1.0 / (static_cast<double>(rows) * static_cast<double>(accumulation)));
  constexpr int kOnly = 0;
  const absl::StatusOr<double> loss_sum =
      Forward(kOnly, tokens, targets, nullptr, nullptr, scale, true);
  RETURN_IF_ERROR(WithPrefix(loss_sum.status(), "ForwardBackward"));
  RETURN_IF_ERROR(Backward(kOnly, nullptr, nullptr));
  return static_cast<float>(*loss_sum / static_cast<double>(rows));
}

absl::StatusOr<double> GpuGpt::GradSquaredNorm(bool include_tied_copy) {
  Impl& im = *impl_;
  RETURN_IF_ERROR(im.SquaredNorm(include_tied_copy));
  double sum_sq = 0.0;
  TANDEM_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(&sum_sq, im.w.norm_sq, sizeof(double), cudaMemcpyDeviceToHost, im.s()));
  RETURN_IF_ERROR(im.stream.Synchronize());
  return sum_sq;
}

absl::StatusOr<float> GpuGpt::GradNorm() {
  ASSIGN_OR_RETURN(const double sum_sq, GradSquaredNorm(/*include_tied_copy=*/true));
  return static_cast<float>(std::sqrt(sum_sq));
}

absl::StatusOr<float> GpuGpt::Step(float lr, float grad_scale) {
  Impl& im = *impl_;
  if (!std::isfinite(lr)) {
    return absl::InvalidArgumentError(absl::StrCat("Step: lr must be finite, got ", lr));
  }
  if (!(grad_scale > 0.0f) || !std::isfinite(grad_scale)) {
    return absl::InvalidArgumentError(
        absl::StrCat("Step: grad_scale must be finite and > 0, got ", grad_scale));
  }
  TANDEM_CUDA_RETURN_IF_ERROR(cudaEventRecord(im.ev[4].get(), im.s()));
  RETURN_IF_ERROR(im.SquaredNorm(/*include_tied_copy=*/true));
  if (grad_scale != 1.0f && num_params_ > 0) {
    TANDEM_CUBLAS_RETURN_IF_ERROR(
        cublasSscal(im.blas.get(), static_cast<int>(num_params_), &grad_scale, im.grads.data(), 1));
  }
  AdamWHyper hyper = hyper_;
  hyper.lr = lr;
  const int64_t step = step_ + 1;
  for (size_t i = 0; i < layout_.size(); ++i) {
    const GpuGptTensor& t = layout_[i];
    RETURN_IF_ERROR(AdamWStep(im.s(), im.P(i), im.G(i), im.m.data() + t.offset,
                              im.v.data() + t.offset, static_cast<int64_t>(t.count), hyper, t.decay,
                              step));
    if (t.compute_copy) {
      RETURN_IF_ERROR(ConvertToBf16(im.s(), im.P(i), im.compute.data() + t.compute_offset,
                                    static_cast<int64_t>(t.count)));
    }
  }
  TANDEM_CUDA_RETURN_IF_ERROR(cudaEventRecord(im.ev[5].get(), im.s()));
  double sum_sq = 0.0;
  TANDEM_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(&sum_sq, im.w.norm_sq, sizeof(double), cudaMemcpyDeviceToHost, im.s()));
  RETURN_IF_ERROR(im.stream.Synchronize());
  step_ = step;
  TANDEM_CUDA_RETURN_IF_ERROR(
      cudaEventElapsedTime(&times_.optimizer_ms, im.ev[4].get(), im.ev[5].get()));
  return static_cast<float>(std::sqrt(sum_sq));
}

absl::Status GpuGpt::ZeroGradients() {
  RETURN_IF_ERROR(impl_->grads.Zero(impl_->s()));
  return impl_->stream.Synchronize();
}

absl::Status GpuGpt::CheckIndex(size_t index, size_t count) const {
  if (index >= layout_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("parameter index ", index, " out of range [0, ", layout_.size(), ")"));
  }
  if (count != layout_[index].count) {
    return absl::InvalidArgumentError(
        absl::StrCat(layout_[index].name, " has ", layout_[index].count, " elements, got ", count));
  }
  return absl::OkStatus();
}

namespace {
// A synchronous device-to-host copy of `count` floats.
absl::Status Download(const float* device, float* host, size_t count) {
  TANDEM_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(host, device, count * sizeof(float), cudaMemcpyDeviceToHost));
  return absl::OkStatus();
}
absl::Status Upload(const float* host, float* device, size_t count) {
  TANDEM_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(device, host, count * sizeof(float), cudaMemcpyHostToDevice));
  TANDEM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(cudaStreamLegacy));
  return absl::OkStatus();
}
}  // namespace

absl::Status GpuGpt::SetParameter(size_t index, const float* host, size_t count) {
  RETURN_IF_ERROR(CheckIndex(index, count));
  Impl& im = *impl_;
  const GpuGptTensor& t = layout_[index];
  // Ordered after any work on the model's stream that still reads the old values.
  RETURN_IF_ERROR(im.stream.Synchronize());
  RETURN_IF_ERROR(Upload(host, im.P(index), count));
  if (t.compute_copy) {
    RETURN_IF_ERROR(ConvertToBf16(im.s(), im.P(index), im.compute.data() + t.compute_offset,
                                  static_cast<int64_t>(t.count)));
  }
  return im.stream.Synchronize();
}

absl::Status GpuGpt::GetParameter(size_t index, float* host, size_t count) const {
  RETURN_IF_ERROR(CheckIndex(index, count));
  RETURN_IF_ERROR(impl_->stream.Synchronize());
  return Download(impl_->P(index), host, count);
}

absl::Status GpuGpt::GetGradient(size_t index, float* host, size_t count) const {
  RETURN_IF_ERROR(CheckIndex(index, count));
  RETURN_IF_ERROR(impl_->stream.Synchronize());
  return Download(impl_->G(index), host, count);
}

absl::Status GpuGpt::GetMoments(size_t index, float* m, float* v, size_t count) const {
  RETURN_IF_ERROR(CheckIndex(index, count));
  RETURN_IF_ERROR(impl_->stream.Synchronize());
  const size_t offset = layout_[index].offset;
  RETURN_IF_ERROR(Download(impl_->m.data() + offset, m, count));
  return Download(impl_->v.data() + offset, v, count);
}

absl::Status GpuGpt::SetMoments(size_t index, const float* m, const float* v, size_t count) {
  RETURN_IF_ERROR(CheckIndex(index, count));
  RETURN_IF_ERROR(impl_->stream.Synchronize());
  const size_t offset = layout_[index].offset;
  RETURN_IF_ERROR(Upload(m, impl_->m.data() + offset, count));
  return Upload(v, impl_->v.data() + offset, count);
}

float* GpuGpt::DeviceGradient(size_t index) {
  return index < layout_.size() ? impl_->G(index) : nullptr;
}

absl::Status GpuGpt::AddToGradient(size_t index, const float* other) {
  RETURN_IF_ERROR(CheckIndex(index, index < layout_.size() ? layout_[index].count : 0));
  Impl& im = *impl_;
  float* g = im.G(index);
  RETURN_IF_ERROR(Add(im.s(), g, other, g, static_cast<int64_t>(layout_[index].count)));
  return im.stream.Synchronize();
}

absl::Status GpuGpt::CopyGradientFrom(size_t index, const float* other) {
  RETURN_IF_ERROR(CheckIndex(index, index < layout_.size() ? layout_[index].count : 0));
  Impl& im = *impl_;
  RETURN_IF_ERROR(im.Copy(im.G(index), other, static_cast<int64_t>(layout_[index].count)));
  return im.stream.Synchronize();
}

}  // namespace tandem::worker::cuda
