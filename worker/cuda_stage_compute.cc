#include "worker/cuda_stage_compute.h"

#include <cuda_runtime_api.h>

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
#include "worker/backend/cuda/cuda_status.h"
#include "worker/backend/cuda/device_buffer.h"
#include "worker/model/gpt.h"

namespace tandem::worker {
namespace {

using cuda::DeviceBuffer;
using cuda::GpuGpt;

}  // namespace

// Micro-batch buffers (activations and gradients between stages), reused by size: a cudaMalloc
// per micro-batch costs more than a small stage's kernels, and cudaFree synchronises the whole
// device. A buffer returns here when the executor drops it, which is after its last use (a
// compute call returns when the device is done; a send's buffer is kept until WaitSends), so
// the pool holds at most the step's peak of live buffers, which the executor already counts in
// the stage's activation bytes. Shared by the compute and its buffers, which may outlive it.
class CudaStageCompute::BufferPool {
 public:
  absl::StatusOr<DeviceBuffer<float>> Take(size_t count) {
    {
      absl::MutexLock lock(&mu_);
      auto it = free_.find(count);
      if (it != free_.end() && !it->second.empty()) {
        DeviceBuffer<float> b = std::move(it->second.back());
        it->second.pop_back();
        return b;
      }
    }
    return DeviceBuffer<float>::Create(count);
  }
  void Give(DeviceBuffer<float> b) {
    absl::MutexLock lock(&mu_);
    free_[b.size()].push_back(std::move(b));
  }

 private:
  absl::Mutex mu_;
  std::map<size_t, std::vector<DeviceBuffer<float>>> free_ ABSL_GUARDED_BY(mu_);
};

namespace {

class DeviceStageBuffer final : public StageBuffer {
 public:
  DeviceStageBuffer(DeviceBuffer<float> b, std::shared_ptr<CudaStageCompute::BufferPool> pool)
      : buffer_(std::move(b)), pool_(std::move(pool)) {}
  ~DeviceStageBuffer() override { pool_->Give(std::move(buffer_)); }
  void* data() override { return buffer_.data(); }
  size_t bytes() const override { return buffer_.size() * sizeof(float); }

 private:
  DeviceBuffer<float> buffer_;
  std::shared_ptr<CudaStageCompute::BufferPool> pool_;
};

// Plain device bytes (NewDeviceBuffer).
class DeviceBytes final : public StageBuffer {
 public:
  explicit DeviceBytes(DeviceBuffer<char> b) : buffer_(std::move(b)) {}
  void* data() override { return buffer_.data(); }
  size_t bytes() const override { return buffer_.size(); }

