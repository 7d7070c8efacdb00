#include "worker/backend/cuda/gpu_stage.h"

#include <cmath>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/backend/cuda/cuda_status.h"
#include "worker/backend/cuda/device.h"
#include "worker/backend/cuda/gpu_gpt_kernels.h"
#include "worker/backend/cuda/gpu_stage_core.h"

namespace tandem::worker::cuda {

// The plans size bf16 buffers with Bf16Bits; the device's bf16 must be as large.
static_assert(sizeof(bf16) == sizeof(gpu_stage_internal::Bf16Bits));

// ---- Core: the shared linears, rounding and the LM head.

absl::Status GpuStage::Core::Linear(const float* in_f, const bf16* in_h, size_t wi, int64_t bi,
                                    float* out, int64_t c, int64_t oc) {
  if (bf16_mode()) return LinearForward(blas.get(), s(), in_h, H(wi), Bias(bi), out, rows, c, oc);
  return LinearForward(blas.get(), s(), in_f, P(wi), Bias(bi), out, rows, c, oc);
}

absl::Status GpuStage::Core::LinearGrad(const float* dout, const float* in_f, const bf16* in_h,
                                        size_t wi, int64_t bi, float* din, int64_t c, int64_t oc) {
  if (!bf16_mode()) {
    return LinearBackward(blas.get(), s(), dout, in_f, P(wi), din, G(wi), BiasGrad(bi), rows, c,
                          oc);
  }
  RETURN_IF_ERROR(ConvertToBf16(s(), dout, dout_h, rows * oc));
  RETURN_IF_ERROR(
      LinearBackward(blas.get(), s(), dout_h, in_h, H(wi), din, G(wi), nullptr, rows, c, oc));
  if (bi < 0) return absl::OkStatus();
  return LinearBackward(blas.get(), s(), dout, nullptr, nullptr, nullptr, nullptr, BiasGrad(bi),
                        rows, c, oc);
}

absl::Status GpuStage::Core::LinearInputGrad(const float* dout, size_t wi, float* din, int64_t c,
                                             int64_t oc) {
  if (!bf16_mode()) {
    return LinearBackward(blas.get(), s(), dout, nullptr, P(wi), din, nullptr, nullptr, rows, c,
                          oc);
  }
  RETURN_IF_ERROR(ConvertToBf16(s(), dout, dout_h, rows * oc));
  return LinearBackward(blas.get(), s(), dout_h, nullptr, H(wi), din, nullptr, nullptr, rows, c,
                        oc);
}

absl::Status GpuStage::Core::LinearWeightGrad(const float* dout, const float* in_f,
                                              const bf16* in_h, size_t wi, int64_t bi, int64_t c,
                                              int64_t oc) {
  if (!bf16_mode()) {
    return LinearBackward(blas.get(), s(), dout, in_f, nullptr, nullptr, G(wi), BiasGrad(bi), rows,
                          c, oc);
  }
  RETURN_IF_ERROR(ConvertToBf16(s(), dout, dout_h, rows * oc));
  RETURN_IF_ERROR(
      LinearBackward(blas.get(), s(), dout_h, in_h, nullptr, nullptr, G(wi), nullptr, rows, c, oc));
  if (bi < 0) return absl::OkStatus();
  return LinearBackward(blas.get(), s(), dout, nullptr, nullptr, nullptr, nullptr, BiasGrad(bi),
                        rows, c, oc);
}

absl::Status GpuStage::Core::Round(bf16* saved_h, int64_t count) {
  if (!bf16_mode()) return absl::OkStatus();
  return ConvertToBf16(s(), out_f, saved_h, count);
}

absl::Status GpuStage::Core::Zero(float* p, int64_t count) {
  TANDEM_CUDA_RETURN_IF_ERROR(
      cudaMemsetAsync(p, 0, static_cast<size_t>(count) * sizeof(float), s()));
  return absl::OkStatus();
}

absl::Status GpuStage::Core::Copy(float* dst, const float* src, int64_t count) {
  TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, static_cast<size_t>(count) * sizeof(float),
                                              cudaMemcpyDeviceToDevice, s()));
  return absl::OkStatus();
}

