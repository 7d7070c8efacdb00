#include "worker/cpu_stage_compute.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/shard_range.h"
#include "common/spec.h"
#include "common/status_macros.h"
#include "worker/model/kernels.h"
#include "worker/model/model_layers.h"

namespace tandem::worker {
namespace {

class HostBuffer final : public StageBuffer {
 public:
  explicit HostBuffer(Tensor t) : tensor_(std::move(t)) {}
  void* data() override { return tensor_.data(); }
  size_t bytes() const override { return tensor_.bytes(); }
  Tensor& tensor() { return tensor_; }

 private:
  Tensor tensor_;
};

StageBufferPtr Wrap(Tensor t) { return std::make_unique<HostBuffer>(std::move(t)); }

// The tensor of a buffer this backend made (an empty one for null).
Tensor Unwrap(StageBufferPtr b) {
  if (b == nullptr) return Tensor{};
  return std::move(static_cast<HostBuffer&>(*b).tensor());
}

}  // namespace

absl::StatusOr<std::unique_ptr<CpuStageCompute>> CpuStageCompute::Create(
    const v1::StageProgram& program, size_t slots) {
  std::unique_ptr<CpuStageCompute> c(new CpuStageCompute());
  for (const v1::StageChunk& pc : program.chunks()) {
    ASSIGN_OR_RETURN(std::vector<std::unique_ptr<Layer>> layers,
                     BuildModelLayers(program.spec(), pc.layer_begin(), pc.layer_end()));
    c->chunks_.push_back(std::move(layers));
  }
  std::vector<Parameter*> params = c->HostParameters();
  for (const Parameter* p : params) c->parameter_count_ += static_cast<int64_t>(p->value.size());
  if (ShardsOptimizerState(program.spec())) {
    // ZeRO stage 1: this replica's segment of every parameter (common/shard_range.h).
    for (const Parameter* p : params) {
      c->shard_.push_back(OwnedSegment(p->value.size(), program.num_replicas(), program.replica()));
    }
  }
  ASSIGN_OR_RETURN(c->optimizer_,
                   MakeOptimizer(program.spec().optimizer(), std::move(params), c->shard_));
  // Each chunk's static memory: value and gradient of its parameters, and the optimizer state
  // in proportion (AdamW and SGD keep the same floats for every parameter element, or for
  // every element of this replica's segment when sharded).
  const size_t state_bytes = c->optimizer_->StateBytes();
  for (const auto& layers : c->chunks_) {
    int64_t elements = 0;
    for (const auto& layer : layers) {
      for (const Parameter* p : layer->Parameters()) {
        elements += static_cast<int64_t>(p->value.size());
      }
    }
    const int64_t share = c->parameter_count_ > 0
                              ? static_cast<int64_t>(static_cast<double>(state_bytes) *
                                                     static_cast<double>(elements) /
                                                     static_cast<double>(c->parameter_count_))
                              : 0;
    const int64_t bytes = elements * static_cast<int64_t>(sizeof(float));
    c->static_memory_.push_back({bytes, bytes, share, 0});
  }
  c->slots_ = slots;
  c->last_call_peak_.assign(c->chunks_.size(), 0);
  c->saved_.resize(c->chunks_.size() * slots);
  c->checkpoints_.resize(c->chunks_.size() * slots);
  return c;
}

absl::StatusOr<StageBufferPtr> CpuStageCompute::NewBuffer(const std::vector<int64_t>& shape) {
  return Wrap(Tensor(shape));
}

std::atomic<int64_t> CpuStageCompute::reads_of_running_{0};

// Marks `chunk` as inside a compute call of this thread for the guard's life (with
// AllowConcurrentChunks only).
class CpuStageCompute::Running {
 public:
  Running(CpuStageCompute* c, int chunk) : c_(c), chunk_(static_cast<size_t>(chunk)) {
    if (!c_->concurrent_chunks_) return;
    std::lock_guard<std::mutex> lock(c_->running_mu_);
    c_->running_[chunk_] = std::this_thread::get_id();
  }
  ~Running() {
    if (!c_->concurrent_chunks_) return;
    std::lock_guard<std::mutex> lock(c_->running_mu_);
    c_->running_[chunk_] = std::thread::id();
  }
  Running(const Running&) = delete;
  Running& operator=(const Running&) = delete;

