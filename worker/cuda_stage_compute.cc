#include "worker/cuda_stage_compute.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "worker/backend/cuda/device.h"
#include "worker/backend/cuda/gpu_gpt.h"
#include "worker/backend/cuda/gpu_llama.h"
#include "worker/model/gpt.h"
#include "worker/model/llama.h"
#include "worker/model/model_layers.h"

namespace tandem::worker {
namespace {

using cuda::DeviceMemory;
using cuda::GpuStage;

}  // namespace

// Micro-batch buffers (activations and gradients between stages), reused by size: a cudaMalloc
// per micro-batch costs more than a small stage's kernels, and cudaFree synchronises the whole
// device. A buffer returns here when the executor drops it, which is after its last use (a
// compute call returns when the device is done; a send's buffer is kept until WaitSends), so
// the pool holds at most the step's peak of live buffers, which the executor already counts in
// the stage's activation bytes. Shared by the compute and its buffers, which may outlive it.
class CudaStageCompute::BufferPool {
 public:
  absl::StatusOr<DeviceMemory> Take(size_t bytes) {
    {
      absl::MutexLock lock(&mu_);
      auto it = free_.find(bytes);
      if (it != free_.end() && !it->second.empty()) {
        DeviceMemory b = std::move(it->second.back());
        it->second.pop_back();
        return b;
      }
    }
    return DeviceMemory::Allocate(bytes);
  }
  void Give(DeviceMemory b) {
    absl::MutexLock lock(&mu_);
    free_[b.bytes()].push_back(std::move(b));
  }

 private:
  absl::Mutex mu_;
  std::map<size_t, std::vector<DeviceMemory>> free_ ABSL_GUARDED_BY(mu_);  // by size in bytes
};

namespace {

class DeviceStageBuffer final : public StageBuffer {
 public:
  DeviceStageBuffer(DeviceMemory b, std::shared_ptr<CudaStageCompute::BufferPool> pool)
      : buffer_(std::move(b)), pool_(std::move(pool)) {}
  ~DeviceStageBuffer() override { pool_->Give(std::move(buffer_)); }
  void* data() override { return buffer_.data(); }
  size_t bytes() const override { return buffer_.bytes(); }

 private:
  DeviceMemory buffer_;
  std::shared_ptr<CudaStageCompute::BufferPool> pool_;
};

// Plain device bytes (NewDeviceBuffer).
class DeviceBytes final : public StageBuffer {
 public:
  explicit DeviceBytes(DeviceMemory b) : buffer_(std::move(b)) {}
  void* data() override { return buffer_.data(); }
  size_t bytes() const override { return buffer_.bytes(); }