absl::Status GpuStage::Core::LmHead(const float* xn_f, const bf16* xn_h, size_t head_w,
                                    float grad_scale, float* dxn, int64_t c, int64_t vocab) {
  // logits = xn W^T, then softmax cross-entropy in place (logits become p - onehot).
  RETURN_IF_ERROR(Linear(xn_f, xn_h, head_w, -1, logits, c, vocab));
  RETURN_IF_ERROR(SoftmaxCrossEntropyInPlace(s(), logits, targets, losses, loss_sum, rows, vocab));
  if (grad_scale <= 0.0f) return absl::OkStatus();
  // dxn = scale (p - onehot) W; dW += scale (p - onehot)^T xn.
  RETURN_IF_ERROR(Zero(dxn, rows * c));
  if (bf16_mode()) {
    RETURN_IF_ERROR(ScaledConvertToBf16(s(), logits, grad_scale, dout_h, rows * vocab));
    return LinearBackward(blas.get(), s(), dout_h, xn_h, H(head_w), dxn, G(head_w), nullptr, rows,
                          c, vocab);
  }
  return ScaledLinearBackward(blas.get(), s(), logits, xn_f, P(head_w), grad_scale, dxn, G(head_w),
                              rows, c, vocab);
}

// ---- GpuStage.

GpuStage::GpuStage() : core_(std::make_unique<Core>()) {}
GpuStage::~GpuStage() = default;

absl::Status GpuStage::Init(const Dims& dims, GpuPrecision precision, const GpuStageShape& shape,
                            std::vector<GpuTensor> layout, const GpuStageMemory& memory,
                            const std::vector<float>& init, const AdamWHyper& hyper) {
  RETURN_IF_ERROR(CudaAvailable());
  dims_ = dims;
  shape_ = shape;
  hyper_ = hyper;
  layout_ = std::move(layout);
  num_params_ = ParameterElements(layout_);
  memory_ = memory;
  Core& co = *core_;
  co.precision = precision;
  co.rows = dims.batch * dims.seq;
  co.layout = &layout_;
  ASSIGN_OR_RETURN(co.stream, CudaStream::Create());
  ASSIGN_OR_RETURN(co.blas, CublasHandle::Create(co.stream.get()));
  for (CudaEvent& e : co.ev) {
    ASSIGN_OR_RETURN(e, CudaEvent::Create(cudaEventDefault));
  }
  for (DeviceBuffer<float>* b : {&co.params, &co.grads, &co.m, &co.v}) {
    ASSIGN_OR_RETURN(*b, DeviceBuffer<float>::Create(num_params_));
  }
  ASSIGN_OR_RETURN(co.compute, DeviceBuffer<bf16>::Create(ComputeCopyElements(layout_)));
  ASSIGN_OR_RETURN(co.work_mem, DeviceBuffer<char>::Create(memory_.workspace));
  CarveWorkspace(reinterpret_cast<uintptr_t>(co.work_mem.data()));
  // The first slot now, so that a model that cannot hold one micro-batch fails here.
  ASSIGN_OR_RETURN(Slot* const first, Acquire());
  Release(first);
  if (init.size() != num_params_) {
    return absl::InternalError(
        absl::StrCat("initial values: ", init.size(), " for ", num_params_, " parameters"));
  }
  RETURN_IF_ERROR(co.params.CopyFromHost(init.data(), init.size()));
  for (DeviceBuffer<float>* b : {&co.grads, &co.m, &co.v}) {
    RETURN_IF_ERROR(b->Zero(co.s()));
  }
  for (size_t i = 0; i < layout_.size(); ++i) {
    const GpuTensor& t = layout_[i];
    if (t.compute_copy) {
      RETURN_IF_ERROR(ConvertToBf16(co.s(), co.P(i), co.compute.data() + t.compute_offset,
                                    static_cast<int64_t>(t.count)));
    }
  }
  return co.stream.Synchronize();
}

absl::StatusOr<GpuStage::Slot*> GpuStage::Acquire() {
  Core& co = *core_;
  if (!co.free_slots.empty()) {
    Slot* slot = co.free_slots.back();
    co.free_slots.pop_back();
    return slot;
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Slot> slot, NewSlot());
  co.slots.push_back(std::move(slot));
  return co.slots.back().get();
}

void GpuStage::Release(Slot* slot) {
  slot->awaiting_w = false;
  core_->free_slots.push_back(slot);
}