 private:
  CpuStageCompute* c_;
  size_t chunk_;
};

absl::StatusOr<double> CpuStageCompute::Forward(int chunk, int mb, StageBufferPtr input,
                                                const MicroBatchData& data, bool save,
                                                StageBufferPtr* output) {
  const Running running(this, chunk);
  const auto& layers = chunks_[chunk];
  std::vector<SavedContext>& saved = Saved(chunk, mb);
  saved.assign(layers.size(), SavedContext{});
  Tensor x = Unwrap(std::move(input));
  Tensor y;
  for (size_t l = 0; l < layers.size(); ++l) {
    RETURN_IF_ERROR(layers[l]->Forward(x, data, saved[l], y));
    std::swap(x, y);
  }
  if (!save) saved.clear();
  if (layers.back()->is_loss()) return static_cast<double>(x[0]);
  *output = Wrap(std::move(x));
  return 0.0;
}

size_t CpuStageCompute::Checkpoint::Bytes() const {
  size_t n = 0;
  for (const Tensor& t : inputs) n += t.bytes();
  return n;
}

absl::StatusOr<double> CpuStageCompute::ForwardKeepingInput(int chunk, int mb, StageBufferPtr input,
                                                            const MicroBatchData& data,
                                                            StageBufferPtr* output) {
  const Running running(this, chunk);
  const auto& layers = chunks_[chunk];
  Saved(chunk, mb).clear();
  Checkpoint& cp = CheckpointOf(chunk, mb);
  cp.inputs.assign(layers.size(), Tensor{});
  cp.inputs[0] = Unwrap(std::move(input));
  cp.kept = true;
  cp.at_backward = false;
  // Layer by layer as Forward runs them, each layer keeping nothing for a backward and its
  // output kept as the next layer's checkpoint: the same arithmetic, one layer's
  // intermediates at a time.
  Tensor y;
  // The most it holds: the checkpoints so far (the running layer's output among them, but the
  // stage's output, a message, is not saved) and the running layer's intermediates.
  size_t peak = 0;
  for (size_t l = 0; l < layers.size(); ++l) {
    size_t intermediates = 0;
    RETURN_IF_ERROR(layers[l]->ForwardWithoutSaving(cp.inputs[l], data, y, &intermediates));
    if (l + 1 < layers.size()) cp.inputs[l + 1] = std::move(y);
    peak = std::max(peak, cp.Bytes() + intermediates);
  }
  last_call_peak_[static_cast<size_t>(chunk)] = peak;
  if (layers.back()->is_loss()) return static_cast<double>(y[0]);
  *output = Wrap(std::move(y));
  return 0.0;
}

absl::Status CpuStageCompute::Recompute(int chunk, int mb, const MicroBatchData& data,
                                        bool at_backward) {
  const Running running(this, chunk);
  Checkpoint& cp = CheckpointOf(chunk, mb);
  if (!cp.kept || cp.at_backward) return absl::InternalError("recompute without checkpoints");
  last_call_peak_[static_cast<size_t>(chunk)] = SavedBytes(chunk, mb);
  if (at_backward) {
    cp.at_backward = true;
    cp.data = data;
    return absl::OkStatus();
  }
  // Every layer's context again, from its own checkpoint (what the F without saving would
  // have saved; no layer's output is needed), each checkpoint released once its layer has run.
  const auto& layers = chunks_[chunk];
  std::vector<SavedContext>& saved = Saved(chunk, mb);
  saved.assign(layers.size(), SavedContext{});
  for (size_t l = 0; l < layers.size(); ++l) {
    RETURN_IF_ERROR(layers[l]->RecomputeContext(cp.inputs[l], data, saved[l]));
    NotePeak(chunk, mb);
    cp.inputs[l] = Tensor{};
  }
  cp = Checkpoint{};
  return absl::OkStatus();
}

absl::Status CpuStageCompute::RecomputingBackward(int chunk, int mb, bool split, Tensor g,
                                                  Tensor& grad_input) {
  const auto& layers = chunks_[chunk];
  Checkpoint& cp = CheckpointOf(chunk, mb);
  std::vector<SavedContext>& saved = Saved(chunk, mb);
  saved.assign(layers.size(), SavedContext{});
  Tensor gin;
  for (size_t l = layers.size(); l-- > 0;) {
    RETURN_IF_ERROR(layers[l]->RecomputeContext(cp.inputs[l], cp.data, saved[l]));
    cp.inputs[l] = Tensor{};
    NotePeak(chunk, mb);
    RETURN_IF_ERROR(split ? layers[l]->BackwardInput(g, saved[l], gin)
                          : layers[l]->Backward(g, saved[l], gin));
    if (!split) saved[l].Clear();
    if (!split && layer_done_) layer_done_(chunk, static_cast<int>(l));
    std::swap(g, gin);
  }
  cp = Checkpoint{};
  if (!split) saved.clear();
  grad_input = std::move(g);
  return absl::OkStatus();
}

absl::Status CpuStageCompute::Backward(int chunk, int mb, v1::ActionKind kind,
                                       StageBufferPtr grad_output, StageBufferPtr* grad_input) {
  const Running running(this, chunk);
  const auto& layers = chunks_[chunk];
  std::vector<SavedContext>& saved = Saved(chunk, mb);
  last_call_peak_[static_cast<size_t>(chunk)] = SavedBytes(chunk, mb);
  const bool split = kind == v1::ACTION_I;
  if (kind != v1::ACTION_W && CheckpointOf(chunk, mb).at_backward) {
    Tensor g;
    RETURN_IF_ERROR(RecomputingBackward(chunk, mb, split, Unwrap(std::move(grad_output)), g));
    if (!layers.front()->reads_tokens()) *grad_input = Wrap(std::move(g));
    return absl::OkStatus();
  }
  if (saved.size() != layers.size()) {
    return absl::InternalError("backward without a saved forward");
  }
  if (kind == v1::ACTION_W) {
    for (size_t l = layers.size(); l-- > 0;) {
      RETURN_IF_ERROR(layers[l]->BackwardWeight(saved[l]));
      if (layer_done_) layer_done_(chunk, static_cast<int>(l));
    }
    saved.clear();
    return absl::OkStatus();
  }
  Tensor g = Unwrap(std::move(grad_output));
  Tensor gin;
  for (size_t l = layers.size(); l-- > 0;) {
    RETURN_IF_ERROR(split ? layers[l]->BackwardInput(g, saved[l], gin)
                          : layers[l]->Backward(g, saved[l], gin));
    if (!split) saved[l].Clear();
    if (!split && layer_done_) layer_done_(chunk, static_cast<int>(l));
    std::swap(g, gin);
  }
  if (!split) saved.clear();
  if (!layers.front()->reads_tokens()) *grad_input = Wrap(std::move(g));
  return absl::OkStatus();
}

// The spans of `layer` of `chunk`: each parameter's gradient, or its value.
absl::StatusOr<std::vector<absl::Span<float>>> CpuStageCompute::LayerSpans(int chunk, int layer,
                                                                           bool values) {
  if (chunk < 0 || static_cast<size_t>(chunk) >= chunks_.size() || layer < 0 ||
      static_cast<size_t>(layer) >= chunks_[chunk].size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("no layer ", layer, " in chunk ", chunk, " of this stage"));
  }
  std::vector<absl::Span<float>> out;
  for (Parameter* p : chunks_[chunk][layer]->Parameters()) {
    out.push_back(absl::MakeSpan(values ? p->value.vec() : p->grad.vec()));
  }
  return out;
}