 private:
  DeviceMemory buffer_;
};

// An event-measured time in whole microseconds, at least 1 (0 means "no device time").
int64_t DeviceMicros(float ms) {
  return std::max<int64_t>(1, std::llround(static_cast<double>(ms) * 1000.0));
}

const float* Data(const StageBufferPtr& b) {
  return b == nullptr ? nullptr : static_cast<const float*>(b->data());
}

}  // namespace

absl::StatusOr<int> ParseCudaDevice(absl::string_view device) {
  int n = -1;
  absl::string_view ordinal = device;
  if (!absl::ConsumePrefix(&ordinal, "cuda:") || !absl::SimpleAtoi(ordinal, &n) || n < 0 ||
      n > 1023) {
    return absl::InvalidArgumentError(
        absl::StrCat("device '", device, "' is not cuda:N with N a device ordinal"));
  }
  return n;
}

absl::StatusOr<StageBufferPtr> NewDeviceBuffer(int device, size_t bytes) {
  RETURN_IF_ERROR(cuda::SetDevice(device));
  ASSIGN_OR_RETURN(DeviceMemory b, DeviceMemory::Allocate(bytes));
  RETURN_IF_ERROR(b.Zero());
  return std::make_unique<DeviceBytes>(std::move(b));
}

CudaStageCompute::~CudaStageCompute() = default;

absl::Status CudaStageCompute::Use() const { return cuda::SetDevice(device_); }

std::string CudaStageCompute::device() const { return absl::StrCat("cuda:", device_); }

namespace {

// The GPU stage of one chunk: the model's shape from the spec, the micro-batch (B, seq_len).
// The fields every architecture's GPU stage config has alike: the micro-batch shape (full
// sequences), precision, seed and the chunk's layer range.
template <typename GpuConfig>
void SetStageFields(const v1::JobSpec& spec, const v1::StageChunk& chunk, GpuConfig& cfg) {
  cfg.batch = spec.pipeline().micro_batch_size();
  cfg.seq = cfg.seq_len;
  cfg.precision =
      spec.precision() == "fp32" ? cuda::GpuPrecision::kFp32 : cuda::GpuPrecision::kBf16;
  cfg.seed = spec.seed();
  cfg.layer_begin = chunk.layer_begin();
  cfg.layer_end = chunk.layer_end();
  cfg.selective_recompute = spec.pipeline().recompute() == "selective";
}

absl::StatusOr<std::unique_ptr<GpuStage>> CreateStage(const v1::JobSpec& spec,
                                                      const v1::StageChunk& chunk,
                                                      const cuda::AdamWHyper& hyper) {
  if (spec.model().arch() == "llama") {
    ASSIGN_OR_RETURN(const LlamaConfig llama, LlamaConfigFromSpec(spec.model()));
    cuda::GpuLlamaConfig cfg;
    cfg.n_layer = llama.n_layer;
    cfg.n_head = llama.n_head;
    cfg.n_kv_head = llama.n_kv_head;
    cfg.d_model = llama.d_model;
    cfg.d_hidden = llama.d_hidden;
    cfg.seq_len = llama.seq_len;
    cfg.vocab = llama.vocab;
    cfg.rope_theta = llama.rope_theta;
    cfg.rms_eps = llama.rms_eps;
    cfg.tie_embeddings = llama.tie_embeddings;
    SetStageFields(spec, chunk, cfg);
    ASSIGN_OR_RETURN(std::unique_ptr<cuda::GpuLlama> stage, cuda::GpuLlama::Create(cfg, hyper));
    return std::unique_ptr<GpuStage>(std::move(stage));
  }
  ASSIGN_OR_RETURN(const GptConfig gpt, GptConfigFromSpec(spec.model()));
  cuda::GpuGptConfig cfg;
  cfg.n_layer = gpt.n_layer;
  cfg.n_head = gpt.n_head;
  cfg.d_model = gpt.d_model;
  cfg.d_hidden = gpt.d_hidden;
  cfg.seq_len = gpt.seq_len;
  cfg.vocab = gpt.vocab;
  cfg.tie_embeddings = gpt.tie_embeddings;
  SetStageFields(spec, chunk, cfg);
  ASSIGN_OR_RETURN(std::unique_ptr<cuda::GpuGpt> stage, cuda::GpuGpt::Create(cfg, hyper));
  return std::unique_ptr<GpuStage>(std::move(stage));
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaStageCompute>> CudaStageCompute::Create(
    const v1::StageProgram& program, int device) {
  const v1::JobSpec& spec = program.spec();
  const std::string& arch = spec.model().arch();
  if (arch != "gpt" && arch != "llama") {
    return absl::InvalidArgumentError(absl::StrCat(
        "the CUDA backend runs gpt and llama models only, got model.arch '", arch, "'"));
  }
  // The model's errors before the device's (INVALID_ARGUMENT, as on a machine without one).
  if (arch == "gpt") {
    if (absl::StatusOr<GptConfig> gpt = GptConfigFromSpec(spec.model()); !gpt.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the CUDA backend's gpt model: ", gpt.status().message()));
    }
  } else if (absl::StatusOr<LlamaConfig> llama = LlamaConfigFromSpec(spec.model()); !llama.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the CUDA backend's llama model: ", llama.status().message()));
  }
  const v1::OptimizerSpec& opt = spec.optimizer();
  if (absl::AsciiStrToLower(opt.name()) != "adamw") {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer.name '", opt.name(), "' is not supported by the CUDA backend (adamw only)"));
  }
  if (spec.precision() != "" && spec.precision() != "fp32" && spec.precision() != "bf16") {
    return absl::InvalidArgumentError(
        absl::StrCat("precision '", spec.precision(), "' is not fp32 or bf16"));
  }
  RETURN_IF_ERROR(cuda::CudaAvailable());
  std::unique_ptr<CudaStageCompute> c(new CudaStageCompute());
  c->pool_ = std::make_shared<BufferPool>();
  c->device_ = device;
  RETURN_IF_ERROR(c->Use());
  cuda::AdamWHyper hyper;
  hyper.beta1 = opt.beta1();
  hyper.beta2 = opt.beta2();
  hyper.eps = opt.eps();
  hyper.weight_decay = opt.weight_decay();
  for (const v1::StageChunk& chunk : program.chunks()) {
    absl::StatusOr<std::unique_ptr<GpuStage>> created = CreateStage(spec, chunk, hyper);
    RETURN_IF_ERROR(
        WithPrefix(created.status(), absl::StrCat("stage ", chunk.stage(), " on cuda:", device)));
    std::unique_ptr<GpuStage> stage = *std::move(created);
    const cuda::GpuStageMemory& m = stage->memory();
    // The activation slots are the saved activations (SavedBytes), not static memory.
    c->static_memory_.push_back(
        {static_cast<int64_t>(m.parameters + m.compute_weights), static_cast<int64_t>(m.gradients),
         static_cast<int64_t>(m.optimizer_state), static_cast<int64_t>(m.workspace)});
    c->parameter_count_ += stage->num_parameters();
    c->activation_elements_ = spec.pipeline().micro_batch_size() *
                              static_cast<int64_t>(spec.model().seq_len()) *
                              static_cast<int64_t>(spec.model().d_model());
    c->stages_.push_back(std::move(stage));
  }
  c->last_device_us_.assign(c->stages_.size(), 0);
  c->last_call_peak_.assign(c->stages_.size(), 0);
  return c;
}

absl::StatusOr<StageBufferPtr> CudaStageCompute::NewBuffer(const std::vector<int64_t>& shape) {
  RETURN_IF_ERROR(Use());
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  ASSIGN_OR_RETURN(DeviceMemory b, pool_->Take(n * sizeof(float)));
  return std::make_unique<DeviceStageBuffer>(std::move(b), pool_);
}

absl::StatusOr<double> CudaStageCompute::Forward(int chunk, int mb, StageBufferPtr input,
                                                 const MicroBatchData& data, bool save,
                                                 StageBufferPtr* output) {
  return ForwardFrom(chunk, mb, Data(input), data, save, output);
}

absl::StatusOr<double> CudaStageCompute::ForwardFrom(int chunk, int mb, const float* input,
                                                     const MicroBatchData& data, bool save,
                                                     StageBufferPtr* output) {
  RETURN_IF_ERROR(Use());
  GpuStage& stage = *stages_[chunk];
  float* out = nullptr;
  if (!stage.has_head()) {
    ASSIGN_OR_RETURN(*output, NewBuffer({activation_elements_}));
    out = static_cast<float*>((*output)->data());
  }
  const double normalizer = static_cast<double>(std::max<int64_t>(data.loss_normalizer, 1));
  const int32_t* tokens = stage.has_embedding() && data.tokens ? data.tokens->data() : nullptr;
  const int32_t* targets = stage.has_head() && data.targets ? data.targets->data() : nullptr;
  last_device_us_[static_cast<size_t>(chunk)] = 0;
  ASSIGN_OR_RETURN(const double sum, stage.Forward(mb, tokens, targets, input, out,
                                                   static_cast<float>(1.0 / normalizer), save));
  last_device_us_[static_cast<size_t>(chunk)] = DeviceMicros(stage.last_times().forward_ms);
  return sum / normalizer;
}

absl::Status CudaStageCompute::Backward(int chunk, int mb, v1::ActionKind kind,
                                        StageBufferPtr grad_output, StageBufferPtr* grad_input) {
  RETURN_IF_ERROR(Use());
  GpuStage& stage = *stages_[chunk];
  last_device_us_[static_cast<size_t>(chunk)] = 0;
  last_call_peak_[static_cast<size_t>(chunk)] = 0;  // a backward holds no more inside
  // The split backward: I computes the input gradient and keeps what W needs; W adds the
  // weight gradients (GpuStage::BackwardInput / BackwardWeight).
  if (kind == v1::ACTION_W) {
    RETURN_IF_ERROR(stage.BackwardWeight(mb));
    last_device_us_[static_cast<size_t>(chunk)] = DeviceMicros(stage.last_times().backward_ms);
    return absl::OkStatus();
  }
  float* din = nullptr;
  if (!stage.has_embedding()) {
    ASSIGN_OR_RETURN(*grad_input, NewBuffer({activation_elements_}));
    din = static_cast<float*>((*grad_input)->data());
  }
  RETURN_IF_ERROR(kind == v1::ACTION_I ? stage.BackwardInput(mb, Data(grad_output), din)
                                       : stage.Backward(mb, Data(grad_output), din));
  last_device_us_[static_cast<size_t>(chunk)] = DeviceMicros(stage.last_times().backward_ms);
  return absl::OkStatus();
}

absl::StatusOr<double> CudaStageCompute::ForwardKeepingInput(int chunk, int mb,
                                                             StageBufferPtr input,
                                                             const MicroBatchData& data,
                                                             StageBufferPtr* output) {
  {
    absl::MutexLock lock(&kept_mu_);
    if (kept_inputs_.count({chunk, mb}) > 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "stage ", chunk, " already keeps the input of micro-batch ", mb, " for its recompute"));
    }
  }
  // The forward without saving (the loss, the output), then only its input stays. While it
  // runs it fills an activation slot of the stage (returned to the pool after) beside the input.
  StageBufferPtr kept = std::move(input);
  ASSIGN_OR_RETURN(const double loss, ForwardFrom(chunk, mb, Data(kept), data, false, output));
  last_call_peak_[static_cast<size_t>(chunk)] =
      stages_[chunk]->memory().activations + (kept != nullptr ? kept->bytes() : 0);
  absl::MutexLock lock(&kept_mu_);
  kept_inputs_[{chunk, mb}] = std::move(kept);
  return loss;
}

absl::Status CudaStageCompute::Recompute(int chunk, int mb, const MicroBatchData& data,
                                         bool /*at_backward*/) {
  StageBufferPtr kept;
  {
    absl::MutexLock lock(&kept_mu_);
    auto it = kept_inputs_.find({chunk, mb});
    if (it == kept_inputs_.end()) return absl::InternalError("recompute without checkpoints");
    kept = std::move(it->second);
    kept_inputs_.erase(it);
  }
  // The saving forward again, now (per stage: see the header), its output discarded.
  StageBufferPtr scratch;
  last_call_peak_[static_cast<size_t>(chunk)] = 0;
  RETURN_IF_ERROR(ForwardFrom(chunk, mb, Data(kept), data, true, &scratch).status());
  // Until it returns, the micro-batch holds its kept input beside the slot refilled.
  last_call_peak_[static_cast<size_t>(chunk)] =
      stages_[chunk]->SavedBytes(mb) + (kept != nullptr ? kept->bytes() : 0);
  return absl::OkStatus();
}

size_t CudaStageCompute::SavedBytes(int chunk, int mb) const {
  size_t n = stages_[chunk]->SavedBytes(mb);
  absl::MutexLock lock(&kept_mu_);
  auto it = kept_inputs_.find({chunk, mb});
  if (it != kept_inputs_.end() && it->second != nullptr) n += it->second->bytes();
  return n;
}

void CudaStageCompute::DropSaved() {
  for (auto& s : stages_) s->DropSaved();
  absl::MutexLock lock(&kept_mu_);
  kept_inputs_.clear();
}

std::vector<std::pair<size_t, size_t>> CudaStageCompute::TiedCopies() const {
  // Only the token embedding is ever tied: chunk order lists the embedding's copy before the
  // head's.
  std::vector<std::pair<size_t, size_t>> out;
  for (size_t s = 0; s < stages_.size(); ++s) {
    const std::vector<cuda::GpuTensor>& layout = stages_[s]->layout();
    for (size_t i = 0; i < layout.size(); ++i) {
      if (layout[i].tied) out.emplace_back(s, i);
    }
  }
  return out;
}

std::vector<TiedGradient> CudaStageCompute::TiedGradients() {
  std::vector<TiedGradient> out;
  for (auto [s, i] : TiedCopies()) {
    const cuda::GpuTensor& t = stages_[s]->layout()[i];
    out.push_back({t.name, stages_[s]->DeviceGradient(i), t.count * sizeof(float)});
  }
  return out;
}

absl::Status CudaStageCompute::SumLocalTiedGradients() {
  RETURN_IF_ERROR(Use());
  const std::vector<std::pair<size_t, size_t>> copies = TiedCopies();
  if (copies.size() != 2) return absl::OkStatus();
  GpuStage& a = *stages_[copies[0].first];
  GpuStage& b = *stages_[copies[1].first];
  RETURN_IF_ERROR(a.AddToGradient(copies[0].second, b.DeviceGradient(copies[1].second)));
  return b.CopyGradientFrom(copies[1].second, a.DeviceGradient(copies[0].second));
}

absl::Status CudaStageCompute::AddToTiedGradient(size_t index, StageBuffer& other) {
  RETURN_IF_ERROR(Use());
  const std::vector<std::pair<size_t, size_t>> copies = TiedCopies();
  if (index >= copies.size()) {
    return absl::InternalError(absl::StrCat("tied gradient ", index, " of ", copies.size()));
  }
  return stages_[copies[index].first]->AddToGradient(copies[index].second,
                                                     static_cast<const float*>(other.data()));
}

absl::StatusOr<StageCompute::GradStats> CudaStageCompute::GradientStats(bool count_tied) {
  RETURN_IF_ERROR(Use());
  GradStats stats;
  for (auto& stage : stages_) {
    // The head's wte copy never counts; the embedding's does (only on the first stage's worker,
    // which is the one that counts tied parameters).
    ASSIGN_OR_RETURN(const double sum_sq, stage->GradSquaredNorm(/*include_tied_copy=*/false));
    if (!count_tied) {
      for (size_t i = 0; i < stage->layout().size(); ++i) {
        if (!stage->layout()[i].tied || stage->layout()[i].tied_copy) continue;
        return absl::InternalError("a worker holding the embedding must count its tied wte");
      }
    }
    stats.sum_sq += sum_sq;
  }
  stats.finite = std::isfinite(stats.sum_sq);
  return stats;
}

int CudaStageCompute::num_layers(int chunk) const {
  return chunk >= 0 && static_cast<size_t>(chunk) < stages_.size() ? 1 : 0;
}

absl::StatusOr<std::vector<absl::Span<float>>> CudaStageCompute::LayerGradients(int chunk,
                                                                                int layer) {
  if (chunk < 0 || static_cast<size_t>(chunk) >= stages_.size() || layer != 0) {
    return absl::InvalidArgumentError(absl::StrCat("no gradient bucket ", layer, " in chunk ",
                                                   chunk, " (one bucket per chunk on cuda)"));
  }
  cuda::GpuStage& stage = *stages_[chunk];
  return std::vector<absl::Span<float>>{
      absl::Span<float>(stage.DeviceGradients(), stage.gradient_elements())};
}

absl::Status CudaStageCompute::Apply(float learning_rate, float grad_scale, bool skip) {
  RETURN_IF_ERROR(Use());
  for (auto& stage : stages_) {
    RETURN_IF_ERROR(skip ? stage->ZeroGradients()
                         : stage->Step(learning_rate, grad_scale).status());
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<StateTensor>> CudaStageCompute::CheckpointTensors(bool list_tied) {
  RETURN_IF_ERROR(Use());
  host_f32_.clear();
  host_steps_.clear();
  std::vector<StateTensor> params, state;
  for (auto& stage : stages_) {
    const std::vector<cuda::GpuTensor>& layout = stage->layout();
    for (size_t i = 0; i < layout.size(); ++i) {
      const cuda::GpuTensor& t = layout[i];
      if (t.tied_copy || (t.tied && !list_tied)) continue;
      std::vector<float>& value = host_f32_.emplace_back(t.count);
      std::vector<float>& m = host_f32_.emplace_back(t.count);
      std::vector<float>& v = host_f32_.emplace_back(t.count);
      RETURN_IF_ERROR(stage->GetParameter(i, value.data(), t.count));
      RETURN_IF_ERROR(stage->GetMoments(i, m.data(), v.data(), t.count));
      const size_t bytes = t.count * sizeof(float);
      params.push_back({t.name, "F32", t.shape, value.data(), bytes});
      state.push_back({t.name + ".adam_m", "F32", t.shape, m.data(), bytes});
      state.push_back({t.name + ".adam_v", "F32", t.shape, v.data(), bytes});
      const int64_t& steps = host_steps_.emplace_back(stage->steps());
      state.push_back({t.name + ".adam_step", "I64", {1}, &steps, sizeof(int64_t)});
    }
  }
  params.insert(params.end(), state.begin(), state.end());
  return params;
}

std::vector<std::string> CudaStageCompute::RestoreNames(bool weights_only) {
  std::vector<std::string> names;
  std::set<std::string> seen;
  for (const char* suffix : {"", ".adam_m", ".adam_v", ".adam_step"}) {
    if (weights_only && *suffix != '\0') break;
    for (const auto& stage : stages_) {
      for (const cuda::GpuTensor& t : stage->layout()) {
        std::string n = t.name + suffix;
        if (seen.insert(n).second) names.push_back(std::move(n));
      }
    }
  }
  return names;
}

absl::Status CudaStageCompute::Restore(const TensorLookup& lookup, bool weights_only,
                                       absl::string_view where) {
  RETURN_IF_ERROR(Use());
  auto copy = [&](const std::string& name, void* dst, size_t bytes) {
    return CopyRestoredTensor(lookup, name, dst, bytes, where);
  };
  std::vector<float> value, m, v;
  for (auto& stage : stages_) {
    int64_t steps = 0;
    const std::vector<cuda::GpuTensor>& layout = stage->layout();
    for (size_t i = 0; i < layout.size(); ++i) {
      const cuda::GpuTensor& t = layout[i];
      const size_t bytes = t.count * sizeof(float);
      value.resize(t.count);
      RETURN_IF_ERROR(copy(t.name, value.data(), bytes));
      RETURN_IF_ERROR(stage->SetParameter(i, value.data(), t.count));
      if (weights_only) continue;
      m.resize(t.count);
      v.resize(t.count);
      RETURN_IF_ERROR(copy(t.name + ".adam_m", m.data(), bytes));
      RETURN_IF_ERROR(copy(t.name + ".adam_v", v.data(), bytes));
      RETURN_IF_ERROR(stage->SetMoments(i, m.data(), v.data(), t.count));
      int64_t n = 0;
      RETURN_IF_ERROR(copy(t.name + ".adam_step", &n, sizeof(n)));
      steps = std::max(steps, n);
    }
    stage->set_steps(weights_only ? 0 : steps);
    RETURN_IF_ERROR(stage->ZeroGradients());
  }
  return absl::OkStatus();
}

}  // namespace tandem::worker