absl::Status GpuStage::EnsureWeightGradInputs(Slot& slot) {
  if (slot.grad_mem.data() != nullptr || memory_.weight_grad_inputs == 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(slot.grad_mem, DeviceBuffer<char>::Create(memory_.weight_grad_inputs));
  CarveWeightGradInputs(slot, reinterpret_cast<uintptr_t>(slot.grad_mem.data()));
  return absl::OkStatus();
}

size_t GpuStage::activation_slots() const { return core_->slots.size(); }

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

absl::StatusOr<double> GpuStage::Forward(int mb, const int32_t* tokens, const int32_t* targets,
                                         const float* input, float* output, float grad_scale,
                                         bool save) {
  Core& co = *core_;
  const int64_t rows = co.rows, c = dims_.d_model;
  if (save && co.in_use.contains(mb)) {
    return absl::FailedPreconditionError(
        absl::StrCat("forward of micro-batch ", mb, ": it already has a saved forward"));
  }
  if (shape_.embedding) {
    RETURN_IF_ERROR(CheckIds("token", tokens, rows, dims_.vocab));
  } else if (input == nullptr) {
    return absl::InvalidArgumentError("forward: a stage without the embedding needs an input");
  }
  if (shape_.head) {
    RETURN_IF_ERROR(CheckIds("target", targets, rows, dims_.vocab));
  } else if (output == nullptr) {
    return absl::InvalidArgumentError("forward: a stage without the head needs an output");
  }
  ASSIGN_OR_RETURN(Slot* const slot, Acquire());
  auto run = [&]() -> absl::StatusOr<double> {
    const size_t id_bytes = static_cast<size_t>(rows) * sizeof(int32_t);
    TANDEM_CUDA_RETURN_IF_ERROR(cudaEventRecord(co.ev[0].get(), co.s()));
    if (shape_.embedding) {
      TANDEM_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(slot->tokens, tokens, id_bytes, cudaMemcpyHostToDevice, co.s()));
    } else {
      RETURN_IF_ERROR(co.Copy(slot->input, input, rows * c));
    }
    if (shape_.head) {
      TANDEM_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(co.targets, targets, id_bytes, cudaMemcpyHostToDevice, co.s()));
    }
    RETURN_IF_ERROR(ForwardPass(*slot, save ? grad_scale : 0.0f));
    if (!shape_.head) RETURN_IF_ERROR(co.Copy(output, slot->output, rows * c));
    TANDEM_CUDA_RETURN_IF_ERROR(cudaEventRecord(co.ev[1].get(), co.s()));
    double loss_sum = 0.0;
    if (shape_.head) {
      TANDEM_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(&loss_sum, co.loss_sum, sizeof(double), cudaMemcpyDeviceToHost, co.s()));
    }
    RETURN_IF_ERROR(co.stream.Synchronize());
    TANDEM_CUDA_RETURN_IF_ERROR(
        cudaEventElapsedTime(&times_.forward_ms, co.ev[0].get(), co.ev[1].get()));
    return loss_sum;
  };
  absl::StatusOr<double> loss = run();
  if (loss.ok() && save) {
    co.in_use[mb] = slot;
  } else {
    Release(slot);
  }
  return loss;
}

absl::Status GpuStage::StartBackward(int mb, const float* dout, float* din, bool split,
                                     const char* what) {
  Core& co = *core_;
  const int64_t rows = co.rows, c = dims_.d_model;
  auto it = co.in_use.find(mb);
  if (it == co.in_use.end()) {
    return absl::InternalError(absl::StrCat(what, " of micro-batch ", mb, " without a forward"));
  }
  if (it->second->awaiting_w) {
    return absl::InternalError(split ? absl::StrCat(what, " of micro-batch ", mb, " twice")
                                     : absl::StrCat(what, " of micro-batch ", mb,
                                                    " whose input gradient already ran (I)"));
  }
  if (!shape_.head && dout == nullptr) {
    return absl::InvalidArgumentError("backward: a stage without the head needs dout");
  }
  if (!shape_.embedding && din == nullptr) {
    return absl::InvalidArgumentError("backward: a stage without the embedding needs din");
  }
  Slot* slot = it->second;
  if (split) RETURN_IF_ERROR(EnsureWeightGradInputs(*slot));
  if (!split) co.in_use.erase(it);
  absl::Status s = [&]() -> absl::Status {
    TANDEM_CUDA_RETURN_IF_ERROR(cudaEventRecord(co.ev[2].get(), co.s()));
    ASSIGN_OR_RETURN(const float* const dx,
                     BackwardPass(*slot, shape_.head ? slot->dhead : dout, split));
    if (!shape_.embedding) RETURN_IF_ERROR(co.Copy(din, dx, rows * c));
    TANDEM_CUDA_RETURN_IF_ERROR(cudaEventRecord(co.ev[3].get(), co.s()));
    RETURN_IF_ERROR(co.stream.Synchronize());
    TANDEM_CUDA_RETURN_IF_ERROR(
        cudaEventElapsedTime(&times_.backward_ms, co.ev[2].get(), co.ev[3].get()));
    return absl::OkStatus();
  }();
  if (split) {
    if (s.ok()) slot->awaiting_w = true;
  } else {
    Release(slot);
  }
  return s;
}

absl::Status GpuStage::Backward(int mb, const float* dout, float* din) {
  return StartBackward(mb, dout, din, /*split=*/false, "backward");
}