absl::StatusOr<std::vector<absl::Span<float>>> CpuStageCompute::LayerGradients(int chunk,
                                                                               int layer) {
  return LayerSpans(chunk, layer, /*values=*/false);
}

absl::StatusOr<std::vector<absl::Span<float>>> CpuStageCompute::LayerParameters(int chunk,
                                                                                int layer) {
  return LayerSpans(chunk, layer, /*values=*/true);
}

size_t CpuStageCompute::SavedBytes(int chunk, int mb) const {
  if (concurrent_chunks_) {
    std::lock_guard<std::mutex> lock(running_mu_);
    const std::thread::id in = running_[static_cast<size_t>(chunk)];
    if (in != std::thread::id() && in != std::this_thread::get_id()) ++reads_of_running_;
  }
  const size_t i = static_cast<size_t>(chunk) * slots_ + static_cast<size_t>(mb);
  size_t n = checkpoints_[i].Bytes();
  for (const SavedContext& c : saved_[i]) n += c.Bytes();
  return n;
}

void CpuStageCompute::DropSaved() {
  for (auto& s : saved_) s.clear();
  for (Checkpoint& c : checkpoints_) c = Checkpoint{};
}

std::vector<Parameter*> CpuStageCompute::HostParameters() {
  std::vector<Parameter*> out;
  for (const auto& layers : chunks_) {
    for (const auto& layer : layers) {
      for (Parameter* p : layer->Parameters()) out.push_back(p);
    }
  }
  return out;
}