 private:
  DeviceBuffer<char> buffer_;
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
  TANDEM_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  absl::StatusOr<DeviceBuffer<char>> b = DeviceBuffer<char>::Create(bytes);
  if (!b.ok()) return b.status();
  TANDEM_CUDA_RETURN_IF_ERROR(cudaMemset(b->data(), 0, bytes));
  return std::make_unique<DeviceBytes>(*std::move(b));
}

absl::Status CudaStageCompute::Use() const {
  TANDEM_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  return absl::OkStatus();
}

std::string CudaStageCompute::device() const { return absl::StrCat("cuda:", device_); }

absl::StatusOr<std::unique_ptr<CudaStageCompute>> CudaStageCompute::Create(
    const v1::StageProgram& program, int device) {
  const v1::JobSpec& spec = program.spec();
  absl::StatusOr<GptConfig> gpt = GptConfigFromSpec(spec.model());
  if (!gpt.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the CUDA backend runs gpt models only: ", gpt.status().message()));
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
  if (absl::Status s = cuda::CudaAvailable(); !s.ok()) return s;
  std::unique_ptr<CudaStageCompute> c(new CudaStageCompute());
  c->pool_ = std::make_shared<BufferPool>();
  c->device_ = device;
  if (absl::Status s = c->Use(); !s.ok()) return s;
  cuda::AdamWHyper hyper;
  hyper.beta1 = opt.beta1();
  hyper.beta2 = opt.beta2();
  hyper.eps = opt.eps();
  hyper.weight_decay = opt.weight_decay();
  for (const v1::StageChunk& chunk : program.chunks()) {
    cuda::GpuGptConfig cfg;
    cfg.n_layer = gpt->n_layer;
    cfg.n_head = gpt->n_head;
    cfg.d_model = gpt->d_model;
    cfg.d_hidden = gpt->d_hidden;
    cfg.seq_len = gpt->seq_len;
    cfg.vocab = gpt->vocab;
    cfg.tie_embeddings = gpt->tie_embeddings;
    cfg.batch = spec.pipeline().micro_batch_size();
    cfg.seq = gpt->seq_len;
    cfg.precision =
        spec.precision() == "fp32" ? cuda::GpuPrecision::kFp32 : cuda::GpuPrecision::kBf16;
    cfg.seed = spec.seed();
    cfg.layer_begin = chunk.layer_begin();
    cfg.layer_end = chunk.layer_end();
    absl::StatusOr<std::unique_ptr<GpuGpt>> stage = GpuGpt::Create(cfg, hyper);
    if (!stage.ok()) {
      return absl::Status(stage.status().code(),
                          absl::StrCat("stage ", chunk.stage(), " on cuda:", device, ": ",
                                       stage.status().message()));
    }
    const cuda::GpuGptMemory& m = (*stage)->memory();
    // The activation slots are the saved activations (SavedBytes), not static memory.
    c->static_memory_.push_back(
        {static_cast<int64_t>(m.parameters + m.compute_weights), static_cast<int64_t>(m.gradients),
         static_cast<int64_t>(m.optimizer_state), static_cast<int64_t>(m.workspace)});
    c->parameter_count_ += (*stage)->num_parameters();
    c->activation_elements_ = cfg.batch * cfg.seq * cfg.d_model;
    c->stages_.push_back(*std::move(stage));
  }
  return c;
}

absl::StatusOr<StageBufferPtr> CudaStageCompute::NewBuffer(const std::vector<int64_t>& shape) {
  if (absl::Status s = Use(); !s.ok()) return s;
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  absl::StatusOr<DeviceBuffer<float>> b = pool_->Take(n);
  if (!b.ok()) return b.status();
  return std::make_unique<DeviceStageBuffer>(*std::move(b), pool_);
}

absl::StatusOr<double> CudaStageCompute::Forward(int chunk, int mb, StageBufferPtr input,
                                                 const MicroBatchData& data, bool save,
                                                 StageBufferPtr* output) {
  if (absl::Status s = Use(); !s.ok()) return s;
  GpuGpt& stage = *stages_[chunk];
  float* out = nullptr;
  if (!stage.has_head()) {
    absl::StatusOr<StageBufferPtr> b = NewBuffer({activation_elements_});
    if (!b.ok()) return b.status();
    *output = *std::move(b);
    out = static_cast<float*>((*output)->data());
  }
  const double normalizer = static_cast<double>(std::max<int64_t>(data.loss_normalizer, 1));
  const int32_t* tokens = stage.has_embedding() && data.tokens ? data.tokens->data() : nullptr;
  const int32_t* targets = stage.has_head() && data.targets ? data.targets->data() : nullptr;
  last_device_us_ = 0;
  absl::StatusOr<double> sum = stage.Forward(mb, tokens, targets, Data(input), out,
                                             static_cast<float>(1.0 / normalizer), save);
  if (!sum.ok()) return sum.status();
  last_device_us_ = DeviceMicros(stage.last_times().forward_ms);
  return *sum / normalizer;
}

absl::Status CudaStageCompute::Backward(int chunk, int mb, v1::ActionKind kind,
                                        StageBufferPtr grad_output, StageBufferPtr* grad_input) {
  if (absl::Status s = Use(); !s.ok()) return s;
  GpuGpt& stage = *stages_[chunk];
  last_device_us_ = 0;
  // The split backward: I computes the input gradient and keeps what W needs; W adds the
  // weight gradients (GpuGpt::BackwardInput / BackwardWeight).
  if (kind == v1::ACTION_W) {
    if (absl::Status s = stage.BackwardWeight(mb); !s.ok()) return s;
    last_device_us_ = DeviceMicros(stage.last_times().backward_ms);
    return absl::OkStatus();
  }
  float* din = nullptr;
  if (!stage.has_embedding()) {
    absl::StatusOr<StageBufferPtr> b = NewBuffer({activation_elements_});
    if (!b.ok()) return b.status();
    *grad_input = *std::move(b);
    din = static_cast<float*>((*grad_input)->data());
  }
  absl::Status s = kind == v1::ACTION_I ? stage.BackwardInput(mb, Data(grad_output), din)
                                        : stage.Backward(mb, Data(grad_output), din);
  if (!s.ok()) return s;
  last_device_us_ = DeviceMicros(stage.last_times().backward_ms);
  return absl::OkStatus();
}

size_t CudaStageCompute::SavedBytes(int chunk, int mb) const {
  return stages_[chunk]->SavedBytes(mb);
}

void CudaStageCompute::DropSaved() {
  for (auto& s : stages_) s->DropSaved();
}

std::vector<std::pair<size_t, size_t>> CudaStageCompute::TiedCopies() const {
  // Only wte is ever tied: chunk order lists the embedding's copy before the head's.
  std::vector<std::pair<size_t, size_t>> out;
  for (size_t s = 0; s < stages_.size(); ++s) {
    const std::vector<cuda::GpuGptTensor>& layout = stages_[s]->layout();
    for (size_t i = 0; i < layout.size(); ++i) {
      if (layout[i].tied) out.emplace_back(s, i);
    }
  }
  return out;
}

std::vector<TiedGradient> CudaStageCompute::TiedGradients() {
  std::vector<TiedGradient> out;
  for (auto [s, i] : TiedCopies()) {
    const cuda::GpuGptTensor& t = stages_[s]->layout()[i];
    out.push_back({t.name, stages_[s]->DeviceGradient(i), t.count * sizeof(float)});
  }
  return out;
}

absl::Status CudaStageCompute::SumLocalTiedGradients() {
  if (absl::Status s = Use(); !s.ok()) return s;
  const std::vector<std::pair<size_t, size_t>> copies = TiedCopies();
  if (copies.size() != 2) return absl::OkStatus();
  GpuGpt& a = *stages_[copies[0].first];
  GpuGpt& b = *stages_[copies[1].first];
  if (absl::Status s = a.AddToGradient(copies[0].second, b.DeviceGradient(copies[1].second));
      !s.ok()) {
    return s;
  }
  return b.CopyGradientFrom(copies[1].second, a.DeviceGradient(copies[0].second));
}

absl::Status CudaStageCompute::AddToTiedGradient(size_t index, StageBuffer& other) {
  if (absl::Status s = Use(); !s.ok()) return s;
  const std::vector<std::pair<size_t, size_t>> copies = TiedCopies();
  if (index >= copies.size()) {
    return absl::InternalError(absl::StrCat("tied gradient ", index, " of ", copies.size()));
  }
  return stages_[copies[index].first]->AddToGradient(copies[index].second,
                                                     static_cast<const float*>(other.data()));
}

absl::StatusOr<StageCompute::GradStats> CudaStageCompute::GradientStats(bool count_tied) {
  if (absl::Status s = Use(); !s.ok()) return s;
  GradStats stats;
  for (auto& stage : stages_) {
    // The head's wte copy never counts; the embedding's does (only on the first stage's worker,
    // which is the one that counts tied parameters).
    absl::StatusOr<double> sum_sq = stage->GradSquaredNorm(/*include_tied_copy=*/false);
    if (!sum_sq.ok()) return sum_sq.status();
    if (!count_tied) {
      for (size_t i = 0; i < stage->layout().size(); ++i) {
        if (!stage->layout()[i].tied || stage->layout()[i].tied_copy) continue;
        return absl::InternalError("a worker holding the embedding must count its tied wte");
      }
    }
    stats.sum_sq += *sum_sq;
  }
  stats.finite = std::isfinite(stats.sum_sq);
  return stats;
}

absl::Status CudaStageCompute::Apply(float learning_rate, float grad_scale, bool skip) {
  if (absl::Status s = Use(); !s.ok()) return s;
  for (auto& stage : stages_) {
    absl::Status s =
        skip ? stage->ZeroGradients() : stage->Step(learning_rate, grad_scale).status();
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<StateTensor>> CudaStageCompute::CheckpointTensors(bool list_tied) {
  if (absl::Status s = Use(); !s.ok()) return s;
  host_f32_.clear();
  host_steps_.clear();
  std::vector<StateTensor> params, state;
  for (auto& stage : stages_) {
    const std::vector<cuda::GpuGptTensor>& layout = stage->layout();
    for (size_t i = 0; i < layout.size(); ++i) {
      const cuda::GpuGptTensor& t = layout[i];
      if (t.tied_copy || (t.tied && !list_tied)) continue;
      std::vector<float>& value = host_f32_.emplace_back(t.count);
      std::vector<float>& m = host_f32_.emplace_back(t.count);
      std::vector<float>& v = host_f32_.emplace_back(t.count);
      if (absl::Status s = stage->GetParameter(i, value.data(), t.count); !s.ok()) return s;
      if (absl::Status s = stage->GetMoments(i, m.data(), v.data(), t.count); !s.ok()) return s;
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
      for (const cuda::GpuGptTensor& t : stage->layout()) {
        std::string n = t.name + suffix;
        if (seen.insert(n).second) names.push_back(std::move(n));
      }
    }
  }
  return names;
}

absl::Status CudaStageCompute::Restore(const TensorLookup& lookup, bool weights_only,
                                       absl::string_view where) {
  if (absl::Status s = Use(); !s.ok()) return s;
  auto copy = [&](const std::string& name, void* dst, size_t bytes) {
    return CopyRestoredTensor(lookup, name, dst, bytes, where);
  };
  std::vector<float> value, m, v;
  for (auto& stage : stages_) {
    int64_t steps = 0;
    const std::vector<cuda::GpuGptTensor>& layout = stage->layout();
    for (size_t i = 0; i < layout.size(); ++i) {
      const cuda::GpuGptTensor& t = layout[i];
      const size_t bytes = t.count * sizeof(float);
      value.resize(t.count);
      if (absl::Status s = copy(t.name, value.data(), bytes); !s.ok()) return s;
      if (absl::Status s = stage->SetParameter(i, value.data(), t.count); !s.ok()) return s;
      if (weights_only) continue;
      m.resize(t.count);
      v.resize(t.count);
      if (absl::Status s = copy(t.name + ".adam_m", m.data(), bytes); !s.ok()) return s;
      if (absl::Status s = copy(t.name + ".adam_v", v.data(), bytes); !s.ok()) return s;
      if (absl::Status s = stage->SetMoments(i, m.data(), v.data(), t.count); !s.ok()) return s;
      int64_t n = 0;
      if (absl::Status s = copy(t.name + ".adam_step", &n, sizeof(n)); !s.ok()) return s;
      steps = std::max(steps, n);
    }
    stage->set_steps(weights_only ? 0 : steps);
    if (absl::Status s = stage->ZeroGradients(); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace tandem::worker