absl::Status GpuStage::BackwardInput(int mb, const float* dout, float* din) {
  return StartBackward(mb, dout, din, /*split=*/true, "I");
}

absl::Status GpuStage::BackwardWeight(int mb) {
  Core& co = *core_;
  auto it = co.in_use.find(mb);
  if (it == co.in_use.end() || !it->second->awaiting_w) {
    return absl::InternalError(absl::StrCat("W of micro-batch ", mb, " before its I"));
  }
  Slot* slot = it->second;
  co.in_use.erase(it);
  absl::Status s = [&]() -> absl::Status {
    TANDEM_CUDA_RETURN_IF_ERROR(cudaEventRecord(co.ev[2].get(), co.s()));
    RETURN_IF_ERROR(WeightPass(*slot));
    TANDEM_CUDA_RETURN_IF_ERROR(cudaEventRecord(co.ev[3].get(), co.s()));
    RETURN_IF_ERROR(co.stream.Synchronize());
    TANDEM_CUDA_RETURN_IF_ERROR(
        cudaEventElapsedTime(&times_.backward_ms, co.ev[2].get(), co.ev[3].get()));
    return absl::OkStatus();
  }();
  Release(slot);
  return s;
}

size_t GpuStage::SavedBytes(int mb) const {
  auto it = core_->in_use.find(mb);
  if (it == core_->in_use.end()) return 0;
  return memory_.activations + (it->second->awaiting_w ? memory_.weight_grad_inputs : 0);
}

void GpuStage::DropSaved() {
  for (auto& [mb, slot] : core_->in_use) Release(slot);
  core_->in_use.clear();
}

absl::StatusOr<float> GpuStage::ForwardBackward(const int32_t* tokens, const int32_t* targets,
                                                int64_t accumulation) {
  const int64_t rows = core_->rows;
  if (!shape_.embedding || !shape_.head) {
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

namespace {
// Accumulates the squared norm of the gradients into `norm_sq` (zeroed first).
absl::Status SquaredNorm(cudaStream_t s, const std::vector<GpuTensor>& layout, const float* grads,
                         bool include_tied_copy, double* norm_sq) {
  TANDEM_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(norm_sq, 0, sizeof(double), s));
  for (const GpuTensor& t : layout) {
    if (t.tied_copy && !include_tied_copy) continue;
    RETURN_IF_ERROR(
        cuda::GradSquaredNorm(s, grads + t.offset, static_cast<int64_t>(t.count), norm_sq));
  }
  return absl::OkStatus();
}
}  // namespace

absl::StatusOr<double> GpuStage::GradSquaredNorm(bool include_tied_copy) {
  Core& co = *core_;
  RETURN_IF_ERROR(SquaredNorm(co.s(), layout_, co.grads.data(), include_tied_copy, co.norm_sq));
  double sum_sq = 0.0;
  TANDEM_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(&sum_sq, co.norm_sq, sizeof(double), cudaMemcpyDeviceToHost, co.s()));
  RETURN_IF_ERROR(co.stream.Synchronize());
  return sum_sq;
}

absl::StatusOr<float> GpuStage::GradNorm() {
  ASSIGN_OR_RETURN(const double sum_sq, GradSquaredNorm(/*include_tied_copy=*/true));
  return static_cast<float>(std::sqrt(sum_sq));
}

absl::StatusOr<float> GpuStage::Step(float lr, float grad_scale) {
  Core& co = *core_;
  if (!std::isfinite(lr)) {
    return absl::InvalidArgumentError(absl::StrCat("Step: lr must be finite, got ", lr));
  }
  if (!(grad_scale > 0.0f) || !std::isfinite(grad_scale)) {
    return absl::InvalidArgumentError(
        absl::StrCat("Step: grad_scale must be finite and > 0, got ", grad_scale));
  }
  TANDEM_CUDA_RETURN_IF_ERROR(cudaEventRecord(co.ev[4].get(), co.s()));
  RETURN_IF_ERROR(
      SquaredNorm(co.s(), layout_, co.grads.data(), /*include_tied_copy=*/true, co.norm_sq));
  if (grad_scale != 1.0f && num_params_ > 0) {
    TANDEM_CUBLAS_RETURN_IF_ERROR(cublasSetStream(co.blas.get(), co.s()));
    TANDEM_CUBLAS_RETURN_IF_ERROR(
        cublasSscal(co.blas.get(), static_cast<int>(num_params_), &grad_scale, co.grads.data(), 1));
  }
  AdamWHyper hyper = hyper_;
  hyper.lr = lr;
  const int64_t step = step_ + 1;
  for (size_t i = 0; i < layout_.size(); ++i) {
    const GpuTensor& t = layout_[i];
    RETURN_IF_ERROR(AdamWStep(co.s(), co.P(i), co.G(i), co.m.data() + t.offset,
                              co.v.data() + t.offset, static_cast<int64_t>(t.count), hyper, t.decay,
                              step));
    if (t.compute_copy) {
      RETURN_IF_ERROR(ConvertToBf16(co.s(), co.P(i), co.compute.data() + t.compute_offset,
                                    static_cast<int64_t>(t.count)));
    }
  }
  TANDEM_CUDA_RETURN_IF_ERROR(cudaEventRecord(co.ev[5].get(), co.s()));
  double sum_sq = 0.0;
  TANDEM_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(&sum_sq, co.norm_sq, sizeof(double), cudaMemcpyDeviceToHost, co.s()));
  RETURN_IF_ERROR(co.stream.Synchronize());
  step_ = step;
  TANDEM_CUDA_RETURN_IF_ERROR(
      cudaEventElapsedTime(&times_.optimizer_ms, co.ev[4].get(), co.ev[5].get()));
  return static_cast<float>(std::sqrt(sum_sq));
}