std::map<std::string, std::vector<Parameter*>> CpuStageCompute::TiedByName() {
  std::map<std::string, std::vector<Parameter*>> tied;
  for (Parameter* p : HostParameters()) {
    if (p->tied) tied[p->name].push_back(p);
  }
  return tied;
}

std::vector<Parameter*> CpuStageCompute::TiedCopies() {
  std::vector<Parameter*> out;
  for (auto& [name, copies] : TiedByName()) out.insert(out.end(), copies.begin(), copies.end());
  return out;
}

std::vector<TiedGradient> CpuStageCompute::TiedGradients() {
  std::vector<TiedGradient> out;
  for (Parameter* p : TiedCopies()) out.push_back({p->name, p->grad.data(), p->grad.bytes()});
  return out;
}

absl::Status CpuStageCompute::SumLocalTiedGradients() {
  for (auto& [name, copies] : TiedByName()) {
    if (copies.size() != 2) continue;
    TensorStorage<float>& a = copies[0]->grad.vec();
    TensorStorage<float>& b = copies[1]->grad.vec();
    for (size_t i = 0; i < a.size(); ++i) a[i] = b[i] = a[i] + b[i];
  }
  return absl::OkStatus();
}

absl::Status CpuStageCompute::AddToTiedGradient(size_t index, StageBuffer& other) {
  std::vector<Parameter*> copies = TiedCopies();
  if (index >= copies.size() || other.bytes() != copies[index]->grad.bytes()) {
    return absl::InternalError(
        absl::StrCat("tied gradient ", index, " of ", copies.size(), ": wrong index or size"));
  }
  // a + b is exactly b + a in IEEE arithmetic, so both workers' copies stay bit-identical.
  TensorStorage<float>& g = copies[index]->grad.vec();
  const float* o = static_cast<const float*>(other.data());
  for (size_t i = 0; i < g.size(); ++i) g[i] += o[i];
  return absl::OkStatus();
}

absl::StatusOr<StageCompute::GradStats> CpuStageCompute::GradientStats(bool count_tied) {
  GradStats stats;
  std::set<std::string> tied_counted;
  const std::vector<Parameter*> params = HostParameters();
  for (size_t i = 0; i < params.size(); ++i) {
    const Parameter* p = params[i];
    if (p->tied && (!count_tied || !tied_counted.insert(p->name).second)) continue;
    const ElementRange range = shard_.empty() ? ElementRange{0, p->grad.size()} : shard_[i];
    stats.sum_sq +=
        kernels::SumOfSquares(p->grad.data() + range.begin, static_cast<int64_t>(range.size()));
  }
  // A NaN or infinite gradient makes the sum so; finite floats cannot (a square is below
  // 1.2e77, far from double's limit), so this is the per-element check, exactly.
  stats.finite = std::isfinite(stats.sum_sq);
  return stats;
}

absl::Status CpuStageCompute::Apply(float learning_rate, float grad_scale, bool skip) {
  std::vector<Parameter*> params = HostParameters();
  if (skip) {
    for (Parameter* p : params) p->grad.Fill(0.0f);
    return absl::OkStatus();
  }
  // Clipping's factor rides in the update's pass (a separate pass over every gradient cost as
  // much as the gradient-norm pass, and the profile's update did not price it).
  optimizer_->Step(learning_rate, grad_scale);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<StateTensor>> CpuStageCompute::CheckpointTensors(bool list_tied) {
  std::vector<StateTensor> out;
  std::vector<Parameter*> params = HostParameters();
  std::set<const Parameter*> skip;
  std::set<std::string> seen;
  for (const Parameter* p : params) {
    if (p->tied && (!list_tied || !seen.insert(p->name).second)) skip.insert(p);
  }
  for (Parameter* p : params) {
    if (skip.contains(p)) continue;
    out.push_back({p->name, "F32", p->value.shape(), p->value.vec().data(), p->value.bytes()});
  }
  for (const OptimizerSlot& slot : optimizer_->Slots()) {
    const Parameter* p = params[slot.param];
    if (skip.contains(p)) continue;
    const std::string name = absl::StrCat(p->name, ".", slot.key);
    if (slot.f32 != nullptr) {
      StateTensor t{name, "F32", p->value.shape(), slot.f32->data(),
                    slot.f32->size() * sizeof(float)};
      if (!shard_.empty()) {  // the same tensors on every replica, so they gather in step
        t.shard = ElementRange{slot.offset, slot.offset + slot.f32->size()};
      }
      out.push_back(std::move(t));
    } else {
      out.push_back({name, "I64", {1}, slot.i64, sizeof(int64_t)});
    }
  }
  return out;
}

std::vector<std::string> CpuStageCompute::RestoreNames(bool weights_only) {
  std::vector<std::string> names;
  std::set<std::string> seen;  // both copies of a tied parameter read the same tensor
  auto add = [&](std::string n) {
    if (seen.insert(n).second) names.push_back(std::move(n));
  };
  std::vector<Parameter*> params = HostParameters();
  for (const Parameter* p : params) add(p->name);
  if (weights_only) return names;
  for (const OptimizerSlot& slot : optimizer_->Slots()) {
    add(absl::StrCat(params[slot.param]->name, ".", slot.key));
  }
  return names;
}

absl::Status CpuStageCompute::Restore(const TensorLookup& lookup, bool weights_only,
                                      absl::string_view where) {
  auto copy = [&](const std::string& name, void* dst, size_t bytes) {
    return CopyRestoredTensor(lookup, name, dst, bytes, where);
  };
  std::vector<Parameter*> params = HostParameters();
  for (Parameter* p : params) {
    RETURN_IF_ERROR(copy(p->name, p->value.vec().data(), p->value.bytes()));
    p->grad.Fill(0.0f);
  }
  if (weights_only) return absl::OkStatus();
  for (const OptimizerSlot& slot : optimizer_->Slots()) {
    const Parameter* p = params[slot.param];
    const std::string name = absl::StrCat(p->name, ".", slot.key);
    if (slot.f32 == nullptr) {
      RETURN_IF_ERROR(copy(name, slot.i64, sizeof(int64_t)));
    } else if (shard_.empty()) {
      RETURN_IF_ERROR(copy(name, slot.f32->data(), slot.f32->size() * sizeof(float)));
    } else {
      // Sharded: the checkpoint holds the whole tensor (whatever layout wrote it); this
      // replica keeps its segment.
      RETURN_IF_ERROR(CopyRestoredRange(lookup, name, p->value.bytes(), slot.offset * sizeof(float),
                                        slot.f32->data(), slot.f32->size() * sizeof(float), where));
    }
  }
  return absl::OkStatus();
}

}  // namespace tandem::worker