absl::Status GpuStage::ZeroGradients() {
  RETURN_IF_ERROR(core_->grads.Zero(core_->s()));
  return core_->stream.Synchronize();
}

absl::Status GpuStage::CheckIndex(size_t index, size_t count) const {
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

absl::Status GpuStage::SetParameter(size_t index, const float* host, size_t count) {
  RETURN_IF_ERROR(CheckIndex(index, count));
  Core& co = *core_;
  const GpuTensor& t = layout_[index];
  // Ordered after any work on the stage's stream that still reads the old values.
  RETURN_IF_ERROR(co.stream.Synchronize());
  RETURN_IF_ERROR(Upload(host, co.P(index), count));
  if (t.compute_copy) {
    RETURN_IF_ERROR(ConvertToBf16(co.s(), co.P(index), co.compute.data() + t.compute_offset,
                                  static_cast<int64_t>(t.count)));
  }
  return co.stream.Synchronize();
}

absl::Status GpuStage::GetParameter(size_t index, float* host, size_t count) const {
  RETURN_IF_ERROR(CheckIndex(index, count));
  RETURN_IF_ERROR(core_->stream.Synchronize());
  return Download(core_->P(index), host, count);
}

absl::Status GpuStage::GetGradient(size_t index, float* host, size_t count) const {
  RETURN_IF_ERROR(CheckIndex(index, count));
  RETURN_IF_ERROR(core_->stream.Synchronize());
  return Download(core_->G(index), host, count);
}

absl::Status GpuStage::GetMoments(size_t index, float* m, float* v, size_t count) const {
  RETURN_IF_ERROR(CheckIndex(index, count));
  RETURN_IF_ERROR(core_->stream.Synchronize());
  const size_t offset = layout_[index].offset;
  RETURN_IF_ERROR(Download(core_->m.data() + offset, m, count));
  return Download(core_->v.data() + offset, v, count);
}

absl::Status GpuStage::SetMoments(size_t index, const float* m, const float* v, size_t count) {
  RETURN_IF_ERROR(CheckIndex(index, count));
  RETURN_IF_ERROR(core_->stream.Synchronize());
  const size_t offset = layout_[index].offset;
  RETURN_IF_ERROR(Upload(m, core_->m.data() + offset, count));
  return Upload(v, core_->v.data() + offset, count);
}

float* GpuStage::DeviceGradient(size_t index) {
  return index < layout_.size() ? core_->G(index) : nullptr;
}

float* GpuStage::DeviceGradients() { return core_->grads.data(); }

size_t GpuStage::gradient_elements() const { return ParameterElements(layout_); }

absl::Status GpuStage::AddToGradient(size_t index, const float* other) {
  RETURN_IF_ERROR(CheckIndex(index, index < layout_.size() ? layout_[index].count : 0));
  Core& co = *core_;
  float* g = co.G(index);
  RETURN_IF_ERROR(Add(co.s(), g, other, g, static_cast<int64_t>(layout_[index].count)));
  return co.stream.Synchronize();
}

absl::Status GpuStage::CopyGradientFrom(size_t index, const float* other) {
  RETURN_IF_ERROR(CheckIndex(index, index < layout_.size() ? layout_[index].count : 0));
  Core& co = *core_;
  RETURN_IF_ERROR(co.Copy(co.G(index), other, static_cast<int64_t>(layout_[index].count)));
  return co.stream.Synchronize();
}

}  // namespace tandem::worker::cuda
